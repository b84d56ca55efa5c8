//! The disk KV cache: token prefixes checkpointed as files, restored
//! instead of recomputed (also by a worker started later).
//!
//! One file per prefix, named by the hash chain of its tokens
//! (`<hex>.ds4kv`), written to a temporary name, fsynced and renamed. A
//! file carries a versioned header with the model's identity and KV
//! geometry and a SHA-256 trailer; files that are truncated, corrupt, of
//! another format version or of another model are skipped with a log line,
//! and so is anything that is not a regular file (a FIFO is never opened:
//! reading one would block start-up).
//! The files this cache indexes never take more than the byte budget: the
//! least recently used go first. The format is documented in
//! `docs/contracts/kv-disk-cache.md`.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use ds4_model::gguf::open_regular;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::blocks::{chain_hashes, ChainHash};

const MAGIC: &[u8; 8] = b"DS4KVC\0\0";
const VERSION: u32 = 2;
const EXT: &str = "ds4kv";
/// Largest header accepted (the token list of a 1M-token prefix fits).
const MAX_HEADER: u32 = 16 << 20;

/// What a file must match to be used by this worker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskKey {
    /// The model's identity (layout and sampled content).
    pub model: String,
    pub block_size: usize,
    /// The state layout in words, row dtype included.
    pub layout: String,
    pub block_bytes: usize,
    /// Bytes after the blocks that make the prefix resumable at its end
    /// (the last block's window block, for compressed-attention layouts);
    /// 0 for dense layouts, whose files resume at any of their blocks.
    pub tail_bytes: usize,
}

/// Receives block `i`'s bytes as a file is read (`i` = the block count
/// for the tail).
pub type BlockSink<'a> = dyn FnMut(usize, &[u8]) -> Result<(), String> + 'a;
/// Fills block `i`'s bytes as a file is written (`i` = the block count
/// for the tail).
pub type BlockSource<'a> = dyn FnMut(usize, &mut [u8]) -> Result<(), String> + 'a;

#[derive(Serialize, Deserialize)]
struct Header {
    #[serde(flatten)]
    key: DiskKey,
    /// Tokens of the prefix (a whole number of blocks).
    tokens: Vec<u32>,
}

#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {problem}")]
    Invalid { path: PathBuf, problem: String },
}

struct Entry {
    path: PathBuf,
    bytes: u64,
    hashes: Vec<ChainHash>,
    tokens: Vec<u32>,
    used: u64,
}

/// The files of one directory that belong to this model.
pub struct DiskCache {
    dir: PathBuf,
    budget: u64,
    key: DiskKey,
    /// By the hash of the whole prefix a file holds.
    files: HashMap<ChainHash, Entry>,
    /// Every block hash of every file: `(file, depth)`.
    prefixes: HashMap<ChainHash, (ChainHash, usize)>,
    tick: u64,
}

fn hex(h: &ChainHash) -> String {
    h.iter().map(|b| format!("{b:02x}")).collect()
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> DiskError + '_ {
    move |source| DiskError::Io {
        path: path.into(),
        source,
    }
}

impl DiskCache {
    /// Index the valid files of `dir` (created if missing); skip the others
    /// with a log line, delete leftovers of interrupted writes, and evict
    /// the oldest files beyond `budget` bytes.
    pub fn open(dir: &Path, budget: u64, key: DiskKey) -> Result<DiskCache, DiskError> {
        fs::create_dir_all(dir).map_err(io(dir))?;
        let mut cache = DiskCache {
            dir: dir.into(),
            budget,
            key,
            files: HashMap::new(),
            prefixes: HashMap::new(),
            tick: 0,
        };
        let mut found = Vec::new();
        for ent in fs::read_dir(dir).map_err(io(dir))?.flatten() {
            let path = ent.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.ends_with(&format!(".{EXT}.tmp")) {
                let _ = fs::remove_file(&path);
                continue;
            }
            if path.extension().and_then(|e| e.to_str()) != Some(EXT) {
                continue;
            }
            let mtime = ent
                .metadata()
                .and_then(|m| m.modified())
                .unwrap_or(std::time::UNIX_EPOCH);
            match cache.inspect(&path) {
                Ok((tokens, bytes)) => found.push((mtime, path, tokens, bytes)),
                Err(Skip::Foreign(e)) => {
                    tracing::warn!(error = %e, "disk KV cache: file skipped (left in place)")
                }
                Err(Skip::Damaged(e)) => {
                    tracing::warn!(error = %e, "disk KV cache: damaged file skipped and removed");
                    let _ = fs::remove_file(&path);
                }
            }
        }
        found.sort_by_key(|f| f.0);
        for (_, path, tokens, bytes) in found {
            cache.insert(path, tokens, bytes);
        }
        cache.evict_to(0);
        tracing::info!(
            dir = %dir.display(),
            files = cache.files.len(),
            mb = cache.used_bytes() >> 20,
            budget_mb = budget >> 20,
            "disk KV cache ready"
        );
        Ok(cache)
    }

    /// Bytes of the indexed files.
    pub fn used_bytes(&self) -> u64 {
        self.files.values().map(|e| e.bytes).sum()
    }

    pub fn files(&self) -> usize {
        self.files.len()
    }

    /// Whether a file holds the prefix with this hash.
    pub fn contains(&self, hash: &ChainHash) -> bool {
        self.prefixes.contains_key(hash)
    }

    /// The longest prefix of `hashes` some file can resume: `(blocks,
    /// file)`. With a tail, only a whole file resumes (at its end).
    pub fn longest(&self, hashes: &[ChainHash]) -> Option<(usize, ChainHash)> {
        let whole = self.key.tail_bytes > 0;
        hashes.iter().enumerate().rev().find_map(|(i, h)| {
            if whole {
                self.files.contains_key(h).then_some((i + 1, *h))
            } else {
                self.prefixes.get(h).map(|&(file, _)| (i + 1, file))
            }
        })
    }

    /// Read the first `blocks` blocks of `file`, handing each to `on_block`
    /// (index, bytes) as it is read, then its tail when it has one and
    /// `blocks` is all of it; the checksum is verified at the end.
    /// A file that fails is dropped from the index and deleted; the blocks
    /// already handed over must then be discarded by the caller.
    pub fn load(
        &mut self,
        file: &ChainHash,
        blocks: usize,
        on_block: &mut BlockSink<'_>,
    ) -> Result<(), DiskError> {
        let entry = self.files.get_mut(file).ok_or_else(|| DiskError::Invalid {
            path: self.dir.clone(),
            problem: "no such file in the index".into(),
        })?;
        self.tick += 1;
        entry.used = self.tick;
        let path = entry.path.clone();
        let result = read_blocks(&path, &self.key, blocks, on_block);
        if let Err(e) = &result {
            tracing::warn!(error = %e, "disk KV cache: file dropped");
            self.remove(file);
            let _ = fs::remove_file(&path);
        }
        result
    }

    /// Write the prefix `tokens` (whole blocks) to a file unless one holds
    /// it already; `read_block` fills block `i`'s bytes (and the tail). Older files are
    /// evicted to stay within the budget; a prefix larger than the whole
    /// budget is not written. Returns whether a file was written.
    pub fn store(
        &mut self,
        tokens: &[u32],
        read_block: &mut BlockSource<'_>,
    ) -> Result<bool, DiskError> {
        let bs = self.key.block_size;
        let hashes = chain_hashes(tokens, bs);
        let Some(end) = hashes.last().copied() else {
            return Ok(false);
        };
        if hashes.len() * bs != tokens.len() || self.contains(&end) {
            return Ok(false);
        }
        let header = serde_json::to_vec(&Header {
            key: self.key.clone(),
            tokens: tokens.to_vec(),
        })
        .expect("header serializes");
        let block_bytes = self.key.block_bytes;
        let tail = self.key.tail_bytes;
        let bytes = (8 + 4 + 4 + header.len() + hashes.len() * block_bytes + tail + 32) as u64;
        if bytes > self.budget {
            return Ok(false);
        }
        self.evict_to(bytes);
        let path = self.dir.join(format!("{}.{EXT}", hex(&end)));
        let tmp = self.dir.join(format!("{}.{EXT}.tmp", hex(&end)));
        let mut write = || -> Result<(), DiskError> {
            // A new file, never whatever is at that name (O_EXCL: not even
            // a FIFO is opened).
            let _ = fs::remove_file(&tmp);
            let f = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)
                .map_err(io(&tmp))?;
            let mut w = BufWriter::with_capacity(1 << 20, f);
            let mut sha = Sha256::new();
            let mut put = |w: &mut BufWriter<File>, b: &[u8]| {
                sha.update(b);
                w.write_all(b).map_err(io(&tmp))
            };
            put(&mut w, MAGIC)?;
            put(&mut w, &VERSION.to_le_bytes())?;
            put(&mut w, &(header.len() as u32).to_le_bytes())?;
            put(&mut w, &header)?;
            let mut buf = vec![0u8; block_bytes];
            for i in 0..hashes.len() {
                read_block(i, &mut buf).map_err(|problem| DiskError::Invalid {
                    path: tmp.clone(),
                    problem,
                })?;
                put(&mut w, &buf)?;
            }
            if tail > 0 {
                buf.resize(tail, 0);
                read_block(hashes.len(), &mut buf).map_err(|problem| DiskError::Invalid {
                    path: tmp.clone(),
                    problem,
                })?;
                put(&mut w, &buf)?;
            }
            let digest = sha.finalize();
            w.write_all(&digest).map_err(io(&tmp))?;
            let f = w.into_inner().map_err(|e| DiskError::Io {
                path: tmp.clone(),
                source: e.into_error(),
            })?;
            f.sync_all().map_err(io(&tmp))?;
            fs::rename(&tmp, &path).map_err(io(&path))?;
            if let Ok(d) = File::open(&self.dir) {
                let _ = d.sync_all();
            }
            Ok(())
        };
        if let Err(e) = write() {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        self.insert(path, tokens.to_vec(), bytes);
        Ok(true)
    }

    /// Check a file's header and size; returns its tokens and size.
    fn inspect(&self, path: &Path) -> Result<(Vec<u32>, u64), Skip> {
        let bad = |problem: String| {
            Skip::Damaged(DiskError::Invalid {
                path: path.into(),
                problem,
            })
        };
        let f = open_regular(path).map_err(|e| Skip::Foreign(io(path)(e)))?;
        let len = f.metadata().map_err(|e| Skip::Foreign(io(path)(e)))?.len();
        let mut r = BufReader::new(f);
        let (header, json) = read_header(&mut r, path)?;
        if header.key != self.key {
            return Err(Skip::Foreign(DiskError::Invalid {
                path: path.into(),
                problem: format!(
                    "written for another model or state layout ({} / {} tokens per block / {}); this worker serves {} / {}",
                    short(&header.key.model),
                    header.key.block_size,
                    header.key.layout,
                    short(&self.key.model),
                    self.key.layout
                ),
            }));
        }
        let bs = self.key.block_size;
        if header.tokens.is_empty() || !header.tokens.len().is_multiple_of(bs) {
            return Err(bad(format!(
                "{} tokens is not a whole number of {bs}-token blocks",
                header.tokens.len()
            )));
        }
        let body = (header.tokens.len() / bs * self.key.block_bytes + self.key.tail_bytes) as u64;
        let expected = 16 + json.len() as u64 + body + 32;
        if len != expected {
            return Err(bad(format!(
                "{len} bytes, expected {expected} (truncated or padded)"
            )));
        }
        let hashes = chain_hashes(&header.tokens, bs);
        let want_name = format!("{}.{EXT}", hex(hashes.last().expect("not empty")));
        if path.file_name().and_then(|n| n.to_str()) != Some(want_name.as_str()) {
            return Err(bad(format!(
                "name does not match its tokens (expected {want_name})"
            )));
        }
        Ok((header.tokens, len))
    }

    fn insert(&mut self, path: PathBuf, tokens: Vec<u32>, bytes: u64) {
        let hashes = chain_hashes(&tokens, self.key.block_size);
        let end = *hashes.last().expect("files hold at least one block");
        for (i, h) in hashes.iter().enumerate() {
            self.prefixes.entry(*h).or_insert((end, i + 1));
        }
        self.tick += 1;
        self.files.insert(
            end,
            Entry {
                path,
                bytes,
                hashes,
                tokens,
                used: self.tick,
            },
        );
    }

    fn remove(&mut self, file: &ChainHash) -> Option<Entry> {
        let e = self.files.remove(file)?;
        for h in &e.hashes {
            if self.prefixes.get(h).map(|p| p.0) == Some(*file) {
                self.prefixes.remove(h);
                // Another file may hold the same prefix.
                if let Some((other, entry)) = self.files.iter().find(|(_, f)| f.hashes.contains(h))
                {
                    let depth = entry.hashes.iter().position(|x| x == h).expect("found") + 1;
                    self.prefixes.insert(*h, (*other, depth));
                }
            }
        }
        Some(e)
    }

    /// Evict least recently used files until `extra` more bytes fit.
    fn evict_to(&mut self, extra: u64) {
        while self.used_bytes() + extra > self.budget {
            let Some(oldest) = self
                .files
                .iter()
                .min_by_key(|(_, e)| e.used)
                .map(|(k, _)| *k)
            else {
                return;
            };
            if let Some(e) = self.remove(&oldest) {
                tracing::info!(
                    file = %e.path.display(),
                    tokens = e.tokens.len(),
                    "disk KV cache: evicted to stay within its budget"
                );
                let _ = fs::remove_file(&e.path);
            }
        }
    }
}

fn short(model: &str) -> &str {
    &model[..model.len().min(24)]
}

/// Why a file found at start-up is not used: it belongs to something else
/// (another format, version or model: left alone), or it is ours but
/// damaged (removed).
enum Skip {
    Foreign(DiskError),
    Damaged(DiskError),
}

/// The header of a cache file: its fields and its JSON bytes.
fn read_header(r: &mut impl Read, path: &Path) -> Result<(Header, Vec<u8>), Skip> {
    let err = |problem: String| DiskError::Invalid {
        path: path.into(),
        problem,
    };
    let bad = |problem: String| Skip::Damaged(err(problem));
    let mut fixed = [0u8; 16];
    r.read_exact(&mut fixed)
        .map_err(|e| Skip::Foreign(err(format!("not a ds4 KV cache file: {e}"))))?;
    if &fixed[..8] != MAGIC {
        return Err(Skip::Foreign(err("not a ds4 KV cache file".into())));
    }
    let version = u32::from_le_bytes(fixed[8..12].try_into().expect("4 bytes"));
    if version != VERSION {
        return Err(Skip::Foreign(err(format!(
            "format version {version}, this worker reads version {VERSION}"
        ))));
    }
    let len = u32::from_le_bytes(fixed[12..16].try_into().expect("4 bytes"));
    if len > MAX_HEADER {
        return Err(bad(format!("header of {len} bytes")));
    }
    let mut json = vec![0u8; len as usize];
    r.read_exact(&mut json)
        .map_err(|e| bad(format!("truncated header: {e}")))?;
    let header = serde_json::from_slice(&json).map_err(|e| bad(format!("bad header: {e}")))?;
    Ok((header, json))
}

fn read_blocks(
    path: &Path,
    key: &DiskKey,
    blocks: usize,
    on_block: &mut BlockSink<'_>,
) -> Result<(), DiskError> {
    let bad = |problem: String| DiskError::Invalid {
        path: path.into(),
        problem,
    };
    let f = open_regular(path).map_err(io(path))?;
    let mut r = BufReader::with_capacity(1 << 20, f);
    let (header, json) = read_header(&mut r, path).map_err(|skip| match skip {
        Skip::Foreign(e) | Skip::Damaged(e) => e,
    })?;
    if header.key != *key {
        return Err(bad("header changed since the cache was opened".into()));
    }
    let total = header.tokens.len() / key.block_size;
    if blocks > total {
        return Err(bad(format!("{blocks} blocks asked of a file of {total}")));
    }
    // The checksum covers every byte before it, the header included.
    let mut sha = Sha256::new();
    sha.update(MAGIC);
    sha.update(VERSION.to_le_bytes());
    sha.update((json.len() as u32).to_le_bytes());
    sha.update(&json);
    let mut buf = vec![0u8; key.block_bytes];
    for i in 0..total {
        r.read_exact(&mut buf)
            .map_err(|e| bad(format!("block {i}: {e}")))?;
        sha.update(&buf);
        if i < blocks {
            on_block(i, &buf).map_err(|e| bad(format!("block {i}: {e}")))?;
        }
    }
    if key.tail_bytes > 0 {
        buf.resize(key.tail_bytes, 0);
        r.read_exact(&mut buf)
            .map_err(|e| bad(format!("window block: {e}")))?;
        sha.update(&buf);
        if blocks == total {
            on_block(total, &buf).map_err(|e| bad(format!("window block: {e}")))?;
        }
    }
    let mut trailer = [0u8; 32];
    r.read_exact(&mut trailer)
        .map_err(|e| bad(format!("checksum: {e}")))?;
    if trailer[..] != sha.finalize()[..] {
        return Err(bad("checksum mismatch: the file is corrupt".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> DiskKey {
        DiskKey {
            model: "m".into(),
            block_size: 2,
            layout: "dense".into(),
            block_bytes: 8,
            tail_bytes: 0,
        }
    }

    #[test]
    fn a_fifo_or_directory_among_the_files_is_skipped_not_opened() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join(format!("{}.{EXT}", "ab".repeat(16)));
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        std::fs::create_dir(dir.path().join(format!("{}.{EXT}", "cd".repeat(16)))).unwrap();
        let mut cache = DiskCache::open(dir.path(), 1 << 20, key()).unwrap();
        assert_eq!(cache.files(), 0);
        assert!(fifo.exists(), "left in place");
        // A prefix is still written and indexed beside them.
        let tokens = [1, 2, 3, 4];
        let stored = cache
            .store(&tokens, &mut |i, b: &mut [u8]| {
                b.fill(i as u8);
                Ok(())
            })
            .unwrap();
        assert!(stored);
        let reopened = DiskCache::open(dir.path(), 1 << 20, key()).unwrap();
        assert_eq!(reopened.files(), 1);
    }
}

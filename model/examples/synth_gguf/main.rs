//! Synthetic GGUF files for performance runs: the real layout of a model
//! (metadata, tokenizer, tensor table) with random but valid weights.
//! Speed does not depend on weight values; every file this writes is
//! labelled synthetic in `general.name` and `general.description`, and its
//! outputs mean nothing.
//!
//! ```text
//! synth_gguf header PART OUT.header.gguf [--name NAME]
//!     Parse the header of PART (the start of a real GGUF; the tensor data
//!     may be cut off) and write just the header, relabelled, to OUT.
//! synth_gguf ds4-flash TOKENIZER.gguf OUT.header.gguf [--experts q2|q4]
//!     Write the header of a DeepSeek V4 Flash file in the published
//!     layout (all 1,328 tensors, the q2 or q4 file's types), with the
//!     tokenizer of TOKENIZER (a GGUF holding DeepSeek V4's tokenizer).
//! synth_gguf fill HEADER OUT.gguf [--layers N] [--seed S] [--threads T]
//!     Write the full file: HEADER's metadata and tensor table (with
//!     --layers, only the first N blocks and `{arch}.block_count = N`),
//!     then every tensor filled with random blocks of its type.
//! synth_gguf check FILE.gguf [--forward]
//!     Open FILE with the GGUF reader, validate it against its family
//!     contract and bind it on the CPU backend; with --forward, run one
//!     token through it and check that the logits are finite.
//! ```
//!
//! Valid blocks: every f16 scale of a quantized block is a small finite
//! positive number (values stay within about ±1), the quants are random
//! bytes; f32/f16 tensors hold small values (norm weights near 1). The
//! bytes depend only on the seed, the tensor's index and the chunk.
//! DeepSeek V4's hash-routing tables hold valid expert ids: six distinct
//! experts per token, every expert used about equally; its learned
//! routers are random small weights, so score routing spreads tokens over
//! the experts about uniformly (a real model's routing is less even).
//! Chunks of up to 16 MiB are generated and written (`pwrite`) by every
//! core in parallel.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

mod ds4_flash;

use ds4_kernels::quant::GgmlType;
use ds4_kernels::CpuBackend;
use ds4_model::chat::{ChatMessage, ChatTemplate};
use ds4_model::families::{Logits, Model};
use ds4_model::gguf::writer::{header_bytes, TensorHeader};
use ds4_model::gguf::{parse_header, GgufFile, MetaValue};
use ds4_model::tokenizer::Tokenizer;

type Result<T> = std::result::Result<T, String>;

const DEFAULT_NAME: &str = "synthetic Qwen2-7B layout (random weights)";
/// Bytes read from a part file to find its header.
const MAX_HEADER_READ: u64 = 256 << 20;
const CHUNK: usize = 16 << 20;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("header") => header(&args[1..]),
        Some("ds4-flash") => ds4_header(&args[1..]),
        Some("fill") => fill(&args[1..]),
        Some("check") => check(&args[1..]),
        _ => Err(USAGE.to_string()),
    };
    if let Err(e) = result {
        eprintln!("synth_gguf: {e}");
        std::process::exit(1);
    }
}

const USAGE: &str = "usage:
  synth_gguf header PART OUT.header.gguf [--name NAME]
  synth_gguf ds4-flash TOKENIZER.gguf OUT.header.gguf [--experts q2|q4]
  synth_gguf fill HEADER OUT.gguf [--layers N] [--seed S] [--threads T]
  synth_gguf check FILE.gguf [--forward]";

/// Positional arguments and `--flag value` options (`--forward` takes none).
struct Args {
    positional: Vec<String>,
    options: Vec<(String, Option<String>)>,
}

impl Args {
    fn parse(args: &[String], switches: &[&str]) -> Args {
        let mut positional = Vec::new();
        let mut options = Vec::new();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            if let Some(flag) = a.strip_prefix("--") {
                let value = if switches.contains(&flag) {
                    None
                } else {
                    it.next().cloned()
                };
                options.push((flag.to_string(), value));
            } else {
                positional.push(a.clone());
            }
        }
        Args {
            positional,
            options,
        }
    }

    fn path(&self, i: usize) -> Result<PathBuf> {
        self.positional
            .get(i)
            .map(PathBuf::from)
            .ok_or_else(|| USAGE.to_string())
    }

    fn get(&self, flag: &str) -> Result<Option<&str>> {
        match self.options.iter().find(|(f, _)| f == flag) {
            None => Ok(None),
            Some((_, Some(v))) => Ok(Some(v)),
            Some((_, None)) => Err(format!("--{flag} needs a value")),
        }
    }

    fn number(&self, flag: &str) -> Result<Option<u64>> {
        self.get(flag)?
            .map(|v| v.parse().map_err(|e| format!("--{flag} {v}: {e}")))
            .transpose()
    }

    fn has(&self, flag: &str) -> bool {
        self.options.iter().any(|(f, _)| f == flag)
    }

    fn check_known(&self, known: &[&str]) -> Result<()> {
        match self
            .options
            .iter()
            .find(|(f, _)| !known.contains(&f.as_str()))
        {
            Some((f, _)) => Err(format!("unknown option --{f}\n{USAGE}")),
            None => Ok(()),
        }
    }
}

/// A header to write: metadata in file order, tensors with their offsets.
struct Layout {
    metadata: Vec<(String, MetaValue)>,
    tensors: Vec<Tensor>,
    alignment: u64,
}

struct Tensor {
    name: String,
    shape: Vec<u64>,
    ggml_type: GgmlType,
    /// Relative to the start of the data section.
    offset: u64,
    n_bytes: u64,
}

fn read_layout(path: &Path) -> Result<Layout> {
    let file = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let len = file.metadata().map_err(|e| e.to_string())?.len();
    let mut buf = vec![0u8; len.min(MAX_HEADER_READ) as usize];
    file.read_exact_at(&mut buf, 0)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let h = parse_header(&buf).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(Layout {
        metadata: h
            .metadata
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
        tensors: h
            .tensors
            .iter()
            .map(|t| Tensor {
                name: t.name.clone(),
                shape: t.shape.clone(),
                ggml_type: t.ggml_type,
                offset: t.offset,
                n_bytes: t.n_bytes,
            })
            .collect(),
        alignment: h.alignment,
    })
}

impl Layout {
    fn set(&mut self, key: &str, value: MetaValue) {
        match self.metadata.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => *v = value,
            None => self.metadata.push((key.to_string(), value)),
        }
    }

    fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// Label the file as synthetic (keeps the original name in the description).
    fn label(&mut self, name: &str) {
        let original = match self.get("general.name").and_then(MetaValue::as_str) {
            Some(n) if n.starts_with("synthetic") => return,
            Some(n) => n.to_string(),
            None => "an unnamed model".to_string(),
        };
        self.set("general.name", MetaValue::String(name.into()));
        self.set(
            "general.description",
            MetaValue::String(format!(
                "SYNTHETIC: random but valid quant blocks in the tensor layout of {original} \
                 (ds4 model/examples/synth_gguf.rs); for performance runs only, its outputs \
                 mean nothing"
            )),
        );
    }

    /// Place the tensors one after the other, each aligned; returns the
    /// size of the data section.
    fn place(&mut self) -> u64 {
        let mut offset = 0;
        for t in &mut self.tensors {
            t.offset = offset;
            offset = (offset + t.n_bytes).div_ceil(self.alignment) * self.alignment;
        }
        offset
    }

    /// Keep only the first `n` blocks (and of every per-block array in
    /// the metadata, its first `n` values).
    fn keep_layers(&mut self, n: u64) -> Result<()> {
        let arch = self
            .get("general.architecture")
            .and_then(MetaValue::as_str)
            .ok_or("the header has no general.architecture")?
            .to_string();
        let key = format!("{arch}.block_count");
        let have = self
            .get(&key)
            .and_then(MetaValue::as_u64)
            .ok_or_else(|| format!("the header has no {key}"))?;
        if n == 0 || n > have {
            return Err(format!("--layers {n}: the model has {have} blocks"));
        }
        let value = match self.get(&key) {
            Some(MetaValue::U64(_)) => MetaValue::U64(n),
            _ => MetaValue::U32(n as u32),
        };
        self.set(&key, value);
        // DeepSeek V4: the hash-routed layers are among the kept ones.
        let hash = format!("{arch}.hash_layer_count");
        if self
            .get(&hash)
            .and_then(MetaValue::as_u64)
            .is_some_and(|h| h > n)
        {
            self.set(&hash, MetaValue::U32(n as u32));
        }
        // Per-block arrays (one value a block, as llama.cpp checks them).
        let prefix = format!("{arch}.");
        for (k, v) in &mut self.metadata {
            if let MetaValue::Array(items) = v {
                if k.starts_with(&prefix) && items.len() as u64 == have {
                    items.truncate(n as usize);
                }
            }
        }
        self.tensors.retain(|t| {
            match t
                .name
                .strip_prefix("blk.")
                .and_then(|r| r.split('.').next())
                .and_then(|i| i.parse::<u64>().ok())
            {
                Some(i) => i < n,
                None => true,
            }
        });
        Ok(())
    }

    /// The header bytes, padded to the alignment.
    fn header_bytes(&self) -> Vec<u8> {
        let tensors: Vec<TensorHeader<'_>> = self
            .tensors
            .iter()
            .map(|t| TensorHeader {
                name: &t.name,
                shape: &t.shape,
                ggml_type: t.ggml_type,
                offset: t.offset,
            })
            .collect();
        header_bytes(&self.metadata, &tensors, self.alignment)
    }
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).map_err(|e| format!("{}: {e}", path.display()))
}

fn header(args: &[String]) -> Result<()> {
    let a = Args::parse(args, &[]);
    a.check_known(&["name"])?;
    let (part, out) = (a.path(0)?, a.path(1)?);
    let mut layout = read_layout(&part)?;
    let original: Vec<u64> = layout.tensors.iter().map(|t| t.offset).collect();
    let data = layout.place();
    if layout.tensors.iter().map(|t| t.offset).ne(original) {
        return Err(
            "the tensors are not stored one after the other in table order; \
                    this tool rewrites offsets that way"
                .into(),
        );
    }
    layout.label(a.get("name")?.unwrap_or(DEFAULT_NAME));
    let bytes = layout.header_bytes();
    write_file(&out, &bytes)?;
    let t = layout.tensors.len();
    println!(
        "{}: header of {} bytes, {t} tensors, {} metadata keys; the full file is {} bytes",
        out.display(),
        bytes.len(),
        layout.metadata.len(),
        bytes.len() as u64 + data
    );
    Ok(())
}

fn ds4_header(args: &[String]) -> Result<()> {
    let a = Args::parse(args, &[]);
    a.check_known(&["experts"])?;
    let (tokenizer, out) = (a.path(0)?, a.path(1)?);
    let experts = ds4_flash::Experts::parse(a.get("experts")?.unwrap_or("q2"))?;
    let mut layout = ds4_flash::layout(&tokenizer, experts)?;
    let data = layout.place();
    let bytes = layout.header_bytes();
    write_file(&out, &bytes)?;
    println!(
        "{}: DeepSeek V4 Flash header ({experts:?} experts), {} bytes, {} tensors, {} metadata \
         keys; the full file is {} bytes ({:.2} GiB of tensors)",
        out.display(),
        bytes.len(),
        layout.tensors.len(),
        layout.metadata.len(),
        bytes.len() as u64 + data,
        data as f64 / (1u64 << 30) as f64
    );
    Ok(())
}

/// wyrand: small and fast; one stream per chunk.
struct Rng(u64);

impl Rng {
    fn new(seed: u64, tensor: usize, chunk: usize) -> Rng {
        let mut r = Rng(seed ^ ((tensor as u64) << 32) ^ (chunk as u64).rotate_left(17));
        r.next();
        r
    }

    #[inline]
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0xa076_1d64_78bd_642f);
        let t = u128::from(self.0) * u128::from(self.0 ^ 0xe703_7ed1_a0b4_28db);
        ((t >> 64) as u64) ^ (t as u64)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }

    fn fill(&mut self, buf: &mut [u8]) {
        let mut words = buf.chunks_exact_mut(8);
        for w in &mut words {
            w.copy_from_slice(&self.next().to_le_bytes());
        }
        let rest = words.into_remainder();
        let last = self.next().to_le_bytes();
        let n = rest.len();
        rest.copy_from_slice(&last[..n]);
    }
}

/// Where a block keeps its f16 scales, and their size: `(offset, base)`;
/// each is set to `base * [1, 2)`. Bases keep |values| within about ±1,
/// and the minimum of the `d * q - m` types near the mean of `d * q`.
fn scales(ty: GgmlType) -> Option<&'static [(usize, f32)]> {
    Some(match ty {
        GgmlType::Q4_0 => &[(0, 0.01)],
        GgmlType::Q4_1 => &[(0, 0.005), (2, -0.0375)],
        GgmlType::Q5_0 => &[(0, 0.005)],
        GgmlType::Q5_1 => &[(0, 0.003), (2, -0.0465)],
        GgmlType::Q8_0 => &[(0, 0.0005)],
        GgmlType::Q8_1 => &[(0, 0.0005), (2, 0.0)],
        GgmlType::Q2_K => &[(80, 0.003), (82, 0.0045)],
        GgmlType::Q3_K => &[(108, 0.001)],
        GgmlType::Q4_K => &[(0, 0.0003), (2, 0.00225)],
        GgmlType::Q5_K => &[(0, 0.00015), (2, 0.0023)],
        GgmlType::Q6_K => &[(208, 0.0001)],
        // d * (0.5 + s) / 4 * grid (up to 43): values within about ±0.1.
        GgmlType::IQ2_XXS => &[(0, 0.002)],
        _ => return None,
    })
}

fn f16_bits(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_le_bytes()
}

/// Fill `buf` (whole blocks of `ty`, from byte `start` of tensor `name`).
fn fill_chunk(name: &str, ty: GgmlType, buf: &mut [u8], start: usize, rng: &mut Rng) -> Result<()> {
    // Norm weights near 1, everything else small and centred.
    let (centre, spread) = if name.ends_with("_norm.weight") {
        (1.0, 0.2)
    } else {
        (0.0, 0.05)
    };
    match ty {
        GgmlType::F32 => {
            for v in buf.chunks_exact_mut(4) {
                v.copy_from_slice(&(centre + spread * (2.0 * rng.unit() - 1.0)).to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for v in buf.chunks_exact_mut(2) {
                v.copy_from_slice(&f16_bits(centre + spread * (2.0 * rng.unit() - 1.0)));
            }
        }
        GgmlType::BF16 => {
            for v in buf.chunks_exact_mut(2) {
                let x = centre + spread * (2.0 * rng.unit() - 1.0);
                v.copy_from_slice(&((x.to_bits() >> 16) as u16).to_le_bytes());
            }
        }
        GgmlType::I32 if ds4_flash::is_expert_table(name) => {
            ds4_flash::fill_expert_table(buf, start as u64 / 4);
        }
        _ => {
            let fields = scales(ty)
                .ok_or_else(|| format!("{name}: no generator for {} blocks", ty.name()))?;
            rng.fill(buf);
            // A handful of scale values per chunk is random enough and fast.
            let table: Vec<Vec<[u8; 2]>> = fields
                .iter()
                .map(|&(_, base)| {
                    (0..64)
                        .map(|_| f16_bits(base * (1.0 + rng.unit())))
                        .collect()
                })
                .collect();
            let mut pick = rng.next();
            for block in buf.chunks_exact_mut(ty.type_size()) {
                for (&(at, _), values) in fields.iter().zip(&table) {
                    pick = pick.rotate_left(6) ^ 0x9e37_79b9;
                    block[at..at + 2].copy_from_slice(&values[(pick & 63) as usize]);
                }
            }
        }
    }
    Ok(())
}

fn fill(args: &[String]) -> Result<()> {
    let a = Args::parse(args, &[]);
    a.check_known(&["layers", "seed", "threads"])?;
    let (header_path, out) = (a.path(0)?, a.path(1)?);
    let seed = a.number("seed")?.unwrap_or(0x5eed_0000_0000_0007);
    let threads = match a.number("threads")? {
        Some(n) => n.max(1) as usize,
        // Past 8 threads the page cache, not the generator, is the limit
        // (H200 host, 4.68 GB: 1.41 GB/s with 4, 1.44 with 8, 1.39 with 16).
        None => std::thread::available_parallelism().map_or(4, |n| n.get().min(8)),
    };
    let mut layout = read_layout(&header_path)?;
    if let Some(n) = a.number("layers")? {
        layout.keep_layers(n)?;
    }
    layout.label(DEFAULT_NAME);
    let data = layout.place();
    let header = layout.header_bytes();
    let total = header.len() as u64 + data;
    for t in &layout.tensors {
        let known = matches!(t.ggml_type, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
            || (t.ggml_type == GgmlType::I32 && ds4_flash::is_expert_table(&t.name));
        if !known && scales(t.ggml_type).is_none() {
            return Err(format!(
                "{}: no generator for {} blocks",
                t.name,
                t.ggml_type.name()
            ));
        }
    }

    let file = File::create(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    file.set_len(total)
        .map_err(|e| format!("{}: {e}", out.display()))?;
    file.write_all_at(&header, 0).map_err(|e| e.to_string())?;
    // Work items: (tensor, chunk index, start within the tensor, length).
    let mut items = Vec::new();
    for (i, t) in layout.tensors.iter().enumerate() {
        let per = (CHUNK / t.ggml_type.type_size()) * t.ggml_type.type_size();
        let mut start = 0;
        while start < t.n_bytes as usize {
            let len = per.min(t.n_bytes as usize - start);
            items.push((i, items.len(), start, len));
            start += len;
        }
    }
    let started = Instant::now();
    let next = AtomicUsize::new(0);
    let data_start = header.len() as u64;
    let failures: Vec<String> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| -> Result<()> {
                    let mut buf = vec![0u8; CHUNK];
                    loop {
                        let k = next.fetch_add(1, Ordering::Relaxed);
                        let Some(&(ti, chunk, start, len)) = items.get(k) else {
                            return Ok(());
                        };
                        let t = &layout.tensors[ti];
                        let mut rng = Rng::new(seed, ti, chunk);
                        fill_chunk(&t.name, t.ggml_type, &mut buf[..len], start, &mut rng)?;
                        file.write_all_at(&buf[..len], data_start + t.offset + start as u64)
                            .map_err(|e| format!("{}: {e}", out.display()))?;
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .filter_map(|w| w.join().expect("worker panicked").err())
            .collect()
    });
    if let Some(e) = failures.into_iter().next() {
        return Err(e);
    }
    file.sync_all().map_err(|e| e.to_string())?;
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{}: {} bytes ({} tensors, header {} bytes) in {secs:.1} s, {:.2} GB/s with {threads} threads",
        out.display(),
        total,
        layout.tensors.len(),
        header.len(),
        data as f64 / secs / 1e9
    );
    Ok(())
}

fn check(args: &[String]) -> Result<()> {
    let a = Args::parse(args, &["forward"]);
    a.check_known(&["forward"])?;
    let path = a.path(0)?;
    let file = GgufFile::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let name = file.metadata().get_str("general.name").unwrap_or("");
    if !name.starts_with("synthetic") {
        return Err(format!(
            "{}: general.name {name:?} is not labelled synthetic",
            path.display()
        ));
    }
    let backend = CpuBackend::new();
    let started = Instant::now();
    let model = Model::load(&file, &backend).map_err(|e| e.to_string())?;
    let info = model.info();
    println!(
        "{}: {} family, {} layers, embedding {}, vocabulary {}, {} tensors, {} tensor bytes; \
         contract holds, bound in {:.1} s",
        path.display(),
        info.family.name(),
        info.n_layer,
        info.n_embd,
        info.n_vocab,
        file.tensors().len(),
        file.tensor_bytes(),
        started.elapsed().as_secs_f64()
    );
    // The real header's tokenizer and chat template work on the copy.
    let tokenizer = Tokenizer::from_gguf(file.metadata()).map_err(|e| e.to_string())?;
    if let Some(template) = ChatTemplate::from_gguf(file.metadata()).map_err(|e| e.to_string())? {
        let prompt = template
            .render(&[ChatMessage::new("user", "Name 3 primes below 20.")], true)
            .map_err(|e| e.to_string())?;
        let ids = tokenizer
            .encode_with(&prompt, true, false)
            .map_err(|e| e.to_string())?;
        let back = tokenizer.decode(&ids);
        println!(
            "tokenizer {:?} ({} tokens): chat prompt {prompt:?} is {} tokens, decodes back {}",
            tokenizer.pre_tokenizer(),
            tokenizer.vocab_size(),
            ids.len(),
            if back == prompt {
                "exactly"
            } else {
                "DIFFERENTLY"
            }
        );
        if back != prompt {
            return Err(format!("tokenizer round trip: {back:?}"));
        }
    }
    if a.has("forward") {
        let started = Instant::now();
        let mut seq = model
            .new_sequence(&backend, 16)
            .map_err(|e| e.to_string())?;
        let logits = model
            .forward(&backend, &mut seq, &[1, 2], Logits::Last)
            .map_err(|e| e.to_string())?;
        let bad = logits.iter().filter(|v| !v.is_finite()).count();
        let max = logits.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        println!(
            "forward of 2 tokens: {} logits, {bad} not finite, max |logit| {max:.3}, {:.1} s",
            logits.len(),
            started.elapsed().as_secs_f64()
        );
        if bad > 0 {
            return Err("the forward pass produced non-finite logits".into());
        }
    }
    Ok(())
}

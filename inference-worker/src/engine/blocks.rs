//! The KV block pool's bookkeeping: which block belongs to whom, which
//! full blocks hold which token prefix, and which idle blocks go first.
//!
//! - Every block has a reference count: the live sequences whose block
//!   tables name it. A sequence writes only into blocks it alone holds
//!   (its partial tail and fresh blocks), so shared blocks are never written.
//! - A full block is indexed by the hash chain of its tokens: the hash of
//!   block `i` covers its own tokens and the hash of block `i - 1`, so one
//!   hash names a whole prefix. A new sequence reuses the longest chain of
//!   indexed blocks that matches its prompt.
//! - Indexed blocks nobody holds stay cached (idle) until a block is needed;
//!   then the least recently released goes. A sequence releases its blocks
//!   last-to-first, so a prefix's tail is evicted before its head and the
//!   blocks of a chain are always resident from its root.

use std::collections::{BTreeMap, HashMap};

use sha2::{Digest, Sha256};

pub type BlockId = u32;

/// The hash of a token prefix that ends on a block boundary.
pub type ChainHash = [u8; 16];

/// The hash of the block after `parent` holding `tokens`.
pub fn chain_hash(parent: Option<&ChainHash>, tokens: &[u32]) -> ChainHash {
    let mut h = Sha256::new();
    h.update(b"ds4.kv.block/1");
    h.update(parent.unwrap_or(&[0; 16]));
    for t in tokens {
        h.update(t.to_le_bytes());
    }
    let d = h.finalize();
    let mut out = [0; 16];
    out.copy_from_slice(&d[..16]);
    out
}

/// Hashes of every full block of `tokens`.
pub fn chain_hashes(tokens: &[u32], block_size: usize) -> Vec<ChainHash> {
    let mut out: Vec<ChainHash> = Vec::with_capacity(tokens.len() / block_size);
    for block in tokens.chunks_exact(block_size) {
        let h = chain_hash(out.last(), block);
        out.push(h);
    }
    out
}

/// What is known about an indexed block.
#[derive(Clone, Debug)]
struct Indexed {
    hash: ChainHash,
    /// The block before it in its chain (`None` for the first block).
    parent: Option<BlockId>,
    /// Blocks in the chain up to and including this one.
    depth: usize,
    /// The block's tokens.
    tokens: Vec<u32>,
}

/// A block about to be reused for something else, while its contents are
/// still intact (the caller may checkpoint its chain first).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Eviction {
    pub block: BlockId,
    pub hash: ChainHash,
    pub depth: usize,
}

/// Counts for metrics and stats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockCounts {
    /// Held by live sequences.
    pub used: usize,
    /// Idle but indexed (reusable until evicted).
    pub cached: usize,
    /// Empty.
    pub free: usize,
}

#[derive(Debug)]
pub struct BlockManager {
    block_size: usize,
    refs: Vec<u32>,
    indexed: Vec<Option<Indexed>>,
    index: HashMap<ChainHash, BlockId>,
    free: Vec<BlockId>,
    /// Idle indexed blocks by release tick (oldest first).
    idle: BTreeMap<u64, BlockId>,
    idle_tick: Vec<u64>,
    tick: u64,
}

impl BlockManager {
    pub fn new(n_blocks: usize, block_size: usize) -> BlockManager {
        BlockManager {
            block_size,
            refs: vec![0; n_blocks],
            indexed: vec![None; n_blocks],
            index: HashMap::new(),
            // Pop from the end: hand out low block ids first.
            free: (0..n_blocks as BlockId).rev().collect(),
            idle: BTreeMap::new(),
            idle_tick: vec![0; n_blocks],
            tick: 0,
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn n_blocks(&self) -> usize {
        self.refs.len()
    }

    pub fn counts(&self) -> BlockCounts {
        BlockCounts {
            used: self.refs.iter().filter(|&&r| r > 0).count(),
            cached: self.idle.len(),
            free: self.free.len(),
        }
    }

    /// Blocks that can be handed out now (free or evictable).
    pub fn available(&self) -> usize {
        self.free.len() + self.idle.len()
    }

    /// The indexed blocks holding the longest prefix of `hashes`, in order.
    pub fn lookup(&self, hashes: &[ChainHash]) -> Vec<BlockId> {
        hashes
            .iter()
            .map_while(|h| self.index.get(h).copied())
            .collect()
    }

    /// Whether `block` is in the prefix index (full and registered).
    pub fn is_indexed(&self, block: BlockId) -> bool {
        self.indexed[block as usize].is_some()
    }

    /// Whether a prefix with this hash is resident.
    pub fn contains(&self, hash: &ChainHash) -> bool {
        self.index.contains_key(hash)
    }

    /// Take a reference to `block` (an indexed block found by [`lookup`]).
    pub fn acquire(&mut self, block: BlockId) {
        let b = block as usize;
        if self.refs[b] == 0 {
            self.idle.remove(&self.idle_tick[b]);
        }
        self.refs[b] += 1;
    }

    /// A block for a sequence to write (reference count 1): a free one, or
    /// else the least recently used idle one, whose eviction is returned.
    pub fn allocate(&mut self) -> Option<(BlockId, Option<Eviction>)> {
        if let Some(b) = self.free.pop() {
            self.refs[b as usize] = 1;
            return Some((b, None));
        }
        let (&tick, &b) = self.idle.iter().next()?;
        self.idle.remove(&tick);
        let info = self.indexed[b as usize]
            .take()
            .expect("idle blocks are indexed");
        self.index.remove(&info.hash);
        self.refs[b as usize] = 1;
        Some((
            b,
            Some(Eviction {
                block: b,
                hash: info.hash,
                depth: info.depth,
            }),
        ))
    }

    /// The idle block that [`allocate`] would evict next, if no block is free.
    pub fn next_eviction(&self) -> Option<Eviction> {
        if !self.free.is_empty() {
            return None;
        }
        let (_, &b) = self.idle.iter().next()?;
        let info = self.indexed[b as usize].as_ref()?;
        Some(Eviction {
            block: b,
            hash: info.hash,
            depth: info.depth,
        })
    }

    /// Index the full block `block` (held by the caller) as the block after
    /// `parent` with chain hash `hash`, holding `tokens`. If another block
    /// already holds the same prefix, this one stays unindexed and is freed
    /// on release.
    pub fn register(
        &mut self,
        block: BlockId,
        parent: Option<BlockId>,
        hash: ChainHash,
        tokens: &[u32],
    ) {
        let b = block as usize;
        if self.indexed[b].is_some() || self.index.contains_key(&hash) {
            return;
        }
        let depth = parent.map_or(Some(1), |p| {
            self.indexed[p as usize].as_ref().map(|i| i.depth + 1)
        });
        // A parent that is not indexed (a duplicate) cannot anchor a chain.
        let Some(depth) = depth else { return };
        self.index.insert(hash, block);
        self.indexed[b] = Some(Indexed {
            hash,
            parent,
            depth,
            tokens: tokens.to_vec(),
        });
    }

    /// Drop a sequence's references, last block first (so the tail of a
    /// prefix is older in the idle order than its head).
    pub fn release(&mut self, blocks: &[BlockId]) {
        for &block in blocks.iter().rev() {
            let b = block as usize;
            debug_assert!(self.refs[b] > 0, "block {b} released twice");
            self.refs[b] -= 1;
            if self.refs[b] > 0 {
                continue;
            }
            if self.indexed[b].is_some() {
                self.tick += 1;
                self.idle_tick[b] = self.tick;
                self.idle.insert(self.tick, block);
            } else {
                self.free.push(block);
            }
        }
    }

    /// The blocks of the chain ending at `block`, root first.
    pub fn chain(&self, block: BlockId) -> Vec<BlockId> {
        let mut out = vec![block];
        let mut at = block;
        while let Some(p) = self.indexed[at as usize].as_ref().and_then(|i| i.parent) {
            out.push(p);
            at = p;
        }
        out.reverse();
        out
    }

    /// The tokens of a chain of indexed blocks; `None` if one is not indexed.
    pub fn chain_tokens(&self, chain: &[BlockId]) -> Option<Vec<u32>> {
        let mut out = Vec::with_capacity(chain.len() * self.block_size);
        for &b in chain {
            out.extend_from_slice(&self.indexed[b as usize].as_ref()?.tokens);
        }
        Some(out)
    }

    /// Every idle indexed block whose chain is not a prefix of another idle
    /// chain's: the ends of the cached prefixes (for a shutdown checkpoint).
    pub fn idle_chain_ends(&self) -> Vec<Eviction> {
        let mut is_parent = vec![false; self.refs.len()];
        for info in self.indexed.iter().flatten() {
            if let Some(p) = info.parent {
                is_parent[p as usize] = true;
            }
        }
        self.idle
            .values()
            .filter(|&&b| !is_parent[b as usize])
            .filter_map(|&b| {
                let info = self.indexed[b as usize].as_ref()?;
                Some(Eviction {
                    block: b,
                    hash: info.hash,
                    depth: info.depth,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(mgr: &mut BlockManager, tokens: &[u32]) -> Vec<BlockId> {
        let hashes = chain_hashes(tokens, mgr.block_size());
        let mut blocks = mgr.lookup(&hashes);
        for &b in &blocks {
            mgr.acquire(b);
        }
        while blocks.len() < tokens.len().div_ceil(mgr.block_size()) {
            let (b, _) = mgr.allocate().expect("room");
            let i = blocks.len();
            if i < hashes.len() {
                let bs = mgr.block_size();
                mgr.register(
                    b,
                    blocks.last().copied(),
                    hashes[i],
                    &tokens[i * bs..(i + 1) * bs],
                );
            }
            blocks.push(b);
        }
        blocks
    }

    #[test]
    fn hashes_name_whole_prefixes() {
        let a = chain_hashes(&[1, 2, 3, 4, 5, 6, 7], 2);
        let b = chain_hashes(&[1, 2, 3, 4, 9, 9], 2);
        assert_eq!(a.len(), 3);
        assert_eq!(a[..2], b[..2]);
        assert_ne!(a[2], b[2]);
        // The same block after a different prefix hashes differently.
        let c = chain_hashes(&[0, 0, 3, 4], 2);
        assert_ne!(a[1], c[1]);
    }

    #[test]
    fn a_shared_prefix_is_reused_and_never_freed_while_held() {
        let mut m = BlockManager::new(8, 2);
        let a = seq(&mut m, &[1, 2, 3, 4, 5]);
        assert_eq!(a.len(), 3);
        let b = seq(&mut m, &[1, 2, 3, 4, 7, 8]);
        assert_eq!(
            a[..2],
            b[..2],
            "full blocks of the shared prefix are shared"
        );
        assert_ne!(a[2], b[2], "partial tails are private");
        m.release(&a);
        assert_eq!(m.counts().used, 3);
        // a's private tail is not indexed: freed at once.
        assert_eq!(m.counts().cached, 0);
        m.release(&b);
        assert_eq!(
            m.counts(),
            BlockCounts {
                used: 0,
                cached: 3,
                free: 5
            }
        );
    }

    #[test]
    fn eviction_takes_idle_tails_before_heads_and_drops_their_index() {
        let mut m = BlockManager::new(3, 2);
        let a = seq(&mut m, &[1, 2, 3, 4, 5, 6]);
        m.release(&a);
        assert_eq!(m.available(), 3);
        let (b, ev) = m.allocate().unwrap();
        let ev = ev.expect("no free block: an idle one is evicted");
        assert_eq!((b, ev.depth), (a[2], 3), "the tail goes first");
        assert_eq!(m.chain(a[1]), vec![a[0], a[1]]);
        assert_eq!(m.lookup(&chain_hashes(&[1, 2, 3, 4, 5, 6], 2)).len(), 2);
        m.release(&[b]);
        assert_eq!(m.counts().free, 1);
    }

    #[test]
    fn held_blocks_are_never_handed_out() {
        let mut m = BlockManager::new(2, 2);
        let a = seq(&mut m, &[1, 2, 3, 4]);
        assert!(m.allocate().is_none());
        m.release(&a[1..]);
        let (b, _) = m.allocate().unwrap();
        assert_eq!(b, a[1]);
    }

    #[test]
    fn chain_ends_name_each_cached_prefix_once() {
        let mut m = BlockManager::new(8, 2);
        let a = seq(&mut m, &[1, 2, 3, 4]);
        let b = seq(&mut m, &[1, 2, 5, 6, 7, 8]);
        m.release(&a);
        m.release(&b);
        let mut ends: Vec<usize> = m.idle_chain_ends().iter().map(|e| e.depth).collect();
        ends.sort();
        assert_eq!(ends, vec![2, 3]);
    }
}

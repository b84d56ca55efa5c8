//! Window blocks of compressed-attention families
//! (`docs/design/deepseek4-state.md`): the raw rows of a block's positions
//! and the compressor carry at its end. A running sequence holds the
//! window blocks its next positions read and write; a window block it no
//! longer needs is either freed or **kept** for its block, which makes the
//! boundary after that block resumable (a later sequence with the same
//! prefix starts there). Kept window blocks that no sequence holds are
//! idle cache, handed out again least recently used first.
//!
//! Invariants: a window block is free, held by sequences (`refs > 0`),
//! kept for one block, or held and kept; at most one window block is kept
//! per block; a kept window block whose block is evicted is dropped with it.

use std::collections::{BTreeMap, HashMap};

use super::blocks::BlockId;

pub type WindowId = u32;

/// No window block (an entry of a sequence's window table).
pub const NONE: WindowId = u32::MAX;

#[derive(Debug)]
pub struct WindowManager {
    refs: Vec<u32>,
    /// The block each window block is kept for.
    kept_for: Vec<Option<BlockId>>,
    /// Block -> its kept window block.
    kept: HashMap<BlockId, WindowId>,
    free: Vec<WindowId>,
    /// Kept window blocks no sequence holds, by release tick (oldest first).
    idle: BTreeMap<u64, WindowId>,
    idle_tick: Vec<u64>,
    tick: u64,
}

impl WindowManager {
    pub fn new(n: usize) -> WindowManager {
        WindowManager {
            refs: vec![0; n],
            kept_for: vec![None; n],
            kept: HashMap::new(),
            free: (0..n as WindowId).rev().collect(),
            idle: BTreeMap::new(),
            idle_tick: vec![0; n],
            tick: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.refs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.refs.is_empty()
    }

    /// Window blocks held or kept.
    pub fn used(&self) -> usize {
        self.refs.len() - self.free.len()
    }

    /// The window block kept for `block`, if any.
    pub fn kept(&self, block: BlockId) -> Option<WindowId> {
        self.kept.get(&block).copied()
    }

    /// A window block for a sequence to write (one reference): a free one,
    /// else the least recently used idle kept one (its block is no longer
    /// resumable).
    pub fn allocate(&mut self) -> Option<WindowId> {
        let w = match self.free.pop() {
            Some(w) => w,
            None => {
                let (&tick, &w) = self.idle.iter().next()?;
                self.idle.remove(&tick);
                self.unkeep(w);
                w
            }
        };
        self.refs[w as usize] = 1;
        Some(w)
    }

    /// Hold a kept window block (a sequence resuming after its block).
    pub fn acquire(&mut self, w: WindowId) {
        let i = w as usize;
        if self.refs[i] == 0 {
            self.idle.remove(&self.idle_tick[i]);
        }
        self.refs[i] += 1;
    }

    /// Drop a sequence's hold on `w`; `keep_for` keeps it for that block
    /// (when none is kept for it yet).
    pub fn release(&mut self, w: WindowId, keep_for: Option<BlockId>) {
        let i = w as usize;
        debug_assert!(self.refs[i] > 0, "window block {w} released twice");
        if let Some(b) = keep_for {
            if self.kept_for[i].is_none() && !self.kept.contains_key(&b) {
                self.kept_for[i] = Some(b);
                self.kept.insert(b, w);
            }
        }
        self.refs[i] -= 1;
        if self.refs[i] > 0 {
            return;
        }
        if self.kept_for[i].is_some() {
            self.tick += 1;
            self.idle_tick[i] = self.tick;
            self.idle.insert(self.tick, w);
        } else {
            self.free.push(w);
        }
    }

    /// `block` was evicted: drop the window block kept for it.
    pub fn drop_block(&mut self, block: BlockId) {
        let Some(w) = self.kept.get(&block).copied() else {
            return;
        };
        self.unkeep(w);
        let i = w as usize;
        if self.refs[i] == 0 {
            self.idle.remove(&self.idle_tick[i]);
            self.free.push(w);
        }
    }

    fn unkeep(&mut self, w: WindowId) {
        if let Some(b) = self.kept_for[w as usize].take() {
            self.kept.remove(&b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_windows_survive_their_sequence_and_are_evicted_oldest_first() {
        let mut m = WindowManager::new(3);
        let a = m.allocate().unwrap();
        let b = m.allocate().unwrap();
        let c = m.allocate().unwrap();
        assert!(m.allocate().is_none(), "every window block is held");
        m.release(a, Some(10));
        m.release(b, Some(11));
        m.release(c, None);
        assert_eq!(m.kept(10), Some(a));
        assert_eq!(m.used(), 2);
        // A later sequence resumes after block 11.
        m.acquire(b);
        // The free one first, then the oldest idle kept one (block 10).
        assert_eq!(m.allocate(), Some(c));
        assert_eq!(m.allocate(), Some(a));
        assert_eq!(m.kept(10), None, "block 10 is no longer resumable");
        assert!(m.allocate().is_none());
        m.release(b, None);
        assert_eq!(m.kept(11), Some(b), "still kept after its holder let go");
        m.drop_block(11);
        assert_eq!(m.kept(11), None);
        assert_eq!(m.allocate(), Some(b));
    }

    #[test]
    fn one_window_is_kept_per_block() {
        let mut m = WindowManager::new(2);
        let a = m.allocate().unwrap();
        let b = m.allocate().unwrap();
        m.release(a, Some(5));
        m.release(b, Some(5));
        assert_eq!(m.kept(5), Some(a));
        assert_eq!(m.used(), 1, "the second is freed");
    }
}

//! The engine's paged state and the work on it that is not the step
//! itself: a sequence's block and window tables, prefix reuse (memory,
//! then disk), allocation with checkpoints of what an eviction would lose,
//! the indexing of full blocks, disk checkpoints, and what a finished
//! sequence leaves behind for the next one. One path for every family:
//! dense families have blocks only; compressed-attention families also
//! hold window blocks and a frontier slot, and resume only at blocks whose
//! window block is kept (`docs/design/deepseek4-state.md`).

use std::time::Instant;

use ds4_kernels::Backend;
use ds4_model::StatePool;

use super::blocks::{chain_hash, chain_hashes, BlockId, BlockManager, ChainHash};
use super::disk::DiskCache;
use super::windows::{WindowId, WindowManager, NONE};
use crate::generate::PrefixReuse;
use crate::runtime::LoadedModel;

/// Shortest prefix worth a disk checkpoint, in tokens.
pub const DISK_MIN_TOKENS: usize = 512;
/// Prompt tokens left out of a prefill checkpoint (the tail of a chat
/// prompt, e.g. the generation prompt, changes from turn to turn).
pub const DISK_TRIM_TOKENS: usize = 32;

/// Window blocks, slots and the window length of a compressed-attention
/// family's state.
pub(super) struct Windows {
    pub manager: WindowManager,
    /// Free frontier slots.
    pub slots: Vec<u32>,
    /// Raw rows attention reads before a position (itself included).
    pub len: usize,
}

/// The paged state pool and its bookkeeping.
pub(super) struct PagedKv<B: Backend> {
    pub pool: StatePool<B>,
    pub blocks: BlockManager,
    pub windows: Option<Windows>,
    pub disk: Option<DiskCache>,
}

/// One sequence's share of the pool.
#[derive(Debug, Default)]
pub(super) struct SeqState {
    pub blocks: Vec<BlockId>,
    /// Hashes of the full blocks so far.
    pub hashes: Vec<ChainHash>,
    /// Window block per block index (`NONE` where none is held).
    pub window: Vec<WindowId>,
    pub slot: Option<u32>,
    /// Block indices whose window block is kept when released (resume
    /// points).
    pub keep: Vec<usize>,
}

/// How much of a cold prompt to checkpoint: trimmed at the tail, aligned
/// down to the prefill chunk.
pub fn checkpoint_len(prompt_len: usize, chunk: usize) -> usize {
    let trimmed = prompt_len.saturating_sub(DISK_TRIM_TOKENS);
    trimmed / chunk * chunk
}

impl<B: Backend> PagedKv<B> {
    pub fn block_size(&self) -> usize {
        self.blocks.block_size()
    }

    /// A sequence for `prompt` starting from the longest cached prefix it
    /// can resume (memory, then disk), leaving at least the last prompt
    /// token to run; `Err` when its slot could not be started.
    pub fn start(
        &mut self,
        lm: &LoadedModel<B>,
        prompt: &[u32],
        chunk: usize,
    ) -> Result<(SeqState, PrefixReuse), String> {
        let bs = self.block_size();
        let mut hashes = chain_hashes(prompt, bs);
        hashes.truncate((prompt.len() - 1) / bs);
        let mut blocks = self.blocks.lookup(&hashes);
        let mut reuse = PrefixReuse {
            block_size: bs,
            resumable: hashes.len(),
            ..PrefixReuse::default()
        };
        if let Some(w) = &self.windows {
            // Only a block whose window block is kept can be resumed after.
            while blocks.last().is_some_and(|&b| w.manager.kept(b).is_none()) {
                blocks.pop();
                reuse.no_window += 1;
            }
        }
        reuse.memory = blocks.len();
        for &b in &blocks {
            self.blocks.acquire(b);
        }
        let mut resume = blocks.last().and_then(|&b| self.kept_window(b));
        if let Some(w) = resume {
            self.windows_mut().manager.acquire(w);
        }
        if let Some((more, window)) = self.restore(lm, prompt, &hashes, &mut blocks) {
            if let (Some(old), Some(new)) = (resume, window) {
                self.windows_mut().manager.release(old, None);
                resume = Some(new);
            } else {
                resume = window;
            }
            tracing::debug!(blocks = more, "resumed from the disk KV cache");
            reuse.disk = more;
            reuse.no_window = 0;
        }
        hashes.truncate(blocks.len());
        let mut seq = SeqState {
            window: vec![NONE; blocks.len()],
            blocks,
            hashes,
            ..SeqState::default()
        };
        if let Some(w) = &mut self.windows {
            let slot = w.slots.pop().expect("one slot per running sequence");
            seq.slot = Some(slot);
            if let Some(win) = resume {
                seq.window[seq.blocks.len() - 1] = win;
            }
            // The prompt's chunk boundaries (its disk checkpoint among
            // them) stay resumable: requests that share a long system
            // prompt but differ after it resume at the last one before
            // they differ. The window pool's size bounds what is kept.
            seq.keep = (1..)
                .map(|i| i * chunk)
                .take_while(|&p| p <= prompt.len())
                .map(|p| p / bs - 1)
                .collect();
            if let Err(e) = self.pool.begin(&lm.backend, slot, resume) {
                let err = e.to_string();
                self.finish(seq, 0);
                return Err(err);
            }
        }
        Ok((seq, reuse))
    }

    fn windows_mut(&mut self) -> &mut Windows {
        self.windows.as_mut().expect("a compressed-attention pool")
    }

    fn kept_window(&self, block: BlockId) -> Option<WindowId> {
        self.windows.as_ref().and_then(|w| w.manager.kept(block))
    }

    /// Extend `blocks` from the disk cache when a file resumes deeper;
    /// returns the blocks added and, with windows, the (held, kept) window
    /// block of the last one.
    fn restore(
        &mut self,
        lm: &LoadedModel<B>,
        prompt: &[u32],
        hashes: &[ChainHash],
        blocks: &mut Vec<BlockId>,
    ) -> Option<(usize, Option<WindowId>)> {
        let bs = self.block_size();
        let (depth, file) = self.disk.as_ref()?.longest(hashes)?;
        if depth <= blocks.len() {
            return None;
        }
        let have = blocks.len();
        let windowed = self.windows.is_some();
        let mut fresh = Vec::new();
        let mut window = None;
        let t0 = Instant::now();
        let disk = self.disk.as_mut().expect("checked");
        let (pool, mgr, windows) = (&mut self.pool, &mut self.blocks, &mut self.windows);
        let mut on_block = |i: usize, bytes: &[u8]| -> Result<(), String> {
            if i < have {
                return Ok(());
            }
            if i == depth {
                let w = windows
                    .as_mut()
                    .and_then(|w| w.manager.allocate())
                    .ok_or("no window block for a restored prefix")?;
                window = Some(w);
                return pool
                    .write_window(&lm.backend, w, bytes)
                    .map_err(|e| e.to_string());
            }
            let (b, ev) = mgr.allocate().ok_or("no KV block for a restored prefix")?;
            if let (Some(ev), Some(w)) = (ev, windows.as_mut()) {
                w.manager.drop_block(ev.block);
            }
            fresh.push(b);
            pool.write_block(&lm.backend, b, bytes)
                .map_err(|e| e.to_string())
        };
        let loaded = disk.load(&file, depth, &mut on_block);
        if loaded.is_err() || (windowed && window.is_none()) {
            self.blocks.release(&fresh);
            if let (Some(w), Some(win)) = (&mut self.windows, window) {
                w.manager.release(win, None);
            }
            return None;
        }
        for (i, &b) in fresh.iter().enumerate() {
            let parent = blocks.last().copied();
            let at = (have + i) * bs;
            self.blocks
                .register(b, parent, hashes[have + i], &prompt[at..at + bs]);
            blocks.push(b);
        }
        if let (Some(w), Some(win)) = (&mut self.windows, window) {
            // Held by the new sequence and kept for its block.
            w.manager.acquire(win);
            w.manager.release(win, blocks.last().copied());
        }
        tracing::info!(
            tokens = depth * bs,
            ms = format!("{:.1}", t0.elapsed().as_secs_f64() * 1e3),
            "disk KV cache: prefix restored"
        );
        Some((depth - have, window))
    }

    /// Make `seq` hold every block and window block a step writing or
    /// reading positions up to `start + n` needs.
    pub fn prepare(
        &mut self,
        lm: &LoadedModel<B>,
        seq: &mut SeqState,
        start: usize,
        n: usize,
    ) -> Result<(), String> {
        let bs = self.block_size();
        let need = (start + n).div_ceil(bs);
        while seq.blocks.len() < need {
            let b = self.allocate(lm);
            seq.blocks.push(b);
        }
        let Some(w) = &mut self.windows else {
            return Ok(());
        };
        seq.window.resize(need, NONE);
        let first = start.saturating_sub(w.len - 1) / bs;
        for idx in first..need {
            if seq.window[idx] != NONE {
                continue;
            }
            if (idx + 1) * bs <= start {
                return Err(format!(
                    "positions {}..{} have no window block: their raw rows are gone",
                    idx * bs,
                    (idx + 1) * bs
                ));
            }
            seq.window[idx] = w
                .manager
                .allocate()
                .expect("window blocks are sized for every running sequence");
        }
        Ok(())
    }

    /// After a step: let go of the window blocks no future position of
    /// `seq` (now computed up to `computed`) reads.
    pub fn advance_windows(&mut self, seq: &mut SeqState, computed: usize) {
        let Some(w) = &self.windows else { return };
        let keep_from = computed.saturating_sub(w.len - 1) / self.block_size();
        for idx in 0..keep_from.min(seq.window.len()) {
            self.release_window(seq, idx, false);
        }
    }

    /// Release `seq`'s window block of block `idx`, keeping it for its
    /// block when asked (or a keep point) and the block is indexed.
    fn release_window(&mut self, seq: &mut SeqState, idx: usize, keep: bool) {
        let w = std::mem::replace(&mut seq.window[idx], NONE);
        if w == NONE {
            return;
        }
        let block = seq.blocks[idx];
        let keep = (keep || seq.keep.contains(&idx)) && self.blocks.is_indexed(block);
        self.windows_mut().manager.release(w, keep.then_some(block));
    }

    /// A finished sequence (computed up to `computed`) gives everything
    /// back; its last full block stays resumable.
    pub fn finish(&mut self, mut seq: SeqState, computed: usize) {
        if self.windows.is_some() {
            let last_full = (computed / self.block_size()).checked_sub(1);
            for idx in 0..seq.window.len() {
                self.release_window(&mut seq, idx, Some(idx) == last_full);
            }
            if let Some(slot) = seq.slot {
                self.windows_mut().slots.push(slot);
            }
        }
        self.blocks.release(&seq.blocks);
    }

    /// Index the blocks `tokens` (the computed positions) fill.
    pub fn register_full_blocks(&mut self, seq: &mut SeqState, tokens: &[u32]) {
        let bs = self.block_size();
        while (seq.hashes.len() + 1) * bs <= tokens.len() {
            let i = seq.hashes.len();
            let h = chain_hash(seq.hashes.last(), &tokens[i * bs..(i + 1) * bs]);
            let parent = i.checked_sub(1).map(|p| seq.blocks[p]);
            self.blocks
                .register(seq.blocks[i], parent, h, &tokens[i * bs..(i + 1) * bs]);
            seq.hashes.push(h);
        }
    }

    /// A block to write, checkpointing the prefix an eviction would lose.
    fn allocate(&mut self, lm: &LoadedModel<B>) -> BlockId {
        if let Some(ev) = self.blocks.next_eviction() {
            let bs = self.block_size();
            let on_disk = self.disk.as_ref().map(|d| d.contains(&ev.hash));
            if on_disk == Some(false) && ev.depth * bs >= DISK_MIN_TOKENS {
                self.checkpoint_chain(lm, ev.block);
            }
        }
        let (b, ev) = self
            .blocks
            .allocate()
            .expect("the ledger reserves every block an admitted request writes");
        if let (Some(ev), Some(w)) = (ev, &mut self.windows) {
            w.manager.drop_block(ev.block);
        }
        b
    }

    /// Checkpoint the cached chain ending at `end` (with windows: up to its
    /// deepest block whose window block is kept); returns whether a file
    /// was written.
    pub fn checkpoint_chain(&mut self, lm: &LoadedModel<B>, end: BlockId) -> bool {
        let mut chain = self.blocks.chain(end);
        let mut tail = None;
        if self.windows.is_some() {
            while let Some(&b) = chain.last() {
                if let Some(w) = self.kept_window(b) {
                    tail = Some(w);
                    break;
                }
                chain.pop();
            }
            if tail.is_none() {
                return false;
            }
        }
        match self.blocks.chain_tokens(&chain) {
            Some(tokens) => self.checkpoint(lm, &tokens, &chain, tail),
            None => false,
        }
    }

    /// Write the prefix `tokens` held in `blocks` (and, with windows, the
    /// window block `tail` of its last block) to the disk cache; returns
    /// whether a file was written.
    pub fn checkpoint(
        &mut self,
        lm: &LoadedModel<B>,
        tokens: &[u32],
        blocks: &[BlockId],
        tail: Option<WindowId>,
    ) -> bool {
        let bs = self.block_size();
        let n = tokens.len() / bs;
        if n == 0 || n * bs < DISK_MIN_TOKENS || (self.windows.is_some() && tail.is_none()) {
            return false;
        }
        let Some(disk) = &mut self.disk else {
            return false;
        };
        let pool = &self.pool;
        let t0 = Instant::now();
        let mut read = |i: usize, out: &mut [u8]| {
            let r = if i == n {
                pool.read_window(&lm.backend, tail.expect("a tail"), out)
            } else {
                pool.read_block(&lm.backend, blocks[i], out)
            };
            r.map_err(|e| e.to_string())
        };
        match disk.store(&tokens[..n * bs], &mut read) {
            Ok(true) => {
                tracing::info!(
                    tokens = n * bs,
                    ms = format!("{:.1}", t0.elapsed().as_secs_f64() * 1e3),
                    "disk KV cache: prefix written"
                );
                true
            }
            Ok(false) => false,
            Err(e) => {
                tracing::warn!(error = %e, "disk KV cache: prefix not written");
                false
            }
        }
    }

    /// The window block holding the end of `seq`'s first `blocks` blocks
    /// (held, or kept for its block).
    pub fn tail_window(&self, seq: &SeqState, blocks: usize) -> Option<WindowId> {
        let idx = blocks.checked_sub(1)?;
        match seq.window.get(idx) {
            Some(&w) if w != NONE => Some(w),
            _ => self.kept_window(seq.blocks[idx]),
        }
    }

    /// On shutdown: write every cached prefix long enough to disk.
    pub fn checkpoint_idle(&mut self, lm: &LoadedModel<B>) {
        if self.disk.is_none() {
            return;
        }
        let bs = self.block_size();
        let mut written = 0;
        for end in self.blocks.idle_chain_ends() {
            if end.depth * bs >= DISK_MIN_TOKENS {
                written += usize::from(self.checkpoint_chain(lm, end.block));
            }
        }
        if written > 0 {
            tracing::info!(
                files = written,
                "disk KV cache: cached prefixes written at shutdown"
            );
        }
    }
}

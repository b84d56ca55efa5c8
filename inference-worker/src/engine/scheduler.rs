//! The engine thread's loop, one iteration per model step:
//!
//! 1. **intake**: take submitted requests off the channel;
//! 2. **admit**: while fewer than `max_seqs` run, start waiting requests,
//!    reusing the longest cached prefix (memory, then disk);
//! 3. **step**: one batched forward pass over every running sequence's
//!    next token plus chunks of waiting prompts, within `batch_tokens`;
//! 4. **sample and retire**: sample where logits came back, stream the
//!    tokens, and retire finished, failed and cancelled sequences.
//!
//! Each phase runs in a `debug` span of its name (`admit`, `plan`,
//! `forward`, `sample`, `retire`); what concerns one request is logged
//! inside that request's span (its `request_id`).
//!
//! Families whose state is not paged (DeepSeek V4) run each sequence in
//! its own state, one forward call per sequence per step; a finished
//! conversation's state is kept and reused when a prompt extends it.

use std::collections::VecDeque;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ds4_kernels::Backend;
use ds4_model::{Logits, ModelError, PagedInput, Sequence};
use tokio::sync::mpsc;
use tracing::debug_span;

use super::blocks::{chain_hash, chain_hashes, BlockId, BlockManager, ChainHash};
use super::disk::DiskCache;
use super::ledger::Ledger;
use super::{EngineConfig, Event, Job, Msg};
use crate::generate::{
    Decoding, FinishReason, GenerateError, Generation, Next, Timings, TokenStep,
};
use crate::metrics::Metrics;
use crate::runtime::LoadedModel;

/// Shortest prefix worth a disk checkpoint, in tokens.
pub const DISK_MIN_TOKENS: usize = 512;
/// Prompt tokens left out of a prefill checkpoint (the tail of a chat
/// prompt, e.g. the generation prompt, changes from turn to turn).
pub const DISK_TRIM_TOKENS: usize = 32;

/// The paged KV pool and its bookkeeping.
pub(super) struct PagedKv<B: Backend> {
    pub pool: B::KvPool,
    pub blocks: BlockManager,
    pub disk: Option<DiskCache>,
}

enum State<B: Backend> {
    Paged {
        blocks: Vec<BlockId>,
        /// Hashes of the full blocks so far.
        hashes: Vec<ChainHash>,
    },
    Own(Sequence<B>),
}

struct Live<'m, B: Backend> {
    job: Job,
    /// The prompt, then every token fed back.
    tokens: Vec<u32>,
    prompt_len: usize,
    /// Positions whose state is computed.
    computed: usize,
    state: State<B>,
    decoding: Decoding<'m>,
    timings: Timings,
    admitted: Instant,
    first_token: Option<Instant>,
    done: bool,
}

/// One sequence's part of a step.
struct Part {
    live: usize,
    start: usize,
    n: usize,
    logits: bool,
}

pub(super) struct Scheduler<'m, B: Backend> {
    lm: &'m LoadedModel<B>,
    cfg: EngineConfig,
    metrics: Arc<Metrics>,
    ledger: Arc<Mutex<Ledger>>,
    kv: Option<PagedKv<B>>,
    /// Finished sequences of unpaged families, newest last.
    idle: Vec<Sequence<B>>,
    live: Vec<Live<'m, B>>,
    waiting: VecDeque<Job>,
    /// Submitted requests not yet admitted (shared with the handles).
    queued: Arc<AtomicUsize>,
}

impl<'m, B: Backend> Scheduler<'m, B> {
    pub fn new(
        lm: &'m LoadedModel<B>,
        cfg: EngineConfig,
        metrics: Arc<Metrics>,
        ledger: Arc<Mutex<Ledger>>,
        kv: Option<PagedKv<B>>,
        queued: Arc<AtomicUsize>,
    ) -> Self {
        Scheduler {
            lm,
            cfg,
            metrics,
            ledger,
            kv,
            idle: Vec::new(),
            live: Vec::new(),
            waiting: VecDeque::new(),
            queued,
        }
    }

    /// Serve until the channel closes or a shutdown message arrives and
    /// every admitted request is done; then checkpoint cached prefixes.
    pub fn run(mut self, rx: &mut mpsc::UnboundedReceiver<Msg>) {
        let mut open = true;
        loop {
            if open {
                if self.live.is_empty() && self.waiting.is_empty() {
                    match rx.blocking_recv() {
                        Some(msg) => open = self.take(msg),
                        None => open = false,
                    }
                }
                while open {
                    match rx.try_recv() {
                        Ok(msg) => open = self.take(msg),
                        Err(mpsc::error::TryRecvError::Empty) => break,
                        Err(mpsc::error::TryRecvError::Disconnected) => open = false,
                    }
                }
            }
            debug_span!("admit", waiting = self.waiting.len()).in_scope(|| self.admit());
            self.metrics.queue_depth.set(self.waiting.len() as i64);
            if self.live.is_empty() {
                if !open && self.waiting.is_empty() {
                    break;
                }
                continue;
            }
            self.step();
            debug_span!("retire").in_scope(|| self.retire());
        }
        self.checkpoint_idle();
        tracing::info!("engine stopped");
    }

    /// Handle one message; `false` on shutdown.
    fn take(&mut self, msg: Msg) -> bool {
        match msg {
            Msg::Job(job) => {
                self.waiting.push_back(job);
                true
            }
            Msg::Shutdown => false,
        }
    }

    fn admit(&mut self) {
        while self.live.len() < self.cfg.max_seqs {
            let Some(job) = self.waiting.pop_front() else {
                break;
            };
            self.queued.fetch_sub(1, Ordering::Relaxed);
            if job.events.is_closed() {
                self.metrics.cancelled.inc();
                self.ledger.lock().expect("ledger").release(job.reserved);
                continue;
            }
            let live = self.start(job);
            self.live.push(live);
        }
        self.metrics.active_sequences.set(self.live.len() as i64);
    }

    /// A new live sequence for `job`, with the longest cached prefix.
    fn start(&mut self, job: Job) -> Live<'m, B> {
        let span = job.span.clone();
        let _in = span.enter();
        let prompt = job.req.prompt.clone();
        let (state, cached) = match &mut self.kv {
            Some(kv) => {
                let (blocks, hashes) = reuse_prefix(self.lm, kv, &prompt);
                let cached = blocks.len() * kv.blocks.block_size();
                (State::Paged { blocks, hashes }, cached)
            }
            None => {
                let seq = self.idle_sequence(&prompt);
                let cached = seq.tokens().len();
                (State::Own(seq), cached)
            }
        };
        let decoding = Decoding::new(&self.lm.chat.tokenizer, &job.req, job.opts);
        let timings = Timings {
            prompt_tokens: prompt.len(),
            cached_tokens: cached,
            ..Default::default()
        };
        tracing::debug!(
            prompt_tokens = prompt.len(),
            cached_tokens = cached,
            queued_ms = format!("{:.1}", job.submitted.elapsed().as_secs_f64() * 1e3),
            "admitted"
        );
        Live {
            prompt_len: prompt.len(),
            tokens: prompt,
            computed: cached,
            state,
            decoding,
            timings,
            admitted: job.submitted,
            first_token: None,
            done: false,
            job,
        }
    }

    /// For unpaged families: an idle sequence whose tokens the prompt
    /// extends (leaving one prompt token to run), or a fresh one.
    fn idle_sequence(&mut self, prompt: &[u32]) -> Sequence<B> {
        let best = self
            .idle
            .iter()
            .enumerate()
            .filter(|(_, s)| s.tokens().len() < prompt.len() && prompt.starts_with(s.tokens()))
            .max_by_key(|(_, s)| s.tokens().len())
            .map(|(i, _)| i);
        match best {
            Some(i) => self.idle.remove(i),
            None => self
                .lm
                .model
                .new_sequence(&self.lm.backend, self.cfg.ctx)
                .expect("unpaged families create sequences without a pool"),
        }
    }

    /// The parts of the next step: one token of every decoding sequence,
    /// then prompt chunks in arrival order while the token budget lasts.
    fn plan(&self) -> Vec<Part> {
        let mut budget = self.cfg.batch_tokens;
        let mut parts = Vec::new();
        for (i, l) in self.live.iter().enumerate() {
            if !l.done && l.computed >= l.prompt_len && l.computed < l.tokens.len() {
                parts.push(Part {
                    live: i,
                    start: l.computed,
                    n: 1,
                    logits: true,
                });
                budget = budget.saturating_sub(1);
            }
        }
        for (i, l) in self.live.iter().enumerate() {
            if budget == 0 {
                break;
            }
            if !l.done && l.computed < l.prompt_len {
                let n = (l.prompt_len - l.computed)
                    .min(self.cfg.prefill_chunk)
                    .min(budget);
                parts.push(Part {
                    live: i,
                    start: l.computed,
                    n,
                    logits: l.computed + n == l.prompt_len,
                });
                budget -= n;
            }
        }
        parts
    }

    fn step(&mut self) {
        let parts = debug_span!("plan").in_scope(|| self.plan());
        if parts.is_empty() {
            return;
        }
        let rows: usize = parts.iter().map(|p| p.n).sum();
        let span = debug_span!("forward", sequences = parts.len(), rows);
        let result = span.in_scope(|| match self.kv.is_some() {
            true => self.forward_paged(&parts),
            false => self.forward_own(&parts),
        });
        match result {
            Ok(logits) => {
                let _sample = debug_span!("sample").entered();
                for (part, logits) in parts.iter().zip(logits) {
                    self.advance(part, &logits);
                }
            }
            Err(e) => {
                tracing::error!(error = %e, sequences = parts.len(), "forward pass failed");
                for part in &parts {
                    let l = &mut self.live[part.live];
                    tracing::error!(parent: &l.job.span, error = %e, "request failed in the forward pass");
                    l.done = true;
                    let _ = l
                        .job
                        .events
                        .send(Event::Failed(GenerateError::BatchFailed(e.to_string())));
                }
            }
        }
    }

    fn forward_paged(&mut self, parts: &[Part]) -> Result<Vec<Vec<f32>>, ModelError> {
        let kv = self.kv.as_mut().expect("paged");
        // Blocks for every position this step writes.
        for part in parts {
            let State::Paged { blocks, .. } = &mut self.live[part.live].state else {
                unreachable!("paged families have paged sequences")
            };
            let need = (part.start + part.n).div_ceil(kv.blocks.block_size());
            while blocks.len() < need {
                blocks.push(allocate(self.lm, kv));
            }
        }
        let inputs: Vec<PagedInput<'_>> = parts
            .iter()
            .map(|p| {
                let l = &self.live[p.live];
                let State::Paged { blocks, .. } = &l.state else {
                    unreachable!("paged families have paged sequences")
                };
                PagedInput {
                    tokens: &l.tokens[p.start..p.start + p.n],
                    pos: p.start,
                    blocks,
                    logits: p.logits.then_some(Logits::Last),
                }
            })
            .collect();
        self.lm
            .model
            .forward_paged(&self.lm.backend, &mut kv.pool, &inputs)
    }

    fn forward_own(&mut self, parts: &[Part]) -> Result<Vec<Vec<f32>>, ModelError> {
        let mut out = Vec::with_capacity(parts.len());
        for p in parts {
            let l = &mut self.live[p.live];
            let State::Own(seq) = &mut l.state else {
                unreachable!("unpaged families own their sequences")
            };
            let tokens = &l.tokens[p.start..p.start + p.n];
            let logits = self
                .lm
                .model
                .forward(&self.lm.backend, seq, tokens, Logits::Last)?;
            out.push(if p.logits { logits } else { Vec::new() });
        }
        Ok(out)
    }

    /// Account a part's computed positions; sample when it produced logits.
    fn advance(&mut self, part: &Part, logits: &[f32]) {
        let ctx = self.cfg.ctx;
        let l = &mut self.live[part.live];
        let _in = l.job.span.clone().entered();
        l.computed += part.n;
        if let (Some(kv), State::Paged { blocks, hashes }) = (&mut self.kv, &mut l.state) {
            register_full_blocks(kv, &l.tokens[..l.computed], blocks, hashes);
        }
        if part.logits && l.computed == l.prompt_len && l.timings.cached_tokens < l.prompt_len {
            let cold = l.prompt_len - l.timings.cached_tokens;
            if cold >= DISK_MIN_TOKENS {
                if let (Some(kv), State::Paged { blocks, .. }) = (&mut self.kv, &l.state) {
                    let keep = checkpoint_len(l.prompt_len, self.cfg.prefill_chunk);
                    checkpoint(self.lm, kv, &l.tokens[..keep], blocks);
                }
            }
        }
        if !part.logits {
            return;
        }
        let events = &l.job.events;
        let mut on_step = |s: &TokenStep<'_>| send_step(events, s);
        let room = l.tokens.len() + 1 < ctx;
        let next = l.decoding.step(logits, room, &mut on_step);
        if l.first_token.is_none() {
            l.first_token = Some(Instant::now());
            l.timings.prefill_ms = l.admitted.elapsed().as_secs_f64() * 1e3;
        }
        match next {
            Next::Feed(t) => l.tokens.push(t),
            Next::Finished => l.done = true,
        }
    }

    /// Remove finished, failed and cancelled sequences.
    fn retire(&mut self) {
        let mut i = 0;
        while i < self.live.len() {
            let l = &mut self.live[i];
            if !l.done && l.job.events.is_closed() {
                l.decoding.cancel();
                l.done = true;
            }
            if !l.done {
                i += 1;
                continue;
            }
            let l = self.live.swap_remove(i);
            self.finish(l);
        }
        self.metrics.active_sequences.set(self.live.len() as i64);
        let used: usize = self.live.iter().map(|l| l.computed).sum();
        self.metrics.kv_tokens_used.set(used as i64);
        if let Some(kv) = &self.kv {
            let c = kv.blocks.counts();
            self.metrics.kv_blocks_used.set(c.used as i64);
            self.metrics.kv_blocks_cached.set(c.cached as i64);
        }
    }

    fn finish(&mut self, mut l: Live<'m, B>) {
        let _in = l.job.span.clone().entered();
        l.timings.decode_ms = l
            .first_token
            .map_or(0.0, |t| t.elapsed().as_secs_f64() * 1e3);
        let events = l.job.events.clone();
        let mut on_step = |s: &TokenStep<'_>| send_step(&events, s);
        let g = l.decoding.finish(l.timings, &mut on_step);
        match l.state {
            State::Paged { blocks, .. } => {
                let kv = self.kv.as_mut().expect("paged");
                kv.blocks.release(&blocks);
            }
            State::Own(seq) => {
                self.idle.push(seq);
                if self.idle.len() > self.cfg.max_seqs {
                    self.idle.remove(0);
                }
            }
        }
        self.ledger.lock().expect("ledger").release(l.job.reserved);
        record(&self.metrics, &g);
        let _ = l.job.events.send(Event::Done(g));
    }

    /// On shutdown: write every cached prefix long enough to disk.
    fn checkpoint_idle(&mut self) {
        let Some(kv) = &mut self.kv else { return };
        if kv.disk.is_none() {
            return;
        }
        let bs = kv.blocks.block_size();
        let mut written = 0;
        for end in kv.blocks.idle_chain_ends() {
            if end.depth * bs < DISK_MIN_TOKENS {
                continue;
            }
            let chain = kv.blocks.chain(end.block);
            if let Some(tokens) = kv.blocks.chain_tokens(&chain) {
                written += usize::from(checkpoint(self.lm, kv, &tokens, &chain));
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

/// Acquire the longest cached prefix of `prompt` (memory, then disk),
/// leaving at least the last prompt token to run.
fn reuse_prefix<B: Backend>(
    lm: &LoadedModel<B>,
    kv: &mut PagedKv<B>,
    prompt: &[u32],
) -> (Vec<BlockId>, Vec<ChainHash>) {
    let bs = kv.blocks.block_size();
    let mut hashes = chain_hashes(prompt, bs);
    hashes.truncate((prompt.len() - 1) / bs);
    let mut blocks = kv.blocks.lookup(&hashes);
    for &b in &blocks {
        kv.blocks.acquire(b);
    }
    if let Some(disk) = &mut kv.disk {
        if let Some((depth, file)) = disk.longest(&hashes) {
            if depth > blocks.len() {
                let have = blocks.len();
                let mut fresh = Vec::new();
                let t0 = Instant::now();
                let pool = &mut kv.pool;
                let mgr = &mut kv.blocks;
                let mut on_block = |i: usize, bytes: &[u8]| -> Result<(), String> {
                    if i < have {
                        return Ok(());
                    }
                    let (b, _) = mgr.allocate().ok_or("no KV block for a restored prefix")?;
                    fresh.push(b);
                    lm.backend
                        .kv_write_block(pool, b, bytes)
                        .map_err(|e| e.to_string())
                };
                match disk.load(&file, depth, &mut on_block) {
                    Ok(()) => {
                        for (i, &b) in fresh.iter().enumerate() {
                            let parent = blocks.last().copied();
                            let at = (have + i) * bs;
                            kv.blocks
                                .register(b, parent, hashes[have + i], &prompt[at..at + bs]);
                            blocks.push(b);
                        }
                        tracing::info!(
                            tokens = depth * bs,
                            ms = format!("{:.1}", t0.elapsed().as_secs_f64() * 1e3),
                            "disk KV cache: prefix restored"
                        );
                    }
                    Err(_) => kv.blocks.release(&fresh),
                }
            }
        }
    }
    hashes.truncate(blocks.len());
    (blocks, hashes)
}

/// A block to write, checkpointing the prefix an eviction would lose.
fn allocate<B: Backend>(lm: &LoadedModel<B>, kv: &mut PagedKv<B>) -> BlockId {
    if let Some(ev) = kv.blocks.next_eviction() {
        let bs = kv.blocks.block_size();
        let on_disk = kv.disk.as_ref().map(|d| d.contains(&ev.hash));
        if on_disk == Some(false) && ev.depth * bs >= DISK_MIN_TOKENS {
            let chain = kv.blocks.chain(ev.block);
            if let Some(tokens) = kv.blocks.chain_tokens(&chain) {
                checkpoint(lm, kv, &tokens, &chain);
            }
        }
    }
    let (b, _) = kv
        .blocks
        .allocate()
        .expect("the ledger reserves every block an admitted request writes");
    b
}

/// Index the blocks of `blocks` that `tokens` (the computed positions) fill.
fn register_full_blocks<B: Backend>(
    kv: &mut PagedKv<B>,
    tokens: &[u32],
    blocks: &[BlockId],
    hashes: &mut Vec<ChainHash>,
) {
    let bs = kv.blocks.block_size();
    while (hashes.len() + 1) * bs <= tokens.len() {
        let i = hashes.len();
        let h = chain_hash(hashes.last(), &tokens[i * bs..(i + 1) * bs]);
        let parent = i.checked_sub(1).map(|p| blocks[p]);
        kv.blocks
            .register(blocks[i], parent, h, &tokens[i * bs..(i + 1) * bs]);
        hashes.push(h);
    }
}

/// How much of a cold prompt to checkpoint: trimmed at the tail, aligned
/// down to the prefill chunk.
pub fn checkpoint_len(prompt_len: usize, chunk: usize) -> usize {
    let trimmed = prompt_len.saturating_sub(DISK_TRIM_TOKENS);
    trimmed / chunk * chunk
}

/// Write the prefix `tokens` held in `blocks` to the disk cache; returns
/// whether a file was written.
fn checkpoint<B: Backend>(
    lm: &LoadedModel<B>,
    kv: &mut PagedKv<B>,
    tokens: &[u32],
    blocks: &[BlockId],
) -> bool {
    let bs = kv.blocks.block_size();
    let n = tokens.len() / bs;
    if n == 0 || n * bs < DISK_MIN_TOKENS {
        return false;
    }
    let Some(disk) = &mut kv.disk else {
        return false;
    };
    let pool = &kv.pool;
    let t0 = Instant::now();
    let mut read = |i: usize, out: &mut [u8]| {
        lm.backend
            .kv_read_block(pool, blocks[i], out)
            .map_err(|e| e.to_string())
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

/// Stream one token to its request; `Break` once the client has gone.
fn send_step(events: &mpsc::UnboundedSender<Event>, s: &TokenStep<'_>) -> ControlFlow<()> {
    let ev = Event::Token {
        token: s.token,
        text: s.text.to_string(),
        logprobs: s.logprobs.clone(),
    };
    if events.send(ev).is_err() {
        ControlFlow::Break(())
    } else {
        ControlFlow::Continue(())
    }
}

fn record(m: &Metrics, g: &Generation) {
    let t = &g.timings;
    tracing::info!(
        prompt_tokens = t.prompt_tokens,
        cached_tokens = t.cached_tokens,
        tokens = g.tokens.len(),
        finish = ?g.finish,
        ttft_ms = format!("{:.1}", t.ttft_ms()),
        decode_tps = format!("{:.1}", t.decode_tps()),
        "request done"
    );
    m.prompt_tokens.inc_by(t.prompt_tokens as u64);
    m.cached_tokens.inc_by(t.cached_tokens as u64);
    m.generated_tokens.inc_by(t.generated_tokens as u64);
    if g.finish == FinishReason::Cancelled {
        m.cancelled.inc();
    }
    m.ttft.observe(t.ttft_ms() / 1e3);
    if t.generated_tokens > 1 {
        m.token_latency
            .observe(t.decode_ms / 1e3 / (t.generated_tokens - 1) as f64);
        m.decode_tps.set(t.decode_tps());
    }
}

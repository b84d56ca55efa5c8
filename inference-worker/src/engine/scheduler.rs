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
//! Every family runs through this one path; the paged state a sequence
//! holds (blocks, and for compressed-attention families window blocks and
//! a frontier slot) is managed in [`super::paged`].

use std::collections::VecDeque;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ds4_kernels::Backend;
use ds4_model::{Logits, ModelError, PagedInput};
use tokio::sync::mpsc;
use tracing::debug_span;

use super::ledger::Ledger;
use super::paged::{checkpoint_len, PagedKv, SeqState, DISK_MIN_TOKENS};
use super::{EngineConfig, Event, Job, Msg};
use crate::generate::{
    Decoding, FinishReason, GenerateError, Generation, Next, Timings, TokenStep,
};
use crate::metrics::Metrics;
use crate::runtime::LoadedModel;

struct Live<'m> {
    job: Job,
    /// The prompt, then every token fed back.
    tokens: Vec<u32>,
    prompt_len: usize,
    /// Positions whose state is computed.
    computed: usize,
    state: SeqState,
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
    kv: PagedKv<B>,
    live: Vec<Live<'m>>,
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
        kv: PagedKv<B>,
        queued: Arc<AtomicUsize>,
    ) -> Self {
        Scheduler {
            lm,
            cfg,
            metrics,
            ledger,
            kv,
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
        self.kv.checkpoint_idle(self.lm);
        tracing::info!("engine stopped");
    }

    /// Handle one message; `false` on shutdown.
    fn take(&mut self, msg: Msg) -> bool {
        match msg {
            Msg::Job(job) => {
                self.waiting.push_back(*job);
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
            if let Some(live) = self.start(job) {
                self.live.push(live);
            }
        }
        self.metrics.active_sequences.set(self.live.len() as i64);
    }

    /// A new live sequence for `job`, with the longest cached prefix;
    /// `None` (the request failed) when its state could not be started.
    fn start(&mut self, job: Job) -> Option<Live<'m>> {
        let span = job.span.clone();
        let _in = span.enter();
        let prompt = job.req.prompt.clone();
        let (state, prefix) = match self.kv.start(self.lm, &prompt, self.cfg.prefill_chunk) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "request failed: its state could not be started");
                self.ledger.lock().expect("ledger").release(job.reserved);
                let _ = job
                    .events
                    .send(Event::Failed(GenerateError::BatchFailed(e)));
                return None;
            }
        };
        let cached = state.blocks.len() * self.kv.block_size();
        let decoding = Decoding::new(&self.lm.chat.tokenizer, &job.req, job.opts);
        let timings = Timings {
            prompt_tokens: prompt.len(),
            cached_tokens: cached,
            prefix,
            ..Default::default()
        };
        tracing::debug!(
            prompt_tokens = prompt.len(),
            cached_tokens = cached,
            prefix = %prefix.why(),
            queued_ms = format!("{:.1}", job.submitted.elapsed().as_secs_f64() * 1e3),
            "admitted"
        );
        Some(Live {
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
        })
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
        let result = span.in_scope(|| self.forward_paged(&parts));
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
        // Blocks and window blocks for every position this step reads or
        // writes.
        for part in parts {
            let l = &mut self.live[part.live];
            self.kv
                .prepare(self.lm, &mut l.state, part.start, part.n)
                .map_err(|detail| {
                    ModelError::Backend(ds4_kernels::BackendError::Shape {
                        op: "engine step",
                        detail,
                    })
                })?;
        }
        let inputs: Vec<PagedInput<'_>> = parts
            .iter()
            .map(|p| {
                let l = &self.live[p.live];
                PagedInput {
                    tokens: &l.tokens[p.start..p.start + p.n],
                    pos: p.start,
                    blocks: &l.state.blocks,
                    window: &l.state.window,
                    slot: l.state.slot.unwrap_or(0),
                    logits: p.logits.then_some(Logits::Last),
                }
            })
            .collect();
        self.lm
            .model
            .forward_paged(&self.lm.backend, &mut self.kv.pool, &inputs)
    }

    /// Account a part's computed positions; sample when it produced logits.
    fn advance(&mut self, part: &Part, logits: &[f32]) {
        let ctx = self.cfg.ctx;
        let l = &mut self.live[part.live];
        let _in = l.job.span.clone().entered();
        l.computed += part.n;
        self.kv
            .register_full_blocks(&mut l.state, &l.tokens[..l.computed]);
        if part.logits && l.computed == l.prompt_len && l.timings.cached_tokens < l.prompt_len {
            let cold = l.prompt_len - l.timings.cached_tokens;
            if cold >= DISK_MIN_TOKENS {
                let keep = checkpoint_len(l.prompt_len, self.cfg.prefill_chunk);
                let n = keep / self.kv.block_size();
                let tail = self.kv.tail_window(&l.state, n);
                self.kv
                    .checkpoint(self.lm, &l.tokens[..keep], &l.state.blocks[..n], tail);
            }
        }
        self.kv.advance_windows(&mut l.state, l.computed);
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
        let c = self.kv.blocks.counts();
        self.metrics.kv_blocks_used.set(c.used as i64);
        self.metrics.kv_blocks_cached.set(c.cached as i64);
    }

    fn finish(&mut self, mut l: Live<'m>) {
        let _in = l.job.span.clone().entered();
        l.timings.decode_ms = l
            .first_token
            .map_or(0.0, |t| t.elapsed().as_secs_f64() * 1e3);
        let events = l.job.events.clone();
        let mut on_step = |s: &TokenStep<'_>| send_step(&events, s);
        let g = l.decoding.finish(l.timings, &mut on_step);
        self.lm.chat.remember(&l.tokens);
        self.kv.finish(l.state, l.computed);
        self.ledger.lock().expect("ledger").release(l.job.reserved);
        record(&self.metrics, &g);
        let _ = l.job.events.send(Event::Done(g));
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

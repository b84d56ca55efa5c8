//! The engine: one thread owns the model and its sequence state; request
//! handlers talk to it over a bounded channel and get a stream of
//! [`Event`]s back (one per sampled token, then the finished
//! [`Generation`] or an error). Requests run one at a time in arrival order
//! (continuous batching replaces this loop later); the last conversation's
//! KV state is kept, so a client that resends a growing conversation only
//! pays for the new tokens. A request whose receiver is dropped (the client
//! went away) stops at its next token.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::thread;

use ds4_kernels::Backend;
use tokio::sync::mpsc;

use crate::generate::{
    generate_stream, FinishReason, GenerateError, GenerateRequest, Generation, StreamOptions,
    TokenLogprobs,
};
use crate::metrics::Metrics;
use crate::runtime::LoadedModel;

/// Requests allowed to wait for the engine before new ones are refused.
pub const QUEUE_DEPTH: usize = 64;

/// What the engine reports about one request, in order: any number of
/// `Token`s, then exactly one of `Done` or `Failed`.
#[derive(Debug)]
pub enum Event {
    Token {
        token: u32,
        /// Text that became final with this token (may be empty).
        text: String,
        logprobs: Option<TokenLogprobs>,
    },
    Done(Generation),
    Failed(GenerateError),
}

struct Job {
    req: GenerateRequest,
    opts: StreamOptions,
    events: mpsc::UnboundedSender<Event>,
}

/// Why a request did not reach the engine.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("the server is busy: {0} requests are already waiting")]
    Busy(usize),
    #[error("the engine has stopped")]
    Stopped,
}

/// A cloneable handle to the engine thread.
#[derive(Clone)]
pub struct EngineHandle {
    tx: mpsc::Sender<Job>,
    metrics: Arc<Metrics>,
}

impl EngineHandle {
    /// Queue a request; the receiver yields its events. Dropping the
    /// receiver cancels the request at its next token.
    pub fn submit(
        &self,
        req: GenerateRequest,
        opts: StreamOptions,
    ) -> Result<mpsc::UnboundedReceiver<Event>, SubmitError> {
        let (events, rx) = mpsc::unbounded_channel();
        self.tx
            .try_send(Job { req, opts, events })
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => SubmitError::Busy(QUEUE_DEPTH),
                mpsc::error::TrySendError::Closed(_) => SubmitError::Stopped,
            })?;
        self.metrics.queue_depth.set(self.queue_depth() as i64);
        Ok(rx)
    }

    /// Requests waiting.
    pub fn queue_depth(&self) -> usize {
        QUEUE_DEPTH - self.tx.capacity()
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }
}

/// Start the engine thread over `lm`, with sequences of `ctx` tokens.
pub fn spawn<B: Backend + 'static>(
    lm: LoadedModel<B>,
    ctx: usize,
    metrics: Arc<Metrics>,
) -> EngineHandle
where
    B::KvCache: 'static,
    B::Weight: 'static,
{
    let (tx, mut rx) = mpsc::channel::<Job>(QUEUE_DEPTH);
    let handle = EngineHandle {
        tx,
        metrics: metrics.clone(),
    };
    // A weak view of the queue for its depth: dropping every handle must
    // still stop the thread.
    let depth_tx = handle.tx.downgrade();
    metrics.kv_tokens_capacity.set(ctx as i64);
    thread::Builder::new()
        .name("ds4-engine".into())
        .spawn(move || {
            let mut seq = lm.model.new_sequence(&lm.backend, ctx);
            while let Some(job) = rx.blocking_recv() {
                if let Some(tx) = depth_tx.upgrade() {
                    metrics
                        .queue_depth
                        .set((QUEUE_DEPTH - tx.capacity()) as i64);
                }
                if job.events.is_closed() {
                    metrics.cancelled.inc();
                    continue;
                }
                metrics.active_sequences.set(1);
                let events = &job.events;
                let mut on_step = |s: &crate::generate::TokenStep<'_>| {
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
                };
                let result = generate_stream(&lm, &mut seq, &job.req, job.opts, &mut on_step);
                metrics.active_sequences.set(0);
                metrics.kv_tokens_used.set(seq.tokens().len() as i64);
                let event = match result {
                    Ok(g) => {
                        record(&metrics, &g);
                        Event::Done(g)
                    }
                    Err(e) => Event::Failed(e),
                };
                let _ = job.events.send(event);
            }
            tracing::info!("engine stopped");
        })
        .expect("spawn engine thread");
    handle
}

fn record(m: &Metrics, g: &Generation) {
    let t = &g.timings;
    tracing::info!(
        prompt_tokens = t.prompt_tokens,
        cached_tokens = t.cached_tokens,
        tokens = g.tokens.len(),
        finish = ?g.finish,
        prefill_tps = format!("{:.1}", t.prefill_tps()),
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

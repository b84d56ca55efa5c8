//! The engine: one thread owns the model and its sequence state; request
//! handlers talk to it over a bounded channel and get results back on a
//! oneshot. Requests run one at a time in arrival order (continuous
//! batching replaces this loop later); the last conversation's KV state is
//! kept, so a client that resends a growing conversation only pays for the
//! new tokens.

use std::ops::ControlFlow;
use std::thread;

use ds4_kernels::Backend;
use tokio::sync::{mpsc, oneshot};

use crate::generate::{generate, GenerateError, GenerateRequest, Generation};
use crate::runtime::LoadedModel;

/// Requests allowed to wait for the engine before new ones are refused.
pub const QUEUE_DEPTH: usize = 64;

struct Job {
    req: GenerateRequest,
    reply: oneshot::Sender<Result<Generation, GenerateError>>,
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
}

impl EngineHandle {
    /// Queue a request; the receiver yields its result. Dropping the
    /// receiver cancels the request at its next token.
    pub fn submit(
        &self,
        req: GenerateRequest,
    ) -> Result<oneshot::Receiver<Result<Generation, GenerateError>>, SubmitError> {
        let (reply, rx) = oneshot::channel();
        self.tx.try_send(Job { req, reply }).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => SubmitError::Busy(QUEUE_DEPTH),
            mpsc::error::TrySendError::Closed(_) => SubmitError::Stopped,
        })?;
        Ok(rx)
    }

    /// Requests waiting.
    pub fn queue_depth(&self) -> usize {
        QUEUE_DEPTH - self.tx.capacity()
    }
}

/// Start the engine thread over `lm`, with sequences of `ctx` tokens.
pub fn spawn<B: Backend + 'static>(lm: LoadedModel<B>, ctx: usize) -> EngineHandle
where
    B::KvCache: 'static,
    B::Weight: 'static,
{
    let (tx, mut rx) = mpsc::channel::<Job>(QUEUE_DEPTH);
    thread::Builder::new()
        .name("ds4-engine".into())
        .spawn(move || {
            let mut seq = lm.model.new_sequence(&lm.backend, ctx);
            while let Some(job) = rx.blocking_recv() {
                if job.reply.is_closed() {
                    continue;
                }
                let reply = &job.reply;
                let mut on_text = |_: &str| {
                    if reply.is_closed() {
                        ControlFlow::Break(())
                    } else {
                        ControlFlow::Continue(())
                    }
                };
                let result = generate(&lm, &mut seq, &job.req, &mut on_text);
                if let Ok(g) = &result {
                    tracing::info!(
                        prompt_tokens = g.timings.prompt_tokens,
                        cached_tokens = g.timings.cached_tokens,
                        tokens = g.tokens.len(),
                        finish = ?g.finish,
                        prefill_tps = format!("{:.1}", g.timings.prefill_tps()),
                        decode_tps = format!("{:.1}", g.timings.decode_tps()),
                        "request done"
                    );
                }
                let _ = job.reply.send(result);
            }
            tracing::info!("engine stopped");
        })
        .expect("spawn engine thread");
    EngineHandle { tx }
}

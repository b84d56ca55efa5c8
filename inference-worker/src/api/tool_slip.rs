//! Tool slips: a tools-armed turn that ends with `stop` and no tool call.
//! Deep in an agent loop a low-bit model sometimes answers a tool result
//! with prose, and the agent gives up. Two operator levers: draw such a
//! JSON answer once more before the client sees it
//! (`--tool-slip-resample`, counted in `ds4_tool_slip_resamples_total`),
//! and write each slip to a directory for study (`--tool-slip-dump DIR`:
//! the request body, the generated text and reasoning, the verdict).
//! Every slip of a JSON answer counts in `ds4_tool_slips_total`. Streams
//! cannot take an answer back and are not resampled.

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use serde_json::{json, Value};

use super::run::{self, Collected, Finish, Job, Run};
use super::{ApiError, AppState};
use crate::generate::FinishReason;

/// The operator's choices.
#[derive(Clone, Debug, Default)]
pub struct SlipOptions {
    pub resample: bool,
    pub dump_dir: Option<PathBuf>,
}

/// What a second draw needs: the job, and the body for the dump.
pub struct Retry {
    job: Job,
    body: Bytes,
}

impl Retry {
    /// Kept for tools-armed JSON answers when a slip lever is on.
    pub fn new(state: &AppState, job: &Job, body: &Bytes, stream: bool) -> Option<Retry> {
        let armed = job.answer.tools.is_some() && !stream;
        let levers = state.slips.resample || state.slips.dump_dir.is_some();
        (armed && levers).then(|| Retry {
            job: job.clone(),
            body: body.clone(),
        })
    }
}

/// Run to the end; a slip is dumped and, with resampling on, drawn once
/// more (with the next seed when the client fixed one). The run's
/// end-of-run handler gets the answer the client gets.
pub async fn collect(
    state: &AppState,
    mut run: Run,
    retry: Option<Retry>,
) -> Result<(Collected, Finish), ApiError> {
    let Some(retry) = retry else {
        return run::collect(run).await;
    };
    let on_done = run.take_on_done();
    let (c, f) = redraw_slip(state, run, retry).await?;
    if let Some(then) = on_done {
        then(&c, &f);
    }
    Ok((c, f))
}

async fn redraw_slip(
    state: &AppState,
    run: Run,
    retry: Retry,
) -> Result<(Collected, Finish), ApiError> {
    let (c, f) = run::collect(run).await?;
    if f.reason != FinishReason::Stop || !c.calls.is_empty() {
        return Ok((c, f));
    }
    let metrics = state.engine.metrics();
    metrics.tool_slips.inc();
    let resample = state.slips.resample;
    tracing::info!(resample, "a tools-armed turn ended without a tool call");
    if let Some(dir) = &state.slips.dump_dir {
        dump(dir, &retry.body, &c, resample);
    }
    if !resample {
        return Ok((c, f));
    }
    metrics.tool_slip_resamples.inc();
    let mut job = retry.job;
    job.sampling.seed = job.sampling.seed.map(|s| s.wrapping_add(1));
    run::collect(run::start(state, job)?).await
}

/// One JSON file per slip; a failure to write is logged, never the
/// client's problem.
fn dump(dir: &std::path::Path, body: &[u8], c: &Collected, resampled: bool) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros());
    let path = dir.join(format!(
        "slip-{now}-{}.json",
        ds4_model::chat::new_call_id("")
    ));
    let request = serde_json::from_slice::<Value>(body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(body).into()));
    let record = json!({
        "request": request,
        "text": c.text,
        "reasoning": c.reasoning,
        "verdict": "finished with stop and no tool call",
        "resampled": resampled,
    });
    let written =
        std::fs::create_dir_all(dir).and_then(|()| std::fs::write(&path, record.to_string()));
    if let Err(e) = written {
        tracing::warn!(path = %path.display(), error = %e, "cannot write the tool-slip dump");
    }
}

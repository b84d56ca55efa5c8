//! `GET /metrics` (Prometheus text) and `GET /v1/stats` (JSON, or a small
//! text board for people).

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

use super::AppState;
use crate::metrics::Snapshot;

pub async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let m = state.engine.metrics();
    m.queue_depth.set(state.engine.queue_depth() as i64);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        m.render(),
    )
        .into_response()
}

#[derive(Serialize)]
struct Stats {
    model: String,
    ctx: usize,
    uptime_s: u64,
    /// `standalone`, `owner` or `owner_gone`.
    weights: &'static str,
    #[serde(flatten)]
    totals: Snapshot,
}

pub async fn stats(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    let m = state.engine.metrics();
    m.queue_depth.set(state.engine.queue_depth() as i64);
    let s = Stats {
        model: state.model_id.clone(),
        ctx: state.ctx,
        uptime_s: state.started.elapsed().as_secs(),
        weights: state.weights(),
        totals: m.snapshot(),
    };
    let wants_json = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/json"));
    if wants_json {
        return Json(s).into_response();
    }
    let t = &s.totals;
    let board = format!(
        "ds4  {model}  ctx {ctx}  up {up}s\n\
         weights         {weights}\n\
         requests        {req}\n\
         prompt tokens   {pt} ({ct} cached)\n\
         generated       {gt}\n\
         cancelled       {cancel}\n\
         decode tok/s    {tps:.1}\n\
         queue / active  {q} / {a}\n\
         KV tokens       {kv} / {cap}\n",
        model = s.model,
        ctx = s.ctx,
        up = s.uptime_s,
        weights = s.weights,
        req = t.requests,
        pt = t.prompt_tokens,
        ct = t.cached_tokens,
        gt = t.generated_tokens,
        cancel = t.cancelled,
        tps = t.decode_tokens_per_s,
        q = t.queue_depth,
        a = t.active_sequences,
        kv = t.kv_tokens_used,
        cap = t.kv_tokens_capacity,
    );
    ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], board).into_response()
}

//! HTTP surfaces. Each API has its own module with its own serde wire
//! types; [`ApiError`] is the one internal error, rendered in each API's
//! envelope. Only this module knows OpenAI/Anthropic JSON.
//!
//! - `openai_chat`: `POST /v1/chat/completions`
//! - `openai_completions`: `POST /v1/completions`
//! - `openai_responses`: `POST /v1/responses`
//! - `anthropic_messages`: `POST /v1/messages`, `/v1/messages/count_tokens`
//! - `models`: `GET /v1/models`, `/health`; `stats`: `/metrics`, `/v1/stats`
//! - `convo` (conversations and their rendering) and `run` (engine runs,
//!   collection, SSE) are shared by the surfaces; `trace` gives every
//!   request its id and span.
//! - `listen`: the accept loop, the connection cap and time limits.
//!
//! Before any handler, `guard` answers CORS preflights, refuses requests
//! that came over the connection cap (but `/health`), checks the key and a
//! declared `Content-Length`; the JSON endpoints require a JSON content
//! type; a wrong method gets a 405 with `Allow`, each refusal in the
//! envelope of the path's API.

mod anthropic_messages;
mod continuation;
mod convo;
mod error;
mod fields;
pub mod listen;
mod models;
mod openai_chat;
mod openai_completions;
mod openai_responses;
mod run;
mod stats;
mod structured;
mod tool_slip;
mod trace;
mod trace_file;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::{from_fn, from_fn_with_state, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::de::DeserializeOwned;
use serde::Deserialize;

use anthropic_messages::{CountTokensRequest, MessagesRequest};
use openai_chat::ChatRequest;
use openai_completions::CompletionRequest;
use openai_responses::ResponsesRequest;

use crate::engine::EngineHandle;
use crate::grammar::Grammars;
use crate::sampler::SamplingParams;
use ds4_model::chat::{Chat, Levers, RenderOptions, ReplayStore, Thinking};
pub use error::ApiError;
pub use listen::ConnectionLimits;
pub use tool_slip::SlipOptions;
pub use trace_file::TraceFile;

/// Default largest request body (a long agent conversation fits easily).
pub const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;

/// Model names answered by the loaded model whatever its id.
/// `deepseek-chat` runs without thinking and `deepseek-reasoner` with it,
/// unless the request says otherwise (as DeepSeek's API names them).
pub const ALIASES: &[&str] = &[
    "default",
    "deepseek-v4-flash",
    "deepseek-v4-pro",
    "deepseek-chat",
    "deepseek-reasoner",
];

/// Server settings that shape the HTTP layer.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// Required key (`Authorization: Bearer` or `x-api-key`), if any.
    pub api_key: Option<String>,
    /// Send permissive CORS headers and answer preflights.
    pub cors: bool,
    pub max_body_bytes: usize,
    /// Accept any `Content-Type` on the JSON endpoints (default: JSON
    /// only, so that a web page cannot post to the server without a CORS
    /// preflight).
    pub allow_any_content_type: bool,
    /// Connection cap and time limits.
    pub limits: ConnectionLimits,
    /// Set while the weights come from an owner: `false` once the owner
    /// is found gone (the worker serves on from the imported memory).
    pub owner_alive: Option<Arc<AtomicBool>>,
    /// Agent-loop levers of prompt rendering.
    pub levers: Levers,
    /// Tool-slip resampling and dumps.
    pub slips: SlipOptions,
    /// The `--trace` file, if one is written.
    pub trace: Option<Arc<TraceFile>>,
    /// Most tokens one answer may generate (`--max-tokens`).
    pub max_answer_tokens: usize,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            api_key: None,
            cors: false,
            max_body_bytes: MAX_BODY_BYTES,
            allow_any_content_type: false,
            limits: ConnectionLimits::default(),
            owner_alive: None,
            levers: Levers::default(),
            slips: SlipOptions::default(),
            trace: None,
            max_answer_tokens: usize::MAX,
        }
    }
}

/// What every handler can see.
pub struct AppState {
    pub engine: EngineHandle,
    /// The loaded family's chat layer.
    pub chat: Chat,
    pub model_id: String,
    /// Tokens a request may occupy (prompt + completion).
    pub ctx: usize,
    /// Unix time the server started, reported as the model's `created`.
    pub created: u64,
    pub started: Instant,
    pub api_key: Option<String>,
    pub cors: bool,
    pub max_body_bytes: usize,
    pub allow_any_content_type: bool,
    pub limits: ConnectionLimits,
    owner_alive: Option<Arc<AtomicBool>>,
    /// Sampled tool-call bytes by call id, for exact replay of history.
    pub replay: Arc<ReplayStore>,
    /// Structured output's grammar compiler (`None`: the vocabulary could
    /// not be read as a token trie; such requests get a 400).
    pub grammars: Option<Arc<Grammars>>,
    pub levers: Levers,
    pub slips: SlipOptions,
    /// Conversations that ended with tool calls, for output-only
    /// follow-ups.
    pub continuations: continuation::Registry,
    /// The `--trace` file, if one is written.
    pub trace: Option<Arc<TraceFile>>,
    /// Most tokens one answer may generate.
    pub max_answer_tokens: usize,
}

impl AppState {
    pub fn new(
        engine: EngineHandle,
        chat: Chat,
        model_id: String,
        ctx: usize,
        opts: ServerOptions,
    ) -> AppState {
        let grammars = match Grammars::new(chat.tokenizer.clone()) {
            Ok(g) => Some(Arc::new(g)),
            Err(e) => {
                tracing::warn!(error = %e, "structured output is unavailable for this vocabulary");
                None
            }
        };
        AppState {
            grammars,
            engine,
            chat,
            model_id,
            ctx,
            created: unix_now(),
            started: Instant::now(),
            api_key: opts.api_key,
            cors: opts.cors,
            max_body_bytes: opts.max_body_bytes,
            allow_any_content_type: opts.allow_any_content_type,
            limits: opts.limits,
            owner_alive: opts.owner_alive,
            replay: Arc::new(ReplayStore::default()),
            levers: opts.levers,
            slips: opts.slips,
            continuations: continuation::Registry::default(),
            trace: opts.trace,
            max_answer_tokens: opts.max_answer_tokens,
        }
    }

    /// Where the weights come from: `standalone`, `owner`, or `owner_gone`
    /// (attached to an owner that has since died; serving goes on).
    pub fn weights(&self) -> &'static str {
        match &self.owner_alive {
            None => "standalone",
            Some(a) if a.load(Ordering::Relaxed) => "owner",
            Some(_) => "owner_gone",
        }
    }

    /// What prompt rendering needs from the server, for a request naming
    /// `model` (the thinking aliases set the default thinking mode).
    pub fn render_options(&self, model: &str) -> RenderOptions {
        let mut levers = self.levers;
        match model {
            "deepseek-chat" => levers.default_thinking = Some(Thinking::Off),
            "deepseek-reasoner" => levers.default_thinking = Some(Thinking::High),
            _ => {}
        }
        RenderOptions {
            ctx: self.ctx,
            replay: self.replay.clone(),
            levers,
        }
    }

    /// Whether `requested` names the loaded model (or one of its aliases).
    pub fn serves(&self, requested: &str) -> bool {
        requested.is_empty() || requested == self.model_id || ALIASES.contains(&requested)
    }

    /// Count a request's outcome for `surface`: JSON answers and errors
    /// now, streams when they end.
    fn count(&self, surface: &str, r: &Result<Reply, ApiError>) {
        let m = self.engine.metrics();
        match r {
            Ok(Reply::Json(_)) => m.request(surface, "ok"),
            Ok(Reply::Stream(_)) => {}
            Err(e) => {
                m.request(surface, e.reason());
                m.refusal(e.reason());
            }
        }
    }
}

/// One API surface's request, served by [`serve`]: the surface's name in
/// the metrics, its error envelope, the model the request names, and its
/// answer.
pub trait Surface: DeserializeOwned + Send + 'static {
    /// The `surface` label of the request metrics.
    const NAME: &'static str;

    /// An error as this surface's response (the OpenAI envelope unless
    /// the surface says otherwise).
    fn refuse(e: ApiError) -> Response {
        e.into_response()
    }

    /// Answer a request that parsed and names the loaded model. `body` is
    /// the request's bytes (for what must reach the model in the client's
    /// own bytes: its tools).
    fn answer(
        self,
        state: Arc<AppState>,
        body: Bytes,
    ) -> impl Future<Output = Result<Reply, ApiError>> + Send;

    /// The model the request names (empty: whatever is loaded).
    fn model(&self) -> &str;
}

/// The handler of every surface: check the content type, read the body
/// within the size limit and time, parse it as the surface's request,
/// check the model name, answer, and count the outcome; every error goes
/// out in the surface's envelope.
pub async fn serve<S: Surface>(State(state): State<Arc<AppState>>, req: Request) -> Response {
    let r = async {
        if !state.allow_any_content_type {
            json_content_type(req.headers())?;
        }
        let body = Bytes::from_request(req, &state)
            .await
            .map_err(|r| ApiError::from_rejection(r, state.max_body_bytes))?;
        let req: S = error::parse_json(&body)?;
        if !state.serves(req.model()) {
            return Err(ApiError::UnknownModel(req.model().to_string()));
        }
        req.answer(state.clone(), body).await
    }
    .await;
    state.count(S::NAME, &r);
    match r {
        Ok(Reply::Json(r) | Reply::Stream(r)) => r,
        Err(e) => S::refuse(e),
    }
}

/// Refuse a request whose `Content-Type` is not JSON: `application/json`
/// or a `+json` type under `application/`, parameters (`charset`) allowed.
fn json_content_type(h: &HeaderMap) -> Result<(), ApiError> {
    let Some(ct) = h.get(header::CONTENT_TYPE) else {
        return Err(ApiError::UnsupportedMediaType { found: None });
    };
    let ct = String::from_utf8_lossy(ct.as_bytes());
    let essence = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let json = essence
        .strip_prefix("application/")
        .is_some_and(|sub| sub == "json" || (sub.ends_with("+json") && sub.len() > 5));
    if json {
        Ok(())
    } else {
        Err(ApiError::UnsupportedMediaType {
            found: Some(ct.into_owned()),
        })
    }
}

/// A surface handler's answer.
pub enum Reply {
    Json(Response),
    Stream(Response),
}

impl Reply {
    /// `run` streamed as SSE in `shape`, counted as a request of `S`
    /// when the stream ends.
    pub fn stream<S: Surface>(
        state: &Arc<AppState>,
        run: run::Run,
        shape: impl run::Shape,
    ) -> Reply {
        Reply::Stream(run::sse(state.clone(), S::NAME, run, shape))
    }
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Sampling fields common to every surface.
#[derive(Debug, Default, Deserialize)]
pub struct SamplingFields {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<u32>,
    pub min_p: Option<f32>,
    pub seed: Option<u64>,
}

impl SamplingFields {
    pub fn params(&self) -> Result<SamplingParams, ApiError> {
        let d = SamplingParams::default();
        let p = SamplingParams {
            temperature: self.temperature.unwrap_or(d.temperature),
            top_k: self.top_k.map_or(d.top_k, |k| k as usize),
            top_p: self.top_p.unwrap_or(d.top_p),
            min_p: self.min_p.unwrap_or(d.min_p),
            seed: self.seed,
            ..d
        };
        p.validate().map_err(|m| {
            let param = ["temperature", "top_p", "min_p"]
                .into_iter()
                .find(|f| m.starts_with(f))
                .unwrap_or("temperature");
            ApiError::bad(m, param)
        })?;
        Ok(p)
    }
}

/// `stop`: one string or a list of at most 16.
pub type Stop = convo::TextOr<String>;

pub fn stop_list(stop: Option<Stop>) -> Result<Vec<String>, ApiError> {
    match stop {
        None => Ok(Vec::new()),
        Some(Stop::Text(s)) => Ok(vec![s]),
        Some(Stop::List(v)) if v.len() <= 16 => Ok(v),
        Some(Stop::List(_)) => Err(ApiError::bad("at most 16 stop strings are allowed", "stop")),
    }
}

/// `n` and `best_of`: one choice per request.
pub fn one_choice(n: Option<u32>, param: &'static str) -> Result<(), ApiError> {
    match n {
        Some(n) if n != 1 => Err(ApiError::bad(
            format!("only {param} = 1 is supported"),
            param,
        )),
        _ => Ok(()),
    }
}

pub fn router(state: Arc<AppState>) -> Router {
    let routes = Router::new()
        .route("/v1/chat/completions", post(serve::<ChatRequest>))
        .route("/v1/completions", post(serve::<CompletionRequest>))
        .route("/v1/responses", post(serve::<ResponsesRequest>))
        .route("/v1/messages", post(serve::<MessagesRequest>))
        .route(
            "/v1/messages/count_tokens",
            post(serve::<CountTokensRequest>),
        )
        .route("/v1/models", get(models::list))
        .route("/v1/models/{id}", get(models::one))
        .route("/health", get(models::health))
        .route("/metrics", get(stats::metrics))
        .route("/v1/stats", get(stats::stats))
        .fallback(error::not_found)
        .with_state(state.clone());
    // The guard wraps the routes as a whole, so that it sees the `Allow`
    // header of the router's 405.
    Router::new()
        .fallback_service(routes)
        .layer(from_fn_with_state(state.clone(), guard))
        .layer(DefaultBodyLimit::max(state.max_body_bytes))
        .layer(from_fn(trace::with_request_id))
}

/// Before any handler: CORS, the connection cap, the API key and a
/// declared body size; after it, a wrong method's 405 in the envelope.
async fn guard(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if state.cors && req.method() == Method::OPTIONS {
        let mut r = StatusCode::NO_CONTENT.into_response();
        cors_headers(r.headers_mut());
        return r;
    }
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let mut resp = match refusal(&state, &req) {
        Some(e) => {
            state.engine.metrics().refusal(e.reason());
            e.for_path(&path)
        }
        None => next.run(req).await,
    };
    // The router's own 405 (empty, with `Allow`) in the envelope.
    if resp.status() == StatusCode::METHOD_NOT_ALLOWED {
        let allow = resp
            .headers()
            .get(header::ALLOW)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let e = ApiError::MethodNotAllowed {
            method: method.to_string(),
            path: path.clone(),
            allow,
        };
        state.engine.metrics().refusal(e.reason());
        resp = e.for_path(&path);
    }
    if state.cors {
        cors_headers(resp.headers_mut());
    }
    resp
}

/// Why `req` is refused before its handler, if it is: it came over the
/// connection cap (all but `/health`), lacks the key (all but `/health`),
/// or declares a body over the limit.
fn refusal(state: &AppState, req: &Request) -> Option<ApiError> {
    let health = req.uri().path() == "/health";
    if let (Some(over), false) = (req.extensions().get::<listen::OverCapacity>(), health) {
        return Some(ApiError::Busy {
            message: format!(
                "the server is at its limit of {} connections, all answering requests; retry shortly",
                over.max_connections
            ),
            reason: "busy_connections",
        });
    }
    if !health && !authorized(state, req.headers()) {
        return Some(ApiError::Unauthorized);
    }
    declared_too_large(req.headers(), state.max_body_bytes)
}

/// A `Content-Length` over the body limit, refused before the body is read.
fn declared_too_large(h: &HeaderMap, limit: usize) -> Option<ApiError> {
    let declared: u64 = h.get(header::CONTENT_LENGTH)?.to_str().ok()?.parse().ok()?;
    (declared > limit as u64).then_some(ApiError::TooLarge { limit })
}

fn authorized(state: &AppState, h: &HeaderMap) -> bool {
    let Some(key) = &state.api_key else {
        return true;
    };
    let bearer = h
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let x_key = h.get("x-api-key").and_then(|v| v.to_str().ok());
    bearer == Some(key.as_str()) || x_key == Some(key.as_str())
}

fn cors_headers(h: &mut HeaderMap) {
    h.insert("access-control-allow-origin", HeaderValue::from_static("*"));
    h.insert(
        "access-control-allow-methods",
        HeaderValue::from_static("GET, POST, OPTIONS"),
    );
    h.insert(
        "access-control-allow-headers",
        HeaderValue::from_static("*"),
    );
    h.insert("access-control-max-age", HeaderValue::from_static("86400"));
    h.insert(
        "access-control-expose-headers",
        HeaderValue::from_static(trace::HEADER),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::error::testing::refusal;

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct WithStop {
        stop: Option<Stop>,
    }

    fn stops(body: &str) -> Result<Vec<String>, ApiError> {
        stop_list(serde_json::from_str::<WithStop>(body).unwrap().stop)
    }

    #[test]
    fn stop_is_one_string_or_a_few() {
        assert_eq!(stops(r#"{"stop":"x"}"#).unwrap(), ["x"]);
        assert_eq!(stops(r#"{"stop":["x","y"]}"#).unwrap(), ["x", "y"]);
        assert!(stops(r#"{}"#).unwrap().is_empty());
        let many = format!(r#"{{"stop":{:?}}}"#, vec!["s"; 17]);
        assert!(stops(&many).is_err());
        let (m, param) = refusal::<WithStop>(r#"{"stop":["x",5]}"#);
        assert!(m.contains("stop[1]: invalid type: integer `5`"), "{m}");
        assert_eq!(param.as_deref(), Some("stop"));
        let (m, _) = refusal::<WithStop>(r#"{"stop":5}"#);
        assert!(m.contains("expected a string or a list"), "{m}");
    }

    fn content_type(v: Option<&str>) -> Result<(), ApiError> {
        let mut h = HeaderMap::new();
        if let Some(v) = v {
            h.insert(header::CONTENT_TYPE, HeaderValue::from_str(v).unwrap());
        }
        json_content_type(&h)
    }

    #[test]
    fn json_endpoints_take_json_content_types_only() {
        for ok in [
            "application/json",
            "application/json; charset=utf-8",
            "Application/JSON ;charset=UTF-8",
            "application/vnd.api+json",
        ] {
            assert!(content_type(Some(ok)).is_ok(), "{ok}");
        }
        for bad in [
            "text/plain",
            "text/plain; charset=utf-8",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "text/json",
            "application/+json",
            "application/jsonx",
        ] {
            let e = content_type(Some(bad)).unwrap_err();
            assert_eq!(e.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE, "{bad}");
            assert!(e.to_string().contains(bad), "{e}");
        }
        let e = content_type(None).unwrap_err();
        assert!(e.to_string().contains("found none"), "{e}");
    }

    #[test]
    fn a_declared_body_over_the_limit_is_refused_before_reading() {
        let mut h = HeaderMap::new();
        assert!(declared_too_large(&h, 10).is_none());
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("10"));
        assert!(declared_too_large(&h, 10).is_none());
        h.insert(
            header::CONTENT_LENGTH,
            HeaderValue::from_static("99999999999999"),
        );
        let e = declared_too_large(&h, 10).unwrap();
        assert_eq!(e.status(), StatusCode::PAYLOAD_TOO_LARGE);
    }
}

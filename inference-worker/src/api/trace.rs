//! Following one request: every request gets an id (the client's
//! `x-request-id` when it is a sensible one, else a fresh `req_…`), echoed
//! in the response's `x-request-id` header. The handler runs inside a
//! `request` span carrying it, the span travels with the request to the
//! engine thread ([`crate::engine::EngineHandle::submit`] keeps the
//! current span) and to the task that streams its events, so every log
//! line about the request carries `request_id`. One line per request
//! (`request answered`, at `debug` for `/health` and `/metrics`) gives its
//! status and the time to the response head. The handler also runs with
//! its [`Tag`] in a task-local, for the `--trace` file's records.

use std::time::Instant;

use axum::extract::Request;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use ds4_model::chat::new_call_id;
use tracing::Instrument;

/// The request id header, read and echoed.
pub const HEADER: &str = "x-request-id";

/// Longest client-chosen id kept; longer ones are replaced.
const MAX_ID_LEN: usize = 128;

/// The client's id when it is 1..=128 visible ASCII characters, else a
/// fresh one.
fn request_id(req: &Request) -> String {
    req.headers()
        .get(HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|s| {
            !s.is_empty() && s.len() <= MAX_ID_LEN && s.bytes().all(|b| b.is_ascii_graphic())
        })
        .map_or_else(|| new_call_id("req_"), str::to_string)
}

/// Which request a handler is serving.
#[derive(Clone, Debug)]
pub struct Tag {
    pub id: String,
    pub path: String,
}

tokio::task_local! {
    static TAG: Tag;
}

/// The request the current handler serves (`None` outside one).
pub fn current() -> Option<Tag> {
    TAG.try_with(Tag::clone).ok()
}

/// Middleware: the request's span and its id in the response headers.
pub async fn with_request_id(req: Request, next: Next) -> Response {
    let id = request_id(&req);
    let span = tracing::info_span!("request", request_id = %id);
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let t0 = Instant::now();
    let tag = Tag {
        id: id.clone(),
        path: path.clone(),
    };
    let mut resp = TAG.scope(tag, next.run(req).instrument(span.clone())).await;
    let status = resp.status().as_u16();
    let ms = format!("{:.1}", t0.elapsed().as_secs_f64() * 1e3);
    span.in_scope(|| {
        // Probes and scrapes come every few seconds: not at `info`.
        if matches!(path.as_str(), "/health" | "/metrics") {
            tracing::debug!(%method, path, status, ms, "request answered");
        } else {
            tracing::info!(%method, path, status, ms, "request answered");
        }
    });
    if let Ok(v) = HeaderValue::from_str(&id) {
        resp.headers_mut().insert(HEADER, v);
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;

    fn with_header(v: &str) -> Request {
        Request::builder()
            .header(HEADER, v)
            .body(Body::empty())
            .unwrap()
    }

    #[test]
    fn a_sensible_client_id_is_kept_and_others_are_replaced() {
        assert_eq!(request_id(&with_header("abc-123")), "abc-123");
        for bad in ["", "has space", &"x".repeat(129)] {
            let id = request_id(&with_header(bad));
            assert!(id.starts_with("req_") && id.len() == 28, "{bad:?} -> {id}");
        }
        let none = Request::builder().body(Body::empty()).unwrap();
        assert!(request_id(&none).starts_with("req_"));
    }
}

//! The internal API error and its two envelopes: OpenAI
//! (`{"error": {"message", "type", "param", "code"}}`) and Anthropic
//! (`{"type": "error", "error": {"type", "message"}}`).

use std::borrow::Cow;

use axum::extract::rejection::BytesRejection;
use axum::http::{header, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use serde_path_to_error::Segment;

use super::listen::BodyTimeout;
use crate::engine::SubmitError;
use crate::generate::GenerateError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The request is malformed or asks for something we cannot honour.
    #[error("{message}")]
    BadRequest {
        message: String,
        /// The request field to fix (a top-level field name).
        param: Option<Cow<'static, str>>,
    },
    #[error("the model {0:?} is not served here")]
    UnknownModel(String),
    #[error("prompt is too long: {prompt} tokens, but this server's context is {ctx} tokens (prompt plus completion)")]
    ContextLength { prompt: usize, ctx: usize },
    #[error("request body is larger than the {limit}-byte limit; send less, or raise the server's --max-body-mb")]
    TooLarge { limit: usize },
    #[error("the request body did not arrive within {secs} s of its head (the server's --body-timeout-s); send the whole body at once")]
    BodyTimeout { secs: u64 },
    /// A JSON endpoint got another content type (`None`: no header).
    #[error("Content-Type must be application/json, found {}; send `Content-Type: application/json`", .found.as_deref().map_or_else(|| "none".to_string(), |f| format!("{f:?}")))]
    UnsupportedMediaType { found: Option<String> },
    #[error("{method} is not allowed on {path}; allowed: {allow}")]
    MethodNotAllowed {
        method: String,
        path: String,
        allow: String,
    },
    /// Retryable: the queue is full (`queue`) or the memory budget is
    /// reserved by running requests (`memory`).
    #[error("{message}")]
    Busy {
        message: String,
        reason: &'static str,
    },
    #[error("no route for {0}")]
    NotFound(String),
    /// A follow-up that names earlier state this server does not hold
    /// (or not as the request says): the client should send the whole
    /// history.
    #[error("{message}")]
    Conflict {
        message: String,
        param: &'static str,
    },
    #[error("missing or wrong API key: send Authorization: Bearer KEY or x-api-key: KEY")]
    Unauthorized,
    #[error("internal error: {0}")]
    Internal(String),
}

/// The OpenAI error body.
#[derive(Debug, Serialize)]
pub struct OpenAiEnvelope<'a> {
    error: OpenAiBody<'a>,
}

#[derive(Debug, Serialize)]
struct OpenAiBody<'a> {
    message: String,
    #[serde(rename = "type")]
    kind: &'static str,
    param: Option<&'a str>,
    code: Option<&'static str>,
}

/// The Anthropic error body.
#[derive(Debug, Serialize)]
pub struct AnthropicEnvelope {
    #[serde(rename = "type")]
    kind: &'static str,
    error: AnthropicBody,
}

#[derive(Debug, Serialize)]
struct AnthropicBody {
    #[serde(rename = "type")]
    kind: &'static str,
    message: String,
}

impl ApiError {
    pub fn bad(message: impl Into<String>, param: &'static str) -> ApiError {
        ApiError::BadRequest {
            message: message.into(),
            param: Some(Cow::Borrowed(param)),
        }
    }

    fn parts(&self) -> (StatusCode, &'static str, Option<&str>, Option<&'static str>) {
        match self {
            ApiError::BadRequest { param, .. } => (
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                param.as_deref(),
                None,
            ),
            ApiError::UnknownModel(_) => (
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                Some("model"),
                Some("model_not_found"),
            ),
            ApiError::ContextLength { .. } => (
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                Some("messages"),
                Some("context_length_exceeded"),
            ),
            ApiError::TooLarge { .. } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                None,
                None,
            ),
            ApiError::BodyTimeout { .. } => (
                StatusCode::REQUEST_TIMEOUT,
                "invalid_request_error",
                None,
                Some("request_timeout"),
            ),
            ApiError::UnsupportedMediaType { .. } => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "invalid_request_error",
                None,
                Some("unsupported_media_type"),
            ),
            ApiError::MethodNotAllowed { .. } => (
                StatusCode::METHOD_NOT_ALLOWED,
                "invalid_request_error",
                None,
                Some("method_not_allowed"),
            ),
            ApiError::Busy { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_overloaded",
                None,
                Some("busy"),
            ),
            ApiError::NotFound(_) => (
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                None,
                Some("not_found"),
            ),
            ApiError::Conflict { param, .. } => (
                StatusCode::CONFLICT,
                "invalid_request_error",
                Some(param),
                Some("continuation_unavailable"),
            ),
            ApiError::Unauthorized => (
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                None,
                Some("invalid_api_key"),
            ),
            ApiError::Internal(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                None,
                None,
            ),
        }
    }

    pub fn status(&self) -> StatusCode {
        self.parts().0
    }

    /// A short label for metrics: why the request failed.
    pub fn reason(&self) -> &'static str {
        match self {
            ApiError::BadRequest { .. } => "bad_request",
            ApiError::UnknownModel(_) => "unknown_model",
            ApiError::ContextLength { .. } => "context_length",
            ApiError::TooLarge { .. } => "body_too_large",
            ApiError::BodyTimeout { .. } => "body_timeout",
            ApiError::UnsupportedMediaType { .. } => "unsupported_media_type",
            ApiError::MethodNotAllowed { .. } => "method_not_allowed",
            ApiError::Busy { reason, .. } => reason,
            ApiError::NotFound(_) => "not_found",
            ApiError::Conflict { .. } => "continuation_unavailable",
            ApiError::Unauthorized => "unauthorized",
            ApiError::Internal(_) => "internal",
        }
    }

    /// The OpenAI error body.
    pub fn openai_body(&self) -> OpenAiEnvelope<'_> {
        let (_, kind, param, code) = self.parts();
        OpenAiEnvelope {
            error: OpenAiBody {
                message: self.to_string(),
                kind,
                param,
                code,
            },
        }
    }

    /// The Anthropic error body.
    pub fn anthropic_body(&self) -> AnthropicEnvelope {
        let kind = match self {
            ApiError::BadRequest { .. }
            | ApiError::ContextLength { .. }
            | ApiError::BodyTimeout { .. }
            | ApiError::UnsupportedMediaType { .. }
            | ApiError::MethodNotAllowed { .. }
            | ApiError::Conflict { .. } => "invalid_request_error",
            ApiError::UnknownModel(_) | ApiError::NotFound(_) => "not_found_error",
            ApiError::TooLarge { .. } => "request_too_large",
            ApiError::Busy { .. } => "overloaded_error",
            ApiError::Unauthorized => "authentication_error",
            ApiError::Internal(_) => "api_error",
        };
        AnthropicEnvelope {
            kind: "error",
            error: AnthropicBody {
                kind,
                message: self.to_string(),
            },
        }
    }

    /// This error as a response in the Anthropic envelope.
    pub fn anthropic(self) -> Response {
        let body = Json(self.anthropic_body()).into_response();
        self.respond(body)
    }

    /// This error in the envelope of the API that serves `path`: Anthropic
    /// under `/v1/messages`, OpenAI elsewhere.
    pub fn for_path(self, path: &str) -> Response {
        if path.starts_with("/v1/messages") {
            self.anthropic()
        } else {
            self.into_response()
        }
    }

    /// `body` with this error's status (and `Retry-After` when busy,
    /// `Allow` when the method is wrong, `Connection: close` when the
    /// request body is left unread), logged by severity.
    fn respond(self, body: Response) -> Response {
        let status = self.status();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            // Load shedding, not a fault: the client retries.
            tracing::warn!(error = %self, reason = self.reason(), "request refused");
        } else if status.is_server_error() {
            tracing::error!(error = %self, "request failed");
        } else {
            tracing::info!(error = %self, status = status.as_u16(), "request refused");
        }
        let mut resp = (status, body).into_response();
        let h = resp.headers_mut();
        match &self {
            ApiError::Busy { .. } => {
                h.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            ApiError::MethodNotAllowed { allow, .. } if !allow.is_empty() => {
                if let Ok(v) = HeaderValue::from_str(allow) {
                    h.insert(header::ALLOW, v);
                }
            }
            ApiError::TooLarge { .. } | ApiError::BodyTimeout { .. } => {
                h.insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            _ => {}
        }
        resp
    }

    /// A body-reading failure, given the configured size limit.
    pub fn from_rejection(r: BytesRejection, limit: usize) -> ApiError {
        if let Some(t) = BodyTimeout::find(&r) {
            ApiError::BodyTimeout { secs: t.secs }
        } else if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::TooLarge { limit }
        } else {
            ApiError::BadRequest {
                message: format!("cannot read request body: {r}"),
                param: None,
            }
        }
    }
}

/// The OpenAI envelope is the default rendering.
impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Json(self.openai_body()).into_response();
        self.respond(body)
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> ApiError {
        match e {
            SubmitError::Busy(_) => ApiError::Busy {
                message: e.to_string(),
                reason: "busy_queue",
            },
            SubmitError::NoMemory(_) => ApiError::Busy {
                message: e.to_string(),
                reason: "busy_memory",
            },
            SubmitError::Stopped => ApiError::Internal(e.to_string()),
        }
    }
}

impl From<GenerateError> for ApiError {
    fn from(e: GenerateError) -> ApiError {
        match e {
            GenerateError::PromptTooLong { prompt, ctx } => ApiError::ContextLength { prompt, ctx },
            GenerateError::EmptyPrompt => ApiError::bad("the prompt is empty", "messages"),
            GenerateError::Model(m) => ApiError::Internal(m.to_string()),
            GenerateError::BatchFailed(_) => ApiError::Internal(e.to_string()),
        }
    }
}

/// Parse a JSON body into `T`. A refusal names the place in the body
/// (`messages[2].content[0].type: unknown variant ...`) with serde's
/// message (line, column, what was expected), and the top-level field as
/// its `param`.
pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let bad = |message: String, param| ApiError::BadRequest {
        message: format!("invalid JSON body: {message}"),
        param,
    };
    let mut de = serde_json::Deserializer::from_slice(body);
    let t = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let param = match e.path().iter().next() {
            Some(Segment::Map { key }) => Some(Cow::Owned(key.clone())),
            _ => None,
        };
        bad(e.to_string(), param)
    })?;
    // Nothing but whitespace after the value.
    de.end().map_err(|e| bad(e.to_string(), None))?;
    Ok(t)
}

/// The fallback: no route for the path, in the envelope of its API.
pub async fn not_found(uri: Uri) -> Response {
    ApiError::NotFound(uri.path().to_string()).for_path(uri.path())
}

/// Refusals of request bodies, for the surfaces' tests.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// The message and param of the refusal of `body` as a `T`.
    pub fn refusal<T: serde::de::DeserializeOwned + std::fmt::Debug>(
        body: &str,
    ) -> (String, Option<String>) {
        match parse_json::<T>(body.as_bytes()) {
            Err(ApiError::BadRequest { message, param }) => (message, param.map(Cow::into_owned)),
            other => panic!("{other:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Request {
        messages: Vec<Message>,
    }

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Message {
        role: String,
    }

    fn refusal(body: &str) -> (String, Option<String>) {
        testing::refusal::<Request>(body)
    }

    #[test]
    fn a_parse_error_names_its_place_and_field() {
        let (m, param) = refusal(r#"{"messages": [{"role": "user"}, {"role": 5}]}"#);
        assert!(
            m.starts_with("invalid JSON body: messages[1].role: invalid type: integer `5`"),
            "{m}"
        );
        assert_eq!(param.as_deref(), Some("messages"));
        let (m, param) = refusal(r#"{"messages": ["#);
        assert!(m.starts_with("invalid JSON body: messages: EOF"), "{m}");
        assert_eq!(param.as_deref(), Some("messages"));
        // Not in any field: no param.
        let (m, param) = refusal("{}");
        assert!(m.contains("missing field `messages`"), "{m}");
        assert_eq!(param, None);
        let (m, param) = refusal(r#"{"messages": []} x"#);
        assert!(m.contains("trailing characters"), "{m}");
        assert_eq!(param, None);
    }

    #[test]
    fn envelopes_carry_the_param() {
        let e = ApiError::bad("nope", "tools");
        let v = serde_json::to_value(e.openai_body()).unwrap();
        assert_eq!(v["error"]["param"], "tools");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        let v = serde_json::to_value(e.anthropic_body()).unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["message"], "nope");
    }
}

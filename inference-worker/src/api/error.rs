//! The internal API error and its two envelopes: OpenAI
//! (`{"error": {"message", "type", "param", "code"}}`) and Anthropic
//! (`{"type": "error", "error": {"type", "message"}}`).

use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

use crate::engine::SubmitError;
use crate::generate::GenerateError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The request is malformed or asks for something we cannot honour.
    #[error("{message}")]
    BadRequest {
        message: String,
        param: Option<&'static str>,
    },
    #[error("the model {0:?} is not served here")]
    UnknownModel(String),
    #[error("prompt is too long: {prompt} tokens, but this server's context is {ctx} tokens (prompt plus completion)")]
    ContextLength { prompt: usize, ctx: usize },
    #[error("request body is larger than the {limit}-byte limit")]
    TooLarge { limit: usize },
    /// Retryable: the queue is full (`queue`) or the memory budget is
    /// reserved by running requests (`memory`).
    #[error("{message}")]
    Busy {
        message: String,
        reason: &'static str,
    },
    #[error("no route for {0}")]
    NotFound(String),
    #[error("missing or wrong API key: send Authorization: Bearer KEY or x-api-key: KEY")]
    Unauthorized,
    #[error("internal error: {0}")]
    Internal(String),
}

#[derive(Serialize)]
struct Envelope<'a> {
    error: Body<'a>,
}

#[derive(Serialize)]
struct Body<'a> {
    message: String,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

impl ApiError {
    pub fn bad(message: impl Into<String>, param: &'static str) -> ApiError {
        ApiError::BadRequest {
            message: message.into(),
            param: Some(param),
        }
    }

    fn parts(
        &self,
    ) -> (
        StatusCode,
        &'static str,
        Option<&'static str>,
        Option<&'static str>,
    ) {
        match self {
            ApiError::BadRequest { param, .. } => (
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                *param,
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
            ApiError::Busy { reason, .. } => reason,
            ApiError::NotFound(_) => "not_found",
            ApiError::Unauthorized => "unauthorized",
            ApiError::Internal(_) => "internal",
        }
    }

    /// The OpenAI error body.
    pub fn openai_body(&self) -> serde_json::Value {
        let (_, kind, param, code) = self.parts();
        serde_json::to_value(Envelope {
            error: Body {
                message: self.to_string(),
                kind,
                param,
                code,
            },
        })
        .unwrap_or_default()
    }

    /// The Anthropic error body.
    pub fn anthropic_body(&self) -> serde_json::Value {
        let kind = match self {
            ApiError::BadRequest { .. } | ApiError::ContextLength { .. } => "invalid_request_error",
            ApiError::UnknownModel(_) | ApiError::NotFound(_) => "not_found_error",
            ApiError::TooLarge { .. } => "request_too_large",
            ApiError::Busy { .. } => "overloaded_error",
            ApiError::Unauthorized => "authentication_error",
            ApiError::Internal(_) => "api_error",
        };
        serde_json::to_value(AnthropicEnvelope {
            kind: "error",
            error: AnthropicBody {
                kind,
                message: self.to_string(),
            },
        })
        .unwrap_or_default()
    }

    /// This error as a response in the Anthropic envelope.
    pub fn anthropic(self) -> Response {
        let body = self.anthropic_body();
        self.respond(body)
    }

    fn respond(self, body: serde_json::Value) -> Response {
        let status = self.status();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            // Load shedding, not a fault: the client retries.
            tracing::warn!(error = %self, reason = self.reason(), "request refused");
        } else if status.is_server_error() {
            tracing::error!(error = %self, "request failed");
        } else {
            tracing::info!(error = %self, status = status.as_u16(), "request refused");
        }
        let mut resp = (status, Json(body)).into_response();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            resp.headers_mut()
                .insert("retry-after", HeaderValue::from_static("1"));
        }
        resp
    }

    /// A body-reading failure, given the configured size limit.
    pub fn from_rejection(r: BytesRejection, limit: usize) -> ApiError {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::TooLarge { limit }
        } else {
            ApiError::BadRequest {
                message: format!("cannot read request body: {r}"),
                param: None,
            }
        }
    }
}

#[derive(Serialize)]
struct AnthropicEnvelope<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    error: AnthropicBody<'a>,
}

#[derive(Serialize)]
struct AnthropicBody<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    message: String,
}

/// The OpenAI envelope is the default rendering.
impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = self.openai_body();
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

/// Parse a JSON body into `T`, with serde's message (line, column, field)
/// in the error.
pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::BadRequest {
        message: format!("invalid JSON body: {e}"),
        param: None,
    })
}

pub async fn not_found(uri: Uri) -> ApiError {
    ApiError::NotFound(uri.path().to_string())
}

//! `POST /v1/chat/completions` (OpenAI Chat Completions), non-streaming.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::Json;
use ds4_model::prompt::ChatMessage;
use serde::{Deserialize, Serialize};

use super::error::parse_json;
use super::{ApiError, AppState};
use crate::generate::{FinishReason, GenerateRequest, Generation};
use crate::runtime::PromptError;
use crate::sampler::SamplingParams;

#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    #[serde(default)]
    pub model: String,
    pub messages: Vec<WireMessage>,
    pub max_tokens: Option<u32>,
    pub max_completion_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<u32>,
    pub min_p: Option<f32>,
    pub seed: Option<u64>,
    pub stop: Option<Stop>,
    #[serde(default)]
    pub stream: bool,
    pub n: Option<u32>,
}

#[derive(Debug, Deserialize)]
pub struct WireMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
}

/// Message content: a string, or an array of parts of which text parts count.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Serialize)]
pub struct ChatResponse {
    id: String,
    object: &'static str,
    created: u64,
    model: String,
    choices: Vec<Choice>,
    usage: Usage,
    timings: TimingsOut,
}

#[derive(Serialize)]
struct Choice {
    index: u32,
    message: OutMessage,
    finish_reason: &'static str,
    logprobs: Option<()>,
}

#[derive(Serialize)]
struct OutMessage {
    role: &'static str,
    content: String,
}

#[derive(Serialize)]
struct Usage {
    prompt_tokens: usize,
    completion_tokens: usize,
    total_tokens: usize,
    prompt_tokens_details: PromptDetails,
}

#[derive(Serialize)]
struct PromptDetails {
    cached_tokens: usize,
}

/// Server-side timings of the request.
#[derive(Serialize)]
struct TimingsOut {
    ttft_ms: f64,
    prompt_tokens: usize,
    cached_tokens: usize,
    prefill_tokens_per_s: f64,
    decode_tokens_per_s: f64,
}

/// Roles a message may have.
const ROLES: &[&str] = &["system", "developer", "user", "assistant", "tool"];

fn to_messages(wire: Vec<WireMessage>) -> Result<Vec<ChatMessage>, ApiError> {
    if wire.is_empty() {
        return Err(ApiError::bad("messages must not be empty", "messages"));
    }
    wire.into_iter()
        .enumerate()
        .map(|(i, m)| {
            if !ROLES.contains(&m.role.as_str()) {
                return Err(ApiError::bad(
                    format!("messages[{i}].role {:?} is not one of {}", m.role, ROLES.join(", ")),
                    "messages",
                ));
            }
            let content = match m.content {
                None => String::new(),
                Some(Content::Text(t)) => t,
                Some(Content::Parts(parts)) => {
                    let mut text = String::new();
                    for (j, p) in parts.into_iter().enumerate() {
                        match (p.kind.as_str(), p.text) {
                            ("text", Some(t)) => text.push_str(&t),
                            (kind, _) => {
                                return Err(ApiError::bad(
                                    format!("messages[{i}].content[{j}]: part type {kind:?} is not supported (text only)"),
                                    "messages",
                                ))
                            }
                        }
                    }
                    text
                }
            };
            // Templates without a developer role get it as system.
            let role = if m.role == "developer" { "system".to_string() } else { m.role };
            Ok(ChatMessage { role, content })
        })
        .collect()
}

fn sampling(req: &ChatRequest) -> Result<SamplingParams, ApiError> {
    let d = SamplingParams::default();
    let p = SamplingParams {
        temperature: req.temperature.unwrap_or(d.temperature),
        top_k: req.top_k.map_or(d.top_k, |k| k as usize),
        top_p: req.top_p.unwrap_or(d.top_p),
        min_p: req.min_p.unwrap_or(d.min_p),
        seed: req.seed,
    };
    p.validate().map_err(|m| ApiError::bad(m, "temperature"))?;
    Ok(p)
}

pub async fn handle(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<ChatResponse>, ApiError> {
    let req: ChatRequest = parse_json(&body?)?;
    if !state.serves(&req.model) {
        return Err(ApiError::UnknownModel(req.model));
    }
    if req.stream {
        return Err(ApiError::bad(
            "streaming is not supported by this server yet; send stream: false",
            "stream",
        ));
    }
    if req.n.is_some_and(|n| n != 1) {
        return Err(ApiError::bad("only n = 1 is supported", "n"));
    }
    let sampling = sampling(&req)?;
    let stop = match req.stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s],
        Some(Stop::Many(v)) if v.len() <= 16 => v,
        Some(Stop::Many(_)) => {
            return Err(ApiError::bad("at most 16 stop strings are allowed", "stop"))
        }
    };
    let messages = to_messages(req.messages)?;
    let prompter = state.prompter.clone();
    let (_, prompt) = tokio::task::spawn_blocking(move || prompter.chat_prompt(&messages))
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?
        .map_err(|e| match e {
            PromptError::Template(t) => ApiError::bad(
                format!("the chat template refused the messages: {t}"),
                "messages",
            ),
            other => ApiError::Internal(other.to_string()),
        })?;
    if prompt.len() >= state.ctx {
        return Err(ApiError::ContextLength {
            prompt: prompt.len(),
            ctx: state.ctx,
        });
    }
    let room = state.ctx - prompt.len();
    let max_tokens = req
        .max_completion_tokens
        .or(req.max_tokens)
        .map_or(room, |m| (m as usize).min(room));
    if max_tokens == 0 {
        return Err(ApiError::bad("max_tokens must be at least 1", "max_tokens"));
    }
    let rx = state.engine.submit(GenerateRequest {
        prompt,
        max_tokens,
        sampling,
        stop,
    })?;
    let generation = rx
        .await
        .map_err(|_| ApiError::Internal("the engine dropped the request".into()))??;
    Ok(Json(response(&state, generation)))
}

fn response(state: &AppState, g: Generation) -> ChatResponse {
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let t = &g.timings;
    ChatResponse {
        id: format!("chatcmpl-{}", uuid_like()),
        object: "chat.completion",
        created,
        model: state.model_id.clone(),
        choices: vec![Choice {
            index: 0,
            message: OutMessage {
                role: "assistant",
                content: g.text.clone(),
            },
            finish_reason: match g.finish {
                FinishReason::Stop | FinishReason::Cancelled => "stop",
                FinishReason::Length => "length",
            },
            logprobs: None,
        }],
        usage: Usage {
            prompt_tokens: t.prompt_tokens,
            completion_tokens: t.generated_tokens,
            total_tokens: t.prompt_tokens + t.generated_tokens,
            prompt_tokens_details: PromptDetails {
                cached_tokens: t.cached_tokens,
            },
        },
        timings: TimingsOut {
            ttft_ms: t.ttft_ms(),
            prompt_tokens: t.prompt_tokens,
            cached_tokens: t.cached_tokens,
            prefill_tokens_per_s: t.prefill_tps(),
            decode_tokens_per_s: t.decode_tps(),
        },
    }
}

/// A random 24-hex-digit id.
fn uuid_like() -> String {
    use rand::Rng;
    let v: u128 = rand::rng().random();
    format!("{:024x}", v >> 32)
}

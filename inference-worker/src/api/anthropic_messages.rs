//! `POST /v1/messages` and `POST /v1/messages/count_tokens` (Anthropic
//! Messages), JSON and SSE, errors in the Anthropic envelope.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::convo::{self, schema_or_empty, Conversation, Role, Turn};
use super::error::parse_json;
use super::run::{self, Delta, Finish, Frame, Job, Shape, TimingsOut};
use super::{ApiError, AppState, Reply, SamplingFields};
use crate::generate::FinishReason;
use crate::tools::{new_call_id, ToolCall, ToolChoice, ToolSpec};

const SURFACE: &str = "messages";

/// A Messages request. Fields we do not act on (`thinking`, `metadata`,
/// `context_management`, `output_config`, ...) are accepted and ignored:
/// reasoning goes out as thinking blocks whenever the family produces it.
#[derive(Debug, Deserialize)]
pub struct MessagesRequest {
    #[serde(default)]
    pub model: String,
    pub max_tokens: Option<u32>,
    pub system: Option<Text>,
    pub messages: Vec<WireMessage>,
    #[serde(default)]
    pub tools: Vec<WireTool>,
    pub tool_choice: Option<WireToolChoice>,
    #[serde(flatten)]
    pub sampling: SamplingFields,
    #[serde(default)]
    pub stop_sequences: Vec<String>,
    #[serde(default)]
    pub stream: bool,
}

/// A string or a list of content blocks.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Text {
    Plain(String),
    Blocks(Vec<Value>),
}

#[derive(Debug, Deserialize)]
pub struct WireMessage {
    pub role: String,
    pub content: Text,
}

#[derive(Debug, Deserialize)]
pub struct WireTool {
    pub name: String,
    pub description: Option<String>,
    /// Absent for server tools (web search and the like), which are skipped.
    pub input_schema: Option<Value>,
}

#[derive(Debug, Deserialize)]
pub struct WireToolChoice {
    #[serde(rename = "type")]
    pub kind: String,
    pub name: Option<String>,
}

/// The text of a block list (text blocks only; others are an error).
fn plain(t: &Text, what: &str) -> Result<String, ApiError> {
    match t {
        Text::Plain(s) => Ok(s.clone()),
        Text::Blocks(blocks) => {
            let mut s = String::new();
            for b in blocks {
                match b.get("type").and_then(Value::as_str) {
                    Some("text") => s.push_str(b.get("text").and_then(Value::as_str).unwrap_or("")),
                    other => {
                        return Err(ApiError::bad(
                            format!(
                                "{what}: block type {other:?} is not supported here (text only)"
                            ),
                            "messages",
                        ))
                    }
                }
            }
            Ok(s)
        }
    }
}

fn conversation(req: &MessagesRequest) -> Result<Conversation, ApiError> {
    let mut c = Conversation::default();
    if let Some(s) = &req.system {
        let s = plain(s, "system")?;
        if !s.is_empty() {
            c.push_text(Role::System, &s);
        }
    }
    for (i, m) in req.messages.iter().enumerate() {
        let role = match m.role.as_str() {
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "system" => Role::System,
            other => {
                return Err(ApiError::bad(
                    format!("messages.{i}.role {other:?} is not one of user, assistant"),
                    "messages",
                ))
            }
        };
        let blocks = match &m.content {
            Text::Plain(s) => {
                c.push_text(role, s);
                continue;
            }
            Text::Blocks(b) => b,
        };
        for (j, b) in blocks.iter().enumerate() {
            let field = |k: &str| b.get(k).and_then(Value::as_str).map(str::to_string);
            match b.get("type").and_then(Value::as_str) {
                Some("text") => c.push_text(role, &field("text").unwrap_or_default()),
                Some("tool_use") => {
                    let call = ToolCall {
                        id: field("id").unwrap_or_default(),
                        name: field("name").ok_or_else(|| {
                            ApiError::bad(format!("messages.{i}.content.{j}: tool_use needs a name"), "messages")
                        })?,
                        arguments: b.get("input").cloned().unwrap_or_else(|| json!({})).to_string(),
                    };
                    match c.turns.last_mut() {
                        Some(t) if t.role == Role::Assistant => t.calls.push(call),
                        _ => {
                            let mut t = Turn::new(Role::Assistant, "");
                            t.calls.push(call);
                            c.turns.push(t);
                        }
                    }
                }
                Some("tool_result") => {
                    let content = match b.get("content") {
                        None | Some(Value::Null) => String::new(),
                        Some(Value::String(s)) => s.clone(),
                        Some(Value::Array(parts)) => parts
                            .iter()
                            .filter_map(|p| p.get("text").and_then(Value::as_str))
                            .collect::<Vec<_>>()
                            .join("\n"),
                        Some(other) => other.to_string(),
                    };
                    c.turns.push(Turn::new(Role::Tool, content));
                }
                // Earlier thinking is not shown to the model again.
                Some("thinking" | "redacted_thinking") => {}
                other => {
                    return Err(ApiError::bad(
                        format!("messages.{i}.content.{j}: block type {other:?} is not supported (text, tool_use, tool_result, thinking)"),
                        "messages",
                    ))
                }
            }
        }
    }
    c.tools = req
        .tools
        .iter()
        .filter(|t| t.input_schema.is_some())
        .map(|t| ToolSpec {
            name: t.name.clone(),
            description: t.description.clone(),
            parameters: schema_or_empty(t.input_schema.clone()),
        })
        .collect();
    c.choice = match &req.tool_choice {
        None => ToolChoice::Auto,
        Some(tc) => match (tc.kind.as_str(), &tc.name) {
            ("auto", _) => ToolChoice::Auto,
            ("none", _) => ToolChoice::None,
            ("any", _) => ToolChoice::Required,
            ("tool", Some(n)) => ToolChoice::Named(n.clone()),
            _ => {
                return Err(ApiError::bad(
                    "tool_choice.type must be auto, any, none, or tool with a name",
                    "tool_choice",
                ))
            }
        },
    };
    Ok(c)
}

fn check(state: &AppState, req: &MessagesRequest) -> Result<(), ApiError> {
    if !state.serves(&req.model) {
        return Err(ApiError::UnknownModel(req.model.clone()));
    }
    Ok(())
}

async fn render(state: &AppState, req: &MessagesRequest) -> Result<convo::Rendered, ApiError> {
    let convo = conversation(req)?;
    let prompter = state.prompter.clone();
    tokio::task::spawn_blocking(move || convo::render(&prompter, &convo, "toolu_"))
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?
}

pub async fn count_tokens(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let r = async {
        let req: MessagesRequest = parse_json(&state.body(body)?)?;
        check(&state, &req)?;
        let rendered = render(&state, &req).await?;
        Ok::<_, ApiError>(Reply::Json(
            Json(json!({"input_tokens": rendered.tokens.len()})).into_response(),
        ))
    }
    .await;
    state.count("count_tokens", &r);
    match r {
        Ok(reply) => reply.into_response(),
        Err(e) => e.anthropic(),
    }
}

pub async fn handle(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let r = inner(state.clone(), body).await;
    state.count(SURFACE, &r);
    match r {
        Ok(reply) => reply.into_response(),
        Err(e) => e.anthropic(),
    }
}

async fn inner(
    state: Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Reply, ApiError> {
    let req: MessagesRequest = parse_json(&state.body(body)?)?;
    check(&state, &req)?;
    let max_tokens = req
        .max_tokens
        .ok_or_else(|| ApiError::bad("max_tokens: field required", "max_tokens"))?;
    let sampling = req.sampling.params()?;
    if req.stop_sequences.len() > 16 {
        return Err(ApiError::bad(
            "at most 16 stop_sequences are allowed",
            "stop_sequences",
        ));
    }
    let rendered = render(&state, &req).await?;
    let prompt_tokens = rendered.tokens.len();
    let job = Job {
        prompt: rendered.tokens,
        max_tokens: Some(max_tokens),
        sampling,
        stop: req.stop_sequences.clone(),
        logprobs: None,
        tools: rendered.tools,
    };
    let run = run::start(&state, job)?;
    let id = new_call_id("msg_");
    let model = state.model_id.clone();
    if req.stream {
        let shape = MessagesStream {
            id,
            model,
            prompt_tokens,
            index: 0,
            open: None,
        };
        return Ok(Reply::Stream(run::sse(state.clone(), SURFACE, run, shape)));
    }
    let (c, f) = run::collect(run).await?;
    let mut content = Vec::new();
    if !c.reasoning.is_empty() {
        content.push(Block::Thinking {
            thinking: c.reasoning,
            signature: String::new(),
        });
    }
    if !c.text.is_empty() || c.calls.is_empty() {
        content.push(Block::Text { text: c.text });
    }
    for call in c.calls {
        content.push(Block::ToolUse {
            id: call.id,
            name: call.name,
            input: input_of(&call.arguments),
        });
    }
    let (stop_reason, stop_sequence) = stop_reason(&f);
    Ok(Reply::Json(
        Json(MessageObject {
            id,
            kind: "message",
            role: "assistant",
            model,
            content,
            stop_reason: Some(stop_reason),
            stop_sequence,
            usage: usage(&f),
            timings: Some(f.timings_out()),
        })
        .into_response(),
    ))
}

fn input_of(arguments: &str) -> Value {
    serde_json::from_str(arguments).unwrap_or_else(|_| json!({}))
}

fn stop_reason(f: &Finish) -> (&'static str, Option<String>) {
    if f.calls > 0 {
        return ("tool_use", None);
    }
    match (f.reason, &f.stop_string) {
        (FinishReason::Length, _) => ("max_tokens", None),
        (_, Some(s)) => ("stop_sequence", Some(s.clone())),
        _ => ("end_turn", None),
    }
}

fn usage(f: &Finish) -> Usage {
    Usage {
        input_tokens: f.prompt_tokens() - f.timings.cached_tokens,
        output_tokens: f.completion_tokens(),
        cache_read_input_tokens: f.timings.cached_tokens,
        cache_creation_input_tokens: 0,
    }
}

#[derive(Serialize)]
struct MessageObject {
    id: String,
    #[serde(rename = "type")]
    kind: &'static str,
    role: &'static str,
    model: String,
    content: Vec<Block>,
    stop_reason: Option<&'static str>,
    stop_sequence: Option<String>,
    usage: Usage,
    #[serde(skip_serializing_if = "Option::is_none")]
    timings: Option<TimingsOut>,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Block {
    Text {
        text: String,
    },
    Thinking {
        thinking: String,
        signature: String,
    },
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
}

#[derive(Serialize)]
struct Usage {
    input_tokens: usize,
    output_tokens: usize,
    cache_read_input_tokens: usize,
    cache_creation_input_tokens: usize,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum OpenBlock {
    Text,
    Thinking,
}

struct MessagesStream {
    id: String,
    model: String,
    prompt_tokens: usize,
    /// Index of the next content block.
    index: usize,
    open: Option<OpenBlock>,
}

fn ev(kind: &'static str, data: Value) -> Frame {
    run::event(Some(kind), &data)
}

impl MessagesStream {
    fn close(&mut self, out: &mut Vec<Frame>) {
        if self.open.take().is_some() {
            out.push(ev(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": self.index}),
            ));
            self.index += 1;
        }
    }

    fn text(&mut self, out: &mut Vec<Frame>, t: String, kind: OpenBlock) {
        if self.open != Some(kind) {
            self.close(out);
            let block = match kind {
                OpenBlock::Text => json!({"type": "text", "text": ""}),
                OpenBlock::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
            };
            out.push(ev(
                "content_block_start",
                json!({"type": "content_block_start", "index": self.index, "content_block": block}),
            ));
            self.open = Some(kind);
        }
        let delta = match kind {
            OpenBlock::Text => json!({"type": "text_delta", "text": t}),
            OpenBlock::Thinking => json!({"type": "thinking_delta", "thinking": t}),
        };
        out.push(ev(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": self.index, "delta": delta}),
        ));
    }
}

impl Shape for MessagesStream {
    fn start(&mut self) -> Vec<Frame> {
        let message = MessageObject {
            id: self.id.clone(),
            kind: "message",
            role: "assistant",
            model: self.model.clone(),
            content: Vec::new(),
            stop_reason: None,
            stop_sequence: None,
            usage: Usage {
                input_tokens: self.prompt_tokens,
                output_tokens: 0,
                cache_read_input_tokens: 0,
                cache_creation_input_tokens: 0,
            },
            timings: None,
        };
        vec![ev(
            "message_start",
            json!({"type": "message_start", "message": message}),
        )]
    }

    fn deltas(&mut self, deltas: Vec<Delta>) -> Vec<Frame> {
        let mut out = Vec::new();
        for d in deltas {
            match d {
                Delta::Token { .. } => {}
                Delta::Text(t) => self.text(&mut out, t, OpenBlock::Text),
                Delta::Reasoning(t) => self.text(&mut out, t, OpenBlock::Thinking),
                Delta::Call(c) => {
                    self.close(&mut out);
                    let i = self.index;
                    out.push(ev("content_block_start", json!({"type": "content_block_start", "index": i, "content_block": {"type": "tool_use", "id": c.id, "name": c.name, "input": {}}})));
                    out.push(ev("content_block_delta", json!({"type": "content_block_delta", "index": i, "delta": {"type": "input_json_delta", "partial_json": c.arguments}})));
                    out.push(ev(
                        "content_block_stop",
                        json!({"type": "content_block_stop", "index": i}),
                    ));
                    self.index += 1;
                }
            }
        }
        out
    }

    fn finish(&mut self, f: &Finish) -> Vec<Frame> {
        let mut out = Vec::new();
        if self.index == 0 && self.open.is_none() {
            // An empty answer still has its text block.
            self.text(&mut out, String::new(), OpenBlock::Text);
        }
        self.close(&mut out);
        let (reason, seq) = stop_reason(f);
        let usage = usage(f);
        out.push(ev("message_delta", json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": seq}, "usage": usage, "timings": f.timings_out()})));
        out.push(ev("message_stop", json!({"type": "message_stop"})));
        out
    }

    fn error(&mut self, e: &ApiError) -> Vec<Frame> {
        vec![ev("error", e.anthropic_body())]
    }

    fn ping(&mut self) -> Option<Frame> {
        Some(ev("ping", json!({"type": "ping"})))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::run::testing::{drive, envelope_run, failing_run, thinking_run};

    fn shape() -> MessagesStream {
        MessagesStream {
            id: "msg_1".into(),
            model: "m".into(),
            prompt_tokens: 20,
            index: 0,
            open: None,
        }
    }

    fn events(frames: &[Frame]) -> Vec<(&'static str, Value)> {
        frames
            .iter()
            .map(|f| {
                let v: Value = serde_json::from_str(&f.data).unwrap();
                assert_eq!(v["type"].as_str(), f.event);
                (f.event.unwrap(), v)
            })
            .collect()
    }

    #[tokio::test]
    async fn streamed_tool_use_has_the_messages_event_sequence() {
        let ev = events(&drive(envelope_run(None), shape()).await);
        let names: Vec<&str> = ev.iter().map(|e| e.0).collect();
        let n = names.len();
        assert_eq!(names[..2], ["message_start", "content_block_start"]);
        assert_eq!(
            names[n - 6..],
            [
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        assert_eq!(ev[0].1["message"]["usage"]["input_tokens"], 20);
        let text: String = ev
            .iter()
            .filter_map(|e| e.1["delta"]["text"].as_str())
            .collect();
        assert_eq!(text, "Let me check.\n");
        let start = &ev[n - 5].1;
        assert_eq!(start["index"], 1);
        assert_eq!(start["content_block"]["type"], "tool_use");
        assert_eq!(start["content_block"]["name"], "get_weather");
        assert!(start["content_block"]["id"]
            .as_str()
            .unwrap()
            .starts_with("call_"));
        let delta = &ev[n - 4].1["delta"];
        assert_eq!(delta["type"], "input_json_delta");
        assert_eq!(delta["partial_json"], "{\"city\":\"Paris\"}");
        assert_eq!(ev[n - 3].1["index"], 1);
        assert_eq!(ev[n - 2].1["delta"]["stop_reason"], "tool_use");
        assert_eq!(ev[n - 2].1["usage"]["output_tokens"], 9);
    }

    #[tokio::test]
    async fn reasoning_goes_out_as_a_thinking_block() {
        let ev = events(&drive(thinking_run(), shape()).await);
        let starts: Vec<&Value> = ev
            .iter()
            .filter(|e| e.0 == "content_block_start")
            .map(|e| &e.1["content_block"]["type"])
            .collect();
        assert_eq!(starts, ["thinking", "text"]);
        let thinking: String = ev
            .iter()
            .filter_map(|e| e.1["delta"]["thinking"].as_str())
            .collect();
        assert_eq!(thinking, "France's capital is Paris.");
    }

    #[tokio::test]
    async fn an_error_after_the_stream_started_is_an_error_event() {
        let frames = drive(failing_run(&["Hi"]), shape()).await;
        let last = frames.last().unwrap();
        assert_eq!(last.event, Some("error"));
        let v: Value = serde_json::from_str(&last.data).unwrap();
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "api_error");
    }

    #[test]
    fn errors_use_the_anthropic_envelope() {
        let body = ApiError::bad("nope", "messages").anthropic_body();
        assert_eq!(body["type"], "error");
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!(body["error"]["message"], "nope");
    }
}

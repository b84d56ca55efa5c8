//! `POST /v1/messages` and `POST /v1/messages/count_tokens` (Anthropic
//! Messages), JSON and SSE, errors in the Anthropic envelope.

use std::sync::Arc;

use axum::body::Bytes;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::convo::{self, FunctionDef, TextOr, ThinkingConfig, ToolShape};
use super::fields::ToolName;
use super::run::{self, Delta, Finish, Frame, Job, Shape, TimingsOut};
use super::structured::{self, OutputFormat};
use super::tool_slip;
use super::{ApiError, AppState, Reply, SamplingFields, Surface};
use crate::generate::FinishReason;
use ds4_model::chat::{new_call_id, Conversation, Rendered, Role, ToolCall, ToolChoice, Turn};

/// A Messages request. Fields we do not act on (`metadata`,
/// `context_management`, `output_config`, ...) are accepted and ignored.
/// Reasoning goes out as thinking blocks whenever the family produces it;
/// `thinking` selects the thinking mode of families that think.
#[derive(Debug, Deserialize)]
pub struct MessagesRequest {
    #[serde(default)]
    pub model: String,
    pub max_tokens: Option<u32>,
    /// A string, or a list of text blocks.
    pub system: Option<TextOr<TextBlock>>,
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
    /// `{"type": "enabled", "budget_tokens": N}` or `{"type": "disabled"}`.
    pub thinking: Option<ThinkingConfig>,
    /// Read (so that a wrong type is refused); no effect here.
    #[allow(dead_code)]
    pub metadata: Option<WireMetadata>,
    /// Structured output (`format`) and the thinking tier (`effort`).
    pub output_config: Option<OutputConfig>,
}

/// `output_config`.
#[derive(Debug, Deserialize)]
pub struct OutputConfig {
    pub format: Option<OutputFormat>,
    /// `low` … `max`: the thinking tier, as `reasoning_effort` names it.
    pub effort: Option<String>,
}

/// Anthropic's `metadata`: an end-user id.
#[derive(Debug, Deserialize)]
pub struct WireMetadata {
    #[allow(dead_code)]
    pub user_id: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct WireMessage {
    pub role: WireRole,
    /// A string, or a list of content blocks.
    pub content: TextOr<ContentBlock>,
}

#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WireRole {
    User,
    Assistant,
    System,
}

impl From<WireRole> for Role {
    fn from(r: WireRole) -> Role {
        match r {
            WireRole::User => Role::User,
            WireRole::Assistant => Role::Assistant,
            WireRole::System => Role::System,
        }
    }
}

/// A block of the system prompt: text only.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TextBlock {
    Text {
        #[serde(default)]
        text: String,
    },
}

/// A block of a message's content.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    Text {
        #[serde(default)]
        text: String,
    },
    ToolUse {
        #[serde(default)]
        id: String,
        name: String,
        /// The call's arguments, passed through (`{}` when absent).
        #[serde(default)]
        input: Option<Value>,
    },
    ToolResult {
        #[serde(default)]
        tool_use_id: Option<String>,
        #[serde(default)]
        content: Option<ToolResultContent>,
    },
    /// Earlier thinking, for families that keep it.
    Thinking {
        #[serde(default)]
        thinking: String,
    },
    RedactedThinking,
}

/// A tool result's `content`: text, or blocks of which those with text
/// count (one a line); anything else reaches the model as its JSON text.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum ToolResultContent {
    Content(TextOr<ResultBlock>),
    Json(Value),
}

/// A block of a tool result (text; images and the like are skipped).
#[derive(Debug, Deserialize)]
pub struct ResultBlock {
    #[serde(default)]
    pub text: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct WireTool {
    pub name: ToolName,
    pub description: Option<String>,
    /// An object; absent for server tools (web search and the like),
    /// which are skipped.
    pub input_schema: Option<Map<String, Value>>,
    /// The input must match `input_schema`: enforced while decoding.
    pub strict: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WireToolChoice {
    Auto {
        #[serde(default)]
        disable_parallel_tool_use: bool,
    },
    Any {
        #[serde(default)]
        disable_parallel_tool_use: bool,
    },
    None,
    Tool {
        name: String,
        #[serde(default)]
        disable_parallel_tool_use: bool,
    },
}

impl WireToolChoice {
    /// `disable_parallel_tool_use`: at most one tool use in the answer.
    fn single(&self) -> bool {
        match self {
            WireToolChoice::Auto {
                disable_parallel_tool_use: d,
            }
            | WireToolChoice::Any {
                disable_parallel_tool_use: d,
            }
            | WireToolChoice::Tool {
                disable_parallel_tool_use: d,
                ..
            } => *d,
            WireToolChoice::None => false,
        }
    }
}

impl From<&WireToolChoice> for ToolChoice {
    fn from(c: &WireToolChoice) -> ToolChoice {
        match c {
            WireToolChoice::Auto { .. } => ToolChoice::Auto,
            WireToolChoice::Any { .. } => ToolChoice::Required,
            WireToolChoice::None => ToolChoice::None,
            WireToolChoice::Tool { name, .. } => ToolChoice::Named(name.clone()),
        }
    }
}

/// The text of the system prompt.
fn system_text(t: &TextOr<TextBlock>) -> String {
    match t {
        TextOr::Text(s) => s.clone(),
        TextOr::List(blocks) => blocks
            .iter()
            .map(|TextBlock::Text { text }| text.as_str())
            .collect(),
    }
}

/// A tool result's text.
fn result_text(content: &Option<ToolResultContent>) -> String {
    match content {
        None => String::new(),
        Some(ToolResultContent::Content(TextOr::Text(s))) => s.clone(),
        Some(ToolResultContent::Content(TextOr::List(blocks))) => blocks
            .iter()
            .filter_map(|b| b.text.as_deref())
            .collect::<Vec<_>>()
            .join("\n"),
        Some(ToolResultContent::Json(v)) => v.to_string(),
    }
}

/// The request as a conversation; `body` is the request's bytes (its
/// tools as the client wrote them).
fn conversation(req: &MessagesRequest, body: &[u8]) -> Result<Conversation, ApiError> {
    let mut c = Conversation::default();
    if let Some(s) = &req.system {
        let s = system_text(s);
        if !s.is_empty() {
            c.push_text(Role::System, &s);
        }
    }
    for m in &req.messages {
        let role = Role::from(m.role);
        let blocks = match &m.content {
            TextOr::Text(s) => {
                c.push_text(role, s);
                continue;
            }
            TextOr::List(b) => b,
        };
        for b in blocks {
            match b {
                ContentBlock::Text { text } => c.push_text(role, text),
                ContentBlock::ToolUse { id, name, input } => convo::push_call(
                    &mut c,
                    ToolCall {
                        id: id.clone(),
                        name: name.clone(),
                        arguments: input
                            .as_ref()
                            .map_or_else(|| "{}".to_string(), Value::to_string),
                    },
                ),
                ContentBlock::ToolResult { content, .. } => {
                    c.turns.push(Turn::new(Role::Tool, result_text(content)));
                }
                ContentBlock::Thinking { thinking } if role == Role::Assistant => {
                    c.push_reasoning(thinking)
                }
                ContentBlock::Thinking { .. } | ContentBlock::RedactedThinking => {}
            }
        }
    }
    let functions = req.tools.iter().map(|t| {
        t.input_schema.as_ref().map(|schema| FunctionDef {
            name: t.name.clone(),
            description: t.description.clone(),
            parameters: Some(schema.clone()),
            strict: t.strict,
        })
    });
    c.tools = convo::tool_specs(functions.collect(), body, ToolShape::Flat("input_schema"));
    c.choice = req
        .tool_choice
        .as_ref()
        .map_or(ToolChoice::Auto, ToolChoice::from);
    c.single_call = req.tool_choice.as_ref().is_some_and(WireToolChoice::single);
    // `output_config.effort` (the current SDK's) names the tier like
    // `reasoning_effort`; else `thinking` turns it on or off.
    let effort = req.output_config.as_ref().and_then(|o| o.effort.as_deref());
    c.thinking = match effort {
        Some(e) => Some(convo::effort(e, "output_config.effort")?),
        None => req.thinking.as_ref().and_then(ThinkingConfig::mode),
    };
    Ok(c)
}

async fn render(
    state: &AppState,
    req: &MessagesRequest,
    body: &[u8],
) -> Result<(Rendered, Conversation), ApiError> {
    let mut convo = conversation(req, body)?;
    if let Some(answered) = output_only(req) {
        convo = state
            .continuations
            .resume(&answered[0], &answered, convo, "messages")?;
    }
    convo::render(&state.chat, convo, state.render_options(&req.model)).await
}

/// The calls an output-only follow-up answers: a request with no
/// assistant turn whose first message holds only `tool_result` blocks.
fn output_only(req: &MessagesRequest) -> Option<Vec<String>> {
    if req
        .messages
        .iter()
        .any(|m| matches!(m.role, WireRole::Assistant))
    {
        return None;
    }
    let TextOr::List(blocks) = &req.messages.first()?.content else {
        return None;
    };
    let ids: Option<Vec<String>> = blocks
        .iter()
        .map(|b| match b {
            ContentBlock::ToolResult { tool_use_id, .. } => Some(tool_use_id.clone()?),
            _ => None,
        })
        .collect();
    ids.filter(|ids| !ids.is_empty())
}

/// The `count_tokens` answer.
#[derive(Serialize)]
struct TokenCount {
    input_tokens: usize,
}

/// A `count_tokens` request: a Messages request, counted instead of run.
#[derive(Debug, Deserialize)]
#[serde(transparent)]
pub struct CountTokensRequest(MessagesRequest);

impl Surface for CountTokensRequest {
    const NAME: &'static str = "count_tokens";

    fn refuse(e: ApiError) -> Response {
        e.anthropic()
    }

    /// `POST /v1/messages/count_tokens`: the prompt's length.
    async fn answer(self, state: Arc<AppState>, body: Bytes) -> Result<Reply, ApiError> {
        let (rendered, _) = render(&state, &self.0, &body).await?;
        let count = TokenCount {
            input_tokens: rendered.tokens.len(),
        };
        Ok(Reply::Json(Json(count).into_response()))
    }

    fn model(&self) -> &str {
        &self.0.model
    }
}

impl Surface for MessagesRequest {
    const NAME: &'static str = "messages";

    fn refuse(e: ApiError) -> Response {
        e.anthropic()
    }

    /// `POST /v1/messages`.
    async fn answer(mut self, state: Arc<AppState>, body: Bytes) -> Result<Reply, ApiError> {
        let max_tokens = self
            .max_tokens
            .ok_or_else(|| ApiError::bad("max_tokens: field required", "max_tokens"))?;
        let sampling = self.sampling.params()?;
        if self.stop_sequences.len() > 16 {
            return Err(ApiError::bad(
                "at most 16 stop_sequences are allowed",
                "stop_sequences",
            ));
        }
        let (rendered, kept) = render(&state, &self, &body).await?;
        let prompt_tokens = rendered.tokens.len();
        let spec = self
            .output_config
            .as_mut()
            .and_then(|o| o.format.take())
            .map(|f| (f.spec(), "output_config.format"));
        let constraint = structured::compile(&state, spec, &rendered.answer).await?;
        let job = Job {
            prompt: rendered.tokens,
            max_tokens: Some(max_tokens),
            sampling,
            stop: self.stop_sequences.clone(),
            logprobs: None,
            answer: rendered.answer,
            id_prefix: "toolu_",
            constraint,
        };
        let retry = tool_slip::Retry::new(&state, &job, &body, self.stream);
        let mut run = run::start(&state, job)?;
        let keeper = state.clone();
        run.on_done(move |c, _| keeper.continuations.remember(kept, c, None));
        let id = new_call_id("msg_");
        let model = state.model_id.clone();
        if self.stream {
            let shape = MessagesStream {
                id,
                model,
                prompt_tokens,
                index: 0,
                open: None,
            };
            return Ok(Reply::stream::<Self>(&state, run, shape));
        }
        let (c, f) = tool_slip::collect(&state, run, retry).await?;
        let content = blocks(c);
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

    fn model(&self) -> &str {
        &self.model
    }
}

/// A collected answer's content blocks: thinking, text, tool uses.
fn blocks(c: run::Collected) -> Vec<Block> {
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
    content
}

/// A call's arguments as its `input` (an empty object when they are not
/// JSON).
fn input_of(arguments: &str) -> Value {
    serde_json::from_str(arguments).unwrap_or_else(|_| Value::Object(Default::default()))
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
    ToolUse,
}

struct MessagesStream {
    id: String,
    model: String,
    prompt_tokens: usize,
    /// Index of the next content block.
    index: usize,
    open: Option<OpenBlock>,
}

/// `message_start`.
#[derive(Serialize)]
struct MessageStart {
    message: MessageObject,
}

/// `content_block_start`.
#[derive(Serialize)]
struct BlockStart {
    index: usize,
    content_block: Block,
}

/// `content_block_delta`.
#[derive(Serialize)]
struct BlockDelta {
    index: usize,
    delta: DeltaBody,
}

/// What a delta adds: `text_delta`, `thinking_delta`, `input_json_delta`.
#[derive(Serialize)]
#[serde(tag = "type")]
enum DeltaBody {
    #[serde(rename = "text_delta")]
    Text { text: String },
    #[serde(rename = "thinking_delta")]
    Thinking { thinking: String },
    #[serde(rename = "input_json_delta")]
    InputJson { partial_json: String },
}

/// `content_block_stop`.
#[derive(Serialize)]
struct BlockStop {
    index: usize,
}

/// `message_delta`: how the message ended.
#[derive(Serialize)]
struct MessageDelta {
    delta: StopDelta,
    usage: Usage,
    timings: TimingsOut,
}

#[derive(Serialize)]
struct StopDelta {
    stop_reason: &'static str,
    stop_sequence: Option<String>,
}

impl MessagesStream {
    fn close(&mut self, out: &mut Vec<Frame>) {
        if self.open.take().is_some() {
            let stop = BlockStop { index: self.index };
            out.push(run::typed_event("content_block_stop", &stop));
            self.index += 1;
        }
    }

    /// Open block `kind` at the next index.
    fn start_block(&mut self, out: &mut Vec<Frame>, kind: OpenBlock, content_block: Block) {
        self.close(out);
        let start = BlockStart {
            index: self.index,
            content_block,
        };
        out.push(run::typed_event("content_block_start", &start));
        self.open = Some(kind);
    }

    fn delta(&self, out: &mut Vec<Frame>, delta: DeltaBody) {
        let delta = BlockDelta {
            index: self.index,
            delta,
        };
        out.push(run::typed_event("content_block_delta", &delta));
    }

    fn text(&mut self, out: &mut Vec<Frame>, t: String, kind: OpenBlock) {
        if self.open != Some(kind) {
            let block = match kind {
                OpenBlock::Thinking => Block::Thinking {
                    thinking: String::new(),
                    signature: String::new(),
                },
                OpenBlock::Text | OpenBlock::ToolUse => Block::Text {
                    text: String::new(),
                },
            };
            self.start_block(out, kind, block);
        }
        let delta = match kind {
            OpenBlock::Thinking => DeltaBody::Thinking { thinking: t },
            OpenBlock::Text | OpenBlock::ToolUse => DeltaBody::Text { text: t },
        };
        self.delta(out, delta);
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
        vec![run::typed_event("message_start", &MessageStart { message })]
    }

    fn deltas(&mut self, deltas: Vec<Delta>) -> Vec<Frame> {
        let mut out = Vec::new();
        for d in deltas {
            match d {
                Delta::Token { .. } => {}
                Delta::Text(t) => self.text(&mut out, t, OpenBlock::Text),
                Delta::Reasoning(t) => self.text(&mut out, t, OpenBlock::Thinking),
                Delta::CallStart { id, name, .. } => {
                    let block = Block::ToolUse {
                        id,
                        name,
                        input: Value::Object(Default::default()),
                    };
                    self.start_block(&mut out, OpenBlock::ToolUse, block);
                }
                Delta::CallArgs { delta, .. } => {
                    if self.open == Some(OpenBlock::ToolUse) {
                        let partial = DeltaBody::InputJson {
                            partial_json: delta,
                        };
                        self.delta(&mut out, partial);
                    }
                }
                Delta::CallEnd => {
                    if self.open == Some(OpenBlock::ToolUse) {
                        self.close(&mut out);
                    }
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
        let (stop_reason, stop_sequence) = stop_reason(f);
        let delta = MessageDelta {
            delta: StopDelta {
                stop_reason,
                stop_sequence,
            },
            usage: usage(f),
            timings: f.timings_out(),
        };
        out.push(run::typed_event("message_delta", &delta));
        out.push(run::typed_event("message_stop", &()));
        out
    }

    fn error(&mut self, e: &ApiError) -> Vec<Frame> {
        vec![run::event(Some("error"), &e.anthropic_body())]
    }

    fn ping(&mut self) -> Option<Frame> {
        Some(run::typed_event("ping", &()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::run::testing::{drive, envelope_run, events, failing_run, thinking_run};
    use ds4_model::chat::Thinking;
    use serde_json::json;

    fn shape() -> MessagesStream {
        MessagesStream {
            id: "msg_1".into(),
            model: "m".into(),
            prompt_tokens: 20,
            index: 0,
            open: None,
        }
    }

    #[tokio::test]
    async fn streamed_tool_use_has_the_messages_event_sequence() {
        let ev = events(&drive(envelope_run(None), shape()).await);
        let names: Vec<&str> = ev.iter().map(|e| e.0).collect();
        let n = names.len();
        assert_eq!(names[..2], ["message_start", "content_block_start"]);
        assert_eq!(
            names[n - 7..],
            [
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
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
        let start = &ev[n - 6].1;
        assert_eq!(start["index"], 1);
        assert_eq!(start["content_block"]["type"], "tool_use");
        assert_eq!(start["content_block"]["name"], "get_weather");
        assert!(start["content_block"]["id"]
            .as_str()
            .unwrap()
            .starts_with("call_"));
        // The input streams in the two pieces the model wrote.
        let mut input = String::new();
        for e in &ev[n - 5..n - 3] {
            assert_eq!(e.1["delta"]["type"], "input_json_delta");
            input.push_str(e.1["delta"]["partial_json"].as_str().unwrap());
        }
        assert_eq!(input, "{\"city\": \"Paris\"}");
        assert_eq!(ev[n - 3].1["index"], 1);
        assert_eq!(ev[n - 2].1["delta"]["stop_reason"], "tool_use");
        assert_eq!(ev[n - 2].1["usage"]["output_tokens"], 9);
    }

    #[tokio::test]
    async fn a_deepseek_dsml_call_is_a_tool_use_block_with_streamed_input() {
        use crate::api::run::testing::{dsml_run, DSML_ARGS, DSML_REASONING};
        let ev = events(&drive(dsml_run(None), shape()).await);
        let starts: Vec<&Value> = ev
            .iter()
            .filter(|e| e.0 == "content_block_start")
            .map(|e| &e.1)
            .collect();
        let kinds: Vec<&str> = starts
            .iter()
            .map(|s| s["content_block"]["type"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["thinking", "text", "tool_use"]);
        assert_eq!(starts[2]["index"], 2);
        assert_eq!(starts[2]["content_block"]["name"], "get_weather");
        assert_eq!(starts[2]["content_block"]["input"], json!({}));
        let field =
            |k: &str| -> String { ev.iter().filter_map(|e| e.1["delta"][k].as_str()).collect() };
        assert_eq!(field("thinking"), DSML_REASONING);
        assert_eq!(field("text"), "Checking.");
        let partial: Vec<&str> = ev
            .iter()
            .filter(|e| e.1["delta"]["type"] == "input_json_delta")
            .map(|e| {
                assert_eq!(e.1["index"], 2);
                e.1["delta"]["partial_json"].as_str().unwrap()
            })
            .collect();
        assert!(partial.len() > 3, "input is streamed: {partial:?}");
        assert_eq!(partial.concat(), DSML_ARGS);
        let stops = ev.iter().filter(|e| e.0 == "content_block_stop").count();
        assert_eq!(stops, 3);
        let n = ev.len();
        assert_eq!(ev[n - 2].1["delta"]["stop_reason"], "tool_use");
        assert_eq!(ev[n - 2].1["delta"]["stop_sequence"], Value::Null);

        // Not streamed.
        let (c, f) = crate::api::run::collect(dsml_run(None)).await.unwrap();
        assert_eq!(stop_reason(&f), ("tool_use", None));
        let b = serde_json::to_value(blocks(c)).unwrap();
        assert_eq!(b[0]["type"], "thinking");
        assert_eq!(b[0]["thinking"], DSML_REASONING);
        assert_eq!(b[1]["text"], "Checking.");
        assert_eq!(b[2]["type"], "tool_use");
        assert_eq!(b[2]["input"], json!({"city": "Rome", "days": 1}));
    }

    #[test]
    fn a_deepseek_messages_request_renders_the_spec_prompt() {
        use crate::api::convo::testing::{
            api_prompt, renderer_prompt, PARAMETERS, REASONING, RESULT, SYSTEM, USER,
        };
        let q = |s: &str| serde_json::to_string(s).unwrap();
        let body = |thinking: &str| {
            format!(
                r#"{{"model":"m","max_tokens":100,"system":{},"messages":[{{"role":"user","content":{}}},{{"role":"assistant","content":[{{"type":"thinking","thinking":{},"signature":"sig"}},{{"type":"tool_use","id":"toolu_0","name":"get_weather","input":{{"city": "Rome", "days": 1}}}}]}},{{"role":"user","content":[{{"type":"tool_result","tool_use_id":"toolu_0","content":{}}}]}}],"tools":[{{"name":"get_weather","description":"Get current weather for a city","input_schema":{PARAMETERS}}}],"thinking":{thinking}}}"#,
                q(SYSTEM),
                q(USER),
                q(REASONING),
                q(RESULT),
            )
        };
        let prompt = |b: &str| {
            let req: MessagesRequest = serde_json::from_str(b).unwrap();
            let c = conversation(&req, b.as_bytes()).unwrap();
            (c.thinking, api_prompt(&c, &Default::default()))
        };
        let (thinking, p) = prompt(&body(r#"{"type":"enabled","budget_tokens":1024}"#));
        assert_eq!(thinking, Some(Thinking::High));
        assert_eq!(p, renderer_prompt());
        let (thinking, p) = prompt(&body(r#"{"type":"disabled"}"#));
        assert_eq!(thinking, Some(Thinking::Off));
        assert!(p.ends_with("<｜Assistant｜></think>"));
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
        let body =
            serde_json::to_value(ApiError::bad("nope", "messages").anthropic_body()).unwrap();
        assert_eq!(body["type"], "error");
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!(body["error"]["message"], "nope");
    }

    fn refusal(body: &str) -> (String, Option<String>) {
        crate::api::error::testing::refusal::<MessagesRequest>(body)
    }

    #[test]
    fn malformed_blocks_are_refused_with_their_place() {
        let (m, param) = refusal(
            r#"{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image","source":{}}]}]}"#,
        );
        assert!(
            m.contains("messages[0].content[1].type: unknown variant `image`"),
            "{m}"
        );
        assert!(m.contains("`tool_result`"), "{m}");
        assert_eq!(param.as_deref(), Some("messages"));
        let (m, _) = refusal(
            r#"{"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","input":{}}]}]}"#,
        );
        assert!(
            m.contains("messages[0].content[0]: missing field `name`"),
            "{m}"
        );
        let (m, param) = refusal(r#"{"messages":[],"tool_choice":{"type":"tool"}}"#);
        assert!(m.contains("tool_choice: missing field `name`"), "{m}");
        assert_eq!(param.as_deref(), Some("tool_choice"));
        let (m, param) = refusal(r#"{"messages":[],"system":[{"type":"image"}]}"#);
        assert!(m.contains("system[0].type: unknown variant `image`"), "{m}");
        assert_eq!(param.as_deref(), Some("system"));
    }

    #[test]
    fn tools_results_and_choices_read_from_the_wire() {
        let body = r#"{"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"a","name":"f"},{"type":"tool_use","id":"b","name":"f","input":{"x":1}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":[{"type":"text","text":"one"},{"type":"image","source":{}},{"type":"text","text":"two"}]},{"type":"tool_result","tool_use_id":"b","content":{"ok":true}},{"type":"redacted_thinking","data":"x"}]}],"tools":[{"type":"web_search_20250305","name":"web_search"},{"name":"f","input_schema":{ "type": "object" }}],"tool_choice":{"type":"any","disable_parallel_tool_use":true},"thinking":{"type":"disabled"}}"#;
        let req: MessagesRequest = serde_json::from_str(body).unwrap();
        let c = conversation(&req, body.as_bytes()).unwrap();
        let calls = &c.turns[0].calls;
        assert_eq!(calls[0].arguments, "{}");
        assert_eq!(calls[1].arguments, r#"{"x":1}"#);
        assert_eq!(c.turns[1].text, "one\ntwo");
        assert_eq!(c.turns[2].text, r#"{"ok":true}"#);
        assert_eq!(c.turns.len(), 3);
        // The server tool is skipped; the schema reaches the model in the
        // client's bytes.
        assert_eq!(c.tools.len(), 1);
        assert_eq!(
            c.tools[0].raw.as_deref(),
            Some(r#"{"name":"f","parameters":{ "type": "object" }}"#)
        );
        assert_eq!(c.choice, ToolChoice::Required);
        assert!(c.single_call);
        assert_eq!(c.thinking, Some(Thinking::Off));
    }
}

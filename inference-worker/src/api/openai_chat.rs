//! `POST /v1/chat/completions` (OpenAI Chat Completions), JSON and SSE.

use std::sync::Arc;

use axum::body::Bytes;
use axum::response::IntoResponse;
use axum::Json;
use serde::{Deserialize, Serialize};

use super::convo::{self, FunctionDef, TextOr, ThinkingConfig, ToolShape};
use super::fields::{penalize, LogitBias, Metadata, Penalty};
use super::run::{self, Delta, Finish, Frame, Job, Shape, TimingsOut};
use super::structured::{self, ResponseFormat, WireGrammar};
use super::tool_slip;
use super::{one_choice, stop_list, ApiError, AppState, Reply, SamplingFields, Stop, Surface};
use crate::generate::{FinishReason, TokenLogprobs};
use ds4_model::chat::{
    new_call_id, Chat, Conversation, Role, Thinking, ToolCall, ToolChoice, Turn,
};

#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    #[serde(default)]
    pub model: String,
    pub messages: Vec<WireMessage>,
    pub max_tokens: Option<u32>,
    pub max_completion_tokens: Option<u32>,
    #[serde(flatten)]
    pub sampling: SamplingFields,
    pub stop: Option<Stop>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub tools: Option<Vec<WireTool>>,
    pub tool_choice: Option<WireToolChoice>,
    pub response_format: Option<ResponseFormat>,
    /// A Lark grammar or regular expression the answer must match (an
    /// extension, as llama-server and vLLM have).
    pub grammar: Option<WireGrammar>,
    pub n: Option<u32>,
    #[serde(default)]
    pub logprobs: bool,
    pub top_logprobs: Option<u32>,
    #[serde(default)]
    pub return_token_ids: bool,
    /// `none`, `minimal` … `xhigh`, `max`: the thinking mode of families
    /// that think.
    pub reasoning_effort: Option<String>,
    /// `{"type": "enabled" | "disabled"}` (DeepSeek's API).
    pub thinking: Option<ThinkingConfig>,
    pub presence_penalty: Option<Penalty>,
    pub frequency_penalty: Option<Penalty>,
    pub logit_bias: Option<LogitBias>,
    /// `false`: at most one call in the answer.
    pub parallel_tool_calls: Option<bool>,
    // Documented fields that are read (so that a wrong type is refused)
    // and have no effect here.
    #[allow(dead_code)]
    pub metadata: Option<Metadata>,
    #[allow(dead_code)]
    pub user: Option<String>,
    #[allow(dead_code)]
    pub store: Option<bool>,
}

#[derive(Debug, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

#[derive(Debug, Deserialize)]
pub struct WireMessage {
    pub role: WireRole,
    /// A string, or a list of parts.
    #[serde(default)]
    pub content: Option<TextOr<ContentPart>>,
    #[serde(default)]
    pub tool_calls: Vec<WireToolCall>,
    /// An assistant message's reasoning, sent back.
    #[serde(default)]
    pub reasoning_content: Option<String>,
}

#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WireRole {
    System,
    Developer,
    User,
    Assistant,
    Tool,
}

impl From<WireRole> for Role {
    fn from(r: WireRole) -> Role {
        match r {
            WireRole::System | WireRole::Developer => Role::System,
            WireRole::User => Role::User,
            WireRole::Assistant => Role::Assistant,
            WireRole::Tool => Role::Tool,
        }
    }
}

/// A content part: text is all the model reads.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentPart {
    Text { text: String },
}

#[derive(Debug, Deserialize, Serialize)]
pub struct WireToolCall {
    pub id: String,
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    pub function: WireFunction,
}

fn function_type() -> String {
    "function".into()
}

#[derive(Debug, Deserialize, Serialize)]
pub struct WireFunction {
    pub name: String,
    #[serde(default)]
    pub arguments: String,
}

/// A tool: functions are offered to the model, other kinds are skipped.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WireTool {
    Function {
        function: FunctionDef,
    },
    #[serde(other)]
    Other,
}

/// OpenAI's `tool_choice`, shared with the Responses surface: a mode or
/// a named function.
#[derive(Debug, Deserialize)]
#[serde(
    untagged,
    expecting = "must be \"auto\", \"none\", \"required\" or a named function"
)]
pub enum WireToolChoice {
    Mode(ChoiceMode),
    /// `{"type": "function", "function": {"name": ...}}` (Chat Completions).
    Function {
        function: FunctionName,
    },
    /// `{"type": "function", "name": ...}` (Responses).
    Named {
        name: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChoiceMode {
    Auto,
    None,
    Required,
}

#[derive(Debug, Deserialize)]
pub struct FunctionName {
    pub name: String,
}

impl WireToolChoice {
    pub fn choice(&self) -> ToolChoice {
        match self {
            WireToolChoice::Mode(ChoiceMode::Auto) => ToolChoice::Auto,
            WireToolChoice::Mode(ChoiceMode::None) => ToolChoice::None,
            WireToolChoice::Mode(ChoiceMode::Required) => ToolChoice::Required,
            WireToolChoice::Function {
                function: FunctionName { name },
            }
            | WireToolChoice::Named { name } => ToolChoice::Named(name.clone()),
        }
    }
}

/// The thinking mode a chat request asks for: `reasoning_effort`, else
/// `thinking`.
fn thinking(req: &ChatRequest) -> Result<Option<Thinking>, ApiError> {
    match &req.reasoning_effort {
        Some(e) => convo::effort(e, "reasoning_effort").map(Some),
        None => Ok(req.thinking.as_ref().and_then(ThinkingConfig::mode)),
    }
}

/// The request as a conversation; `body` is the request's bytes (its
/// tools as the client wrote them).
fn conversation(req: &mut ChatRequest, body: &[u8]) -> Result<Conversation, ApiError> {
    let mut c = Conversation::default();
    for m in req.messages.drain(..) {
        let role = Role::from(m.role);
        let text = match m.content {
            None => String::new(),
            Some(TextOr::Text(t)) => t,
            Some(TextOr::List(parts)) => parts
                .into_iter()
                .map(|ContentPart::Text { text }| text)
                .collect(),
        };
        let mut turn = Turn::new(role, text);
        turn.reasoning = m.reasoning_content.filter(|_| role == Role::Assistant);
        turn.calls = m
            .tool_calls
            .into_iter()
            .map(|c| ToolCall {
                id: c.id,
                name: c.function.name,
                arguments: c.function.arguments,
            })
            .collect();
        c.turns.push(turn);
    }
    let tools = req.tools.take().unwrap_or_default().into_iter();
    let functions = tools.map(|t| match t {
        WireTool::Function { function } => Some(function),
        WireTool::Other => None,
    });
    c.tools = convo::tool_specs(functions.collect(), body, ToolShape::Nested);
    c.choice = req
        .tool_choice
        .as_ref()
        .map_or(ToolChoice::Auto, WireToolChoice::choice);
    c.single_call = req.parallel_tool_calls == Some(false);
    c.thinking = thinking(req)?;
    Ok(c)
}

impl Surface for ChatRequest {
    const NAME: &'static str = "chat";

    /// `POST /v1/chat/completions`.
    async fn answer(mut self, state: Arc<AppState>, body: Bytes) -> Result<Reply, ApiError> {
        one_choice(self.n, "n")?;
        let spec = structured::one_spec([
            (
                self.response_format.take().and_then(ResponseFormat::spec),
                "response_format",
            ),
            (self.grammar.take().map(WireGrammar::spec), "grammar"),
        ])?;
        let mut sampling = self.sampling.params()?;
        penalize(
            &mut sampling,
            self.presence_penalty,
            self.frequency_penalty,
            self.logit_bias.take(),
            state.chat.tokenizer.vocab_size(),
        )?;
        let stop = stop_list(self.stop.take())?;
        let convo = conversation(&mut self, &body)?;
        let (rendered, _) =
            convo::render(&state.chat, convo, state.render_options(&self.model)).await?;
        let logprobs = self
            .logprobs
            .then(|| self.top_logprobs.unwrap_or(0).min(20) as usize);
        let prompt_ids = self.return_token_ids.then(|| rendered.tokens.clone());
        let constraint = structured::compile(&state, spec, &rendered.answer).await?;
        let job = Job {
            prompt: rendered.tokens,
            max_tokens: self.max_completion_tokens.or(self.max_tokens),
            sampling,
            stop,
            logprobs,
            answer: rendered.answer,
            id_prefix: "call_",
            constraint,
        };
        let retry = tool_slip::Retry::new(&state, &job, &body, self.stream);
        let run = run::start(&state, job)?;
        let id = new_call_id("chatcmpl-");
        let created = super::unix_now();
        if self.stream {
            let shape = ChatStream {
                id,
                created,
                model: state.model_id.clone(),
                chat: logprobs.map(|_| state.chat.clone()),
                include_usage: self.stream_options.is_some_and(|o| o.include_usage),
            };
            return Ok(Reply::stream::<Self>(&state, run, shape));
        }
        let (c, f) = tool_slip::collect(&state, run, retry).await?;
        let logprobs = logprobs.map(|_| LogprobsOut {
            content: c
                .tokens
                .iter()
                .filter_map(|(id, lp)| lp.as_ref().map(|lp| entry(&state.chat, *id, lp)))
                .collect(),
        });
        let token_ids = self
            .return_token_ids
            .then(|| c.tokens.iter().map(|t| t.0).collect());
        let resp = ChatResponse {
            id,
            object: "chat.completion",
            created,
            model: state.model_id.clone(),
            choices: vec![Choice {
                index: 0,
                message: out_message(c.text, c.reasoning, c.calls),
                finish_reason: finish_reason(&f),
                logprobs,
                token_ids,
            }],
            usage: usage(&f),
            timings: f.timings_out(),
            prompt_token_ids: prompt_ids,
        };
        Ok(Reply::Json(Json(resp).into_response()))
    }

    fn model(&self) -> &str {
        &self.model
    }
}

/// The answer's message: text (null when only calls were made), reasoning
/// in `reasoning_content`, calls in `tool_calls`.
fn out_message(text: String, reasoning: String, calls: Vec<ToolCall>) -> OutMessage {
    OutMessage {
        role: "assistant",
        content: (!text.is_empty() || calls.is_empty()).then_some(text),
        reasoning_content: (!reasoning.is_empty()).then_some(reasoning),
        tool_calls: calls.into_iter().map(wire_call).collect(),
    }
}

fn wire_call(c: ToolCall) -> WireToolCall {
    WireToolCall {
        id: c.id,
        kind: "function".into(),
        function: WireFunction {
            name: c.name,
            arguments: c.arguments,
        },
    }
}

fn finish_reason(f: &Finish) -> &'static str {
    if f.calls > 0 {
        return "tool_calls";
    }
    match f.reason {
        FinishReason::Stop | FinishReason::Cancelled => "stop",
        FinishReason::Length => "length",
        // The answer's grammar could not go on (logged).
        FinishReason::GrammarError => "error",
    }
}

/// OpenAI usage (Chat and Completions), cached prompt tokens included.
pub(super) fn usage(f: &Finish) -> Usage {
    Usage {
        prompt_tokens: f.prompt_tokens(),
        completion_tokens: f.completion_tokens(),
        total_tokens: f.prompt_tokens() + f.completion_tokens(),
        prompt_tokens_details: PromptDetails {
            cached_tokens: f.timings.cached_tokens,
        },
    }
}

fn entry(p: &Chat, id: u32, lp: &TokenLogprobs) -> LogprobEntry {
    let alt = |id: u32, logprob: f32| TopLogprob {
        token: p.tokenizer.decode(&[id]),
        logprob,
        bytes: p.tokenizer.token_bytes(id).to_vec(),
    };
    LogprobEntry {
        token: p.tokenizer.decode(&[id]),
        logprob: lp.logprob,
        bytes: p.tokenizer.token_bytes(id).to_vec(),
        top_logprobs: lp.top.iter().map(|&(t, l)| alt(t, l)).collect(),
    }
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
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_token_ids: Option<Vec<u32>>,
}

#[derive(Serialize)]
struct Choice {
    index: u32,
    message: OutMessage,
    finish_reason: &'static str,
    logprobs: Option<LogprobsOut>,
    #[serde(skip_serializing_if = "Option::is_none")]
    token_ids: Option<Vec<u32>>,
}

#[derive(Serialize)]
struct OutMessage {
    role: &'static str,
    content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<WireToolCall>,
}

#[derive(Serialize)]
struct LogprobsOut {
    content: Vec<LogprobEntry>,
}

#[derive(Serialize)]
struct LogprobEntry {
    token: String,
    logprob: f32,
    bytes: Vec<u8>,
    top_logprobs: Vec<TopLogprob>,
}

#[derive(Serialize)]
struct TopLogprob {
    token: String,
    logprob: f32,
    bytes: Vec<u8>,
}

#[derive(Serialize)]
pub(super) struct Usage {
    prompt_tokens: usize,
    completion_tokens: usize,
    total_tokens: usize,
    prompt_tokens_details: PromptDetails,
}

#[derive(Serialize)]
struct PromptDetails {
    cached_tokens: usize,
}

/// The streaming shape: `chat.completion.chunk`s, then `[DONE]`.
struct ChatStream {
    id: String,
    created: u64,
    model: String,
    /// For log-probabilities, when asked for.
    chat: Option<Chat>,
    include_usage: bool,
}

#[derive(Serialize)]
struct Chunk<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: Vec<ChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Usage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    timings: Option<TimingsOut>,
}

#[derive(Serialize)]
struct ChunkChoice {
    index: u32,
    delta: ChunkDelta,
    finish_reason: Option<&'static str>,
    logprobs: Option<LogprobsOut>,
}

/// What a chunk adds to the message (`{}` in the last one).
#[derive(Default, Serialize)]
struct ChunkDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<CallDelta>,
}

/// A piece of tool call `index`: its id, type and name in the first
/// chunk, then its arguments a piece at a time.
#[derive(Serialize)]
struct CallDelta {
    index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    kind: Option<&'static str>,
    function: FunctionDelta,
}

#[derive(Serialize)]
struct FunctionDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    arguments: String,
}

impl ChunkDelta {
    fn call(call: CallDelta) -> ChunkDelta {
        ChunkDelta {
            tool_calls: vec![call],
            ..ChunkDelta::default()
        }
    }
}

impl ChatStream {
    fn chunk(
        &self,
        delta: ChunkDelta,
        finish: Option<&'static str>,
        lp: Option<LogprobsOut>,
    ) -> Frame {
        run::event(
            None,
            &Chunk {
                id: &self.id,
                object: "chat.completion.chunk",
                created: self.created,
                model: &self.model,
                choices: vec![ChunkChoice {
                    index: 0,
                    delta,
                    finish_reason: finish,
                    logprobs: lp,
                }],
                usage: None,
                timings: None,
            },
        )
    }
}

impl ChatStream {
    /// A content chunk carrying the log-probabilities gathered so far.
    fn text_chunk(&self, text: String, lps: &mut Vec<LogprobEntry>) -> Frame {
        let lp = (!lps.is_empty()).then(|| LogprobsOut {
            content: std::mem::take(lps),
        });
        let delta = ChunkDelta {
            content: Some(text),
            ..ChunkDelta::default()
        };
        self.chunk(delta, None, lp)
    }
}

impl Shape for ChatStream {
    fn start(&mut self) -> Vec<Frame> {
        let delta = ChunkDelta {
            role: Some("assistant"),
            content: Some(String::new()),
            ..ChunkDelta::default()
        };
        vec![self.chunk(delta, None, None)]
    }

    fn deltas(&mut self, deltas: Vec<Delta>) -> Vec<Frame> {
        let mut out = Vec::new();
        let mut lps = Vec::new();
        let mut text = String::new();
        for d in deltas {
            match d {
                Delta::Token { id, logprobs } => {
                    if let (Some(lp), Some(p)) = (logprobs, &self.chat) {
                        lps.push(entry(p, id, &lp));
                    }
                }
                Delta::Text(t) => text.push_str(&t),
                other => {
                    // Keep the order: text so far goes out first.
                    if !text.is_empty() {
                        out.push(self.text_chunk(std::mem::take(&mut text), &mut lps));
                    }
                    let delta = match other {
                        Delta::Reasoning(r) => ChunkDelta {
                            reasoning_content: Some(r),
                            ..ChunkDelta::default()
                        },
                        Delta::CallStart { index, id, name } => ChunkDelta::call(CallDelta {
                            index,
                            id: Some(id),
                            kind: Some("function"),
                            function: FunctionDelta {
                                name: Some(name),
                                arguments: String::new(),
                            },
                        }),
                        Delta::CallArgs { index, delta } => ChunkDelta::call(CallDelta {
                            index,
                            id: None,
                            kind: None,
                            function: FunctionDelta {
                                name: None,
                                arguments: delta,
                            },
                        }),
                        _ => continue,
                    };
                    out.push(self.chunk(delta, None, None));
                }
            }
        }
        if !text.is_empty() || !lps.is_empty() {
            out.push(self.text_chunk(text, &mut lps));
        }
        out
    }

    fn finish(&mut self, f: &Finish) -> Vec<Frame> {
        let mut out = vec![self.chunk(ChunkDelta::default(), Some(finish_reason(f)), None)];
        if self.include_usage {
            out.push(run::event(
                None,
                &Chunk {
                    id: &self.id,
                    object: "chat.completion.chunk",
                    created: self.created,
                    model: &self.model,
                    choices: Vec::new(),
                    usage: Some(usage(f)),
                    timings: Some(f.timings_out()),
                },
            ));
        }
        out.push(run::done());
        out
    }

    fn error(&mut self, e: &ApiError) -> Vec<Frame> {
        vec![run::event(None, &e.openai_body()), run::done()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::run::testing::{drive, envelope_run};
    use serde_json::Value;

    /// The streaming shape of a test run.
    fn stream(include_usage: bool) -> ChatStream {
        ChatStream {
            id: "chatcmpl-1".into(),
            created: 1,
            model: "m".into(),
            chat: None,
            include_usage,
        }
    }

    #[tokio::test]
    async fn streamed_tool_calls_have_the_chat_chunk_shape() {
        let shape = stream(true);
        let frames = drive(envelope_run(None), shape).await;
        assert!(frames.iter().all(|f| f.event.is_none()));
        assert_eq!(frames.last().unwrap().data, "[DONE]");
        let chunks: Vec<Value> = frames[..frames.len() - 1]
            .iter()
            .map(|f| serde_json::from_str(&f.data).unwrap())
            .collect();
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        let text: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(text, "Let me check.\n");
        let calls: Vec<&Value> = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"].get("tool_calls"))
            .collect();
        // The header chunk, then the arguments in the two pieces the model wrote.
        assert_eq!(calls.len(), 3);
        assert_eq!(calls[0][0]["index"], 0);
        assert!(calls[0][0]["id"].as_str().unwrap().starts_with("call_"));
        assert_eq!(calls[0][0]["function"]["name"], "get_weather");
        let args: String = calls[1..]
            .iter()
            .map(|c| c[0]["function"]["arguments"].as_str().unwrap())
            .collect();
        assert_eq!(args, "{\"city\": \"Paris\"}");
        let n = chunks.len();
        assert_eq!(chunks[n - 2]["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(chunks[n - 1]["choices"].as_array().unwrap().len(), 0);
        assert_eq!(chunks[n - 1]["usage"]["completion_tokens"], 9);
    }

    #[tokio::test]
    async fn an_error_after_the_stream_started_is_an_error_chunk() {
        let shape = stream(true);
        let frames = drive(crate::api::run::testing::failing_run(&["Hi"]), shape).await;
        let n = frames.len();
        assert_eq!(frames[n - 1].data, "[DONE]");
        let err: Value = serde_json::from_str(&frames[n - 2].data).unwrap();
        assert_eq!(err["error"]["type"], "server_error");
    }

    #[tokio::test]
    async fn a_deepseek_dsml_call_is_a_chat_tool_call_with_streamed_arguments() {
        use crate::api::run::testing::{dsml_run, DSML_ARGS, DSML_REASONING};
        let shape = stream(false);
        let frames = drive(dsml_run(None), shape).await;
        let chunks: Vec<Value> = frames[..frames.len() - 1]
            .iter()
            .map(|f| serde_json::from_str(&f.data).unwrap())
            .collect();
        let field = |k: &str| -> String {
            chunks
                .iter()
                .filter_map(|c| c["choices"][0]["delta"][k].as_str())
                .collect()
        };
        assert_eq!(field("reasoning_content"), DSML_REASONING);
        assert_eq!(field("content"), "Checking.");
        let calls: Vec<&Value> = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"].get("tool_calls"))
            .map(|t| &t[0])
            .collect();
        assert_eq!(calls[0]["function"]["name"], "get_weather");
        assert!(calls[0]["id"].as_str().unwrap().starts_with("call_"));
        assert!(calls.iter().all(|c| c["index"] == 0));
        assert!(calls[1..].iter().all(|c| c.get("id").is_none()));
        let args: Vec<&str> = calls
            .iter()
            .filter_map(|c| c["function"]["arguments"].as_str())
            .filter(|a| !a.is_empty())
            .collect();
        assert!(args.len() > 3, "arguments are streamed: {args:?}");
        assert_eq!(args.concat(), DSML_ARGS);
        let last = chunks.last().unwrap();
        assert_eq!(last["choices"][0]["finish_reason"], "tool_calls");

        // Not streamed.
        let (c, f) = crate::api::run::collect(dsml_run(None)).await.unwrap();
        assert_eq!(finish_reason(&f), "tool_calls");
        let m = serde_json::to_value(out_message(c.text, c.reasoning, c.calls)).unwrap();
        assert_eq!(m["content"], "Checking.");
        assert_eq!(m["reasoning_content"], DSML_REASONING);
        assert_eq!(m["tool_calls"][0]["type"], "function");
        assert_eq!(m["tool_calls"][0]["function"]["name"], "get_weather");
        assert_eq!(m["tool_calls"][0]["function"]["arguments"], DSML_ARGS);
    }

    use crate::api::convo::testing::{
        api_prompt, renderer_prompt, REASONING, RESULT, SCHEMA, SYSTEM, USER,
    };
    use ds4_model::chat::ReplayStore;

    /// The specification's example as a chat request, with the earlier
    /// call `id` and `arguments`.
    fn spec_request(id: &str, arguments: &str, extra: &str) -> String {
        let q = |s: &str| serde_json::to_string(s).unwrap();
        format!(
            r#"{{"model":"m","messages":[{{"role":"system","content":{}}},{{"role":"user","content":{}}},{{"role":"assistant","content":null,"reasoning_content":{},"tool_calls":[{{"id":{},"type":"function","function":{{"name":"get_weather","arguments":{}}}}}]}},{{"role":"tool","tool_call_id":{},"content":{}}}],"tools":[{{"type":"function","function":{SCHEMA}}}]{extra}}}"#,
            q(SYSTEM),
            q(USER),
            q(REASONING),
            q(id),
            q(arguments),
            q(id),
            q(RESULT),
        )
    }

    fn prompt_of(body: &str, store: &ReplayStore) -> (Conversation, String) {
        let mut req: ChatRequest = serde_json::from_str(body).unwrap();
        let c = conversation(&mut req, body.as_bytes()).unwrap();
        let p = api_prompt(&c, store);
        (c, p)
    }

    #[test]
    fn a_deepseek_chat_request_renders_the_spec_prompt() {
        let store = ReplayStore::default();
        let body = spec_request("call_0", r#"{"city": "Rome", "days": 1}"#, "");
        let (c, p) = prompt_of(&body, &store);
        assert_eq!(p, renderer_prompt());
        assert_eq!(c.thinking, None, "the server default: thinking");
        let (c, p) = prompt_of(
            &spec_request("call_0", "{}", r#","reasoning_effort":"none""#),
            &store,
        );
        assert_eq!(c.thinking, Some(Thinking::Off));
        assert!(p.ends_with("<｜Assistant｜></think>"));
        let (c, _) = prompt_of(
            &spec_request("call_0", "{}", r#","thinking":{"type":"disabled"}"#),
            &store,
        );
        assert_eq!(c.thinking, Some(Thinking::Off));
        let body = spec_request("c", "{}", r#","reasoning_effort":"huge""#);
        let mut req: ChatRequest = serde_json::from_str(&body).unwrap();
        assert!(conversation(&mut req, body.as_bytes()).is_err());
    }

    #[tokio::test]
    async fn a_call_sent_back_in_history_replays_the_sampled_bytes() {
        use crate::api::run::testing::scripted;
        use ds4_model::chat::deepseek4::THINK_DELIMITERS;
        use ds4_model::chat::tool_stream::ToolProtocol;
        use ds4_model::chat::ToolParsing;
        // The model wrote `days` with spaces around the value: not the
        // canonical form.
        let sampled = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" string=\"true\">Rome</｜DSML｜parameter>\n<｜DSML｜parameter name=\"days\" string=\"false\"> 1 </｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
        let pieces: Vec<&str> = vec![
            "The user wants today's weather in Rome; call get_weather.</think>",
            &sampled[..40],
            &sampled[40..],
        ];
        let store = std::sync::Arc::new(ReplayStore::default());
        let run = scripted(
            &pieces,
            Some(THINK_DELIMITERS.inside()),
            Some(ToolParsing {
                names: vec!["get_weather".into()],
                forced: String::new(),
                protocol: ToolProtocol::Dsml,
                replay: Some(store.clone()),
            }),
        );
        let (c, _) = crate::api::run::collect(run).await.unwrap();
        let call = &c.calls[0];
        assert_eq!(call.arguments, r#"{"city":"Rome","days":1}"#);

        // The client sends the call back with the id it got.
        let (_, p) = prompt_of(&spec_request(&call.id, &call.arguments, ""), &store);
        assert!(p.contains(sampled), "{p}");
        assert_ne!(p, renderer_prompt());
        assert_eq!(
            p,
            renderer_prompt().replace("string=\"false\">1</", "string=\"false\"> 1 </")
        );
        // An id the server does not know renders canonically.
        let (_, p) = prompt_of(&spec_request("call_other", &call.arguments, ""), &store);
        assert_eq!(p, renderer_prompt());
    }

    #[tokio::test]
    async fn reasoning_goes_out_as_reasoning_content() {
        let shape = stream(false);
        let frames = drive(crate::api::run::testing::thinking_run(), shape).await;
        let chunks: Vec<Value> = frames[..frames.len() - 1]
            .iter()
            .map(|f| serde_json::from_str(&f.data).unwrap())
            .collect();
        let field = |k: &str| -> String {
            chunks
                .iter()
                .filter_map(|c| c["choices"][0]["delta"][k].as_str())
                .collect()
        };
        assert_eq!(field("reasoning_content"), "France's capital is Paris.");
        assert_eq!(field("content"), "Paris.");
    }

    fn refusal(body: &str) -> (String, Option<String>) {
        crate::api::error::testing::refusal::<ChatRequest>(body)
    }

    #[test]
    fn malformed_messages_are_refused_with_their_place() {
        let (m, param) = refusal(
            r#"{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}}]}]}"#,
        );
        assert!(
            m.contains("messages[0].content[1].type: unknown variant `image_url`, expected `text`"),
            "{m}"
        );
        assert_eq!(param.as_deref(), Some("messages"));
        let (m, param) = refusal(r#"{"messages":[{"role":"wizard","content":"x"}]}"#);
        assert!(
            m.contains("messages[0].role: unknown variant `wizard`"),
            "{m}"
        );
        assert_eq!(param.as_deref(), Some("messages"));
        let (m, _) = refusal(r#"{"messages":[{"role":"user","content":5}]}"#);
        assert!(
            m.starts_with("invalid JSON body: messages[0].content: invalid type"),
            "{m}"
        );
        let (m, param) =
            refusal(r#"{"messages":[{"role":"user","content":"x"}],"tool_choice":"sometimes"}"#);
        assert!(
            m.contains(r#"tool_choice: must be "auto", "none", "required" or a named function"#),
            "{m}"
        );
        assert_eq!(param.as_deref(), Some("tool_choice"));
        let (m, param) = refusal(
            r#"{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]}"#,
        );
        assert!(m.contains("tools[0]: missing field `function`"), "{m}");
        assert_eq!(param.as_deref(), Some("tools"));
    }

    #[test]
    fn tools_choices_and_thinking_read_from_the_wire() {
        let body = r#"{"messages":[{"role":"developer","content":[{"type":"text","text":"Be brief."}]},{"role":"user","content":"Ping?"}],"tools":[{"type":"custom","custom":{"name":"grammar"}},{"type":"function","function":{ "name": "ping" }}],"tool_choice":{"type":"function","function":{"name":"ping"}},"thinking":{"type":"adaptive"}}"#;
        let mut req: ChatRequest = serde_json::from_str(body).unwrap();
        let c = conversation(&mut req, body.as_bytes()).unwrap();
        assert_eq!(c.turns[0].role, Role::System);
        assert_eq!(c.turns[0].text, "Be brief.");
        // The custom tool is skipped; a function without parameters takes
        // none, and the model is shown the client's own bytes.
        assert_eq!(c.tools.len(), 1);
        assert_eq!(c.tools[0].name, "ping");
        assert_eq!(c.tools[0].parameters, convo::empty_schema());
        assert_eq!(c.tools[0].raw.as_deref(), Some(r#"{ "name": "ping" }"#));
        assert_eq!(c.choice, ToolChoice::Named("ping".into()));
        assert_eq!(c.thinking, Some(Thinking::High));
        for (choice, expected) in [
            (r#""none""#, ToolChoice::None),
            (r#""required""#, ToolChoice::Required),
            (r#"null"#, ToolChoice::Auto),
            (
                r#"{"type":"function","name":"ping"}"#,
                ToolChoice::Named("ping".into()),
            ),
        ] {
            let body = format!(r#"{{"messages":[],"tool_choice":{choice}}}"#);
            let mut req: ChatRequest = serde_json::from_str(&body).unwrap();
            let c = conversation(&mut req, body.as_bytes()).unwrap();
            assert_eq!(c.choice, expected, "{choice}");
        }
    }

    #[tokio::test]
    async fn chunk_deltas_have_exactly_the_chat_fields() {
        let shape = stream(false);
        let frames = drive(envelope_run(None), shape).await;
        let deltas: Vec<Value> = frames[..frames.len() - 1]
            .iter()
            .map(|f| serde_json::from_str::<Value>(&f.data).unwrap()["choices"][0]["delta"].clone())
            .collect();
        assert_eq!(
            deltas[0],
            serde_json::json!({"role": "assistant", "content": ""})
        );
        let call = deltas
            .iter()
            .find(|d| d.get("tool_calls").is_some())
            .unwrap();
        let id = call["tool_calls"][0]["id"].clone();
        assert_eq!(
            *call,
            serde_json::json!({"tool_calls": [{"index": 0, "id": id, "type": "function", "function": {"name": "get_weather", "arguments": ""}}]})
        );
        let args = deltas
            .iter()
            .filter(|d| d.get("tool_calls").is_some())
            .nth(1)
            .unwrap();
        assert_eq!(
            *args,
            serde_json::json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"city\":"}}]})
        );
        assert_eq!(*deltas.last().unwrap(), serde_json::json!({}));
    }
}

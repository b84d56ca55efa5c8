//! `POST /v1/responses` (OpenAI Responses), JSON and SSE. Stateless: the
//! client sends the whole conversation every time (`store: false`).

use std::sync::Arc;

use axum::body::Bytes;
use axum::response::IntoResponse;
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::convo;
use super::openai_chat::tool_choice;
use super::run::{self, Delta, Finish, Frame, Job, Shape, TimingsOut};
use super::{ApiError, AppState, Reply, SamplingFields, Surface};
use crate::generate::FinishReason;
use ds4_model::chat::{new_call_id, Conversation, Role, ToolCall, ToolSpec, Turn};

#[derive(Debug, Deserialize)]
pub struct ResponsesRequest {
    #[serde(default)]
    pub model: String,
    pub input: Input,
    pub instructions: Option<String>,
    #[serde(default)]
    pub tools: Vec<Value>,
    pub tool_choice: Option<Value>,
    pub max_output_tokens: Option<u32>,
    #[serde(flatten)]
    pub sampling: SamplingFields,
    pub reasoning: Option<Value>,
    #[serde(default)]
    pub stream: bool,
    pub store: Option<bool>,
    pub previous_response_id: Option<String>,
    pub text: Option<TextConfig>,
    pub metadata: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Input {
    Text(String),
    Items(Vec<Value>),
}

#[derive(Debug, Deserialize)]
pub struct TextConfig {
    pub format: Option<Value>,
}

fn text_of(v: Option<&Value>) -> Result<String, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut s = String::new();
            for p in parts {
                match p.get("type").and_then(Value::as_str) {
                    Some("input_text" | "output_text" | "text" | "summary_text") => {
                        s.push_str(p.get("text").and_then(Value::as_str).unwrap_or(""))
                    }
                    other => {
                        return Err(ApiError::bad(
                            format!("content part type {other:?} is not supported (text only)"),
                            "input",
                        ))
                    }
                }
            }
            Ok(s)
        }
        Some(_) => Err(ApiError::bad(
            "content must be a string or a list of parts",
            "input",
        )),
    }
}

fn str_field(item: &Value, key: &str, i: usize) -> Result<String, ApiError> {
    item.get(key)
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| ApiError::bad(format!("input[{i}].{key} must be a string"), "input"))
}

/// The request's function tools with their raw `parameters`, to show
/// DSML the client's bytes.
#[derive(Deserialize)]
struct RawTools<'a> {
    #[serde(borrow, default)]
    tools: Vec<RawTool<'a>>,
}

#[derive(Deserialize)]
struct RawTool<'a> {
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    description: Option<String>,
    #[serde(borrow, default)]
    parameters: Option<&'a serde_json::value::RawValue>,
}

fn attach_raw_tools(c: &mut Conversation, body: &[u8]) {
    let Ok(raw) = serde_json::from_slice::<RawTools<'_>>(body) else {
        return;
    };
    let raw = raw.tools.into_iter().filter(|t| t.kind == "function");
    for (spec, r) in c.tools.iter_mut().zip(raw) {
        spec.raw = Some(convo::function_json(
            &r.name,
            r.description.as_deref(),
            r.parameters.map(|p| p.get()),
        ));
    }
}

fn conversation(req: &ResponsesRequest) -> Result<Conversation, ApiError> {
    let mut c = Conversation::default();
    if let Some(i) = req.instructions.as_deref().filter(|s| !s.is_empty()) {
        c.push_text(Role::System, i);
    }
    match &req.input {
        Input::Text(t) => c.push_text(Role::User, t),
        Input::Items(items) => {
            for (i, item) in items.iter().enumerate() {
                let kind = item
                    .get("type")
                    .and_then(Value::as_str)
                    .unwrap_or("message");
                match kind {
                    "message" => {
                        let role = match item.get("role").and_then(Value::as_str) {
                            Some("user") => Role::User,
                            Some("assistant") => Role::Assistant,
                            Some("system" | "developer") => Role::System,
                            other => {
                                return Err(ApiError::bad(
                                    format!("input[{i}].role {other:?} is not one of user, assistant, system, developer"),
                                    "input",
                                ))
                            }
                        };
                        let text = text_of(item.get("content"))?;
                        match c.turns.last_mut() {
                            // The answer after its reasoning item.
                            Some(t)
                                if role == Role::Assistant
                                    && t.role == Role::Assistant
                                    && t.reasoning.is_some()
                                    && t.text.is_empty()
                                    && t.calls.is_empty() =>
                            {
                                t.text = text
                            }
                            _ => c.turns.push(Turn::new(role, text)),
                        }
                    }
                    "function_call" => {
                        let call = ToolCall {
                            id: str_field(item, "call_id", i)?,
                            name: str_field(item, "name", i)?,
                            arguments: str_field(item, "arguments", i)?,
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
                    "function_call_output" => {
                        let out = match item.get("output") {
                            Some(Value::String(s)) => s.clone(),
                            other => text_of(other)?,
                        };
                        c.turns.push(Turn::new(Role::Tool, out));
                    }
                    // Earlier reasoning, for families that keep it.
                    "reasoning" => {
                        let mut text = String::new();
                        for k in ["content", "summary"] {
                            if let Some(Value::Array(parts)) = item.get(k) {
                                for p in parts {
                                    text.push_str(
                                        p.get("text").and_then(Value::as_str).unwrap_or(""),
                                    );
                                }
                            }
                            if !text.is_empty() {
                                break;
                            }
                        }
                        c.push_reasoning(&text);
                    }
                    other => {
                        return Err(ApiError::bad(
                            format!("input[{i}].type {other:?} is not supported; send messages, function_call and function_call_output items"),
                            "input",
                        ))
                    }
                }
            }
        }
    }
    c.tools = req
        .tools
        .iter()
        .filter(|t| t.get("type").and_then(Value::as_str) == Some("function"))
        .map(|t| {
            serde_json::from_value::<ToolSpec>(t.clone())
                .map_err(|e| ApiError::bad(format!("invalid function tool: {e}"), "tools"))
        })
        .collect::<Result<_, _>>()?;
    c.choice = tool_choice(req.tool_choice.as_ref())?;
    c.thinking = match req
        .reasoning
        .as_ref()
        .and_then(|r| r.get("effort"))
        .and_then(Value::as_str)
    {
        Some(e) => Some(convo::effort(e, "reasoning.effort")?),
        None => None,
    };
    Ok(c)
}

impl Surface for ResponsesRequest {
    const NAME: &'static str = "responses";

    /// `POST /v1/responses`.
    async fn answer(self, state: Arc<AppState>, body: Bytes) -> Result<Reply, ApiError> {
        if self.store == Some(true) {
            return Err(ApiError::bad(
                "store: true is not supported: this server keeps no responses; send store: false and the full input each time",
                "store",
            ));
        }
        if self
            .previous_response_id
            .as_deref()
            .is_some_and(|s| !s.is_empty())
        {
            return Err(ApiError::bad(
                "previous_response_id is not supported: this server keeps no responses; resend the full input instead",
                "previous_response_id",
            ));
        }
        if let Some(f) = self.text.as_ref().and_then(|t| t.format.as_ref()) {
            let kind = f.get("type").and_then(Value::as_str).unwrap_or("text");
            if kind != "text" {
                return Err(ApiError::bad(
                    format!("text.format {kind:?} is not supported yet (structured output is not implemented); use \"text\""),
                    "text.format",
                ));
            }
        }
        let sampling = self.sampling.params()?;
        let mut convo = conversation(&self)?;
        attach_raw_tools(&mut convo, &body);
        let rendered = convo::render(&state.chat, convo, state.render_options()).await?;
        let job = Job {
            prompt: rendered.tokens,
            max_tokens: self.max_output_tokens,
            sampling: sampling.clone(),
            stop: Vec::new(),
            logprobs: None,
            answer: rendered.answer,
            id_prefix: "call_",
        };
        let run = run::start(&state, job)?;
        let meta = Meta {
            id: new_call_id("resp_"),
            created_at: super::unix_now(),
            model: state.model_id.clone(),
            instructions: self.instructions.clone(),
            tools: self.tools.clone(),
            tool_choice: self.tool_choice.clone().unwrap_or_else(|| "auto".into()),
            temperature: sampling.temperature,
            top_p: sampling.top_p,
            max_output_tokens: self.max_output_tokens,
            reasoning: self
                .reasoning
                .clone()
                .unwrap_or_else(|| serde_json::json!({})),
            metadata: self
                .metadata
                .clone()
                .unwrap_or_else(|| serde_json::json!({})),
        };
        if self.stream {
            let shape = ResponsesStream {
                meta,
                seq: 0,
                output: Vec::new(),
                open: None,
            };
            return Ok(Reply::stream::<Self>(&state, run, shape));
        }
        let (c, f) = run::collect(run).await?;
        Ok(Reply::Json(
            Json(meta.response(&f, output_items(c))).into_response(),
        ))
    }

    fn model(&self) -> &str {
        &self.model
    }
}

/// A collected answer's output items: reasoning, message, function calls.
fn output_items(c: run::Collected) -> Vec<Item> {
    let mut output = Vec::new();
    if !c.reasoning.is_empty() {
        output.push(Item::reasoning(new_call_id("rs_"), c.reasoning));
    }
    if !c.text.is_empty() || c.calls.is_empty() {
        output.push(Item::message(new_call_id("msg_"), c.text, "completed"));
    }
    output.extend(c.calls.into_iter().map(Item::call));
    output
}

/// Request settings echoed in every response object.
struct Meta {
    id: String,
    created_at: u64,
    model: String,
    instructions: Option<String>,
    tools: Vec<Value>,
    tool_choice: Value,
    temperature: f32,
    top_p: f32,
    max_output_tokens: Option<u32>,
    reasoning: Value,
    metadata: Value,
}

impl Meta {
    fn object(&self, status: &'static str, output: Vec<Item>) -> ResponseObject<'_> {
        ResponseObject {
            id: &self.id,
            object: "response",
            created_at: self.created_at,
            status,
            model: &self.model,
            output,
            instructions: self.instructions.as_deref(),
            tools: &self.tools,
            tool_choice: &self.tool_choice,
            parallel_tool_calls: true,
            temperature: self.temperature,
            top_p: self.top_p,
            max_output_tokens: self.max_output_tokens,
            previous_response_id: None,
            reasoning: &self.reasoning,
            store: false,
            text: serde_json::json!({"format": {"type": "text"}}),
            truncation: "disabled",
            metadata: &self.metadata,
            incomplete_details: None,
            error: None,
            usage: None,
            timings: None,
        }
    }

    fn response(&self, f: &Finish, output: Vec<Item>) -> ResponseObject<'_> {
        let incomplete = f.reason == FinishReason::Length;
        let mut r = self.object(
            if incomplete {
                "incomplete"
            } else {
                "completed"
            },
            output,
        );
        r.incomplete_details =
            incomplete.then(|| serde_json::json!({"reason": "max_output_tokens"}));
        r.usage = Some(Usage {
            input_tokens: f.prompt_tokens(),
            input_tokens_details: InputDetails {
                cached_tokens: f.timings.cached_tokens,
            },
            output_tokens: f.completion_tokens(),
            output_tokens_details: OutputDetails {
                reasoning_tokens: 0,
            },
            total_tokens: f.prompt_tokens() + f.completion_tokens(),
        });
        r.timings = Some(f.timings_out());
        r
    }
}

#[derive(Serialize)]
struct ResponseObject<'a> {
    id: &'a str,
    object: &'static str,
    created_at: u64,
    status: &'static str,
    model: &'a str,
    output: Vec<Item>,
    instructions: Option<&'a str>,
    tools: &'a [Value],
    tool_choice: &'a Value,
    parallel_tool_calls: bool,
    temperature: f32,
    top_p: f32,
    max_output_tokens: Option<u32>,
    previous_response_id: Option<&'a str>,
    reasoning: &'a Value,
    store: bool,
    text: Value,
    truncation: &'static str,
    metadata: &'a Value,
    incomplete_details: Option<Value>,
    error: Option<Value>,
    usage: Option<Usage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    timings: Option<TimingsOut>,
}

#[derive(Serialize)]
struct Usage {
    input_tokens: usize,
    input_tokens_details: InputDetails,
    output_tokens: usize,
    output_tokens_details: OutputDetails,
    total_tokens: usize,
}

#[derive(Serialize)]
struct InputDetails {
    cached_tokens: usize,
}

#[derive(Serialize)]
struct OutputDetails {
    reasoning_tokens: usize,
}

#[derive(Clone, Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Item {
    Message {
        id: String,
        status: &'static str,
        role: &'static str,
        content: Vec<Part>,
    },
    FunctionCall {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
        status: &'static str,
    },
    Reasoning {
        id: String,
        summary: Vec<Value>,
        content: Vec<Part>,
    },
}

#[derive(Clone, Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Part {
    OutputText {
        text: String,
        annotations: Vec<Value>,
        logprobs: Vec<Value>,
    },
    ReasoningText {
        text: String,
    },
}

impl Part {
    fn output_text(text: String) -> Part {
        Part::OutputText {
            text,
            annotations: Vec::new(),
            logprobs: Vec::new(),
        }
    }
}

impl Item {
    fn message(id: String, text: String, status: &'static str) -> Item {
        Item::Message {
            id,
            status,
            role: "assistant",
            content: vec![Part::output_text(text)],
        }
    }

    fn reasoning(id: String, text: String) -> Item {
        Item::Reasoning {
            id,
            summary: Vec::new(),
            content: vec![Part::ReasoningText { text }],
        }
    }

    fn call(c: ToolCall) -> Item {
        Item::FunctionCall {
            id: new_call_id("fc_"),
            call_id: c.id,
            name: c.name,
            arguments: c.arguments,
            status: "completed",
        }
    }
}

/// The item being streamed.
enum Open {
    Message {
        id: String,
        text: String,
    },
    Reasoning {
        id: String,
        text: String,
    },
    Call {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
    },
}

struct ResponsesStream {
    meta: Meta,
    seq: u64,
    /// Finished items, in order.
    output: Vec<Item>,
    open: Option<Open>,
}

impl ResponsesStream {
    /// One event: `data` gets `type` and `sequence_number` added.
    fn ev(&mut self, kind: &'static str, mut data: Value) -> Frame {
        data["type"] = Value::String(kind.into());
        data["sequence_number"] = self.seq.into();
        self.seq += 1;
        run::event(Some(kind), &data)
    }

    fn close(&mut self, out: &mut Vec<Frame>) {
        let oi = self.output.len();
        let item = match self.open.take() {
            None => return,
            Some(Open::Message { id, text }) => {
                let part = Part::output_text(text.clone());
                out.push(self.ev("response.output_text.done", serde_json::json!({"item_id": id, "output_index": oi, "content_index": 0, "text": text, "logprobs": []})));
                out.push(self.ev("response.content_part.done", serde_json::json!({"item_id": id, "output_index": oi, "content_index": 0, "part": part})));
                Item::message(id, text, "completed")
            }
            Some(Open::Reasoning { id, text }) => {
                out.push(self.ev("response.reasoning_text.done", serde_json::json!({"item_id": id, "output_index": oi, "content_index": 0, "text": text})));
                Item::reasoning(id, text)
            }
            Some(Open::Call {
                id,
                call_id,
                name,
                arguments,
            }) => {
                out.push(self.ev("response.function_call_arguments.done", serde_json::json!({"item_id": id, "output_index": oi, "name": name, "arguments": arguments})));
                Item::FunctionCall {
                    id,
                    call_id,
                    name,
                    arguments,
                    status: "completed",
                }
            }
        };
        out.push(self.ev(
            "response.output_item.done",
            serde_json::json!({"output_index": oi, "item": item}),
        ));
        self.output.push(item);
    }

    fn text(&mut self, out: &mut Vec<Frame>, t: String, reasoning: bool) {
        let oi = self.output.len();
        let fits = matches!(
            (&self.open, reasoning),
            (Some(Open::Message { .. }), false) | (Some(Open::Reasoning { .. }), true)
        );
        if !fits {
            self.close(out);
            if reasoning {
                let id = new_call_id("rs_");
                let item = Item::Reasoning {
                    id: id.clone(),
                    summary: Vec::new(),
                    content: Vec::new(),
                };
                out.push(self.ev(
                    "response.output_item.added",
                    serde_json::json!({"output_index": oi, "item": item}),
                ));
                self.open = Some(Open::Reasoning {
                    id,
                    text: String::new(),
                });
            } else {
                let id = new_call_id("msg_");
                let item = Item::Message {
                    id: id.clone(),
                    status: "in_progress",
                    role: "assistant",
                    content: Vec::new(),
                };
                out.push(self.ev(
                    "response.output_item.added",
                    serde_json::json!({"output_index": oi, "item": item}),
                ));
                let part = Part::output_text(String::new());
                out.push(self.ev("response.content_part.added", serde_json::json!({"item_id": id, "output_index": oi, "content_index": 0, "part": part})));
                self.open = Some(Open::Message {
                    id,
                    text: String::new(),
                });
            }
        }
        let (id, kind) = match &mut self.open {
            Some(Open::Message { id, text }) => {
                text.push_str(&t);
                (id.clone(), "response.output_text.delta")
            }
            Some(Open::Reasoning { id, text }) => {
                text.push_str(&t);
                (id.clone(), "response.reasoning_text.delta")
            }
            Some(Open::Call { .. }) | None => return,
        };
        let mut data =
            serde_json::json!({"item_id": id, "output_index": oi, "content_index": 0, "delta": t});
        if !reasoning {
            data["logprobs"] = Value::Array(Vec::new());
        }
        out.push(self.ev(kind, data));
    }
}

impl Shape for ResponsesStream {
    fn start(&mut self) -> Vec<Frame> {
        let r =
            serde_json::to_value(self.meta.object("in_progress", Vec::new())).unwrap_or_default();
        vec![
            self.ev("response.created", serde_json::json!({"response": r})),
            self.ev("response.in_progress", serde_json::json!({"response": r})),
        ]
    }

    fn deltas(&mut self, deltas: Vec<Delta>) -> Vec<Frame> {
        let mut out = Vec::new();
        for d in deltas {
            match d {
                Delta::Token { .. } => {}
                Delta::Text(t) => self.text(&mut out, t, false),
                Delta::Reasoning(t) => self.text(&mut out, t, true),
                Delta::CallStart {
                    id: call_id, name, ..
                } => {
                    self.close(&mut out);
                    let oi = self.output.len();
                    let id = new_call_id("fc_");
                    let added = Item::FunctionCall {
                        id: id.clone(),
                        call_id: call_id.clone(),
                        name: name.clone(),
                        arguments: String::new(),
                        status: "in_progress",
                    };
                    out.push(self.ev(
                        "response.output_item.added",
                        serde_json::json!({"output_index": oi, "item": added}),
                    ));
                    self.open = Some(Open::Call {
                        id,
                        call_id,
                        name,
                        arguments: String::new(),
                    });
                }
                Delta::CallArgs { delta, .. } => {
                    let oi = self.output.len();
                    let Some(Open::Call { id, arguments, .. }) = &mut self.open else {
                        continue;
                    };
                    arguments.push_str(&delta);
                    let id = id.clone();
                    out.push(self.ev(
                        "response.function_call_arguments.delta",
                        serde_json::json!({"item_id": id, "output_index": oi, "delta": delta}),
                    ));
                }
                Delta::CallEnd => {
                    if matches!(self.open, Some(Open::Call { .. })) {
                        self.close(&mut out);
                    }
                }
            }
        }
        out
    }

    fn finish(&mut self, f: &Finish) -> Vec<Frame> {
        let mut out = Vec::new();
        if self.output.is_empty() && self.open.is_none() {
            // Every response has its message item, even an empty one.
            self.text(&mut out, String::new(), false);
        }
        self.close(&mut out);
        let output = std::mem::take(&mut self.output);
        let r = serde_json::to_value(self.meta.response(f, output)).unwrap_or_default();
        let kind = if f.reason == FinishReason::Length {
            "response.incomplete"
        } else {
            "response.completed"
        };
        out.push(self.ev(kind, serde_json::json!({"response": r})));
        out
    }

    fn error(&mut self, e: &ApiError) -> Vec<Frame> {
        let mut r =
            serde_json::to_value(self.meta.object("failed", std::mem::take(&mut self.output)))
                .unwrap_or_default();
        r["error"] = serde_json::json!({"code": e.reason(), "message": e.to_string()});
        vec![self.ev("response.failed", serde_json::json!({"response": r}))]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::run::testing::{drive, envelope_run, events, thinking_run};
    use ds4_model::chat::Thinking;

    fn shape() -> ResponsesStream {
        ResponsesStream {
            meta: Meta {
                id: "resp_1".into(),
                created_at: 1,
                model: "m".into(),
                instructions: None,
                tools: Vec::new(),
                tool_choice: "auto".into(),
                temperature: 0.0,
                top_p: 1.0,
                max_output_tokens: None,
                reasoning: serde_json::json!({}),
                metadata: serde_json::json!({}),
            },
            seq: 0,
            output: Vec::new(),
            open: None,
        }
    }

    #[tokio::test]
    async fn streamed_tool_calls_have_the_responses_event_lifecycle() {
        let frames = drive(envelope_run(None), shape()).await;
        let ev = events(&frames);
        let names: Vec<&str> = ev.iter().map(|e| e.0).collect();
        assert_eq!(
            names
                .iter()
                .filter(|n| !n.ends_with("text.delta"))
                .copied()
                .collect::<Vec<_>>(),
            vec![
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                // The arguments stream in the two pieces the model wrote.
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        for (i, (_, v)) in ev.iter().enumerate() {
            assert_eq!(v["sequence_number"], i);
        }
        let added = &ev
            .iter()
            .filter(|e| e.0 == "response.output_item.added")
            .nth(1)
            .unwrap()
            .1;
        assert_eq!(added["output_index"], 1);
        assert_eq!(added["item"]["type"], "function_call");
        assert!(added["item"]["call_id"]
            .as_str()
            .unwrap()
            .starts_with("call_"));
        let done = &ev.last().unwrap().1["response"];
        assert_eq!(done["id"], "resp_1");
        assert_eq!(done["status"], "completed");
        assert_eq!(done["output"][0]["role"], "assistant");
        assert_eq!(done["output"][0]["content"][0]["text"], "Let me check.\n");
        assert_eq!(done["output"][1]["name"], "get_weather");
        assert_eq!(done["output"][1]["arguments"], "{\"city\": \"Paris\"}");
        assert_eq!(done["usage"]["output_tokens"], 9);
    }

    #[tokio::test]
    async fn an_error_after_the_stream_started_is_response_failed() {
        let frames = drive(crate::api::run::testing::failing_run(&["Hi"]), shape()).await;
        let ev = events(&frames);
        let (name, v) = ev.last().unwrap();
        assert_eq!(*name, "response.failed");
        assert_eq!(v["response"]["status"], "failed");
        assert_eq!(v["response"]["id"], "resp_1");
        assert!(v["response"]["error"]["message"].is_string());
    }

    #[tokio::test]
    async fn a_deepseek_dsml_call_is_a_function_call_item_with_streamed_arguments() {
        use crate::api::run::testing::{dsml_run, DSML_ARGS, DSML_REASONING};
        let ev = events(&drive(dsml_run(None), shape()).await);
        for (i, (_, v)) in ev.iter().enumerate() {
            assert_eq!(v["sequence_number"], i);
        }
        let added: Vec<&Value> = ev
            .iter()
            .filter(|e| e.0 == "response.output_item.added")
            .map(|e| &e.1["item"])
            .collect();
        let kinds: Vec<&str> = added.iter().map(|i| i["type"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["reasoning", "message", "function_call"]);
        assert_eq!(added[2]["name"], "get_weather");
        assert_eq!(added[2]["arguments"], "");
        let deltas: Vec<&str> = ev
            .iter()
            .filter(|e| e.0 == "response.function_call_arguments.delta")
            .map(|e| {
                assert_eq!(e.1["output_index"], 2);
                assert_eq!(e.1["item_id"], added[2]["id"]);
                e.1["delta"].as_str().unwrap()
            })
            .collect();
        assert!(deltas.len() > 3, "arguments are streamed: {deltas:?}");
        assert_eq!(deltas.concat(), DSML_ARGS);
        let args_done = ev
            .iter()
            .find(|e| e.0 == "response.function_call_arguments.done")
            .unwrap();
        assert_eq!(args_done.1["arguments"], DSML_ARGS);
        let done = &ev.last().unwrap().1["response"];
        assert_eq!(done["status"], "completed");
        assert_eq!(done["output"][0]["content"][0]["text"], DSML_REASONING);
        assert_eq!(done["output"][1]["content"][0]["text"], "Checking.");
        assert_eq!(done["output"][2]["type"], "function_call");
        assert_eq!(done["output"][2]["status"], "completed");
        assert_eq!(done["output"][2]["arguments"], DSML_ARGS);
        assert_eq!(done["output"][2]["call_id"], added[2]["call_id"]);

        // Not streamed.
        let (c, _) = crate::api::run::collect(dsml_run(None)).await.unwrap();
        let out = serde_json::to_value(output_items(c)).unwrap();
        let kinds: Vec<&str> = out
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["type"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["reasoning", "message", "function_call"]);
        assert_eq!(out[0]["content"][0]["text"], DSML_REASONING);
        assert_eq!(out[2]["name"], "get_weather");
        assert_eq!(out[2]["arguments"], DSML_ARGS);
        assert!(out[2]["call_id"].as_str().unwrap().starts_with("call_"));
    }

    #[test]
    fn a_deepseek_responses_request_renders_the_spec_prompt() {
        use crate::api::convo::testing::{
            api_prompt, renderer_prompt, PARAMETERS, REASONING, RESULT, SYSTEM, USER,
        };
        let q = |s: &str| serde_json::to_string(s).unwrap();
        let body = |effort: &str| {
            format!(
                r#"{{"model":"m","instructions":{},"input":[{{"role":"user","content":{}}},{{"type":"reasoning","id":"rs_1","summary":[],"content":[{{"type":"reasoning_text","text":{}}}]}},{{"type":"function_call","call_id":"call_0","name":"get_weather","arguments":{}}},{{"type":"function_call_output","call_id":"call_0","output":{}}}],"tools":[{{"type":"function","name":"get_weather","description":"Get current weather for a city","parameters":{PARAMETERS},"strict":false}}],"reasoning":{{"effort":{}}}}}"#,
                q(SYSTEM),
                q(USER),
                q(REASONING),
                q(r#"{"city": "Rome", "days": 1}"#),
                q(RESULT),
                q(effort),
            )
        };
        let prompt = |b: &str| {
            let req: ResponsesRequest = serde_json::from_str(b).unwrap();
            let mut c = conversation(&req).unwrap();
            attach_raw_tools(&mut c, b.as_bytes());
            (c.thinking, api_prompt(&c, &Default::default()))
        };
        let (thinking, p) = prompt(&body("high"));
        assert_eq!(thinking, Some(Thinking::High));
        assert_eq!(p, renderer_prompt());
        let (thinking, p) = prompt(&body("none"));
        assert_eq!(thinking, Some(Thinking::Off));
        assert!(p.ends_with("<｜Assistant｜></think>"));
        let (thinking, _) = prompt(&body("max"));
        assert_eq!(thinking, Some(Thinking::Max));
        let req: ResponsesRequest = serde_json::from_str(&body("huge")).unwrap();
        assert!(conversation(&req).is_err());
    }

    #[tokio::test]
    async fn reasoning_goes_out_as_a_reasoning_item() {
        let frames = drive(thinking_run(), shape()).await;
        let ev = events(&frames);
        let done = &ev.last().unwrap().1["response"];
        assert_eq!(done["output"][0]["type"], "reasoning");
        assert_eq!(
            done["output"][0]["content"][0]["text"],
            "France's capital is Paris."
        );
        assert_eq!(done["output"][1]["type"], "message");
        assert_eq!(done["output"][1]["content"][0]["text"], "Paris.");
        assert!(ev.iter().any(|e| e.0 == "response.reasoning_text.delta"));
    }
}

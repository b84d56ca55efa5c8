//! `POST /v1/responses` (OpenAI Responses), JSON and SSE. Stateless: the
//! client sends the whole conversation every time (`store: false`).
//!
//! This file reads requests; `output` writes response objects and their
//! stream of events.

mod output;

use std::sync::Arc;

use axum::body::Bytes;
use axum::response::IntoResponse;
use axum::Json;
use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::convo::{self, FunctionDef, TextOr, ToolShape};
use super::fields::Metadata;
use super::openai_chat::WireToolChoice;
use super::run::{self, Job};
use super::structured::{self, TextFormat};
use super::tool_slip;
use super::{ApiError, AppState, Reply, SamplingFields, Surface};
use ds4_model::chat::{new_call_id, Conversation, Role, ToolCall, ToolChoice, Turn};
use output::{output_items, Meta, ResponsesStream};

#[derive(Debug, Deserialize)]
pub struct ResponsesRequest {
    #[serde(default)]
    pub model: String,
    /// A user message, or a list of items.
    pub input: TextOr<InputElement>,
    pub instructions: Option<String>,
    #[serde(default)]
    pub tools: Vec<WireTool>,
    pub tool_choice: Option<WireToolChoice>,
    pub max_output_tokens: Option<u32>,
    #[serde(flatten)]
    pub sampling: SamplingFields,
    pub reasoning: Option<ReasoningConfig>,
    #[serde(default)]
    pub stream: bool,
    pub store: Option<bool>,
    pub previous_response_id: Option<String>,
    pub text: Option<TextConfig>,
    /// Echoed back unread.
    pub metadata: Option<Metadata>,
    /// `false`: at most one call in the answer.
    pub parallel_tool_calls: Option<bool>,
    // Documented fields that are read (so that a wrong type is refused)
    // and have no effect here.
    #[allow(dead_code)]
    pub user: Option<String>,
}

/// An input item. A message may leave out its `type`.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum InputItem {
    Message(Message),
    FunctionCall {
        call_id: String,
        name: String,
        arguments: String,
    },
    FunctionCallOutput {
        #[serde(default)]
        call_id: Option<String>,
        #[serde(default)]
        output: Option<TextOr<Part>>,
    },
    /// Earlier reasoning, for families that keep it.
    Reasoning {
        #[serde(default)]
        summary: Option<Vec<ReasoningPart>>,
        #[serde(default)]
        content: Option<Vec<ReasoningPart>>,
    },
}

/// An element of `input`: an [`InputItem`], a message when it has no
/// `type`.
#[derive(Debug)]
pub struct InputElement(pub InputItem);

impl<'de> Deserialize<'de> for InputElement {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Held whole to look for `type` first, as serde does to read any
        // internally tagged enum. Messages are read as such (not through
        // the enum) so that their errors keep their place in the item.
        let v = Value::deserialize(d)?;
        let item = match v.get("type") {
            None | Some(Value::Null) => serde_path_to_error::deserialize(v).map(InputItem::Message),
            Some(t) if t == "message" => {
                serde_path_to_error::deserialize(v).map(InputItem::Message)
            }
            Some(_) => serde_path_to_error::deserialize(v),
        };
        item.map(InputElement).map_err(de::Error::custom)
    }
}

#[derive(Debug, Deserialize)]
pub struct Message {
    pub role: MessageRole,
    /// A string, or a list of text parts.
    #[serde(default)]
    pub content: Option<TextOr<Part>>,
}

#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MessageRole {
    User,
    Assistant,
    System,
    Developer,
}

impl From<MessageRole> for Role {
    fn from(r: MessageRole) -> Role {
        match r {
            MessageRole::User => Role::User,
            MessageRole::Assistant => Role::Assistant,
            MessageRole::System | MessageRole::Developer => Role::System,
        }
    }
}

/// A content part: text of any of the kinds a client sends back.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Part {
    #[serde(
        rename = "input_text",
        alias = "output_text",
        alias = "text",
        alias = "summary_text"
    )]
    Text {
        #[serde(default)]
        text: String,
    },
}

/// A part of a reasoning item's `content` or `summary`.
#[derive(Debug, Deserialize)]
pub struct ReasoningPart {
    #[serde(default)]
    pub text: String,
}

/// A tool: functions are offered to the model, other kinds (hosted
/// tools) are skipped.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WireTool {
    Function(FunctionDef),
    #[serde(other)]
    Other,
}

/// `reasoning`: the effort names the thinking mode; echoed back.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct ReasoningConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub effort: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct TextConfig {
    pub format: Option<TextFormat>,
}

/// The call ids the leading `function_call_output` items answer.
fn leading_outputs(req: &ResponsesRequest) -> Vec<String> {
    match &req.input {
        TextOr::List(items) => items
            .iter()
            .map_while(|InputElement(i)| match i {
                InputItem::FunctionCallOutput { call_id, .. } => {
                    Some(call_id.clone().unwrap_or_default())
                }
                _ => None,
            })
            .collect(),
        TextOr::Text(_) => Vec::new(),
    }
}

/// The text of a message's content or a call's output.
fn text_of(content: Option<TextOr<Part>>) -> String {
    match content {
        None => String::new(),
        Some(TextOr::Text(t)) => t,
        Some(TextOr::List(parts)) => parts.into_iter().map(|Part::Text { text }| text).collect(),
    }
}

/// The request as a conversation; `body` is the request's bytes (its
/// tools as the client wrote them).
fn conversation(req: &mut ResponsesRequest, body: &[u8]) -> Result<Conversation, ApiError> {
    let mut c = Conversation::default();
    if let Some(i) = req.instructions.as_deref().filter(|s| !s.is_empty()) {
        c.push_text(Role::System, i);
    }
    let items = match std::mem::replace(&mut req.input, TextOr::List(Vec::new())) {
        TextOr::Text(t) => {
            c.push_text(Role::User, &t);
            Vec::new()
        }
        TextOr::List(items) => items,
    };
    for InputElement(item) in items {
        match item {
            InputItem::Message(m) => {
                let role = Role::from(m.role);
                let text = text_of(m.content);
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
            InputItem::FunctionCall {
                call_id,
                name,
                arguments,
            } => convo::push_call(
                &mut c,
                ToolCall {
                    id: call_id,
                    name,
                    arguments,
                },
            ),
            InputItem::FunctionCallOutput { output, .. } => {
                c.turns.push(Turn::new(Role::Tool, text_of(output)));
            }
            InputItem::Reasoning { summary, content } => {
                let text = |parts: Option<Vec<ReasoningPart>>| -> String {
                    parts.into_iter().flatten().map(|p| p.text).collect()
                };
                let mut reasoning = text(content);
                if reasoning.is_empty() {
                    reasoning = text(summary);
                }
                c.push_reasoning(&reasoning);
            }
        }
    }
    let functions = req.tools.drain(..).map(|t| match t {
        WireTool::Function(f) => Some(f),
        WireTool::Other => None,
    });
    c.tools = convo::tool_specs(functions.collect(), body, ToolShape::Flat("parameters"));
    c.choice = choice(req);
    c.single_call = req.parallel_tool_calls == Some(false);
    c.thinking = match req.reasoning.as_ref().and_then(|r| r.effort.as_deref()) {
        Some(e) => Some(convo::effort(e, "reasoning.effort")?),
        None => None,
    };
    Ok(c)
}

/// The tool choice of a request (`auto` when absent).
fn choice(req: &ResponsesRequest) -> ToolChoice {
    req.tool_choice
        .as_ref()
        .map_or(ToolChoice::Auto, WireToolChoice::choice)
}

impl Surface for ResponsesRequest {
    const NAME: &'static str = "responses";

    /// `POST /v1/responses`.
    async fn answer(mut self, state: Arc<AppState>, body: Bytes) -> Result<Reply, ApiError> {
        if self.store == Some(true) {
            return Err(ApiError::bad(
                "store: true is not supported: this server keeps no responses; send store: false and the full input each time",
                "store",
            ));
        }
        let spec = self
            .text
            .take()
            .and_then(|t| t.format)
            .and_then(TextFormat::spec)
            .map(|s| (s, "text.format"));
        let sampling = self.sampling.params()?;
        let tool_choice = choice(&self);
        let previous = self.previous_response_id.take().filter(|s| !s.is_empty());
        let answered = leading_outputs(&self);
        let mut convo = conversation(&mut self, &body)?;
        if let Some(prev) = &previous {
            convo = state
                .continuations
                .resume(prev, &answered, convo, "previous_response_id")?;
        }
        let (rendered, kept) =
            convo::render(&state.chat, convo, state.render_options(&self.model)).await?;
        let constraint = structured::compile(&state, spec, &rendered.answer).await?;
        let job = Job {
            prompt: rendered.tokens,
            max_tokens: self.max_output_tokens,
            sampling: sampling.clone(),
            stop: Vec::new(),
            logprobs: None,
            answer: rendered.answer,
            id_prefix: "call_",
            constraint,
        };
        let retry = tool_slip::Retry::new(&state, &job, &body, self.stream);
        let mut run = run::start(&state, job)?;
        let id = new_call_id("resp_");
        let (keeper, key) = (state.clone(), id.clone());
        run.on_done(move |c, _| keeper.continuations.remember(kept, c, Some(&key)));
        let meta = Meta {
            id,
            created_at: super::unix_now(),
            model: state.model_id.clone(),
            instructions: self.instructions,
            // As the client sent them, hosted tools included.
            tools: convo::raw_tools(&body)
                .into_iter()
                .map(|t| t.to_owned())
                .collect(),
            tool_choice: (&tool_choice).into(),
            temperature: sampling.temperature,
            top_p: sampling.top_p,
            max_output_tokens: self.max_output_tokens,
            reasoning: self.reasoning.unwrap_or_default(),
            metadata: Value::Object(self.metadata.unwrap_or_default().0),
        };
        if self.stream {
            let shape = ResponsesStream::new(meta);
            return Ok(Reply::stream::<Self>(&state, run, shape));
        }
        let (c, f) = tool_slip::collect(&state, run, retry).await?;
        Ok(Reply::Json(
            Json(meta.response(&f, output_items(c))).into_response(),
        ))
    }

    fn model(&self) -> &str {
        &self.model
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ds4_model::chat::Thinking;

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
            let mut req: ResponsesRequest = serde_json::from_str(b).unwrap();
            let c = conversation(&mut req, b.as_bytes()).unwrap();
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
        let b = body("huge");
        let mut req: ResponsesRequest = serde_json::from_str(&b).unwrap();
        assert!(conversation(&mut req, b.as_bytes()).is_err());
    }

    fn refusal(body: &str) -> (String, Option<String>) {
        crate::api::error::testing::refusal::<ResponsesRequest>(body)
    }

    #[test]
    fn a_malformed_item_is_refused_with_its_place_and_reason() {
        let (m, param) = refusal(
            r#"{"input":[{"role":"user","content":"hi"},{"type":"function_call","name":"f","arguments":"{}"}]}"#,
        );
        assert!(m.contains("input[1]: missing field `call_id`"), "{m}");
        assert_eq!(param.as_deref(), Some("input"));
        // An item type this server does not take is named, with the ones
        // it does.
        let (m, param) = refusal(r#"{"input":[{"type":"web_search_call","id":"ws_1"}]}"#);
        assert!(m.contains("input[0]"), "{m}");
        assert!(m.contains("unknown variant `web_search_call`"), "{m}");
        assert!(m.contains("function_call_output"), "{m}");
        assert_eq!(param.as_deref(), Some("input"));
        // A message without `type` is still a message, and its errors say
        // where in it they are.
        let (m, _) = refusal(r#"{"input":[{"role":"wizard","content":"x"}]}"#);
        assert!(
            m.contains("input[0]: role: unknown variant `wizard`"),
            "{m}"
        );
        let (m, _) = refusal(r#"{"input":[{"role":"user","content":5}]}"#);
        assert!(
            m.contains("input[0]: content: invalid type: integer `5`"),
            "{m}"
        );
        let (m, param) = refusal(r#"{"input":"x","tools":[{"type":"function"}]}"#);
        assert!(m.contains("tools[0]: missing field `name`"), "{m}");
        assert_eq!(param.as_deref(), Some("tools"));
        let (m, param) = refusal(r#"{"input":"x","tool_choice":"sometimes"}"#);
        assert!(m.contains("tool_choice: must be \"auto\""), "{m}");
        assert_eq!(param.as_deref(), Some("tool_choice"));
    }

    #[test]
    fn an_unknown_content_part_type_is_refused() {
        let (m, param) = refusal(
            r#"{"input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_image","image_url":"x"}]}]}"#,
        );
        assert!(m.contains("input[0]: content[1].type"), "{m}");
        assert!(m.contains("unknown variant `input_image`"), "{m}");
        assert_eq!(param.as_deref(), Some("input"));
    }

    #[test]
    fn items_of_every_kind_make_one_conversation() {
        let b = r#"{"input":[{"role":"user","content":[{"type":"input_text","text":"Weather?"}]},{"type":"reasoning","summary":[{"type":"summary_text","text":"call it"}]},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Checking.","annotations":[]}]},{"type":"function_call","call_id":"c1","name":"get_weather","arguments":"{}"},{"type":"function_call_output","call_id":"c1","output":[{"type":"input_text","text":"sunny"}]}],"tools":[{"type":"web_search"},{"type":"function","name":"get_weather"}],"tool_choice":{"type":"function","name":"get_weather"}}"#;
        let mut req: ResponsesRequest = serde_json::from_str(b).unwrap();
        let c = conversation(&mut req, b.as_bytes()).unwrap();
        let roles: Vec<Role> = c.turns.iter().map(|t| t.role).collect();
        assert_eq!(roles, [Role::User, Role::Assistant, Role::Tool]);
        assert_eq!(c.turns[1].reasoning.as_deref(), Some("call it"));
        assert_eq!(c.turns[1].text, "Checking.");
        assert_eq!(c.turns[1].calls[0].id, "c1");
        assert_eq!(c.turns[2].text, "sunny");
        assert_eq!(c.choice, ToolChoice::Named("get_weather".into()));
        // The hosted tool is skipped; a function without parameters takes
        // none.
        assert_eq!(c.tools.len(), 1);
        assert_eq!(c.tools[0].parameters, convo::empty_schema());
        assert_eq!(
            c.tools[0].raw.as_deref(),
            Some(r#"{"name":"get_weather","parameters":{"type":"object","properties":{}}}"#)
        );
    }
}

//! The conversation every chat-like surface converts its request into,
//! and its rendering to prompt tokens with the model's chat template and
//! the tool protocol.

use std::sync::Arc;

use ds4_model::families::Family;
use ds4_model::prompt::deepseek4::{self, Message, Thinking};
use ds4_model::prompt::dsml;
use serde_json::{json, Value};

use super::run::ToolParsing;
use super::ApiError;
use crate::reasoning::{self, Delimiters};
use crate::runtime::Prompter;
use crate::tools::{self, ReplayStore, ToolCall, ToolChoice, ToolProtocol, ToolSpec};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
    /// A tool result.
    Tool,
}

#[derive(Clone, Debug)]
pub struct Turn {
    pub role: Role,
    pub text: String,
    /// Calls an assistant turn made.
    pub calls: Vec<ToolCall>,
    /// An assistant turn's reasoning, as the client sent it back (shown
    /// to families that keep earlier reasoning).
    pub reasoning: Option<String>,
}

impl Turn {
    pub fn new(role: Role, text: impl Into<String>) -> Turn {
        Turn {
            role,
            text: text.into(),
            calls: Vec::new(),
            reasoning: None,
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct Conversation {
    pub turns: Vec<Turn>,
    pub tools: Vec<ToolSpec>,
    pub choice: ToolChoice,
    /// The thinking mode the request asked for (families that think);
    /// `None`: the server default, thinking.
    pub thinking: Option<Thinking>,
}

impl Conversation {
    /// Append text to the last turn when it has `role`, else start a turn.
    pub fn push_text(&mut self, role: Role, text: &str) {
        match self.turns.last_mut() {
            Some(t) if t.role == role && t.calls.is_empty() => {
                if !t.text.is_empty() && !text.is_empty() {
                    t.text.push('\n');
                }
                t.text.push_str(text);
            }
            _ => self.turns.push(Turn::new(role, text)),
        }
    }

    /// Attach earlier reasoning to the assistant turn it belongs to: the
    /// last turn when it is an assistant turn not yet answered, else a new
    /// assistant turn (its text and calls follow).
    pub fn push_reasoning(&mut self, text: &str) {
        match self.turns.last_mut() {
            Some(t) if t.role == Role::Assistant && t.calls.is_empty() && t.text.is_empty() => {
                t.reasoning.get_or_insert_with(String::new).push_str(text)
            }
            _ => {
                let mut t = Turn::new(Role::Assistant, "");
                t.reasoning = Some(text.to_string());
                self.turns.push(t);
            }
        }
    }

    /// Whether generated text should be parsed for calls.
    pub fn tools_active(&self) -> bool {
        !self.tools.is_empty() && self.choice != ToolChoice::None
    }
}

/// A rendered prompt.
#[derive(Debug)]
pub struct Rendered {
    pub tokens: Vec<u32>,
    /// How to find calls in the answer, when tools are offered.
    pub tools: Option<ToolParsing>,
    /// How the answer marks reasoning.
    pub reasoning: Option<Delimiters>,
}

/// What rendering needs besides the conversation.
#[derive(Clone, Debug)]
pub struct RenderOptions {
    /// The server's context size (Think Max needs a large one).
    pub ctx: usize,
    /// Sampled tool-call bytes by call id.
    pub replay: Arc<ReplayStore>,
}

/// Render `c` with the family's prompt format, the tool protocol when
/// tools are offered, and the generation prompt; tokenize. Generated call
/// ids will get `id_prefix`.
pub fn render(
    p: &Prompter,
    c: &Conversation,
    id_prefix: &'static str,
    opts: &RenderOptions,
) -> Result<Rendered, ApiError> {
    if c.turns.is_empty() {
        return Err(ApiError::bad("messages must not be empty", "messages"));
    }
    if let ToolChoice::Named(n) = &c.choice {
        if !c.tools.iter().any(|t| &t.name == n) {
            return Err(ApiError::bad(
                format!("tool_choice names {n:?}, which is not among the tools"),
                "tool_choice",
            ));
        }
    }
    if p.family == Family::DeepSeek4 {
        let thinking = c.thinking.unwrap_or(Thinking::High).for_context(opts.ctx);
        let text = deepseek4_prompt(c, thinking, &opts.replay)?;
        let tokens = p
            .tokenizer
            .encode_with(&text, true, false)
            .map_err(|e| ApiError::Internal(e.to_string()))?;
        let tools = c.tools_active().then(|| ToolParsing {
            id_prefix,
            names: offered(c).map(|t| t.name.clone()).collect(),
            forced: String::new(),
            protocol: ToolProtocol::Dsml,
            replay: Some(opts.replay.clone()),
        });
        let delims = reasoning::delimiters_for(p.family);
        let reasoning = match thinking {
            Thinking::Off => delims,
            Thinking::High | Thinking::Max => delims.map(Delimiters::inside),
        };
        return Ok(Rendered {
            tokens,
            tools,
            reasoning,
        });
    }
    let template = p.template.as_ref().ok_or_else(|| {
        ApiError::bad(
            "this model has no chat template; use /v1/completions with a raw prompt",
            "messages",
        )
    })?;
    let mut messages: Vec<Value> = Vec::new();
    if c.tools_active() {
        let tool_text = tools::system_prompt(&c.tools, &c.choice);
        match c.turns.first() {
            Some(t) if t.role == Role::System => {}
            _ => messages.push(json!({"role": "system", "content": tool_text})),
        }
    }
    for (i, t) in c.turns.iter().enumerate() {
        // Reasoning alone is not shown to families without reasoning.
        if t.role == Role::Assistant
            && t.text.is_empty()
            && t.calls.is_empty()
            && t.reasoning.is_some()
        {
            continue;
        }
        let (role, content) = match t.role {
            Role::System if i == 0 && c.tools_active() => (
                "system",
                format!(
                    "{}\n\n{}",
                    t.text,
                    tools::system_prompt(&c.tools, &c.choice)
                ),
            ),
            Role::System => ("system", t.text.clone()),
            Role::User => ("user", t.text.clone()),
            Role::Tool => ("user", tools::render_result(&t.text)),
            Role::Assistant => {
                let mut s = t.text.clone();
                for call in &t.calls {
                    if !s.is_empty() {
                        s.push('\n');
                    }
                    s.push_str(&tools::render_call(&call.name, &call.arguments));
                }
                ("assistant", s)
            }
        };
        // Consecutive tool results become one user turn.
        if let (Role::Tool, Some(prev)) = (t.role, messages.last_mut()) {
            if i > 0 && c.turns[i - 1].role == Role::Tool {
                let joined = format!("{}\n{}", prev["content"].as_str().unwrap_or(""), content);
                prev["content"] = Value::String(joined);
                continue;
            }
        }
        messages.push(json!({"role": role, "content": content}));
    }
    let mut text = template
        .render_with(&ds4_model::prompt::RenderInput {
            messages: &messages,
            tools: None,
            add_generation_prompt: true,
            extra: None,
        })
        .map_err(|e| {
            ApiError::bad(
                format!("the chat template refused the messages: {e}"),
                "messages",
            )
        })?;
    let parser_prefix = if c.tools_active() {
        tools::forced_prefix(&c.choice)
    } else {
        String::new()
    };
    text.push_str(&parser_prefix);
    let tokens = p
        .tokenizer
        .encode(&text, true)
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    let tools = c.tools_active().then(|| ToolParsing {
        id_prefix,
        names: c.tools.iter().map(|t| t.name.clone()).collect(),
        forced: parser_prefix,
        protocol: ToolProtocol::Envelope,
        replay: None,
    });
    Ok(Rendered {
        tokens,
        tools,
        reasoning: reasoning::delimiters_for(p.family),
    })
}

/// The tools shown to the model: all of them, or the one `tool_choice`
/// names. (DSML has no way to force a call; `required` offers all.)
fn offered(c: &Conversation) -> impl Iterator<Item = &ToolSpec> {
    let active = c.tools_active();
    c.tools.iter().filter(move |t| {
        active
            && match &c.choice {
                ToolChoice::Named(n) => &t.name == n,
                _ => true,
            }
    })
}

/// A tool's DSML schema line: the client's `function` object, or one
/// made from the parsed fields.
fn schema_line(t: &ToolSpec) -> String {
    t.raw.clone().unwrap_or_else(|| {
        let mut o = serde_json::Map::new();
        o.insert("name".into(), Value::String(t.name.clone()));
        if let Some(d) = &t.description {
            o.insert("description".into(), Value::String(d.clone()));
        }
        o.insert("parameters".into(), t.parameters.clone());
        Value::Object(o).to_string()
    })
}

/// A function object's JSON from its parts, `parameters` as raw JSON text
/// (the client's bytes).
pub fn function_json(name: &str, description: Option<&str>, parameters: Option<&str>) -> String {
    let mut s = format!("{{\"name\":{}", Value::String(name.into()));
    if let Some(d) = description {
        s.push_str(&format!(",\"description\":{}", Value::String(d.into())));
    }
    s.push_str(&format!(
        ",\"parameters\":{}}}",
        parameters.unwrap_or(r#"{"type":"object","properties":{}}"#)
    ));
    s
}

/// DeepSeek V4's prompt text for `c` ([`deepseek4::render`]); calls whose
/// ids `replay` knows are written with their sampled bytes.
pub fn deepseek4_prompt(
    c: &Conversation,
    thinking: Thinking,
    replay: &ReplayStore,
) -> Result<String, ApiError> {
    let schemas: Vec<String> = offered(c).map(schema_line).collect();
    let messages: Vec<Message> = c
        .turns
        .iter()
        .map(|t| match t.role {
            Role::System => Message::System(t.text.clone()),
            Role::User => Message::User(t.text.clone()),
            Role::Tool => Message::Tool {
                call_id: String::new(),
                content: t.text.clone(),
            },
            Role::Assistant => Message::Assistant {
                reasoning: t.reasoning.clone(),
                content: t.text.clone(),
                tool_calls: t
                    .calls
                    .iter()
                    .map(|c| dsml::ToolCall {
                        id: c.id.clone(),
                        name: c.name.clone(),
                        arguments: if c.arguments.trim().is_empty() {
                            "{}".into()
                        } else {
                            c.arguments.clone()
                        },
                    })
                    .collect(),
            },
        })
        .collect();
    let map = replay.map_for(
        c.turns
            .iter()
            .flat_map(|t| t.calls.iter().map(|c| c.id.as_str())),
    );
    deepseek4::render(
        &deepseek4::Conversation {
            tools: &schemas,
            messages: &messages,
            thinking,
            add_generation_prompt: true,
        },
        &map,
    )
    .map_err(|e| ApiError::bad(format!("cannot render the conversation: {e}"), "messages"))
}

/// A `reasoning_effort` name as a thinking mode.
pub fn effort(name: &str, param: &'static str) -> Result<Thinking, ApiError> {
    Thinking::from_effort(name).ok_or_else(|| {
        ApiError::bad(
            format!("{param} {name:?} is not one of none, minimal, low, medium, high, xhigh, max"),
            param,
        )
    })
}

/// Parse a tool's JSON `parameters`/`input_schema` default.
pub fn schema_or_empty(v: Option<Value>) -> Value {
    v.unwrap_or_else(|| json!({"type": "object", "properties": {}}))
}

/// The specification's complete DeepSeek V4 example (thinking mode, one
/// tool call and its result), for the surfaces' prompt tests.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// The rendered prompt, byte for byte as the specification shows it.
    pub const SPEC_PROMPT: &str =
        include_str!("../../../model/tests/fixtures/deepseek4/prompt-example.txt");

    /// The example's tool, as a JSON `function` object.
    pub const SCHEMA: &str = r#"{"name":"get_weather","description":"Get current weather for a city","parameters":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}},"required":["city"]}}"#;
    pub const PARAMETERS: &str = r#"{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}},"required":["city"]}"#;
    pub const SYSTEM: &str = "You are a concise assistant.";
    pub const USER: &str = "What's the weather in Rome today?";
    pub const REASONING: &str = "The user wants today's weather in Rome; call get_weather.";
    pub const RESULT: &str = r#"{"city":"Rome","temp_c":21,"sky":"clear"}"#;

    /// The renderer's output for the example's conversation, built
    /// directly (not through any API).
    pub fn renderer_prompt() -> String {
        let tools = [SCHEMA.to_string()];
        let messages = [
            Message::System(SYSTEM.into()),
            Message::User(USER.into()),
            Message::Assistant {
                reasoning: Some(REASONING.into()),
                content: String::new(),
                tool_calls: vec![dsml::ToolCall {
                    id: "call_0".into(),
                    name: "get_weather".into(),
                    arguments: r#"{"city": "Rome", "days": 1}"#.into(),
                }],
            },
            Message::Tool {
                call_id: "call_0".into(),
                content: RESULT.into(),
            },
        ];
        let text = deepseek4::render(
            &deepseek4::Conversation {
                tools: &tools,
                messages: &messages,
                thinking: Thinking::High,
                add_generation_prompt: true,
            },
            &dsml::ReplayMap::new(),
        )
        .unwrap();
        assert_eq!(text, SPEC_PROMPT);
        text
    }

    /// The DeepSeek V4 prompt an API builds for `c`.
    pub fn api_prompt(c: &Conversation, replay: &ReplayStore) -> String {
        let thinking = c.thinking.unwrap_or(Thinking::High);
        deepseek4_prompt(c, thinking, replay).unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

    fn example(raw: Option<&str>) -> Conversation {
        let mut c = Conversation::default();
        c.push_text(Role::System, SYSTEM);
        c.push_text(Role::User, USER);
        c.push_reasoning(REASONING);
        c.turns.last_mut().unwrap().calls.push(ToolCall {
            id: "call_0".into(),
            name: "get_weather".into(),
            arguments: r#"{"city":"Rome","days":1}"#.into(),
        });
        c.turns.push(Turn::new(Role::Tool, RESULT));
        c.tools.push(ToolSpec {
            name: "get_weather".into(),
            description: Some("Get current weather for a city".into()),
            parameters: serde_json::from_str(PARAMETERS).unwrap(),
            raw: raw.map(str::to_string),
        });
        c
    }

    #[test]
    fn the_spec_example_renders_from_a_conversation() {
        let store = ReplayStore::default();
        assert_eq!(
            api_prompt(&example(Some(SCHEMA)), &store),
            renderer_prompt()
        );
        // Without the client's bytes the schema line is rebuilt from the
        // parsed schema, keys in the client's order: the same prompt.
        assert_eq!(api_prompt(&example(None), &store), SPEC_PROMPT);
        assert_eq!(
            function_json(
                "get_weather",
                Some("Get current weather for a city"),
                Some(PARAMETERS)
            ),
            SCHEMA
        );
    }

    #[test]
    fn thinking_modes_and_tool_choice() {
        let store = ReplayStore::default();
        let mut c = example(Some(SCHEMA));
        c.thinking = Some(Thinking::Off);
        let p = api_prompt(&c, &store);
        assert!(p.ends_with("<｜Assistant｜></think>"));
        assert!(!p.contains(REASONING), "non-thinking drops reasoning");
        c.thinking = Some(Thinking::Max);
        assert!(api_prompt(&c, &store).contains(deepseek4::MAX_EFFORT_PREAMBLE));
        // Think Max falls back below its context size.
        assert_eq!(Thinking::Max.for_context(8192), Thinking::High);
        c.choice = ToolChoice::None;
        c.thinking = None;
        let p = api_prompt(&c, &store);
        assert!(!p.contains("## Tools"), "tool_choice none offers no tools");
        assert!(p.contains("<｜DSML｜invoke name=\"get_weather\">"));
        assert!(effort("max", "reasoning_effort").is_ok());
        assert!(effort("huge", "reasoning_effort").is_err());
    }

    #[test]
    fn bad_arguments_in_history_are_a_client_error() {
        let mut c = example(Some(SCHEMA));
        c.turns[2].calls[0].arguments = "[1]".into();
        let e = deepseek4_prompt(&c, Thinking::High, &ReplayStore::default()).unwrap_err();
        assert!(e.to_string().contains("not a JSON object"), "{e}");
    }
}

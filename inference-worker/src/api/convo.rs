//! Between a surface's wire types and the chat layer: rendering a
//! conversation with the loaded family's protocol (off the async threads),
//! the chat layer's refusals as API errors, and the small wire helpers the
//! chat-like surfaces share.

use std::collections::HashMap;
use std::fmt;
use std::marker::PhantomData;

use ds4_model::chat::{
    Chat, ChatError, Conversation, RenderOptions, Rendered, Role, Thinking, ToolCall, ToolSpec,
    Turn,
};
use serde::de::{self, value::SeqAccessDeserializer, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::fields::ToolName;
use super::ApiError;

impl From<ChatError> for ApiError {
    fn from(e: ChatError) -> ApiError {
        match e.param() {
            Some(param) => ApiError::bad(e.to_string(), param),
            None => ApiError::Internal(e.to_string()),
        }
    }
}

/// Render and tokenize `c` on a blocking thread (a long conversation
/// takes milliseconds to tokenize); `c` comes back with the prompt.
pub async fn render(
    chat: &Chat,
    c: Conversation,
    opts: RenderOptions,
) -> Result<(Rendered, Conversation), ApiError> {
    let chat = chat.clone();
    let (rendered, c) = tokio::task::spawn_blocking(move || (chat.render(&c, &opts), c))
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok((rendered?, c))
}

/// The schema of a function that takes no arguments.
const EMPTY_SCHEMA: &str = r#"{"type":"object","properties":{}}"#;

/// A function tool as the wire types read it: Chat Completions'
/// `function` object, a Responses function tool (Anthropic's tools carry
/// the schema as `input_schema`).
#[derive(Debug, Deserialize)]
pub struct FunctionDef {
    pub name: ToolName,
    #[serde(default)]
    pub description: Option<String>,
    /// The arguments' JSON Schema (an object), passed through to the
    /// model; a function without one takes no arguments.
    #[serde(default)]
    pub parameters: Option<Map<String, Value>>,
    /// The arguments must match `parameters`: enforced while decoding.
    #[serde(default)]
    pub strict: Option<bool>,
}

/// Where a surface's tool objects keep the function the model is shown.
#[derive(Clone, Copy, Debug)]
pub enum ToolShape {
    /// `{"type": "function", "function": {...}}` (Chat Completions): the
    /// `function` object as the client wrote it.
    Nested,
    /// `{"name", "description", <key>: schema}` (Responses: `parameters`,
    /// Anthropic: `input_schema`): an object of the parts, the schema as
    /// the client wrote it.
    Flat(&'static str),
}

/// The chat layer's specs of a request's tools. `tools` is the request's
/// `tools` array element by element, `None` for tools that are not
/// functions (server tools, skipped); `body` is the request they were
/// parsed from: each spec's `raw` is its function object in the client's
/// own bytes, which protocols such as DSML show the model unchanged.
pub fn tool_specs(tools: Vec<Option<FunctionDef>>, body: &[u8], shape: ToolShape) -> Vec<ToolSpec> {
    let raw = raw_tools(body);
    tools
        .into_iter()
        .enumerate()
        .filter_map(|(i, f)| {
            let f = f?;
            let fields: HashMap<String, &RawValue> = raw
                .get(i)
                .and_then(|t| serde_json::from_str(t.get()).ok())
                .unwrap_or_default();
            let raw = match shape {
                ToolShape::Nested => fields.get("function").map(|f| f.get().to_string()),
                ToolShape::Flat(key) => function_json(
                    &f.name.0,
                    f.description.as_deref(),
                    fields.get(key).copied(),
                ),
            };
            Some(ToolSpec {
                name: f.name.0,
                description: f.description,
                parameters: f.parameters.map_or_else(empty_schema, Value::Object),
                strict: f.strict == Some(true),
                raw,
            })
        })
        .collect()
}

/// The request's `tools`, each as the client wrote it (none when the
/// request has no tools).
pub fn raw_tools(body: &[u8]) -> Vec<&RawValue> {
    #[derive(Deserialize)]
    struct RawTools<'a> {
        #[serde(borrow, default)]
        tools: Option<Vec<&'a RawValue>>,
    }
    serde_json::from_slice::<RawTools<'_>>(body)
        .ok()
        .and_then(|r| r.tools)
        .unwrap_or_default()
}

/// A function object from its parts, `parameters` as the client wrote it
/// (the empty schema when absent).
fn function_json(
    name: &str,
    description: Option<&str>,
    parameters: Option<&RawValue>,
) -> Option<String> {
    #[derive(Serialize)]
    struct Function<'a> {
        name: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        description: Option<&'a str>,
        parameters: &'a RawValue,
    }
    let parameters = match parameters {
        Some(p) => p,
        None => serde_json::from_str(EMPTY_SCHEMA).ok()?,
    };
    serde_json::to_string(&Function {
        name,
        description,
        parameters,
    })
    .ok()
}

/// The schema of a function without parameters.
pub fn empty_schema() -> Value {
    serde_json::from_str(EMPTY_SCHEMA).unwrap_or_default()
}

/// Add a call the client sent back to the assistant turn it belongs to:
/// the last turn when it is the assistant's, else a new one.
pub fn push_call(c: &mut Conversation, call: ToolCall) {
    match c.turns.last_mut() {
        Some(t) if t.role == Role::Assistant => t.calls.push(call),
        _ => {
            let mut t = Turn::new(Role::Assistant, "");
            t.calls.push(call);
            c.turns.push(t);
        }
    }
}

/// A `reasoning_effort` name as a thinking mode.
pub fn effort(name: &str, param: &'static str) -> Result<Thinking, ApiError> {
    Thinking::from_effort(name).ok_or_else(|| {
        ApiError::bad(
            format!("{param} {name:?} is not one of {}", Thinking::EFFORTS),
            param,
        )
    })
}

/// `thinking`: `{"type": "enabled" | "disabled", ...}` (Anthropic, and
/// DeepSeek's Chat Completions).
#[derive(Debug, Deserialize)]
pub struct ThinkingConfig {
    #[serde(rename = "type", default)]
    kind: Option<ThinkingKind>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
enum ThinkingKind {
    Disabled,
    Enabled,
    /// Anthropic's "the model decides how much": thinking.
    Adaptive,
}

impl ThinkingConfig {
    /// The thinking mode asked for (`None`: the family's default).
    pub fn mode(&self) -> Option<Thinking> {
        self.kind.as_ref().map(|k| match k {
            ThinkingKind::Disabled => Thinking::Off,
            ThinkingKind::Enabled | ThinkingKind::Adaptive => Thinking::High,
        })
    }
}

/// A string, or a list of `T`: message content (text or parts), the
/// Responses `input` (text or items), `stop`. Read by a visitor rather
/// than an untagged enum so that an error inside the list keeps its
/// message and place.
#[derive(Debug)]
pub enum TextOr<T> {
    Text(String),
    List(Vec<T>),
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for TextOr<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = TextOr<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or a list")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<TextOr<T>, E> {
                Ok(TextOr::Text(s.to_string()))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<TextOr<T>, E> {
                Ok(TextOr::Text(s))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<TextOr<T>, A::Error> {
                Vec::deserialize(SeqAccessDeserializer::new(seq)).map(TextOr::List)
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// The specification's complete DeepSeek V4 example (thinking mode, one
/// tool call and its result), for the surfaces' prompt tests.
#[cfg(test)]
pub(crate) mod testing {
    use ds4_model::chat::deepseek4::{self, Ds4Chat, Message, Transcript};
    use ds4_model::chat::dsml;
    use ds4_model::chat::{Conversation, ReplayStore, Thinking};

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
            &Transcript {
                tools: &tools,
                messages: &messages,
                thinking: Thinking::High,
                reasoning_replay: true,
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
        Ds4Chat::prompt(c, thinking, replay, true).unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;
    use ds4_model::chat::deepseek4::{self, thinking_for_context, Ds4Chat};
    use ds4_model::chat::{ReplayStore, Role, ToolCall, ToolChoice, ToolSpec, Turn};

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
            strict: false,
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
        let parameters = serde_json::from_str(PARAMETERS).unwrap();
        assert_eq!(
            function_json(
                "get_weather",
                Some("Get current weather for a city"),
                Some(parameters)
            )
            .as_deref(),
            Some(SCHEMA)
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
        assert_eq!(thinking_for_context(Thinking::Max, 8192), Thinking::High);
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
        let e = Ds4Chat::prompt(&c, Thinking::High, &ReplayStore::default(), true).unwrap_err();
        let e = ApiError::from(ChatError::from(e));
        assert!(e.to_string().contains("not a JSON object"), "{e}");
    }
}

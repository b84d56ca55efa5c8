//! Between a surface's wire types and the chat layer: rendering a
//! conversation with the loaded family's protocol (off the async threads),
//! the chat layer's refusals as API errors, and the small wire helpers the
//! chat-like surfaces share.

use ds4_model::chat::{Chat, ChatError, Conversation, RenderOptions, Rendered, Thinking};
use serde_json::{json, Value};

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
/// takes milliseconds to tokenize).
pub async fn render(
    chat: &Chat,
    c: Conversation,
    opts: RenderOptions,
) -> Result<Rendered, ApiError> {
    let chat = chat.clone();
    tokio::task::spawn_blocking(move || chat.render(&c, &opts))
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?
        .map_err(ApiError::from)
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

/// A `reasoning_effort` name as a thinking mode.
pub fn effort(name: &str, param: &'static str) -> Result<Thinking, ApiError> {
    Thinking::from_effort(name).ok_or_else(|| {
        ApiError::bad(
            format!("{param} {name:?} is not one of {}", Thinking::EFFORTS),
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
        Ds4Chat::prompt(c, thinking, replay).unwrap()
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
        let e = Ds4Chat::prompt(&c, Thinking::High, &ReplayStore::default()).unwrap_err();
        let e = ApiError::from(ChatError::from(e));
        assert!(e.to_string().contains("not a JSON object"), "{e}");
    }
}

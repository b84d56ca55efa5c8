//! The generic tool protocol, for families whose chat template has no
//! tool syntax (llama, qwen2): the tool schemas are described in a system
//! message, and the model calls a tool by writing one envelope per call,
//!
//! ```text
//! <tool_call>
//! {"name": "get_weather", "arguments": {"city": "Paris"}}
//! </tool_call>
//! ```
//!
//! Earlier calls are rendered back in the same envelope, and tool results
//! as user turns wrapped in `<tool_response>` tags.
//! [`super::envelope_parser::CallParser`] finds envelopes in streamed text;
//! text that is not an envelope passes through unchanged.

use serde_json::Value;

use super::conversation::{ToolChoice, ToolSpec};

pub const CALL_OPEN: &str = "<tool_call>";
pub const CALL_CLOSE: &str = "</tool_call>";
pub const RESPONSE_OPEN: &str = "<tool_response>";
pub const RESPONSE_CLOSE: &str = "</tool_response>";
/// Appended to deep tool results (the tool-call reminder lever).
pub const TOOL_REMINDER: &str = "\n\n(Reminder: to call a tool, answer with <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>.)";

/// The system text that describes `tools` and the call envelope.
pub fn system_prompt(tools: &[ToolSpec], choice: &ToolChoice) -> String {
    let mut s = String::from(
        "You can call the following tools. Their signatures, as JSON Schema, are inside <tools></tools>:\n<tools>\n",
    );
    for t in tools {
        let line = serde_json::json!({"type": "function", "function": t});
        s.push_str(&line.to_string());
        s.push('\n');
    }
    s.push_str("</tools>\nTo call a tool, answer with one JSON object per call inside <tool_call></tool_call> tags:\n<tool_call>\n{\"name\": \"tool name\", \"arguments\": {\"argument\": \"value\"}}\n</tool_call>\nTool results come back inside <tool_response></tool_response> tags.");
    match choice {
        ToolChoice::Required => s.push_str("\nYou must call at least one tool now."),
        ToolChoice::Named(n) => s.push_str(&format!("\nYou must call the tool {n} now.")),
        ToolChoice::Auto | ToolChoice::None => {}
    }
    s
}

/// Text the generation is started with so that a required call happens:
/// the envelope opening, and for a named tool its name as well. The same
/// text is fed to the parser before the generated text.
pub fn forced_prefix(choice: &ToolChoice) -> String {
    match choice {
        ToolChoice::Required => format!("{CALL_OPEN}\n"),
        ToolChoice::Named(n) => {
            let name = Value::String(n.clone()).to_string();
            format!("{CALL_OPEN}\n{{\"name\": {name}, \"arguments\": ")
        }
        ToolChoice::Auto | ToolChoice::None => String::new(),
    }
}

/// An earlier call as the model would have written it.
pub fn render_call(name: &str, arguments: &str) -> String {
    /// Name first, as the system prompt documents it (and as calls stream).
    #[derive(serde::Serialize)]
    struct Envelope<'a> {
        name: &'a str,
        arguments: Value,
    }
    let arguments =
        serde_json::from_str(arguments).unwrap_or_else(|_| Value::String(arguments.into()));
    let body = serde_json::to_string(&Envelope { name, arguments }).expect("JSON values serialize");
    format!("{CALL_OPEN}\n{body}\n{CALL_CLOSE}")
}

/// A tool result as the model reads it.
pub fn render_result(content: &str) -> String {
    format!("{RESPONSE_OPEN}\n{content}\n{RESPONSE_CLOSE}")
}

#[cfg(test)]
mod tests {
    use super::super::envelope_parser::{CallParser, Parsed};
    use super::*;

    #[test]
    fn system_prompt_lists_tools_and_forces_named_calls() {
        let t = ToolSpec {
            name: "get_weather".into(),
            description: Some("Weather of a city".into()),
            parameters: serde_json::json!({"type": "object"}),
            raw: None,
            strict: false,
        };
        let s = system_prompt(&[t], &ToolChoice::Named("get_weather".into()));
        assert!(s.contains("\"name\":\"get_weather\""));
        assert!(s.ends_with("You must call the tool get_weather now."));
        assert_eq!(
            forced_prefix(&ToolChoice::Named("f".into())),
            "<tool_call>\n{\"name\": \"f\", \"arguments\": "
        );
    }

    #[test]
    fn rendered_calls_parse_back() {
        let text = render_call("f", "{\"x\":1}");
        let mut p = CallParser::new();
        let out = p.push(&text);
        assert_eq!(
            out,
            vec![
                Parsed::Start { name: "f".into() },
                Parsed::Args("{\"x\":1}".into()),
                Parsed::End
            ]
        );
    }
}

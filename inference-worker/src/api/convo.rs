//! The conversation every chat-like surface converts its request into,
//! and its rendering to prompt tokens with the model's chat template and
//! the tool protocol.

use serde_json::{json, Value};

use super::run::ToolParsing;
use super::ApiError;
use crate::runtime::Prompter;
use crate::tools::{self, ToolCall, ToolChoice, ToolSpec};

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
}

impl Turn {
    pub fn new(role: Role, text: impl Into<String>) -> Turn {
        Turn {
            role,
            text: text.into(),
            calls: Vec::new(),
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct Conversation {
    pub turns: Vec<Turn>,
    pub tools: Vec<ToolSpec>,
    pub choice: ToolChoice,
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
}

/// Render `c` with the chat template, the tool protocol when tools are
/// offered, and the generation prompt; tokenize. Generated call ids will
/// get `id_prefix`.
pub fn render(
    p: &Prompter,
    c: &Conversation,
    id_prefix: &'static str,
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
    });
    Ok(Rendered { tokens, tools })
}

/// Parse a tool's JSON `parameters`/`input_schema` default.
pub fn schema_or_empty(v: Option<Value>) -> Value {
    v.unwrap_or_else(|| json!({"type": "object", "properties": {}}))
}

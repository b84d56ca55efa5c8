//! A conversation as every API surface and the CLI hand it to the chat
//! layer: turns, the tools offered, the tool choice and the thinking mode.
//! Independent of any wire format and of any family's prompt syntax.

use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
    /// A tool result.
    Tool,
}

/// A function tool a client offers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// JSON Schema of the arguments.
    #[serde(default)]
    pub parameters: Value,
    /// The tool as a JSON `function` object (`name`, `description`,
    /// `parameters`) in the client's own bytes where it sent one, for
    /// protocols that show the model the schema unchanged (DSML).
    #[serde(skip)]
    pub raw: Option<String>,
    /// The arguments must match `parameters` (enforced while decoding).
    #[serde(skip)]
    pub strict: bool,
}

impl ToolSpec {
    /// The tool as a JSON `function` object: the client's bytes when it
    /// sent them, else one built from the parsed fields.
    pub fn function_json(&self) -> String {
        self.raw.clone().unwrap_or_else(|| {
            let mut o = serde_json::Map::new();
            o.insert("name".into(), Value::String(self.name.clone()));
            if let Some(d) = &self.description {
                o.insert("description".into(), Value::String(d.clone()));
            }
            o.insert("parameters".into(), self.parameters.clone());
            Value::Object(o).to_string()
        })
    }
}

/// Which tools the model may or must call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ToolChoice {
    #[default]
    Auto,
    None,
    /// Some tool must be called.
    Required,
    /// This tool must be called.
    Named(String),
}

/// A tool call, generated or sent back by a client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as JSON text (an object; key order is kept).
    pub arguments: String,
}

/// A fresh, unguessable call id: `prefix` and 24 random hex digits.
pub fn new_call_id(prefix: &str) -> String {
    use rand::Rng;
    let v: u128 = rand::rng().random();
    format!("{prefix}{:024x}", v >> 32)
}

/// How hard a family that thinks should think.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Thinking {
    /// Non-thinking: the answer starts at once.
    Off,
    /// Thinking (API efforts minimal … xhigh).
    High,
    /// The family's maximum effort (DeepSeek V4's Think Max).
    Max,
}

impl Thinking {
    /// The APIs' `reasoning_effort` names (`none`, `minimal` … `xhigh`, `max`).
    pub fn from_effort(effort: &str) -> Option<Thinking> {
        match effort {
            "none" => Some(Thinking::Off),
            "minimal" | "low" | "medium" | "high" | "xhigh" => Some(Thinking::High),
            "max" => Some(Thinking::Max),
            _ => None,
        }
    }

    /// The names [`Thinking::from_effort`] accepts, for error messages.
    pub const EFFORTS: &'static str = "none, minimal, low, medium, high, xhigh, max";
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
    /// The thinking mode asked for (families that think); `None`: the
    /// family's default.
    pub thinking: Option<Thinking>,
    /// At most one call in the answer (OpenAI's `parallel_tool_calls:
    /// false`, Anthropic's `disable_parallel_tool_use`): held by grammar.
    pub single_call: bool,
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

    /// The tools shown to the model: all of them, or the one the tool
    /// choice names; none when tools are off.
    pub fn offered(&self) -> impl Iterator<Item = &ToolSpec> {
        let active = self.tools_active();
        self.tools.iter().filter(move |t| {
            active
                && match &self.choice {
                    ToolChoice::Named(n) => &t.name == n,
                    _ => true,
                }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_ids_are_random_and_prefixed() {
        let a = new_call_id("call_");
        let b = new_call_id("call_");
        assert!(a.starts_with("call_") && a.len() == 29);
        assert_ne!(a, b);
    }

    #[test]
    fn text_joins_turns_of_one_role_and_reasoning_opens_an_assistant_turn() {
        let mut c = Conversation::default();
        c.push_text(Role::User, "a");
        c.push_text(Role::User, "b");
        c.push_reasoning("r");
        c.push_text(Role::Assistant, "x");
        assert_eq!(c.turns.len(), 2);
        assert_eq!(c.turns[0].text, "a\nb");
        assert_eq!(c.turns[1].reasoning.as_deref(), Some("r"));
        assert_eq!(c.turns[1].text, "x");
    }

    #[test]
    fn offered_tools_follow_the_choice() {
        let tool = |n: &str| ToolSpec {
            name: n.into(),
            description: None,
            parameters: Value::Null,
            raw: None,
            strict: false,
        };
        let mut c = Conversation {
            tools: vec![tool("a"), tool("b")],
            ..Default::default()
        };
        assert_eq!(c.offered().count(), 2);
        c.choice = ToolChoice::Named("b".into());
        assert_eq!(
            c.offered().map(|t| t.name.as_str()).collect::<Vec<_>>(),
            ["b"]
        );
        c.choice = ToolChoice::None;
        assert_eq!(c.offered().count(), 0);
    }
}

//! The chat protocol of families that ship a Jinja chat template and have
//! no tool syntax of their own (llama, qwen2): the template renders the
//! turns, tools go through the generic envelope ([`super::envelope`]) in
//! the system message, and the model does not think.

use serde_json::{json, Value};

use super::call_grammar::CallGrammar;
use super::chat_template::{ChatTemplate, RenderInput};
use super::conversation::{Conversation, Role};
use super::envelope;
use super::protocol::{
    AnswerFormat, ChatError, ChatProtocol, PromptText, RenderOptions, ToolParsing,
};
use super::tool_stream::ToolProtocol;
use super::PromptError;
use crate::gguf::Metadata;

/// A template family's chat protocol; without a template only raw
/// prompts can be served.
#[derive(Debug)]
pub struct TemplateChat {
    template: Option<ChatTemplate>,
}

impl TemplateChat {
    /// The protocol of a model with `template` (or none).
    pub fn new(template: Option<ChatTemplate>) -> TemplateChat {
        TemplateChat { template }
    }

    /// The protocol of a GGUF file's own template (`tokenizer.chat_template`).
    pub fn from_gguf(meta: &Metadata) -> Result<TemplateChat, PromptError> {
        Ok(TemplateChat::new(ChatTemplate::from_gguf(meta)?))
    }
}

impl ChatProtocol for TemplateChat {
    fn can_chat(&self) -> bool {
        self.template.is_some()
    }

    fn tool_reminder(&self) -> Option<&'static str> {
        Some(envelope::TOOL_REMINDER)
    }

    fn render(&self, c: &Conversation, _opts: &RenderOptions) -> Result<PromptText, ChatError> {
        let template = self.template.as_ref().ok_or(ChatError::NoTemplate)?;
        let tools = c.tools_active();
        let tool_text = || envelope::system_prompt(&c.tools, &c.choice);
        let mut messages: Vec<Value> = Vec::new();
        if tools && c.turns.first().is_none_or(|t| t.role != Role::System) {
            messages.push(json!({"role": "system", "content": tool_text()}));
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
                Role::System if i == 0 && tools => {
                    ("system", format!("{}\n\n{}", t.text, tool_text()))
                }
                Role::System => ("system", t.text.clone()),
                Role::User => ("user", t.text.clone()),
                Role::Tool => ("user", envelope::render_result(&t.text)),
                Role::Assistant => {
                    let mut s = t.text.clone();
                    for call in &t.calls {
                        if !s.is_empty() {
                            s.push('\n');
                        }
                        s.push_str(&envelope::render_call(&call.name, &call.arguments));
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
        let mut text = template.render_with(&RenderInput {
            messages: &messages,
            tools: None,
            add_generation_prompt: true,
            extra: None,
        })?;
        let forced = if tools {
            envelope::forced_prefix(&c.choice)
        } else {
            String::new()
        };
        text.push_str(&forced);
        Ok(PromptText {
            text,
            add_bos: true,
            answer: AnswerFormat {
                reasoning: None,
                tools: tools.then(|| ToolParsing {
                    names: c.tools.iter().map(|t| t.name.clone()).collect(),
                    forced,
                    protocol: ToolProtocol::Envelope,
                    replay: None,
                }),
                calls: if tools {
                    CallGrammar::new(
                        ToolProtocol::Envelope,
                        c.offered(),
                        &c.choice,
                        c.single_call,
                    )
                } else {
                    None
                },
            },
        })
    }
}

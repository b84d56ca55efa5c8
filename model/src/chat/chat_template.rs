//! The chat template of a GGUF file and its rendering.
//!
//! Variables passed, as `transformers`' `apply_chat_template` passes them:
//! `messages` (a list of objects with at least `role` and `content`),
//! `add_generation_prompt`, `bos_token`, `eos_token` (the vocabulary's
//! strings for `tokenizer.ggml.bos_token_id`/`eos_token_id`, empty when
//! unset), `tools` when given, and any extra variables of the caller
//! (e.g. `enable_thinking`).

use std::collections::BTreeMap;

use minijinja::{Environment, Value};
use serde::{Deserialize, Serialize};

use super::jinja::{self, Raised};
use super::PromptError;
use crate::gguf::Metadata;

/// The metadata key of the default chat template.
pub const CHAT_TEMPLATE_KEY: &str = "tokenizer.chat_template";

const TEMPLATE_NAME: &str = "chat_template";

/// One message of a conversation in its simplest form.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// Everything a template can be rendered with.
#[derive(Clone, Copy, Debug, Default)]
pub struct RenderInput<'a> {
    /// Messages as JSON objects: `role`, `content` (a string or a list of
    /// parts), and whatever else the template reads (`tool_calls`,
    /// `reasoning_content`, ...).
    pub messages: &'a [serde_json::Value],
    /// Tool definitions, passed as `tools` when present.
    pub tools: Option<&'a [serde_json::Value]>,
    pub add_generation_prompt: bool,
    /// Further variables; they cannot replace the ones above.
    pub extra: Option<&'a serde_json::Map<String, serde_json::Value>>,
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// The template of a GGUF file (`tokenizer.chat_template`); `None` when
    /// the file has none.
    pub fn from_gguf(meta: &Metadata) -> Result<Option<ChatTemplate>, PromptError> {
        let Some(value) = meta.get(CHAT_TEMPLATE_KEY) else {
            return Ok(None);
        };
        let source = value.as_str().ok_or(PromptError::WrongType {
            key: CHAT_TEMPLATE_KEY,
            found: value.type_name(),
        })?;
        let token_text = |key: &str| -> String {
            let id = meta.get_u64(key);
            let tokens = meta.get_array("tokenizer.ggml.tokens");
            match (id, tokens) {
                (Some(id), Some(tokens)) => usize::try_from(id)
                    .ok()
                    .and_then(|i| tokens.get(i))
                    .and_then(|v| v.as_str())
                    .unwrap_or_default()
                    .to_string(),
                _ => String::new(),
            }
        };
        let bos = token_text("tokenizer.ggml.bos_token_id");
        let eos = token_text("tokenizer.ggml.eos_token_id");
        ChatTemplate::new(source, bos, eos).map(Some)
    }

    /// Compile a template; syntax errors are reported here, not at render.
    pub fn new(
        source: impl Into<String>,
        bos_token: impl Into<String>,
        eos_token: impl Into<String>,
    ) -> Result<ChatTemplate, PromptError> {
        let mut env = jinja::environment();
        env.add_template_owned(TEMPLATE_NAME, source.into())
            .map_err(|e| PromptError::Syntax {
                message: e.to_string(),
                line: e.line(),
            })?;
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
        })
    }

    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }

    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }

    /// Render plain role/content messages.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, PromptError> {
        let messages: Vec<serde_json::Value> = messages
            .iter()
            .map(|m| serde_json::json!({"role": m.role, "content": m.content}))
            .collect();
        self.render_with(&RenderInput {
            messages: &messages,
            add_generation_prompt,
            ..RenderInput::default()
        })
    }

    /// Render with JSON messages, tools and extra variables.
    pub fn render_with(&self, input: &RenderInput<'_>) -> Result<String, PromptError> {
        let mut ctx: BTreeMap<String, Value> = BTreeMap::new();
        if let Some(extra) = input.extra {
            for (k, v) in extra {
                ctx.insert(k.clone(), Value::from_serialize(v));
            }
        }
        ctx.insert("messages".into(), Value::from_serialize(input.messages));
        ctx.insert(
            "add_generation_prompt".into(),
            Value::from(input.add_generation_prompt),
        );
        ctx.insert("bos_token".into(), Value::from(self.bos_token.as_str()));
        ctx.insert("eos_token".into(), Value::from(self.eos_token.as_str()));
        if let Some(tools) = input.tools {
            ctx.insert("tools".into(), Value::from_serialize(tools));
        }
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| render_error(&e))?;
        template.render(ctx).map_err(|e| render_error(&e))
    }
}

fn render_error(e: &minijinja::Error) -> PromptError {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(raised) = s.downcast_ref::<Raised>() {
            return PromptError::Raised {
                message: raised.0.clone(),
            };
        }
        source = s.source();
    }
    PromptError::Render {
        message: e.to_string(),
        line: e.line(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn is_shareable_between_threads() {
        fn check<T: Send + Sync>() {}
        check::<ChatTemplate>();
    }

    #[test]
    fn renders_chatml() {
        let t = ChatTemplate::new(CHATML, "", "").unwrap();
        let out = t.render(&[ChatMessage::new("user", "Hi")], true).unwrap();
        assert_eq!(
            out,
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn syntax_error_is_typed() {
        let err = ChatTemplate::new("{% for m in messages %}", "", "").unwrap_err();
        assert!(matches!(err, PromptError::Syntax { .. }), "{err:?}");
    }

    #[test]
    fn raise_exception_is_typed_with_the_template_message() {
        let src = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('Conversation must start with user') }}{% endif %}ok";
        let t = ChatTemplate::new(src, "", "").unwrap();
        let err = t
            .render(&[ChatMessage::new("assistant", "x")], false)
            .unwrap_err();
        match err {
            PromptError::Raised { message } => {
                assert_eq!(message, "Conversation must start with user")
            }
            other => panic!("expected Raised, got {other:?}"),
        }
        assert_eq!(
            t.render(&[ChatMessage::new("user", "x")], false).unwrap(),
            "ok"
        );
    }

    #[test]
    fn tools_and_extra_variables_reach_the_template() {
        let src = "{% if tools %}{% for t in tools %}{{ t|tojson }}{% endfor %}{% endif %}|{{ enable_thinking }}|{{ bos_token }}";
        let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
        let tools = [serde_json::json!({"type": "function", "function": {"name": "f"}})];
        let mut extra = serde_json::Map::new();
        extra.insert("enable_thinking".into(), serde_json::Value::Bool(false));
        extra.insert(
            "bos_token".into(),
            serde_json::Value::String("ignored".into()),
        );
        let out = t
            .render_with(&RenderInput {
                messages: &[],
                tools: Some(&tools),
                add_generation_prompt: false,
                extra: Some(&extra),
            })
            .unwrap();
        // Booleans print as Jinja2 prints Python's: `False`; tool keys
        // keep the client's order.
        assert_eq!(
            out,
            r#"{"type": "function", "function": {"name": "f"}}|False|<s>"#
        );
    }
}

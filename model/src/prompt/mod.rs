//! Prompt rendering: the model's own chat template (`tokenizer.chat_template`,
//! a Jinja template written for Hugging Face `transformers`) rendered with
//! minijinja, set up to behave as `transformers` renders it.

mod chat_template;
pub mod deepseek4;
pub mod dsml;
mod jinja;

pub use chat_template::{ChatMessage, ChatTemplate, RenderInput, CHAT_TEMPLATE_KEY};

/// Why a chat template could not be loaded or rendered.
#[derive(Debug, thiserror::Error)]
pub enum PromptError {
    #[error("GGUF metadata `{key}` is a {found}, expected a string")]
    WrongType {
        key: &'static str,
        found: &'static str,
    },

    #[error("chat template does not compile: {message}")]
    Syntax {
        message: String,
        line: Option<usize>,
    },

    /// The template called `raise_exception(message)`: the request is one
    /// the model's template refuses (e.g. roles not alternating).
    #[error("chat template refused the conversation: {message}")]
    Raised { message: String },

    #[error("chat template failed to render: {message}")]
    Render {
        message: String,
        line: Option<usize>,
    },
}

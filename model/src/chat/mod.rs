//! The chat layer: everything between a conversation and the tokens of its
//! prompt, and between generated text and an answer, for every family.
//! The HTTP surfaces and the `ds4` CLI both call it and never look at the
//! family: each family names its [`ChatProtocol`] in its folder
//! (`families::*`), and [`Chat`] renders with it.
//!
//! - [`conversation`]: turns, tools, tool choice, thinking mode;
//! - [`protocol`]: the [`ChatProtocol`] interface and [`Chat`];
//! - families' protocols: [`templated`] (a Jinja chat template, rendered by
//!   [`chat_template`] + `jinja` as `transformers` does, with the generic
//!   tool [`envelope`]) and [`deepseek4`] (DeepSeek V4's own prompt, tools
//!   in [`dsml`]);
//! - reading answers: [`answer`] (one streaming reader) over [`reasoning`]
//!   (delimiters), [`tool_stream`] (either tool syntax, parsed by
//!   [`envelope_parser`] or [`dsml`]) and [`replay`] (sampled call bytes
//!   kept for exact replay of history);
//! - holding calls to their syntax and schemas: [`call_grammar`];
//! - the operator's agent-loop levers (tool-call reminders, reasoning
//!   replay, effort mapping): [`levers`];
//! - prompts that send the model's own text back keep its tokens where
//!   the text would tokenize differently: [`seams`].

pub mod answer;
pub mod call_grammar;
mod chat_template;
pub mod conversation;
pub mod deepseek4;
pub mod dsml;
pub mod envelope;
pub mod envelope_parser;
mod jinja;
pub mod levers;
pub mod protocol;
pub mod reasoning;
pub mod replay;
pub mod seams;
pub mod templated;
pub mod tool_stream;

pub use answer::{AnswerEvent, AnswerParser};
pub use call_grammar::CallGrammar;
pub use chat_template::{ChatMessage, ChatTemplate, RenderInput, CHAT_TEMPLATE_KEY};
pub use conversation::{
    new_call_id, Conversation, Role, Thinking, ToolCall, ToolChoice, ToolSpec, Turn,
};
pub use levers::Levers;
pub use protocol::{
    AnswerFormat, Chat, ChatError, ChatProtocol, PromptText, RenderOptions, Rendered, ToolParsing,
};
pub use reasoning::Delimiters;
pub use replay::ReplayStore;
pub use seams::Seams;

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

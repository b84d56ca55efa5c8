//! The interface between a family's chat protocol and its callers (the
//! HTTP surfaces and the CLI): [`ChatProtocol`] renders a [`Conversation`]
//! to prompt text and says how to read the answer ([`AnswerFormat`]);
//! [`Chat`] adds the tokenizer and the checks every family shares.

use std::sync::Arc;

use super::call_grammar::CallGrammar;
use super::conversation::{Conversation, ToolChoice};
use super::dsml::DsmlError;
use super::levers::{self, Levers};
use super::reasoning::Delimiters;
use super::replay::ReplayStore;
use super::seams::Seams;
use super::tool_stream::ToolProtocol;
use super::PromptError;
use crate::tokenizer::{Tokenizer, TokenizerError};

/// Why a conversation cannot be rendered.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error("messages must not be empty")]
    Empty,
    #[error("tool_choice names {0:?}, which is not among the tools")]
    UnknownTool(String),
    #[error("tool_choice requires a tool call, but the request offers no function tools")]
    NoTools,
    #[error("this model has no chat template; it takes raw prompts only (/v1/completions, or ds4 --raw)")]
    NoTemplate,
    #[error("the chat template refused the messages: {0}")]
    Template(#[from] PromptError),
    #[error("cannot render the conversation: {0}")]
    History(#[from] DsmlError),
    /// Not the client's fault: the model's own tokenizer failed.
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] TokenizerError),
}

impl ChatError {
    /// The request field a client should fix (`None`: the server's fault).
    pub fn param(&self) -> Option<&'static str> {
        match self {
            ChatError::UnknownTool(_) | ChatError::NoTools => Some("tool_choice"),
            ChatError::Tokenizer(_) => None,
            _ => Some("messages"),
        }
    }
}

/// What rendering needs besides the conversation.
#[derive(Clone, Debug)]
pub struct RenderOptions {
    /// The server's context size (Think Max needs a large one).
    pub ctx: usize,
    /// Sampled tool-call bytes by call id.
    pub replay: Arc<ReplayStore>,
    /// The operator's agent-loop levers.
    pub levers: Levers,
}

/// How to find tool calls in an answer.
#[derive(Clone, Debug)]
pub struct ToolParsing {
    /// Names that may be called.
    pub names: Vec<String>,
    /// Text the prompt opened a forced call with.
    pub forced: String,
    /// The family's tool syntax.
    pub protocol: ToolProtocol,
    /// Where a call's sampled bytes are kept (protocols that replay them).
    pub replay: Option<Arc<ReplayStore>>,
}

/// How to read the answer to a rendered prompt.
#[derive(Clone, Debug, Default)]
pub struct AnswerFormat {
    /// How the answer marks reasoning (the prompt decides whether it
    /// starts inside the reasoning).
    pub reasoning: Option<Delimiters>,
    /// Parse the answer for tool calls, when tools are offered.
    pub tools: Option<ToolParsing>,
    /// The calls' grammar, when they must hold (a forced call, strict
    /// tools).
    pub calls: Option<CallGrammar>,
}

/// A family's rendering of a conversation.
#[derive(Debug)]
pub struct PromptText {
    pub text: String,
    /// Whether the tokenizer may add its BOS (`false` when the text
    /// already starts with it).
    pub add_bos: bool,
    pub answer: AnswerFormat,
}

/// A family's chat protocol: its prompt syntax, tool syntax and reasoning
/// delimiters. The conversation has been checked ([`Chat::render`]).
pub trait ChatProtocol: Send + Sync + std::fmt::Debug {
    fn render(&self, c: &Conversation, opts: &RenderOptions) -> Result<PromptText, ChatError>;

    /// Whether conversations can be rendered at all (a model without a
    /// chat template serves raw prompts only).
    fn can_chat(&self) -> bool {
        true
    }

    /// The text deep tool results end with when the tool-call reminder
    /// is on ([`super::levers`]): the family's call syntax, byte-stable.
    fn tool_reminder(&self) -> Option<&'static str> {
        None
    }
}

/// A loaded model's chat layer: its protocol and tokenizer.
#[derive(Clone, Debug)]
pub struct Chat {
    pub tokenizer: Arc<Tokenizer>,
    protocol: Arc<dyn ChatProtocol>,
    /// Sequences computed recently, for prompts that send them back.
    seams: Arc<Seams>,
}

/// A rendered, tokenized prompt.
#[derive(Debug)]
pub struct Rendered {
    pub text: String,
    pub tokens: Vec<u32>,
    pub answer: AnswerFormat,
}

impl Chat {
    pub fn new(tokenizer: Arc<Tokenizer>, protocol: Arc<dyn ChatProtocol>) -> Chat {
        Chat {
            tokenizer,
            protocol,
            seams: Arc::new(Seams::new()),
        }
    }

    /// Render `c` with the family's protocol (the generation prompt
    /// appended) and tokenize it, special tokens recognised.
    pub fn render(&self, c: &Conversation, opts: &RenderOptions) -> Result<Rendered, ChatError> {
        if c.turns.is_empty() {
            return Err(ChatError::Empty);
        }
        match &c.choice {
            ToolChoice::Named(n) if !c.tools.iter().any(|t| &t.name == n) => {
                return Err(ChatError::UnknownTool(n.clone()));
            }
            ToolChoice::Required if c.tools.is_empty() => return Err(ChatError::NoTools),
            _ => {}
        }
        // A deep conversation is copied to carry its reminders; a shallow
        // one renders as it is.
        let reminded;
        let remind = self
            .protocol
            .tool_reminder()
            .filter(|_| opts.levers.tool_reminder && c.tools_active());
        let c = match remind.and_then(|r| Some((r, levers::deep_from(c)?))) {
            Some((r, from)) => {
                let mut copy = c.clone();
                levers::remind_tool_results(&mut copy, from, r);
                reminded = copy;
                &reminded
            }
            None => c,
        };
        let p = self.protocol.render(c, opts)?;
        let tokens = self.seams.encode(&self.tokenizer, &p.text, p.add_bos)?;
        Ok(Rendered {
            text: p.text,
            tokens,
            answer: p.answer,
        })
    }

    /// Whether the model can render conversations (else raw prompts only:
    /// [`ChatError::NoTemplate`]).
    pub fn can_chat(&self) -> bool {
        self.protocol.can_chat()
    }

    /// Tokenize a raw prompt (no chat protocol); special tokens are
    /// recognised and BOS is added where the model asks for it.
    pub fn raw_prompt(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        self.seams.encode(&self.tokenizer, text, true)
    }

    /// Remember a sequence the engine computed (a prompt and its answer's
    /// tokens), so a prompt that sends its text back starts with these
    /// tokens even where the text tokenizes differently ([`Seams`]).
    pub fn remember(&self, tokens: &[u32]) {
        self.seams.remember(tokens);
    }
}

//! DeepSeek V4's chat protocol (no Jinja template): BOS, the system area
//! (max-effort preamble, DSML tools preamble, system text), `<｜User｜>`
//! turns, `<｜Assistant｜>` turns opened with `<think>` (thinking) or
//! `</think>` (non-thinking), tool results as `<tool_result>` blocks in a
//! user turn, and tool calls in DSML ([`super::dsml`]).
//!
//! Follows the reference C engine's rendering (tools block first in the
//! system area, the client's raw schema bytes, results concatenated),
//! which keeps history byte-identical with what the model sampled.

use super::call_grammar::CallGrammar;
use super::conversation::{Conversation, Role, Thinking};
use super::dsml::{DsmlError, ReplayMap, ToolCall};
use super::protocol::{
    AnswerFormat, ChatError, ChatProtocol, PromptText, RenderOptions, ToolParsing,
};
use super::reasoning::Delimiters;
use super::tool_stream::ToolProtocol;

pub const BOS: &str = "<｜begin▁of▁sentence｜>";
pub const EOS: &str = "<｜end▁of▁sentence｜>";
pub const USER: &str = "<｜User｜>";
pub const ASSISTANT: &str = "<｜Assistant｜>";
pub const THINK_OPEN: &str = "<think>";
pub const THINK_CLOSE: &str = "</think>";

/// Contexts below this fall back from Think Max to normal thinking.
pub const THINK_MAX_MIN_CTX: usize = 393_216;

/// Inserted right after BOS in Think Max mode.
pub const MAX_EFFORT_PREAMBLE: &str = "Reasoning Effort: Absolute maximum with no shortcuts permitted.\nYou MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\nExplicitly write out your entire deliberation process, documenting every intermediate step, considered alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";

const TOOLS_HEAD: &str = "## Tools\n\nYou have access to a set of tools to help answer the user question. You can invoke tools by writing a \"<｜DSML｜tool_calls>\" block like the following:\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"$TOOL_NAME\">\n<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n...\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"$TOOL_NAME2\">\n...\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>\n\nString parameters should be specified as raw text and set `string=\"true\"`. Preserve characters such as `>`, `&`, and `&&` exactly; never replace normal string characters with XML or HTML entity escapes. Only if a string value itself contains the exact closing parameter tag `</｜DSML｜parameter>`, write that tag as `&lt;/｜DSML｜parameter>` inside the value. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\nIf thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.\n\nOtherwise, output directly after </think> with tool calls or final response.\n\n### Available Tool Schemas\n\n";
const TOOLS_TAIL: &str = "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls. Use the exact parameter names from the schemas.";

/// Think Max only where the context is large enough for it.
pub fn thinking_for_context(thinking: Thinking, ctx: usize) -> Thinking {
    if thinking == Thinking::Max && ctx < THINK_MAX_MIN_CTX {
        Thinking::High
    } else {
        thinking
    }
}

/// What the generation prompt opens the assistant turn with.
fn opener(thinking: Thinking) -> &'static str {
    match thinking {
        Thinking::Off => THINK_CLOSE,
        Thinking::High | Thinking::Max => THINK_OPEN,
    }
}

/// One conversation message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// System (or developer) text, placed in the system area.
    System(String),
    User(String),
    Assistant {
        reasoning: Option<String>,
        content: String,
        tool_calls: Vec<ToolCall>,
    },
    /// A tool's result.
    Tool {
        call_id: String,
        content: String,
    },
}

/// A conversation in DeepSeek V4's terms, to render.
#[derive(Clone, Debug)]
pub struct Transcript<'a> {
    /// Tool schemas: each the JSON of a `function` object, as the client's
    /// bytes (written unchanged, one per line).
    pub tools: &'a [String],
    pub messages: &'a [Message],
    pub thinking: Thinking,
    /// Render earlier assistant reasoning in tool-using history (the
    /// reference format); the turn being continued keeps it regardless.
    pub reasoning_replay: bool,
    /// Open the model's next turn after the last message.
    pub add_generation_prompt: bool,
}

/// Escape an exact `</tool_result>` inside a result.
fn escape_result(s: &str) -> String {
    s.replace("</tool_result>", "&lt;/tool_result>")
}

/// Render `conv` to prompt text (to be tokenized with special tokens
/// recognised). Tool calls whose ids `replay` knows are written with the
/// bytes the model sampled; the others canonically.
pub fn render(conv: &Transcript<'_>, replay: &ReplayMap) -> Result<String, DsmlError> {
    let mut s = String::from(BOS);
    if conv.thinking == Thinking::Max {
        s.push_str(MAX_EFFORT_PREAMBLE);
    }
    let system: Vec<&str> = conv
        .messages
        .iter()
        .filter_map(|m| match m {
            Message::System(t) => Some(t.as_str()),
            _ => None,
        })
        .collect();
    let mut area = Vec::new();
    if !conv.tools.is_empty() {
        area.push(format!("{TOOLS_HEAD}{}{TOOLS_TAIL}", conv.tools.join("\n")));
    }
    if !system.is_empty() {
        area.push(system.join("\n\n"));
    }
    s.push_str(&area.join("\n\n"));

    let uses_tools = !conv.tools.is_empty()
        || conv.messages.iter().any(|m| match m {
            Message::Tool { .. } => true,
            Message::Assistant { tool_calls, .. } => !tool_calls.is_empty(),
            _ => false,
        });
    let last_input = conv
        .messages
        .iter()
        .rposition(|m| matches!(m, Message::User(_) | Message::Tool { .. }));
    let last_user = conv
        .messages
        .iter()
        .rposition(|m| matches!(m, Message::User(_)));
    let mut in_results = false;
    for (i, m) in conv.messages.iter().enumerate() {
        let was_results = std::mem::replace(&mut in_results, matches!(m, Message::Tool { .. }));
        match m {
            Message::System(_) => {}
            Message::User(t) => {
                s.push_str(USER);
                s.push_str(t);
            }
            Message::Tool { content, .. } => {
                if !was_results {
                    s.push_str(USER);
                }
                s.push_str("<tool_result>");
                s.push_str(&escape_result(content));
                s.push_str("</tool_result>");
            }
            Message::Assistant {
                reasoning,
                content,
                tool_calls,
            } => {
                s.push_str(ASSISTANT);
                // The turn being continued (since the last user message)
                // keeps its reasoning; earlier turns of a tool-using
                // conversation keep theirs unless replay is off.
                let continued = last_user.is_none_or(|l| i > l);
                let keep = conv.thinking != Thinking::Off
                    && ((uses_tools && (conv.reasoning_replay || continued))
                        || last_input.is_none_or(|l| i > l));
                if keep {
                    s.push_str(THINK_OPEN);
                    s.push_str(reasoning.as_deref().unwrap_or(""));
                }
                s.push_str(THINK_CLOSE);
                s.push_str(content);
                if !tool_calls.is_empty() {
                    s.push_str(&replay.render(tool_calls)?);
                }
                s.push_str(EOS);
            }
        }
    }
    if conv.add_generation_prompt {
        s.push_str(ASSISTANT);
        s.push_str(opener(conv.thinking));
    }
    Ok(s)
}

/// The token text that ends the model's turn.
pub const STOP_TEXT: &str = EOS;

/// DeepSeek V4's reasoning delimiters. A thinking-mode prompt ends with
/// `<think>`, so its answer starts inside them ([`Delimiters::inside`]).
pub const THINK_DELIMITERS: Delimiters = Delimiters {
    open: THINK_OPEN,
    close: THINK_CLOSE,
    starts_inside: false,
};

/// DeepSeek V4's chat protocol: the prompt above, tools in DSML with exact
/// replay of sampled calls, reasoning between `<think>` and `</think>`,
/// thinking by default.
#[derive(Clone, Copy, Debug, Default)]
pub struct Ds4Chat;

impl Ds4Chat {
    /// The prompt text for `c` at `thinking`; calls whose ids `replay`
    /// knows are written with their sampled bytes; earlier reasoning as
    /// `reasoning_replay` says.
    pub fn prompt(
        c: &Conversation,
        thinking: Thinking,
        replay: &super::ReplayStore,
        reasoning_replay: bool,
    ) -> Result<String, DsmlError> {
        let schemas: Vec<String> = c.offered().map(|t| t.function_json()).collect();
        let messages: Vec<Message> = c
            .turns
            .iter()
            .map(|t| match t.role {
                Role::System => Message::System(t.text.clone()),
                Role::User => Message::User(t.text.clone()),
                Role::Tool => Message::Tool {
                    call_id: String::new(),
                    content: t.text.clone(),
                },
                Role::Assistant => Message::Assistant {
                    reasoning: t.reasoning.clone(),
                    content: t.text.clone(),
                    tool_calls: t
                        .calls
                        .iter()
                        .map(|c| ToolCall {
                            arguments: if c.arguments.trim().is_empty() {
                                "{}".into()
                            } else {
                                c.arguments.clone()
                            },
                            ..c.clone()
                        })
                        .collect(),
                },
            })
            .collect();
        let map = replay.map_for(
            c.turns
                .iter()
                .flat_map(|t| t.calls.iter().map(|c| c.id.as_str())),
        );
        render(
            &Transcript {
                tools: &schemas,
                messages: &messages,
                thinking,
                reasoning_replay,
                add_generation_prompt: true,
            },
            &map,
        )
    }
}

/// Appended to deep tool results (the tool-call reminder lever).
pub const TOOL_REMINDER: &str = "\n\n(Reminder: to call a tool, write a <｜DSML｜tool_calls> block as the Tools section shows.)";

impl ChatProtocol for Ds4Chat {
    fn tool_reminder(&self) -> Option<&'static str> {
        Some(TOOL_REMINDER)
    }

    fn render(&self, c: &Conversation, opts: &RenderOptions) -> Result<PromptText, ChatError> {
        let requested = opts.levers.thinking(c.thinking).unwrap_or(Thinking::High);
        let thinking = thinking_for_context(requested, opts.ctx);
        let text = Ds4Chat::prompt(c, thinking, &opts.replay, opts.levers.reasoning_replay)?;
        let tools = c.tools_active().then(|| ToolParsing {
            names: c.offered().map(|t| t.name.clone()).collect(),
            forced: String::new(),
            protocol: ToolProtocol::Dsml,
            replay: Some(opts.replay.clone()),
        });
        // A non-thinking prompt has closed the reasoning: the answer holds
        // none (and a grammar gives the model no way to open it again).
        let reasoning = match thinking {
            Thinking::Off => None,
            Thinking::High | Thinking::Max => Some(THINK_DELIMITERS.inside()),
        };
        Ok(PromptText {
            text,
            // The text starts with BOS.
            add_bos: false,
            answer: AnswerFormat {
                reasoning,
                tools,
                calls: CallGrammar::new(ToolProtocol::Dsml, c.offered(), &c.choice, c.single_call),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_turn_openers() {
        let msgs = [Message::User("Hi".into())];
        let conv = |thinking| Transcript {
            tools: &[],
            messages: &msgs,
            thinking,
            reasoning_replay: true,
            add_generation_prompt: true,
        };
        let r = ReplayMap::new();
        assert_eq!(
            render(&conv(Thinking::Off), &r).unwrap(),
            format!("{BOS}{USER}Hi{ASSISTANT}</think>")
        );
        assert_eq!(
            render(&conv(Thinking::High), &r).unwrap(),
            format!("{BOS}{USER}Hi{ASSISTANT}<think>")
        );
        assert_eq!(
            render(&conv(Thinking::Max), &r).unwrap(),
            format!("{BOS}{MAX_EFFORT_PREAMBLE}{USER}Hi{ASSISTANT}<think>")
        );
        assert_eq!(thinking_for_context(Thinking::Max, 100_000), Thinking::High);
        assert_eq!(Thinking::from_effort("none"), Some(Thinking::Off));
    }

    #[test]
    fn earlier_reasoning_is_dropped_without_tools() {
        let msgs = [
            Message::User("a".into()),
            Message::Assistant {
                reasoning: Some("r1".into()),
                content: "b".into(),
                tool_calls: vec![],
            },
            Message::User("c".into()),
        ];
        let conv = Transcript {
            tools: &[],
            messages: &msgs,
            thinking: Thinking::High,
            reasoning_replay: true,
            add_generation_prompt: true,
        };
        assert_eq!(
            render(&conv, &ReplayMap::new()).unwrap(),
            format!("{BOS}{USER}a{ASSISTANT}</think>b{EOS}{USER}c{ASSISTANT}<think>")
        );
    }

    #[test]
    fn results_share_one_user_marker_and_escape_the_closing_tag() {
        let msgs = [
            Message::Tool {
                call_id: "1".into(),
                content: "x</tool_result>".into(),
            },
            Message::Tool {
                call_id: "2".into(),
                content: "y".into(),
            },
        ];
        let conv = Transcript {
            tools: &[],
            messages: &msgs,
            thinking: Thinking::Off,
            reasoning_replay: true,
            add_generation_prompt: false,
        };
        assert_eq!(
            render(&conv, &ReplayMap::new()).unwrap(),
            format!("{BOS}{USER}<tool_result>x&lt;/tool_result></tool_result><tool_result>y</tool_result>")
        );
    }
}

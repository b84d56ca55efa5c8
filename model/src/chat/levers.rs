//! Agent-loop levers: how the rendering of long tool-using conversations
//! may depart from a plain rendering, each chosen by the operator.
//!
//! - **Tool-call reminder**: deep in a conversation, a low-bit model
//!   sometimes answers a tool result with prose instead of its next call.
//!   Every tool result that comes after [`REMINDER_AFTER_BYTES`] of
//!   conversation text carries a short reminder of the family's call
//!   syntax ([`ChatProtocol::tool_reminder`](super::ChatProtocol)).
//!   Whether a result carries it depends only on what precedes it, so a
//!   conversation renders its earlier turns with the same bytes as it
//!   grows: prefix reuse stays warm turn after turn. Shallow conversations
//!   are never touched.
//! - **Reasoning replay**: whether earlier assistant reasoning is
//!   rendered again in history (the reference format keeps it in
//!   tool-using conversations); the turn being continued (the assistant
//!   turns since the last user message) always keeps its reasoning.
//! - **Effort**: a client's `max` effort means the prefix-free thinking
//!   level unless the operator opts into the native tiers; the server's
//!   own default effort is honoured as written.

use super::conversation::{Conversation, Role, Thinking};

/// Conversation text (tool schemas, turns, calls, reasoning) past which
/// tool results carry the reminder: about 96 KB.
pub const REMINDER_AFTER_BYTES: usize = 96 * 1024;

/// The operator's choices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Levers {
    /// Remind deep tool results of the call syntax.
    pub tool_reminder: bool,
    /// Render earlier assistant reasoning in history.
    pub reasoning_replay: bool,
    /// A client's `max` effort selects the native Think Max tier (else the
    /// prefix-free thinking level).
    pub effort_native: bool,
    /// The thinking mode of requests that name none (`None`: the family's
    /// default).
    pub default_thinking: Option<Thinking>,
}

impl Default for Levers {
    fn default() -> Levers {
        Levers {
            tool_reminder: true,
            reasoning_replay: true,
            effort_native: false,
            default_thinking: None,
        }
    }
}

impl Levers {
    /// The thinking mode a request runs with: the client's (its `max` as
    /// the prefix-free level unless native), else the server's default.
    pub fn thinking(&self, requested: Option<Thinking>) -> Option<Thinking> {
        match requested {
            Some(Thinking::Max) if !self.effort_native => Some(Thinking::High),
            Some(t) => Some(t),
            None => self.default_thinking,
        }
    }
}

/// The first turn that ends past [`REMINDER_AFTER_BYTES`] of
/// conversation text (`None`: a shallow conversation). Every later turn
/// is past it too.
pub fn deep_from(c: &Conversation) -> Option<usize> {
    let mut seen: usize = c
        .tools
        .iter()
        .map(|t| {
            t.raw
                .as_ref()
                .map_or(t.parameters.to_string().len(), String::len)
        })
        .sum();
    c.turns.iter().position(|t| {
        seen += t.text.len()
            + t.reasoning.as_ref().map_or(0, String::len)
            + t.calls
                .iter()
                .map(|c| c.name.len() + c.arguments.len())
                .sum::<usize>();
        seen > REMINDER_AFTER_BYTES
    })
}

/// Append `reminder` to every tool result from turn `from` on (see
/// [`deep_from`]). Returns how many results carry it.
pub fn remind_tool_results(c: &mut Conversation, from: usize, reminder: &str) -> usize {
    let results = c.turns[from..].iter_mut().filter(|t| t.role == Role::Tool);
    results.map(|t| t.text.push_str(reminder)).count()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::chat::conversation::{ToolCall, ToolSpec, Turn};
    use crate::chat::deepseek4::{Ds4Chat, MAX_EFFORT_PREAMBLE, TOOL_REMINDER};
    use crate::chat::{ChatProtocol, RenderOptions, ReplayStore};

    fn opts(levers: Levers) -> RenderOptions {
        RenderOptions {
            ctx: 1 << 20,
            replay: Arc::new(ReplayStore::default()),
            levers,
        }
    }

    /// A tool loop of `rounds` calls, each answered by `result_bytes`.
    fn tool_loop(rounds: usize, result_bytes: usize) -> Conversation {
        let mut c = Conversation::default();
        c.tools.push(ToolSpec {
            name: "read".into(),
            description: None,
            parameters: serde_json::json!({"type": "object"}),
            raw: None,
            strict: false,
        });
        c.turns.push(Turn::new(Role::User, "Read the files."));
        for i in 0..rounds {
            let mut t = Turn::new(Role::Assistant, "");
            t.reasoning = Some(format!("step {i}"));
            t.calls.push(ToolCall {
                id: format!("call_{i}"),
                name: "read".into(),
                arguments: format!("{{\"n\":{i}}}"),
            });
            c.turns.push(t);
            c.turns
                .push(Turn::new(Role::Tool, "x".repeat(result_bytes)));
        }
        c
    }

    /// What the protocol renders once the reminder lever has run.
    fn prompt(c: &Conversation, levers: Levers) -> String {
        let mut c = c.clone();
        if let Some(from) = deep_from(&c).filter(|_| levers.tool_reminder) {
            remind_tool_results(&mut c, from, TOOL_REMINDER);
        }
        Ds4Chat.render(&c, &opts(levers)).unwrap().text
    }

    #[test]
    fn shallow_conversations_are_untouched() {
        let c = tool_loop(3, 1000);
        let off = Levers {
            tool_reminder: false,
            ..Levers::default()
        };
        assert_eq!(prompt(&c, Levers::default()), prompt(&c, off));
        assert!(!prompt(&c, Levers::default()).contains(TOOL_REMINDER));
    }

    #[test]
    fn deep_results_carry_the_reminder_and_earlier_bytes_stay() {
        // 30 KB results: the fourth crosses 96 KB.
        let mut c = tool_loop(6, 30_000);
        let from = deep_from(&c).unwrap();
        assert_eq!(remind_tool_results(&mut c.clone(), from, TOOL_REMINDER), 3);
        let p = prompt(&c, Levers::default());
        assert_eq!(p.matches(TOOL_REMINDER).count(), 3);
        assert!(p.contains(&format!("{}</tool_result>", TOOL_REMINDER)));
        // Each turn's prompt, up to its generation prompt, opens the next
        // turn's: the reminder never rewrites what a cache holds.
        for rounds in 1..6 {
            let short = prompt(&tool_loop(rounds, 30_000), Levers::default());
            let open = short.rfind("<｜Assistant｜>").unwrap();
            let long = prompt(&tool_loop(rounds + 1, 30_000), Levers::default());
            assert!(long.starts_with(&short[..open]), "round {rounds}");
        }
        c.turns.truncate(1);
        assert_eq!(deep_from(&c), None);
    }

    #[test]
    fn dropped_reasoning_keeps_the_turn_being_continued() {
        let mut c = tool_loop(1, 10);
        c.turns.push(Turn::new(Role::User, "And the next one."));
        let mut t = Turn::new(Role::Assistant, "");
        t.reasoning = Some("second thought".into());
        t.calls.push(ToolCall {
            id: "call_9".into(),
            name: "read".into(),
            arguments: "{}".into(),
        });
        c.turns.push(t);
        c.turns.push(Turn::new(Role::Tool, "done"));
        let keep = prompt(&c, Levers::default());
        assert!(keep.contains("<think>step 0</think>"), "{keep}");
        assert!(keep.contains("<think>second thought</think>"), "{keep}");
        let drop = prompt(
            &c,
            Levers {
                reasoning_replay: false,
                ..Levers::default()
            },
        );
        assert!(!drop.contains("step 0"), "{drop}");
        assert!(drop.contains("<think>second thought</think>"), "{drop}");
    }

    #[test]
    fn a_clients_max_is_the_prefix_free_level_unless_native() {
        let mut c = Conversation::default();
        c.turns.push(Turn::new(Role::User, "Think hard."));
        c.thinking = Some(Thinking::Max);
        let plain = prompt(&c, Levers::default());
        assert!(!plain.contains(MAX_EFFORT_PREAMBLE));
        assert!(plain.ends_with("<｜Assistant｜><think>"), "{plain}");
        let native = Levers {
            effort_native: true,
            ..Levers::default()
        };
        assert!(prompt(&c, native)
            .starts_with(&format!("<｜begin▁of▁sentence｜>{MAX_EFFORT_PREAMBLE}")));
        // The server's own default is honoured as written.
        c.thinking = None;
        let max_default = Levers {
            default_thinking: Some(Thinking::Max),
            ..Levers::default()
        };
        assert!(prompt(&c, max_default).contains(MAX_EFFORT_PREAMBLE));
        let off_default = Levers {
            default_thinking: Some(Thinking::Off),
            ..Levers::default()
        };
        assert!(prompt(&c, off_default).ends_with("<｜Assistant｜></think>"));
    }
}

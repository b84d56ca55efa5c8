//! The loaded family's tool protocol: how calls appear in generated text.
//!
//! - [`ToolProtocol::Envelope`]: the generic `<tool_call>{json}</tool_call>`
//!   envelope (families whose template has no tool syntax, e.g. llama).
//!   A call in the documented shape starts as soon as its name is read
//!   and its arguments stream as the model writes them; other shapes are
//!   recognised when the envelope closes and arrive in one piece.
//! - [`ToolProtocol::Dsml`]: DeepSeek V4's DSML block
//!   ([`super::dsml`]). A call's name is known as soon as its
//!   `invoke` header is complete and its arguments stream as JSON text.
//!   The block's exact bytes are kept for replay ([`super::ReplayStore`]);
//!   text after the block is not part of the answer. (The model ends its
//!   turn right after the block. Generation is not cut at the closing tag
//!   with a stop string: the model may draft DSML inside its reasoning,
//!   and a stop there would end the answer before it began.)
//!
//! Both produce the same [`ToolEvent`]s, so nothing above the chat layer
//! knows which family it serves.

use super::dsml::{DsmlError, DsmlEvent, DsmlStreamParser};
use super::envelope_parser::{CallParser, Parsed};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolProtocol {
    Envelope,
    Dsml,
}

/// What a [`ToolStream`] finds in the answer text, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolEvent {
    Text(String),
    /// A call starts; its arguments follow.
    Start {
        name: String,
    },
    /// More of the current call's JSON arguments.
    Args(String),
    /// The current call's arguments are complete.
    End,
    /// The calls written so far form one block with these exact bytes.
    Block {
        raw: String,
    },
}

/// A streaming call parser for one run.
#[derive(Debug)]
pub enum ToolStream {
    Envelope(CallParser),
    Dsml {
        parser: DsmlStreamParser,
        /// A call was started and not yet ended.
        open: bool,
        /// The block was malformed: the rest is passed through as text.
        failed: bool,
        /// Generation ended inside a call.
        cut: bool,
    },
}

impl ToolStream {
    /// A parser for `protocol`, for calls to `names`; `forced` is the text
    /// the prompt opened a forced call with (envelope only).
    pub fn new(protocol: ToolProtocol, names: Vec<String>, forced: &str) -> ToolStream {
        match protocol {
            ToolProtocol::Envelope => ToolStream::Envelope(CallParser::for_tools(names, forced)),
            ToolProtocol::Dsml => ToolStream::Dsml {
                parser: DsmlStreamParser::new(),
                open: false,
                failed: false,
                cut: false,
            },
        }
    }

    /// Whether the last call was left unfinished: generation ended inside
    /// its arguments, or (DSML) it turned malformed; the parser ended it,
    /// not the model.
    pub fn cut_short(&self) -> bool {
        match self {
            ToolStream::Envelope(p) => p.cut_short(),
            ToolStream::Dsml { cut, .. } => *cut,
        }
    }

    /// Whether the calls are complete (generation should stop).
    pub fn is_done(&self) -> bool {
        match self {
            ToolStream::Envelope(_) => false,
            ToolStream::Dsml { parser, .. } => parser.is_done(),
        }
    }

    pub fn push(&mut self, text: &str) -> Vec<ToolEvent> {
        match self {
            ToolStream::Envelope(p) => envelope(p.push(text)),
            ToolStream::Dsml {
                parser,
                open,
                failed,
                cut,
            } => {
                if *failed {
                    return text_event(text);
                }
                let was_open = *open;
                let r = parser.push(text);
                let out = dsml(r, open, failed, text);
                *cut = was_open && *failed;
                out
            }
        }
    }

    /// End of generation: held text, and the end of an unfinished call.
    pub fn finish(&mut self) -> Vec<ToolEvent> {
        match self {
            ToolStream::Envelope(p) => envelope(p.finish()),
            ToolStream::Dsml {
                parser,
                open,
                failed,
                cut,
            } => {
                if *failed {
                    return Vec::new();
                }
                let was_open = *open;
                let r = parser.finish();
                let out = dsml(r, open, failed, "");
                *cut = was_open && *failed;
                out
            }
        }
    }
}

fn text_event(text: &str) -> Vec<ToolEvent> {
    if text.is_empty() {
        Vec::new()
    } else {
        vec![ToolEvent::Text(text.to_string())]
    }
}

fn envelope(parsed: Vec<Parsed>) -> Vec<ToolEvent> {
    let mut out = Vec::new();
    for p in parsed {
        match p {
            Parsed::Text(t) => out.push(ToolEvent::Text(t)),
            Parsed::Call { name, arguments } => {
                out.push(ToolEvent::Start { name });
                out.push(ToolEvent::Args(arguments));
                out.push(ToolEvent::End);
            }
            Parsed::Start { name } => out.push(ToolEvent::Start { name }),
            Parsed::Args(a) => out.push(ToolEvent::Args(a)),
            Parsed::End => out.push(ToolEvent::End),
        }
    }
    out
}

fn dsml(
    r: Result<Vec<DsmlEvent>, DsmlError>,
    open: &mut bool,
    failed: &mut bool,
    text: &str,
) -> Vec<ToolEvent> {
    match r {
        Ok(events) => events
            .into_iter()
            .map(|e| match e {
                DsmlEvent::Text(t) => ToolEvent::Text(t),
                DsmlEvent::CallStart { name, .. } => {
                    *open = true;
                    ToolEvent::Start { name }
                }
                DsmlEvent::ArgumentsDelta { delta, .. } => ToolEvent::Args(delta),
                DsmlEvent::CallEnd { .. } => {
                    *open = false;
                    ToolEvent::End
                }
                DsmlEvent::Done { raw } => ToolEvent::Block { raw },
            })
            .collect(),
        Err(e) => {
            // A malformed or unfinished block: end the open call (its
            // arguments stay incomplete) and let the rest through as text.
            tracing::warn!(error = %e, "the model wrote a malformed DSML tool call");
            *failed = true;
            let mut out = Vec::new();
            if std::mem::take(open) {
                out.push(ToolEvent::End);
            }
            out.extend(text_event(text));
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(protocol: ToolProtocol, text: &str, n: usize) -> Vec<ToolEvent> {
        let mut s = ToolStream::new(protocol, vec!["get_weather".into()], "");
        let chars: Vec<char> = text.chars().collect();
        let mut out = Vec::new();
        for piece in chars.chunks(n) {
            out.extend(s.push(&piece.iter().collect::<String>()));
        }
        out.extend(s.finish());
        out
    }

    fn args(ev: &[ToolEvent]) -> String {
        ev.iter()
            .filter_map(|e| match e {
                ToolEvent::Args(a) => Some(a.as_str()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn both_protocols_give_the_same_events() {
        let env = collect(
            ToolProtocol::Envelope,
            "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}</tool_call>",
            4,
        );
        let dsml = collect(
            ToolProtocol::Dsml,
            "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" string=\"true\">Rome</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
            4,
        );
        for ev in [&env, &dsml] {
            assert_eq!(
                ev[0],
                ToolEvent::Start {
                    name: "get_weather".into()
                }
            );
            let v: serde_json::Value = serde_json::from_str(&args(ev)).expect("arguments JSON");
            assert_eq!(v, serde_json::json!({"city": "Rome"}));
            // The arguments stream: several pieces before the call ends.
            let pieces = ev
                .iter()
                .filter(|e| matches!(e, ToolEvent::Args(_)))
                .count();
            assert!(pieces > 1, "{ev:?}");
        }
        assert!(
            matches!(dsml.last(), Some(ToolEvent::Block { raw }) if raw.starts_with("\n\n<｜DSML｜tool_calls>"))
        );
    }

    #[test]
    fn a_malformed_block_ends_the_call_and_passes_text_through() {
        let ev = collect(
            ToolProtocol::Dsml,
            "<｜DSML｜tool_calls><｜DSML｜invoke name=\"f\"><｜DSML｜oops>tail",
            1,
        );
        assert_eq!(ev[0], ToolEvent::Start { name: "f".into() });
        assert!(ev.contains(&ToolEvent::End), "{ev:?}");
        let ev = collect(
            ToolProtocol::Dsml,
            "<｜DSML｜tool_calls><｜DSML｜invoke name=\"f\">",
            100,
        );
        assert_eq!(ev.last(), Some(&ToolEvent::End));
    }
}

//! Reading an answer as it is generated: reasoning split from the answer
//! by the family's delimiters, tool calls found in the answer by the
//! family's tool syntax, each call given an id, and a call block's sampled
//! bytes kept for exact replay. Every caller (each HTTP surface, the CLI)
//! sees the same [`AnswerEvent`]s whatever the family.

use std::sync::Arc;

use super::conversation::new_call_id;
use super::protocol::AnswerFormat;
use super::reasoning::{Part, ReasoningSplitter};
use super::replay::ReplayStore;
use super::tool_stream::{ToolEvent, ToolStream};

/// What an answer is made of, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AnswerEvent {
    Reasoning(String),
    Text(String),
    /// A tool call starts: its id and name (its arguments follow).
    CallStart {
        index: usize,
        id: String,
        name: String,
    },
    /// More of call `index`'s JSON arguments; the deltas of a call
    /// concatenate to its arguments.
    CallArgs {
        index: usize,
        delta: String,
    },
    /// The current call is complete.
    CallEnd,
}

/// Streaming reader of one answer.
#[derive(Debug)]
pub struct AnswerParser {
    splitter: ReasoningSplitter,
    tools: Option<Tools>,
    /// Calls started so far.
    calls: usize,
}

/// Tool-call parsing state of an answer.
#[derive(Debug)]
struct Tools {
    stream: ToolStream,
    id_prefix: &'static str,
    replay: Option<Arc<ReplayStore>>,
    /// Ids of the calls since the last block was stored.
    block_ids: Vec<String>,
}

impl AnswerParser {
    /// A reader for an answer in `format`; generated call ids start with
    /// `id_prefix` (`call_`, `toolu_`).
    pub fn new(format: AnswerFormat, id_prefix: &'static str) -> AnswerParser {
        AnswerParser {
            splitter: ReasoningSplitter::new(format.reasoning),
            tools: format.tools.map(|t| Tools {
                stream: ToolStream::new(t.protocol, t.names, &t.forced),
                id_prefix,
                replay: t.replay,
                block_ids: Vec::new(),
            }),
            calls: 0,
        }
    }

    /// The events of the next piece of generated text.
    pub fn push(&mut self, text: &str) -> Vec<AnswerEvent> {
        let parts = self.splitter.push(text);
        let mut out = Vec::new();
        self.route(parts, &mut out);
        out
    }

    /// The end of generation: text held back, and the end of an
    /// unfinished call. Returns the events and the number of calls the
    /// model finished writing (a call the token limit cut short does not
    /// count).
    pub fn finish(&mut self) -> (Vec<AnswerEvent>, usize) {
        let parts = self.splitter.finish();
        let mut out = Vec::new();
        self.route(parts, &mut out);
        let mut cut_short = false;
        if let Some(t) = &mut self.tools {
            let events = t.stream.finish();
            self.calls = t.events(events, self.calls, &mut out);
            cut_short = t.stream.cut_short();
        }
        (out, self.calls - usize::from(cut_short))
    }

    fn route(&mut self, parts: Vec<Part>, out: &mut Vec<AnswerEvent>) {
        for part in parts {
            // After a closed tool-call block the turn is over: what follows
            // is neither answer nor reasoning.
            if self.tools.as_ref().is_some_and(|t| t.stream.is_done()) {
                return;
            }
            match part {
                Part::Reasoning(r) => out.push(AnswerEvent::Reasoning(r)),
                Part::Answer(a) => match &mut self.tools {
                    None => out.push(AnswerEvent::Text(a)),
                    Some(t) => {
                        let events = t.stream.push(&a);
                        self.calls = t.events(events, self.calls, out);
                    }
                },
            }
        }
    }
}

impl Tools {
    /// Turn parser events into answer events; returns the calls count.
    fn events(
        &mut self,
        events: Vec<ToolEvent>,
        mut calls: usize,
        out: &mut Vec<AnswerEvent>,
    ) -> usize {
        for e in events {
            match e {
                ToolEvent::Text(t) => out.push(AnswerEvent::Text(t)),
                ToolEvent::Start { name } => {
                    let id = new_call_id(self.id_prefix);
                    self.block_ids.push(id.clone());
                    out.push(AnswerEvent::CallStart {
                        index: calls,
                        id,
                        name,
                    });
                    calls += 1;
                }
                ToolEvent::Args(delta) => out.push(AnswerEvent::CallArgs {
                    index: calls.saturating_sub(1),
                    delta,
                }),
                ToolEvent::End => out.push(AnswerEvent::CallEnd),
                ToolEvent::Block { raw } => {
                    let ids = std::mem::take(&mut self.block_ids);
                    if let Some(r) = &self.replay {
                        r.insert(ids.iter().map(String::as_str), &raw);
                    }
                }
            }
        }
        calls
    }
}

#[cfg(test)]
mod tests {
    use super::super::deepseek4::THINK_DELIMITERS;
    use super::super::protocol::ToolParsing;
    use super::super::tool_stream::ToolProtocol;
    use super::*;

    fn run(p: &mut AnswerParser, text: &str) -> (Vec<AnswerEvent>, usize) {
        let mut out = Vec::new();
        for c in text.chars() {
            out.extend(p.push(&c.to_string()));
        }
        let (tail, calls) = p.finish();
        out.extend(tail);
        (out, calls)
    }

    #[test]
    fn reasoning_then_a_dsml_call_whose_bytes_are_kept() {
        let replay = Arc::new(ReplayStore::default());
        let mut p = AnswerParser::new(
            AnswerFormat {
                reasoning: Some(THINK_DELIMITERS.inside()),
                tools: Some(ToolParsing {
                    names: vec!["f".into()],
                    forced: String::new(),
                    protocol: ToolProtocol::Dsml,
                    replay: Some(replay.clone()),
                }),
                calls: None,
            },
            "call_",
        );
        let block = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"x\" string=\"false\">1</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
        let (ev, calls) = run(&mut p, &format!("hm</think>{block}ignored"));
        assert_eq!(calls, 1);
        let reasoning: String = ev
            .iter()
            .filter_map(|e| match e {
                AnswerEvent::Reasoning(r) => Some(r.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(reasoning, "hm");
        let id = ev
            .iter()
            .find_map(|e| match e {
                AnswerEvent::CallStart { id, name, index } => {
                    assert_eq!((name.as_str(), *index), ("f", 0));
                    Some(id.clone())
                }
                _ => None,
            })
            .expect("a call");
        assert!(id.starts_with("call_"));
        assert_eq!(replay.get(&id).as_deref(), Some(block));
        assert!(
            !ev.iter()
                .any(|e| matches!(e, AnswerEvent::Text(t) if t.contains("ignored"))),
            "text after the block is not part of the answer: {ev:?}"
        );
    }

    #[test]
    fn a_call_cut_short_is_not_counted() {
        let mut p = AnswerParser::new(
            AnswerFormat {
                reasoning: None,
                tools: Some(ToolParsing {
                    names: vec!["f".into()],
                    forced: String::new(),
                    protocol: ToolProtocol::Envelope,
                    replay: None,
                }),
                calls: None,
            },
            "call_",
        );
        let (ev, calls) = run(
            &mut p,
            "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": ",
        );
        assert_eq!(calls, 0);
        assert!(ev.contains(&AnswerEvent::CallEnd), "{ev:?}");
        // So is a DSML call the limit cut inside its parameters; one that
        // closed before the limit counts.
        for (text, want) in [
            ("<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"x\" string=\"true\">Par", 0),
            ("<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"x\" string=\"true\">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n", 1),
        ] {
            let mut d = AnswerParser::new(
                AnswerFormat {
                    reasoning: None,
                    tools: Some(ToolParsing {
                        names: vec!["f".into()],
                        forced: String::new(),
                        protocol: ToolProtocol::Dsml,
                        replay: None,
                    }),
                    calls: None,
                },
                "call_",
            );
            assert_eq!(run(&mut d, text).1, want, "{text}");
        }
        // Without delimiters or tools every piece is answer text.
        let mut plain = AnswerParser::new(AnswerFormat::default(), "call_");
        let (ev, calls) = run(&mut plain, "<think>x");
        assert_eq!(calls, 0);
        let text: String = ev
            .iter()
            .map(|e| match e {
                AnswerEvent::Text(t) => t.as_str(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(text, "<think>x");
    }
}

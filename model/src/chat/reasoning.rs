//! Thinking/reasoning text, separated from the answer.
//!
//! A family that thinks declares the delimiters its model writes around
//! its reasoning ([`Delimiters`]); [`ReasoningSplitter`] then splits the
//! streamed text into reasoning and answer, so each API can send reasoning
//! in its own shape and never mixed into the answer. DeepSeek V4 thinks
//! between `<think>` and `</think>`; llama does not think.

use super::envelope_parser::held_prefix_len;

/// How a family marks its reasoning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Delimiters {
    pub open: &'static str,
    pub close: &'static str,
    /// The chat template's generation prompt already opens the reasoning,
    /// so generated text starts inside it.
    pub starts_inside: bool,
}

impl Delimiters {
    /// The same delimiters for a prompt that already opened the reasoning.
    pub fn inside(self) -> Delimiters {
        Delimiters {
            starts_inside: true,
            ..self
        }
    }
}

/// One piece of split text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Part {
    Reasoning(String),
    Answer(String),
}

/// Streaming splitter; without delimiters everything is answer.
#[derive(Debug)]
pub struct ReasoningSplitter {
    delims: Option<Delimiters>,
    inside: bool,
    buf: String,
}

impl ReasoningSplitter {
    pub fn new(delims: Option<Delimiters>) -> ReasoningSplitter {
        ReasoningSplitter {
            inside: delims.is_some_and(|d| d.starts_inside),
            delims,
            buf: String::new(),
        }
    }

    pub fn push(&mut self, text: &str) -> Vec<Part> {
        let Some(d) = self.delims else {
            return if text.is_empty() {
                Vec::new()
            } else {
                vec![Part::Answer(text.to_string())]
            };
        };
        self.buf.push_str(text);
        let mut out = Vec::new();
        loop {
            let tag = if self.inside { d.close } else { d.open };
            if let Some(at) = self.buf.find(tag) {
                self.emit(&mut out, at);
                self.buf.drain(..tag.len());
                self.inside = !self.inside;
            } else {
                let keep = held_prefix_len(&self.buf, tag);
                self.emit(&mut out, self.buf.len() - keep);
                break;
            }
        }
        out
    }

    /// Text held back when generation ends.
    pub fn finish(&mut self) -> Vec<Part> {
        let mut out = Vec::new();
        self.emit(&mut out, self.buf.len());
        out
    }

    fn emit(&mut self, out: &mut Vec<Part>, upto: usize) {
        if upto == 0 {
            return;
        }
        let s: String = self.buf.drain(..upto).collect();
        out.push(if self.inside {
            Part::Reasoning(s)
        } else {
            Part::Answer(s)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const THINK: Delimiters = Delimiters {
        open: "<think>",
        close: "</think>",
        starts_inside: false,
    };

    fn run(d: Option<Delimiters>, text: &str, n: usize) -> (String, String) {
        let mut s = ReasoningSplitter::new(d);
        let (mut r, mut a) = (String::new(), String::new());
        let chars: Vec<char> = text.chars().collect();
        let mut parts = Vec::new();
        for piece in chars.chunks(n) {
            parts.extend(s.push(&piece.iter().collect::<String>()));
        }
        parts.extend(s.finish());
        for p in parts {
            match p {
                Part::Reasoning(t) => r.push_str(&t),
                Part::Answer(t) => a.push_str(&t),
            }
        }
        (r, a)
    }

    #[test]
    fn reasoning_is_split_from_the_answer_in_any_chunking() {
        for n in [1, 3, 100] {
            assert_eq!(
                run(
                    Some(THINK),
                    "<think>Paris is the capital.</think>It is Paris.",
                    n
                ),
                ("Paris is the capital.".into(), "It is Paris.".into())
            );
        }
    }

    #[test]
    fn template_opened_reasoning_and_no_delimiters() {
        let inside = Delimiters {
            starts_inside: true,
            ..THINK
        };
        assert_eq!(
            run(Some(inside), "hmm</think>Yes", 2),
            ("hmm".into(), "Yes".into())
        );
        assert_eq!(
            run(None, "<think>x</think>y", 2),
            (String::new(), "<think>x</think>y".into())
        );
        assert_eq!(
            run(Some(THINK.inside()), "r</think>a", 1),
            ("r".into(), "a".into())
        );
    }
}

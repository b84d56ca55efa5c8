//! Finds generic call envelopes in streamed text.

use serde_json::Value;

use super::{CALL_CLOSE, CALL_OPEN};

/// What the parser releases.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Parsed {
    /// Ordinary answer text.
    Text(String),
    /// A complete call: the tool name and its arguments as JSON text.
    Call { name: String, arguments: String },
}

/// Streaming envelope parser: push text as it is generated, get back text
/// and completed calls. Text that might be the start of an envelope is
/// held back until it is known; an envelope that does not hold a valid
/// call is released as text.
#[derive(Debug, Default)]
pub struct CallParser {
    buf: String,
    inside: bool,
    /// Tools that may be called; calls to other names are text. Empty:
    /// any name.
    names: Vec<String>,
    /// Prompt text that opened the first envelope (a forced call): it is
    /// not model output, so it is never released as text.
    forced: String,
    /// The last thing released was a call.
    after_call: bool,
}

impl CallParser {
    /// A parser accepting calls to any name.
    pub fn new() -> CallParser {
        CallParser::default()
    }

    /// A parser for calls to `names`; `forced` is the text the prompt
    /// already opened a call with (see [`super::forced_prefix`]).
    pub fn for_tools(names: Vec<String>, forced: &str) -> CallParser {
        let mut p = CallParser {
            names,
            ..CallParser::default()
        };
        let early = p.push(forced);
        debug_assert!(early.is_empty(), "a forced prefix opens a call");
        p.forced = forced.to_string();
        p
    }

    fn parse(&self, body: &str) -> Option<Parsed> {
        let call = parse_call(body)?;
        match &call {
            Parsed::Call { name, .. } if !self.names.is_empty() && !self.names.contains(name) => {
                None
            }
            _ => Some(call),
        }
    }

    /// A failed envelope as text, without the forced prompt part.
    fn as_text(&mut self, text: String) -> Parsed {
        let forced = std::mem::take(&mut self.forced);
        match text.strip_prefix(forced.as_str()) {
            Some(rest) if !forced.is_empty() => Parsed::Text(rest.to_string()),
            _ => Parsed::Text(text),
        }
    }

    pub fn push(&mut self, text: &str) -> Vec<Parsed> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        loop {
            if self.inside {
                let Some(end) = self.buf.find(CALL_CLOSE) else {
                    break;
                };
                let body = self.buf[..end].to_string();
                self.buf.drain(..end + CALL_CLOSE.len());
                self.inside = false;
                match self.parse(&body) {
                    Some(call) => {
                        self.forced.clear();
                        self.after_call = true;
                        out.push(call)
                    }
                    None => {
                        let t = self.as_text(format!("{CALL_OPEN}{body}{CALL_CLOSE}"));
                        out.push(t)
                    }
                }
            } else if self.after_call && self.buf.starts_with(char::is_whitespace) {
                // Whitespace after a call is not answer text.
                let trimmed = self.buf.trim_start().len();
                self.buf.drain(..self.buf.len() - trimmed);
            } else if let Some(at) = self.buf.find(CALL_OPEN) {
                self.after_call = false;
                if at > 0 {
                    out.push(Parsed::Text(self.buf[..at].to_string()));
                }
                self.buf.drain(..at + CALL_OPEN.len());
                self.inside = true;
            } else {
                let hold = held_prefix_len(&self.buf, CALL_OPEN);
                let emit = self.buf.len() - hold;
                if emit > 0 {
                    self.after_call = false;
                    out.push(Parsed::Text(self.buf[..emit].to_string()));
                    self.buf.drain(..emit);
                }
                break;
            }
        }
        out
    }

    /// Whatever is left when generation ends: held text, or an unfinished
    /// envelope (as text, unless it already holds a complete call).
    pub fn finish(&mut self) -> Vec<Parsed> {
        let rest = std::mem::take(&mut self.buf);
        if self.inside {
            self.inside = false;
            if let Some(call) = self.parse(&rest) {
                return vec![call];
            }
            return match self.as_text(format!("{CALL_OPEN}{rest}")) {
                Parsed::Text(t) if t.is_empty() => Vec::new(),
                t => vec![t],
            };
        }
        if rest.is_empty() {
            Vec::new()
        } else {
            vec![Parsed::Text(rest)]
        }
    }
}

fn parse_call(body: &str) -> Option<Parsed> {
    let v: Value = serde_json::from_str(body.trim()).ok()?;
    let name = v.get("name")?.as_str()?.to_string();
    let arguments = match v.get("arguments").or_else(|| v.get("parameters")) {
        None | Some(Value::Null) => "{}".to_string(),
        // Some models write the arguments as a JSON string.
        Some(Value::String(s)) if serde_json::from_str::<Value>(s).is_ok() => s.clone(),
        Some(a) => a.to_string(),
    };
    Some(Parsed::Call { name, arguments })
}

/// Length of the longest tail of `buf` that is a proper prefix of `tag`.
pub(crate) fn held_prefix_len(buf: &str, tag: &str) -> usize {
    (1..tag.len().min(buf.len() + 1))
        .rev()
        .find(|&n| buf.is_char_boundary(buf.len() - n) && tag.starts_with(&buf[buf.len() - n..]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, args: &str) -> Parsed {
        Parsed::Call {
            name: name.into(),
            arguments: args.into(),
        }
    }

    /// Feed `text` in pieces of `n` bytes (on char boundaries) and merge
    /// adjacent text.
    fn feed(text: &str, n: usize) -> Vec<Parsed> {
        let mut p = CallParser::new();
        let mut out = Vec::new();
        let chars: Vec<char> = text.chars().collect();
        for piece in chars.chunks(n) {
            out.extend(p.push(&piece.iter().collect::<String>()));
        }
        out.extend(p.finish());
        let mut merged: Vec<Parsed> = Vec::new();
        for x in out {
            match (merged.last_mut(), x) {
                (Some(Parsed::Text(a)), Parsed::Text(b)) => a.push_str(&b),
                (_, x) => merged.push(x),
            }
        }
        merged
    }

    #[test]
    fn text_then_two_calls_in_any_chunking() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
        for n in [1, 2, 3, 7, 1000] {
            assert_eq!(
                feed(text, n),
                vec![
                    Parsed::Text("Let me check.\n".into()),
                    call("get_weather", "{\"city\":\"Paris\"}"),
                    call("now", "{}"),
                ],
                "pieces of {n}"
            );
        }
    }

    #[test]
    fn plain_text_and_lookalikes_pass_through() {
        assert_eq!(
            feed("a < b <tool", 1),
            vec![Parsed::Text("a < b <tool".into())]
        );
        let bad = "<tool_call>not json</tool_call> ok";
        assert_eq!(feed(bad, 4), vec![Parsed::Text(bad.into())]);
    }

    #[test]
    fn unknown_tools_and_failed_forced_calls_are_text() {
        let mut p = CallParser::for_tools(vec!["f".into()], "");
        let text = "<tool_call>{\"name\": \"g\", \"arguments\": {}}</tool_call>";
        assert_eq!(p.push(text), vec![Parsed::Text(text.into())]);

        let forced = "<tool_call>\n{\"name\": \"f\", \"arguments\": ";
        let mut p = CallParser::for_tools(vec!["f".into()], forced);
        assert_eq!(
            p.push("{\"x\": 1}}\n</tool_call>"),
            vec![call("f", "{\"x\":1}")]
        );
        let mut p = CallParser::for_tools(vec!["f".into()], forced);
        let mut out = p.push("oops, no JSON");
        out.extend(p.finish());
        assert_eq!(out, vec![Parsed::Text("oops, no JSON".into())]);
    }

    #[test]
    fn unterminated_envelope_with_a_complete_call_counts() {
        let text = "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}";
        assert_eq!(feed(text, 5), vec![call("f", "{\"a\": 1}")]);
        assert_eq!(
            feed("<tool_call>{\"name\":", 5),
            vec![Parsed::Text("<tool_call>{\"name\":".into())]
        );
    }
}

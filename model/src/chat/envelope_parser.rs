//! Finds generic call envelopes in streamed text.

use serde_json::Value;

use super::envelope::{CALL_CLOSE, CALL_OPEN};

/// What the parser releases.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Parsed {
    /// Ordinary answer text.
    Text(String),
    /// A complete call found only once its envelope closed (its fields in
    /// another order, or string-encoded arguments): the tool name and its
    /// arguments as JSON text.
    Call { name: String, arguments: String },
    /// A streamed call starts (`{"name": "...", "arguments": {` seen).
    Start { name: String },
    /// More of the streamed call's arguments, as the model wrote them.
    Args(String),
    /// The streamed call's arguments are complete.
    End,
}

/// Where the parser is in the text.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum State {
    /// Answer text.
    #[default]
    Outside,
    /// Inside an envelope, before the call's header is known.
    Header,
    /// Inside a streamed call's arguments object.
    Args {
        depth: u32,
        in_str: bool,
        escape: bool,
    },
    /// After a streamed call's arguments, up to the closing tag.
    Tail,
}

/// Streaming envelope parser: push text as it is generated, get back text
/// and calls. Text that might be the start of an envelope is held back
/// until it is known. A call written in the documented shape
/// (`{"name": "...", "arguments": {...}}`) to an offered tool streams its
/// arguments as the model writes them; any other envelope is parsed when
/// it closes, and released as text if it does not hold a valid call.
#[derive(Debug, Default)]
pub struct CallParser {
    buf: String,
    state: State,
    /// Tools that may be called; calls to other names are text. Empty:
    /// any name.
    names: Vec<String>,
    /// Prompt text that opened the first envelope (a forced call): it is
    /// not model output, so it is never released as text.
    forced: String,
    /// The last thing released was a call.
    after_call: bool,
    /// Generation ended inside a streamed call.
    cut_short: bool,
}

impl CallParser {
    /// A parser accepting calls to any name.
    pub fn new() -> CallParser {
        CallParser::default()
    }

    /// A parser for calls to `names`; `forced` is the text the prompt
    /// already opened a call with (see [`super::envelope::forced_prefix`]).
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
            if let State::Args { .. } = self.state {
                match self.scan_args() {
                    Some(end) => {
                        out.push(Parsed::Args(self.buf[..end].to_string()));
                        self.buf.drain(..end);
                        self.state = State::Tail;
                    }
                    None => {
                        if !self.buf.is_empty() {
                            out.push(Parsed::Args(std::mem::take(&mut self.buf)));
                        }
                        break;
                    }
                }
            } else if self.state == State::Tail {
                // The envelope's closing brace and tag: not part of the call.
                let Some(end) = self.buf.find(CALL_CLOSE) else {
                    break;
                };
                self.buf.drain(..end + CALL_CLOSE.len());
                self.state = State::Outside;
                self.after_call = true;
                out.push(Parsed::End);
            } else if self.state == State::Header {
                match header(&self.buf) {
                    Header::Streams { name, args_at }
                        if self.names.is_empty() || self.names.contains(&name) =>
                    {
                        self.buf.drain(..args_at);
                        self.forced.clear();
                        self.state = State::Args {
                            depth: 0,
                            in_str: false,
                            escape: false,
                        };
                        out.push(Parsed::Start { name });
                        continue;
                    }
                    // Not streamable: parsed whole when it closes.
                    _ => {}
                }
                let Some(end) = self.buf.find(CALL_CLOSE) else {
                    break;
                };
                let body = self.buf[..end].to_string();
                self.buf.drain(..end + CALL_CLOSE.len());
                self.state = State::Outside;
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
                self.state = State::Header;
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

    /// Whether generation ended inside a streamed call's arguments.
    pub fn cut_short(&self) -> bool {
        self.cut_short
    }

    /// Byte length of the arguments object at the start of `buf` once it
    /// is complete, updating the JSON nesting state as it scans.
    fn scan_args(&mut self) -> Option<usize> {
        let State::Args {
            mut depth,
            mut in_str,
            mut escape,
        } = self.state
        else {
            return None;
        };
        let mut end = None;
        for (i, b) in self.buf.bytes().enumerate() {
            if in_str {
                match (escape, b) {
                    (true, _) => escape = false,
                    (false, b'\\') => escape = true,
                    (false, b'"') => in_str = false,
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => in_str = true,
                b'{' | b'[' => depth += 1,
                b'}' | b']' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        end = Some(i + 1);
                        break;
                    }
                }
                _ => {}
            }
        }
        self.state = State::Args {
            depth,
            in_str,
            escape,
        };
        end
    }

    /// Whatever is left when generation ends: held text, the end of a
    /// streamed call, or an unfinished envelope (as text, unless it
    /// already holds a complete call).
    pub fn finish(&mut self) -> Vec<Parsed> {
        let rest = std::mem::take(&mut self.buf);
        let state = std::mem::take(&mut self.state);
        if matches!(state, State::Args { .. } | State::Tail) {
            // A streamed call cut short: its arguments went out already.
            self.cut_short = matches!(state, State::Args { .. });
            return vec![Parsed::End];
        }
        if state == State::Header {
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

/// What the start of an envelope's body says.
#[derive(Debug, PartialEq, Eq)]
enum Header {
    /// `{"name": "<name>", "arguments": {`: the arguments object starts at
    /// byte `args_at`.
    Streams { name: String, args_at: usize },
    /// Not decided yet.
    NeedMore,
    /// Another shape: parse the whole envelope when it closes.
    Other,
}

fn header(body: &str) -> Header {
    let b = body.as_bytes();
    let mut i = 0;
    let ws = |i: &mut usize| {
        while *i < b.len() && b[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    // Expect the literal `lit` at i (after whitespace).
    let lit = |i: &mut usize, lit: &str| -> Option<bool> {
        ws(i);
        let rest = &b[*i..];
        if rest.len() < lit.len() {
            return lit.as_bytes().starts_with(rest).then_some(false);
        }
        if rest.starts_with(lit.as_bytes()) {
            *i += lit.len();
            Some(true)
        } else {
            None
        }
    };
    for l in ["{", "\"name\"", ":", "\""] {
        match lit(&mut i, l) {
            Some(true) => {}
            Some(false) => return Header::NeedMore,
            None => return Header::Other,
        }
    }
    let start = i;
    while i < b.len() && b[i] != b'"' {
        if b[i] == b'\\' {
            return Header::Other;
        }
        i += 1;
    }
    if i == b.len() {
        return Header::NeedMore;
    }
    let name = body[start..i].to_string();
    i += 1;
    for l in [",", "\"arguments\"", ":"] {
        match lit(&mut i, l) {
            Some(true) => {}
            Some(false) => return Header::NeedMore,
            None => return Header::Other,
        }
    }
    ws(&mut i);
    match b.get(i) {
        None => Header::NeedMore,
        Some(b'{') => Header::Streams { name, args_at: i },
        Some(_) => Header::Other,
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
                (Some(Parsed::Args(a)), Parsed::Args(b)) => a.push_str(&b),
                (_, x) => merged.push(x),
            }
        }
        merged
    }

    fn streamed(name: &str, args: &str) -> [Parsed; 3] {
        [
            Parsed::Start { name: name.into() },
            Parsed::Args(args.into()),
            Parsed::End,
        ]
    }

    #[test]
    fn text_then_two_calls_in_any_chunking() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
        for n in [1, 2, 3, 7, 1000] {
            assert_eq!(
                feed(text, n),
                [
                    vec![Parsed::Text("Let me check.\n".into())],
                    streamed("get_weather", "{\"city\": \"Paris\"}").to_vec(),
                    streamed("now", "{}").to_vec(),
                ]
                .concat(),
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
            streamed("f", "{\"x\": 1}").to_vec()
        );
        let mut p = CallParser::for_tools(vec!["f".into()], forced);
        let mut out = p.push("oops, no JSON");
        out.extend(p.finish());
        assert_eq!(out, vec![Parsed::Text("oops, no JSON".into())]);
    }

    #[test]
    fn arguments_stream_before_the_envelope_closes() {
        let mut p = CallParser::for_tools(vec!["f".into()], "");
        assert_eq!(p.push("<tool_call>{\"name\": \"f\", \"argu"), vec![]);
        assert_eq!(
            p.push("ments\": {\"q\": \"a}b"),
            vec![
                Parsed::Start { name: "f".into() },
                Parsed::Args("{\"q\": \"a}b".into())
            ]
        );
        // Braces inside strings and escaped quotes do not end the object.
        assert_eq!(
            p.push("\\\"\", \"n\": [1, {}]"),
            vec![Parsed::Args("\\\"\", \"n\": [1, {}]".into())]
        );
        assert_eq!(
            p.push("}} </tool_call> done"),
            vec![
                Parsed::Args("}".into()),
                Parsed::End,
                Parsed::Text("done".into())
            ]
        );
        // A streamed call cut short still ends.
        let mut p = CallParser::new();
        assert_eq!(
            p.push("<tool_call>{\"name\": \"g\", \"arguments\": {\"a\""),
            streamed("g", "{\"a\"")[..2].to_vec()
        );
        assert_eq!(p.finish(), vec![Parsed::End]);
        assert!(p.cut_short());
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

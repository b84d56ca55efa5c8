//! DSML, DeepSeek V4's tool-call markup: canonical rendering of tool calls,
//! a streaming parser of what the model generates, and the exact-replay map
//! that brings sampled tool-call bytes back into history unchanged.
//!
//! ```text
//! \n\n<｜DSML｜tool_calls>
//! <｜DSML｜invoke name="NAME">
//! <｜DSML｜parameter name="P" string="true">raw text</｜DSML｜parameter>
//! <｜DSML｜parameter name="Q" string="false">JSON</｜DSML｜parameter>
//! </｜DSML｜invoke>
//! </｜DSML｜tool_calls>
//! ```
//!
//! The parser is fed the answer text (after `</think>`; markup inside the
//! reasoning is not a call). It recognises a call's name as soon as its
//! `invoke` header is complete and streams the arguments as JSON text, so
//! an API can send argument deltas while the model is still writing them.

use std::collections::HashMap;

/// The block's opening tag.
pub const TOOL_CALLS_OPEN: &str = "<｜DSML｜tool_calls>";
/// The block's closing tag; generation stops right after it.
pub const TOOL_CALLS_CLOSE: &str = "</｜DSML｜tool_calls>";
const PARAM_CLOSE: &str = "</｜DSML｜parameter>";
const PARAM_CLOSE_ESCAPED: &str = "&lt;/｜DSML｜parameter>";

/// Tag prefixes accepted after `<` or `</` (the reference engine also
/// accepts a missing first bar and bare tags).
const MARKERS: [&str; 3] = ["｜DSML｜", "DSML｜", ""];

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum DsmlError {
    #[error("tool call arguments are not a JSON object: {0}")]
    BadArguments(String),
    #[error("malformed DSML tool call: expected {expected}, found {found:?}")]
    Malformed {
        expected: &'static str,
        found: String,
    },
    #[error("the DSML tool-call block ended before {0}")]
    Incomplete(&'static str),
}

pub use super::conversation::ToolCall;

// ---------------------------------------------------------------- rendering

fn escape_attr(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// JSON text without insignificant whitespace (order and escapes kept).
fn minify_json(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let (mut in_str, mut esc) = (false, false);
    for c in s.chars() {
        if in_str {
            out.push(c);
            if esc {
                esc = false;
            } else if c == '\\' {
                esc = true;
            } else if c == '"' {
                in_str = false;
            }
        } else if c == '"' {
            in_str = true;
            out.push(c);
        } else if !c.is_whitespace() {
            out.push(c);
        }
    }
    out
}

/// The members of a JSON object, in order, as (key, raw minified value).
fn object_members(args: &str) -> Result<Vec<(String, String)>, DsmlError> {
    let bad = || DsmlError::BadArguments(args.chars().take(80).collect());
    let v: serde_json::Value = serde_json::from_str(args).map_err(|_| bad())?;
    if !v.is_object() {
        return Err(bad());
    }
    let m = minify_json(args);
    let body = &m[1..m.len() - 1];
    let mut members = Vec::new();
    let (mut depth, mut in_str, mut esc, mut start) = (0i32, false, false, 0usize);
    let mut parts = Vec::new();
    for (i, c) in body.char_indices() {
        if in_str {
            if esc {
                esc = false;
            } else if c == '\\' {
                esc = true;
            } else if c == '"' {
                in_str = false;
            }
            continue;
        }
        match c {
            '"' => in_str = true,
            '{' | '[' => depth += 1,
            '}' | ']' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&body[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if !body.is_empty() {
        parts.push(&body[start..]);
    }
    for p in parts {
        // The key is a JSON string; the first ':' after it separates the value.
        let key_end = {
            let (mut esc, mut end) = (false, None);
            for (i, c) in p.char_indices().skip(1) {
                if esc {
                    esc = false;
                } else if c == '\\' {
                    esc = true;
                } else if c == '"' {
                    end = Some(i);
                    break;
                }
            }
            end.ok_or_else(bad)?
        };
        let key: String = serde_json::from_str(&p[..=key_end]).map_err(|_| bad())?;
        let value = p[key_end + 1..].strip_prefix(':').ok_or_else(bad)?;
        members.push((key, value.to_string()));
    }
    Ok(members)
}

/// The canonical DSML block for `calls` (used when no sampled bytes are
/// known), starting with the two newlines that separate it from content.
pub fn render_tool_calls(calls: &[ToolCall]) -> Result<String, DsmlError> {
    let mut s = String::from("\n\n");
    s.push_str(TOOL_CALLS_OPEN);
    s.push('\n');
    for c in calls {
        s.push_str(&format!(
            "<｜DSML｜invoke name=\"{}\">\n",
            escape_attr(&c.name)
        ));
        for (key, raw) in object_members(&c.arguments)? {
            let (is_str, value) = match serde_json::from_str::<serde_json::Value>(&raw) {
                Ok(serde_json::Value::String(v)) => {
                    (true, v.replace(PARAM_CLOSE, PARAM_CLOSE_ESCAPED))
                }
                _ => (false, raw),
            };
            s.push_str(&format!(
                "<｜DSML｜parameter name=\"{}\" string=\"{is_str}\">{value}{PARAM_CLOSE}\n",
                escape_attr(&key)
            ));
        }
        s.push_str("</｜DSML｜invoke>\n");
    }
    s.push_str(TOOL_CALLS_CLOSE);
    Ok(s)
}

// ---------------------------------------------------------------- replay

/// Tool-call id → the exact DSML bytes the model sampled for the block the
/// call was in (separator whitespace included), so that history renders
/// byte-identically to what the model produced.
#[derive(Clone, Debug, Default)]
pub struct ReplayMap {
    by_id: HashMap<String, String>,
}

impl ReplayMap {
    pub fn new() -> ReplayMap {
        ReplayMap::default()
    }

    /// Remember `raw` for every id of one block.
    pub fn insert<'a>(&mut self, ids: impl IntoIterator<Item = &'a str>, raw: &str) {
        for id in ids {
            self.by_id.insert(id.to_string(), raw.to_string());
        }
    }

    pub fn get(&self, id: &str) -> Option<&str> {
        self.by_id.get(id).map(String::as_str)
    }

    pub fn remove(&mut self, id: &str) -> Option<String> {
        self.by_id.remove(id)
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// The bytes to render for an assistant turn's calls: the sampled
    /// bytes when the first call's id is known, else the canonical form.
    pub fn render(&self, calls: &[ToolCall]) -> Result<String, DsmlError> {
        match calls.first().and_then(|c| self.get(&c.id)) {
            Some(raw) => Ok(raw.to_string()),
            None => render_tool_calls(calls),
        }
    }
}

// ---------------------------------------------------------------- parsing

/// What the streaming parser recognised in the text fed so far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DsmlEvent {
    /// Visible answer text.
    Text(String),
    /// A call's header is complete: its name is known (arguments follow).
    CallStart { index: usize, name: String },
    /// More of the call's JSON arguments text.
    ArgumentsDelta { index: usize, delta: String },
    /// The call's arguments are complete.
    CallEnd { index: usize },
    /// The block is closed: generation should stop. `raw` is the block's
    /// exact text (separator whitespace included) for [`ReplayMap`].
    Done { raw: String },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Text,
    Block,
    Invoke,
    Param { string: bool },
    Done,
}

/// Incremental DSML parser over streamed answer text.
#[derive(Debug)]
pub struct DsmlStreamParser {
    state: State,
    /// Unconsumed input.
    buf: String,
    /// Whitespace held back at the end of the text (maybe the block's separator).
    pending_ws: String,
    /// The block's text so far.
    raw: String,
    calls: usize,
    params_in_call: usize,
}

impl Default for DsmlStreamParser {
    fn default() -> Self {
        DsmlStreamParser::new()
    }
}

/// Whether `s` is a proper prefix of one of `tags`.
fn is_partial(s: &str, tags: &[String]) -> bool {
    tags.iter().any(|t| t.len() > s.len() && t.starts_with(s))
}

fn tag_variants(slash: bool, name: &str) -> Vec<String> {
    MARKERS
        .iter()
        .map(|m| format!("<{}{m}{name}", if slash { "/" } else { "" }))
        .collect()
}

/// Decode the entities the reference parser accepts in parameter text.
fn decode_entities(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}

/// A JSON string body (no quotes) for `s`.
fn json_str_body(s: &str) -> String {
    let q = serde_json::to_string(s).expect("strings serialize");
    q[1..q.len() - 1].to_string()
}

impl DsmlStreamParser {
    pub fn new() -> DsmlStreamParser {
        DsmlStreamParser {
            state: State::Text,
            buf: String::new(),
            pending_ws: String::new(),
            raw: String::new(),
            calls: 0,
            params_in_call: 0,
        }
    }

    /// Whether the block has closed (the stop condition).
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Feed more generated text.
    pub fn push(&mut self, text: &str) -> Result<Vec<DsmlEvent>, DsmlError> {
        if self.state == State::Done {
            return Ok(Vec::new());
        }
        self.buf.push_str(text);
        let mut ev = Vec::new();
        while self.step(&mut ev)? {}
        Ok(ev)
    }

    /// End of generation: flush held-back text; an open block is an error.
    pub fn finish(&mut self) -> Result<Vec<DsmlEvent>, DsmlError> {
        match self.state {
            State::Text => {
                let mut t = std::mem::take(&mut self.pending_ws);
                t.push_str(&std::mem::take(&mut self.buf));
                Ok(if t.is_empty() {
                    Vec::new()
                } else {
                    vec![DsmlEvent::Text(t)]
                })
            }
            State::Done => Ok(Vec::new()),
            _ => Err(DsmlError::Incomplete("the closing tool_calls tag")),
        }
    }

    fn consume(&mut self, n: usize) -> String {
        let s: String = self.buf.drain(..n).collect();
        self.raw.push_str(&s);
        s
    }

    /// One parsing step; `false` when more input is needed.
    fn step(&mut self, ev: &mut Vec<DsmlEvent>) -> Result<bool, DsmlError> {
        match self.state {
            State::Done => Ok(false),
            State::Text => Ok(self.step_text(ev)),
            State::Block | State::Invoke => self.step_tags(ev),
            State::Param { string } => Ok(self.step_param(string, ev)),
        }
    }

    fn step_text(&mut self, ev: &mut Vec<DsmlEvent>) -> bool {
        let opens = tag_variants(false, "tool_calls>");
        let found = opens
            .iter()
            .filter_map(|t| self.buf.find(t.as_str()).map(|i| (i, t.len())))
            .min();
        if let Some((i, len)) = found {
            let before: String = self.buf.drain(..i).collect();
            let mut text = std::mem::take(&mut self.pending_ws);
            text.push_str(&before);
            let body = text.trim_end_matches(char::is_whitespace);
            let sep = text[body.len()..].to_string();
            if !body.is_empty() {
                ev.push(DsmlEvent::Text(body.to_string()));
            }
            self.raw = sep;
            self.consume(len);
            self.state = State::Block;
            return true;
        }
        // Hold back a possible partial opening tag and trailing whitespace.
        let mut keep = self.buf.len();
        if let Some(lt) = self.buf.rfind('<') {
            if is_partial(&self.buf[lt..], &opens) {
                keep = lt;
            }
        }
        let head = &self.buf[..keep];
        let body_len = head.trim_end_matches(char::is_whitespace).len();
        if body_len > 0 {
            let mut text = std::mem::take(&mut self.pending_ws);
            text.push_str(&head[..body_len]);
            ev.push(DsmlEvent::Text(text));
        }
        let ws = head[body_len..].to_string();
        self.pending_ws.push_str(&ws);
        self.buf.drain(..keep);
        false
    }

    /// Between tags inside the block: whitespace, then a complete tag.
    fn step_tags(&mut self, ev: &mut Vec<DsmlEvent>) -> Result<bool, DsmlError> {
        let ws = self.buf.len() - self.buf.trim_start().len();
        self.consume(ws);
        let Some(end) = self.buf.find('>') else {
            return Ok(false);
        };
        let tag = self.buf[..=end].to_string();
        let strip = |t: &str, slash: bool| -> Option<String> {
            let t = t.strip_prefix(if slash { "</" } else { "<" })?;
            MARKERS
                .iter()
                .find_map(|m| t.strip_prefix(m).map(str::to_string))
        };
        let attr = |t: &str, key: &str| -> Option<String> {
            let start = t.find(&format!("{key}=\""))? + key.len() + 2;
            let len = t[start..].find('"')?;
            Some(decode_entities(&t[start..start + len]))
        };
        match self.state {
            State::Block => {
                if let Some(rest) = strip(&tag, false).filter(|r| r.starts_with("invoke ")) {
                    let name = attr(&rest, "name").ok_or(DsmlError::Malformed {
                        expected: "invoke name=\"…\"",
                        found: tag.clone(),
                    })?;
                    self.consume(tag.len());
                    ev.push(DsmlEvent::CallStart {
                        index: self.calls,
                        name,
                    });
                    ev.push(DsmlEvent::ArgumentsDelta {
                        index: self.calls,
                        delta: "{".into(),
                    });
                    self.params_in_call = 0;
                    self.state = State::Invoke;
                } else if strip(&tag, true).as_deref() == Some("tool_calls>") {
                    self.consume(tag.len());
                    self.state = State::Done;
                    ev.push(DsmlEvent::Done {
                        raw: std::mem::take(&mut self.raw),
                    });
                    return Ok(false);
                } else {
                    return Err(DsmlError::Malformed {
                        expected: "an invoke tag or the closing tool_calls tag",
                        found: tag,
                    });
                }
            }
            State::Invoke => {
                if let Some(rest) = strip(&tag, false).filter(|r| r.starts_with("parameter ")) {
                    let bad = || DsmlError::Malformed {
                        expected: "parameter name=\"…\" string=\"true|false\"",
                        found: tag.clone(),
                    };
                    let name = attr(&rest, "name").ok_or_else(bad)?;
                    let string = match attr(&rest, "string").as_deref() {
                        Some("true") => true,
                        Some("false") => false,
                        _ => return Err(bad()),
                    };
                    self.consume(tag.len());
                    let mut delta = String::new();
                    if self.params_in_call > 0 {
                        delta.push(',');
                    }
                    delta.push_str(&serde_json::to_string(&name).expect("strings serialize"));
                    delta.push(':');
                    if string {
                        delta.push('"');
                    }
                    self.params_in_call += 1;
                    ev.push(DsmlEvent::ArgumentsDelta {
                        index: self.calls,
                        delta,
                    });
                    self.state = State::Param { string };
                } else if strip(&tag, true).as_deref() == Some("invoke>") {
                    self.consume(tag.len());
                    ev.push(DsmlEvent::ArgumentsDelta {
                        index: self.calls,
                        delta: "}".into(),
                    });
                    ev.push(DsmlEvent::CallEnd { index: self.calls });
                    self.calls += 1;
                    self.state = State::Block;
                } else {
                    return Err(DsmlError::Malformed {
                        expected: "a parameter tag or the closing invoke tag",
                        found: tag,
                    });
                }
            }
            _ => unreachable!("step_tags runs between tags"),
        }
        Ok(true)
    }

    fn step_param(&mut self, string: bool, ev: &mut Vec<DsmlEvent>) -> bool {
        let closes = tag_variants(true, "parameter>");
        let found = closes
            .iter()
            .filter_map(|t| self.buf.find(t.as_str()).map(|i| (i, t.len())))
            .min();
        let (value_len, close_len) = match found {
            Some((i, len)) => (i, Some(len)),
            None => {
                // Hold back a partial closing tag or a partial entity.
                let mut keep = self.buf.len();
                if let Some(lt) = self.buf.rfind('<') {
                    if is_partial(&self.buf[lt..], &closes) {
                        keep = lt;
                    }
                }
                if let Some(amp) = self.buf[..keep].rfind('&') {
                    if !self.buf[amp..keep].contains(';') && keep - amp < 24 {
                        keep = amp;
                    }
                }
                (keep, None)
            }
        };
        let value = self.consume(value_len);
        let delta = if string {
            json_str_body(&decode_entities(&value))
        } else {
            value.trim().to_string()
        };
        let mut deltas = Vec::new();
        if !delta.is_empty() {
            deltas.push(delta);
        }
        if let Some(len) = close_len {
            self.consume(len);
            if string {
                deltas.push("\"".into());
            }
            self.state = State::Invoke;
        }
        for d in deltas {
            ev.push(DsmlEvent::ArgumentsDelta {
                index: self.calls,
                delta: d,
            });
        }
        close_len.is_some()
    }
}

/// A complete answer split into its parts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ParsedAnswer {
    /// Visible text before the tool-call block.
    pub content: String,
    /// Each call's name and JSON arguments.
    pub calls: Vec<(String, String)>,
    /// The block's exact text, for [`ReplayMap`].
    pub raw: Option<String>,
}

/// Parse a complete answer (non-streaming responses).
pub fn parse_complete(text: &str) -> Result<ParsedAnswer, DsmlError> {
    let mut p = DsmlStreamParser::new();
    let mut ev = p.push(text)?;
    ev.extend(p.finish()?);
    let mut out = ParsedAnswer::default();
    for e in ev {
        match e {
            DsmlEvent::Text(t) => out.content.push_str(&t),
            DsmlEvent::CallStart { name, .. } => out.calls.push((name, String::new())),
            DsmlEvent::ArgumentsDelta { index, delta } => out.calls[index].1.push_str(&delta),
            DsmlEvent::CallEnd { .. } => {}
            DsmlEvent::Done { raw } => out.raw = Some(raw),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BLOCK: &str = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" string=\"true\">Rome</｜DSML｜parameter>\n<｜DSML｜parameter name=\"days\" string=\"false\">1</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";

    #[test]
    fn canonical_rendering() {
        let call = ToolCall {
            id: "call_1".into(),
            name: "get_weather".into(),
            arguments: r#"{"city": "Rome", "days": 1}"#.into(),
        };
        assert_eq!(render_tool_calls(&[call]).unwrap(), BLOCK);
    }

    #[test]
    fn string_values_escape_only_the_closing_tag() {
        let call = ToolCall {
            id: "c".into(),
            name: "sh".into(),
            arguments: r#"{"cmd":"a && b > c </｜DSML｜parameter>","opts":{"z":1, "a":[1, 2]}}"#
                .into(),
        };
        let s = render_tool_calls(&[call]).unwrap();
        assert!(
            s.contains(">a && b > c &lt;/｜DSML｜parameter></｜DSML｜parameter>"),
            "{s}"
        );
        assert!(s.contains("string=\"false\">{\"z\":1,\"a\":[1,2]}<"), "{s}");
        let calls = parse_complete(&s).unwrap().calls;
        let v: serde_json::Value = serde_json::from_str(&calls[0].1).unwrap();
        assert_eq!(v["cmd"], "a && b > c </｜DSML｜parameter>");
        assert_eq!(v["opts"]["a"][1], 2);
    }

    #[test]
    fn streaming_byte_by_byte_recognises_the_header_early() {
        let text = format!("Checking.{BLOCK}ignored");
        let mut p = DsmlStreamParser::new();
        let mut events = Vec::new();
        let mut header_at = None;
        let mut args_done_at = None;
        for (i, c) in text.char_indices() {
            for e in p.push(&c.to_string()).unwrap() {
                if matches!(e, DsmlEvent::CallStart { .. }) {
                    header_at = Some(i);
                }
                if matches!(e, DsmlEvent::CallEnd { .. }) {
                    args_done_at = Some(i);
                }
                events.push(e);
            }
        }
        assert!(p.is_done());
        assert!(header_at.unwrap() < args_done_at.unwrap());
        let mut content = String::new();
        let mut args = String::new();
        let mut raw = None;
        for e in events {
            match e {
                DsmlEvent::Text(t) => content.push_str(&t),
                DsmlEvent::ArgumentsDelta { delta, .. } => args.push_str(&delta),
                DsmlEvent::CallStart { name, .. } => assert_eq!(name, "get_weather"),
                DsmlEvent::Done { raw: r } => raw = Some(r),
                DsmlEvent::CallEnd { .. } => {}
            }
        }
        assert_eq!(content, "Checking.");
        assert_eq!(args, r#"{"city":"Rome","days":1}"#);
        assert_eq!(raw.unwrap(), BLOCK);
    }

    #[test]
    fn plain_text_passes_through() {
        let p = parse_complete("Just <b>text</b> \n\n").unwrap();
        assert_eq!(p.content, "Just <b>text</b> \n\n");
        assert!(p.calls.is_empty() && p.raw.is_none());
    }

    #[test]
    fn variants_and_entities_are_accepted() {
        let t = "<DSML｜tool_calls><DSML｜invoke name=\"f\"><DSML｜parameter name=\"x\" string=\"true\">a &amp; b</DSML｜parameter></DSML｜invoke></DSML｜tool_calls>";
        let calls = parse_complete(t).unwrap().calls;
        assert_eq!(
            calls,
            vec![("f".to_string(), r#"{"x":"a & b"}"#.to_string())]
        );
    }

    #[test]
    fn malformed_and_unfinished_blocks_are_errors() {
        assert!(parse_complete("<｜DSML｜tool_calls><｜DSML｜oops>").is_err());
        assert_eq!(
            parse_complete("<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">"),
            Err(DsmlError::Incomplete("the closing tool_calls tag"))
        );
    }

    #[test]
    fn replay_returns_sampled_bytes() {
        let sampled = BLOCK.replace("days\" string=\"false\">1", "days\" string=\"false\"> 1 ");
        let mut m = ReplayMap::new();
        m.insert(["call_1"], &sampled);
        let call = ToolCall {
            id: "call_1".into(),
            name: "get_weather".into(),
            arguments: r#"{"city":"Rome","days":1}"#.into(),
        };
        assert_eq!(m.render(std::slice::from_ref(&call)).unwrap(), sampled);
        let other = ToolCall {
            id: "call_2".into(),
            ..call
        };
        assert_eq!(m.render(&[other]).unwrap(), BLOCK);
    }
}

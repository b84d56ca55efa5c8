//! Each family's tool-call syntax as a grammar (llguidance's Lark
//! dialect), for answers whose calls must hold: a call the request forces
//! (`tool_choice` required or named) and the arguments of tools marked
//! strict, which must match their JSON Schema.
//!
//! - The generic envelope (llama, qwen2): `<tool_call>\n{"name": ...,
//!   "arguments": {...}}\n</tool_call>`, the JSON of each call held to an
//!   `anyOf` of the offered tools (a forced call continues the envelope the
//!   prompt opened).
//! - DSML (DeepSeek V4): a `<｜DSML｜tool_calls>` block of invokes whose
//!   parameters are those of the tool's schema, in its order, required ones
//!   present; a string parameter is raw text (one of its `enum` values when
//!   it has them), any other is JSON held to its schema.
//!
//! Content that is not a call is free text that does not open a call, or
//! the grammar the caller names (a JSON answer format). Reasoning before
//! the answer is the caller's to leave free.

use serde_json::{json, Value};

use super::conversation::{ToolChoice, ToolSpec};
use super::dsml::{TOOL_CALLS_CLOSE, TOOL_CALLS_OPEN};
use super::envelope::{CALL_CLOSE, CALL_OPEN};
use super::tool_stream::ToolProtocol;

/// The calls an answer may make, in a family's syntax.
#[derive(Clone, Debug, PartialEq)]
pub struct CallGrammar {
    pub protocol: ToolProtocol,
    /// The tools that may be called: name and, for strict tools, the
    /// schema their arguments must match.
    pub tools: Vec<(String, Option<Value>)>,
    /// Whether the answer must be calls (and of which tool).
    pub choice: ToolChoice,
    /// At most one call.
    pub single: bool,
}

impl CallGrammar {
    /// The grammar for `offered` tools under `choice`, when the calls must
    /// hold: a forced call, a strict tool, or `single` (at most one call);
    /// `None` otherwise.
    pub fn new<'a>(
        protocol: ToolProtocol,
        offered: impl Iterator<Item = &'a ToolSpec>,
        choice: &ToolChoice,
        single: bool,
    ) -> Option<CallGrammar> {
        let tools: Vec<(String, Option<Value>)> = offered
            .map(|t| (t.name.clone(), t.strict.then(|| t.parameters.clone())))
            .collect();
        let forced = matches!(choice, ToolChoice::Required | ToolChoice::Named(_));
        let strict = tools.iter().any(|(_, s)| s.is_some());
        (!tools.is_empty() && (forced || strict || single)).then(|| CallGrammar {
            protocol,
            tools,
            choice: choice.clone(),
            single,
        })
    }

    /// Whether the answer must be calls.
    pub fn forced(&self) -> bool {
        matches!(self.choice, ToolChoice::Required | ToolChoice::Named(_))
    }

    /// The Lark grammar of the answer. `content` is the expression for an
    /// answer that is not a call (e.g. `@content`, a grammar the caller
    /// adds); `None`: free text that does not open a call.
    pub fn lark(&self, content: Option<&str>) -> String {
        match self.protocol {
            ToolProtocol::Envelope => self.envelope(content),
            ToolProtocol::Dsml => self.dsml(content),
        }
    }

    fn envelope(&self, content: Option<&str>) -> String {
        let mut g = String::new();
        let close = lit(&format!("\n{CALL_CLOSE}"));
        let open = lit(&format!("{CALL_OPEN}\n"));
        // Calls may follow calls, unless the answer holds one.
        let more = if self.single { "" } else { " more" };
        match &self.choice {
            // The prompt opened the envelope and wrote the name: the
            // arguments, then the envelope's end (one call).
            ToolChoice::Named(n) => {
                let schema = self.schema_of(n);
                g.push_str(&format!(
                    "start: args \"}}\" {close}\nargs: %json {schema}\n"
                ));
            }
            // The prompt opened the envelope.
            ToolChoice::Required => g.push_str(&format!("start: call {close}{more}\n")),
            ToolChoice::Auto | ToolChoice::None => {
                let text = content.map_or_else(|| "TEXT".to_string(), str::to_string);
                g.push_str(&format!("start: {text} | TEXT {open} call {close}{more}\n"));
                g.push_str(&free_text("TEXT", CALL_OPEN));
            }
        }
        if !more.is_empty() && !matches!(self.choice, ToolChoice::Named(_)) {
            g.push_str(&format!("more: (/[ \\n]*/ {open} call {close})*\n"));
        }
        let calls: Vec<Value> = self
            .tools
            .iter()
            .map(|(name, schema)| {
                json!({
                    "type": "object",
                    "properties": {
                        "name": {"const": name},
                        "arguments": schema.clone().unwrap_or_else(any_object),
                    },
                    "required": ["name", "arguments"],
                    "additionalProperties": false,
                })
            })
            .collect();
        g.push_str(&format!("call: %json {}\n", json!({ "anyOf": calls })));
        g
    }

    fn dsml(&self, content: Option<&str>) -> String {
        let mut g = String::new();
        // A named tool is called once, and so is any under `single`;
        // otherwise calls may follow calls.
        let repeat = if self.single || matches!(self.choice, ToolChoice::Named(_)) {
            ""
        } else {
            "+"
        };
        let block = format!(
            "block: {} invoke{repeat} {}\n",
            lit(&format!("{TOOL_CALLS_OPEN}\n")),
            lit(TOOL_CALLS_CLOSE)
        );
        if self.forced() {
            g.push_str("start: \"\\n\\n\"? block\n");
        } else {
            let text = content.map_or_else(|| "TEXT".to_string(), str::to_string);
            g.push_str(&format!("start: {text} | TEXT block\n"));
            g.push_str(&free_text("TEXT", TOOL_CALLS_OPEN));
        }
        g.push_str(&block);
        let callable: Vec<usize> = (0..self.tools.len())
            .filter(|&i| match &self.choice {
                ToolChoice::Named(n) => &self.tools[i].0 == n,
                _ => true,
            })
            .collect();
        let invokes: Vec<String> = callable.iter().map(|i| format!("invoke_{i}")).collect();
        g.push_str(&format!("invoke: {}\n", invokes.join(" | ")));
        for &i in &callable {
            let (name, schema) = &self.tools[i];
            let head = lit(&format!("<｜DSML｜invoke name=\"{}\">\n", attr(name)));
            let tail = lit("</｜DSML｜invoke>\n");
            let params = match schema {
                Some(s) => self.dsml_params(&mut g, i, s),
                None => "any_param*".to_string(),
            };
            g.push_str(&format!("invoke_{i}: {head} {params} {tail}\n"));
        }
        g.push_str(&format!(
            "any_param: \"<｜DSML｜parameter name=\\\"\" /[^\"]+/ \"\\\" string=\\\"\" (\"true\" | \"false\") \"\\\">\" PARAM_VALUE {}\n",
            lit(PARAM_CLOSE_NL)
        ));
        g.push_str(&free_text("PARAM_VALUE", PARAM_CLOSE));
        g
    }

    /// The rules of tool `i`'s parameters (strict: from its schema); the
    /// expression for them in order.
    fn dsml_params(&self, g: &mut String, i: usize, schema: &Value) -> String {
        let Some(props) = schema.get("properties").and_then(Value::as_object) else {
            return "any_param*".to_string();
        };
        let required: Vec<&str> = schema
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut seq = Vec::new();
        for (j, (key, prop)) in props.iter().enumerate() {
            let rule = format!("p_{i}_{j}");
            let is_string = prop.get("type").and_then(Value::as_str) == Some("string");
            let open = lit(&format!(
                "<｜DSML｜parameter name=\"{}\" string=\"{is_string}\">",
                attr(key)
            ));
            let value = if is_string {
                match prop.get("enum").and_then(Value::as_array) {
                    Some(vals) if vals.iter().all(Value::is_string) => {
                        let alts: Vec<String> =
                            vals.iter().filter_map(Value::as_str).map(lit).collect();
                        format!("({})", alts.join(" | "))
                    }
                    _ => "PARAM_VALUE".to_string(),
                }
            } else {
                g.push_str(&format!("{rule}_json: %json {prop}\n"));
                format!("{rule}_json")
            };
            g.push_str(&format!("{rule}: {open} {value} {}\n", lit(PARAM_CLOSE_NL)));
            seq.push(if required.contains(&key.as_str()) {
                rule
            } else {
                format!("{rule}?")
            });
        }
        seq.join(" ")
    }

    /// The schema a named tool's arguments must match (any object when it
    /// is not strict).
    fn schema_of(&self, name: &str) -> Value {
        self.tools
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, s)| s.clone())
            .unwrap_or_else(any_object)
    }
}

const PARAM_CLOSE: &str = "</｜DSML｜parameter>";
const PARAM_CLOSE_NL: &str = "</｜DSML｜parameter>\n";

fn any_object() -> Value {
    json!({"type": "object"})
}

/// A Lark string literal.
fn lit(s: &str) -> String {
    serde_json::to_string(s).expect("strings serialize")
}

/// A DSML attribute value as the renderer escapes it.
fn attr(s: &str) -> String {
    s.replace('&', "&amp;").replace('"', "&quot;")
}

/// A terminal `name`: any text that does not contain `stop`.
fn free_text(name: &str, stop: &str) -> String {
    let any = "/(.|\\n)*/";
    format!("{name}: {any} & ~({any} {} {any})\n", lit(stop))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str, strict: bool) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: None,
            parameters: json!({
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                               "unit": {"type": "string", "enum": ["c", "f"]}},
                "required": ["city"]
            }),
            raw: None,
            strict,
        }
    }

    #[test]
    fn only_forced_calls_and_strict_tools_need_a_grammar() {
        let loose = [tool("a", false)];
        let p = ToolProtocol::Envelope;
        assert!(CallGrammar::new(p, loose.iter(), &ToolChoice::Auto, false).is_none());
        assert!(CallGrammar::new(p, loose.iter(), &ToolChoice::Required, false).is_some());
        let strict = [tool("a", true)];
        let g = CallGrammar::new(p, strict.iter(), &ToolChoice::Auto, false).unwrap();
        assert!(!g.forced());
        assert_eq!(g.tools[0].1.as_ref().unwrap()["required"][0], "city");
    }

    #[test]
    fn a_single_call_has_no_repetition() {
        let loose = [tool("a", false)];
        for p in [ToolProtocol::Envelope, ToolProtocol::Dsml] {
            // Single alone asks for a grammar, even of loose tools.
            let g = CallGrammar::new(p, loose.iter(), &ToolChoice::Auto, true).unwrap();
            let one = g.lark(None);
            assert!(!one.contains("more") && !one.contains("invoke+"), "{one}");
            let many = CallGrammar::new(p, loose.iter(), &ToolChoice::Required, false)
                .unwrap()
                .lark(None);
            assert!(many.contains("more") || many.contains("invoke+"), "{many}");
        }
    }

    #[test]
    fn the_grammars_name_each_syntax() {
        let tools = [tool("get_weather", true), tool("loose", false)];
        let env = CallGrammar::new(
            ToolProtocol::Envelope,
            tools.iter(),
            &ToolChoice::Auto,
            false,
        )
        .unwrap()
        .lark(None);
        assert!(env.contains("\"<tool_call>\\n\""), "{env}");
        assert!(env.contains("\"const\":\"get_weather\""), "{env}");
        assert!(env.contains("TEXT: /(.|\\n)*/ & ~("), "{env}");
        let named = CallGrammar::new(
            ToolProtocol::Envelope,
            tools.iter(),
            &ToolChoice::Named("get_weather".into()),
            false,
        )
        .unwrap()
        .lark(None);
        assert!(named.starts_with("start: args \"}\""), "{named}");
        assert!(!named.contains("more"), "{named}");
        let dsml = CallGrammar::new(
            ToolProtocol::Dsml,
            tools.iter(),
            &ToolChoice::Required,
            false,
        )
        .unwrap()
        .lark(None);
        assert!(dsml.starts_with("start: \"\\n\\n\"? block"), "{dsml}");
        // city is required, days and unit optional; unit is one of its enum.
        assert!(
            dsml.contains(
                "invoke_0: \"<｜DSML｜invoke name=\\\"get_weather\\\">\\n\" p_0_0 p_0_1? p_0_2?"
            ),
            "{dsml}"
        );
        assert!(
            dsml.contains("string=\\\"true\\\">\" (\"c\" | \"f\")"),
            "{dsml}"
        );
        assert!(
            dsml.contains("p_0_1_json: %json {\"type\":\"integer\"}"),
            "{dsml}"
        );
        assert!(
            dsml.contains("invoke_1: \"<｜DSML｜invoke name=\\\"loose\\\">\\n\" any_param*"),
            "{dsml}"
        );
    }
}

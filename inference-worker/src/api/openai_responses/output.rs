//! Response objects, their output items, and the stream of events that
//! builds them (`response.created` … `response.completed`).

use serde::{Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::Value;

use super::ReasoningConfig;
use crate::api::run::{self, Delta, Finish, Frame, Shape, TimingsOut};
use crate::api::ApiError;
use crate::generate::FinishReason;
use ds4_model::chat::{new_call_id, ToolCall, ToolChoice};

/// A collected answer's output items: reasoning, message, function calls.
pub(super) fn output_items(c: run::Collected) -> Vec<Item> {
    let mut output = Vec::new();
    if !c.reasoning.is_empty() {
        output.push(Item::reasoning(new_call_id("rs_"), c.reasoning));
    }
    if !c.text.is_empty() || c.calls.is_empty() {
        output.push(Item::message(new_call_id("msg_"), c.text, "completed"));
    }
    output.extend(c.calls.into_iter().map(Item::call));
    output
}

/// Request settings echoed in every response object.
pub(super) struct Meta {
    pub id: String,
    pub created_at: u64,
    pub model: String,
    pub instructions: Option<String>,
    /// The request's tools as the client sent them.
    pub tools: Vec<Box<RawValue>>,
    pub tool_choice: ToolChoiceOut,
    pub temperature: f32,
    pub top_p: f32,
    pub max_output_tokens: Option<u32>,
    pub reasoning: ReasoningConfig,
    /// The request's `metadata`, unread.
    pub metadata: Value,
}

impl Meta {
    fn object(&self, status: &'static str, output: Vec<Item>) -> ResponseObject<'_> {
        ResponseObject {
            id: &self.id,
            object: "response",
            created_at: self.created_at,
            status,
            model: &self.model,
            output,
            instructions: self.instructions.as_deref(),
            tools: &self.tools,
            tool_choice: &self.tool_choice,
            parallel_tool_calls: true,
            temperature: self.temperature,
            top_p: self.top_p,
            max_output_tokens: self.max_output_tokens,
            previous_response_id: None,
            reasoning: &self.reasoning,
            store: false,
            text: TextOut {
                format: Format { kind: "text" },
            },
            truncation: "disabled",
            metadata: &self.metadata,
            incomplete_details: None,
            error: None,
            usage: None,
            timings: None,
        }
    }

    pub(super) fn response(&self, f: &Finish, output: Vec<Item>) -> ResponseObject<'_> {
        let incomplete = f.reason != FinishReason::Stop && f.reason != FinishReason::Cancelled;
        let mut r = self.object(
            if incomplete {
                "incomplete"
            } else {
                "completed"
            },
            output,
        );
        r.incomplete_details = incomplete.then_some(IncompleteDetails {
            reason: if f.reason == FinishReason::Length {
                "max_output_tokens"
            } else {
                // The answer's grammar could not go on (logged).
                "grammar_error"
            },
        });
        r.usage = Some(Usage {
            input_tokens: f.prompt_tokens(),
            input_tokens_details: InputDetails {
                cached_tokens: f.timings.cached_tokens,
            },
            output_tokens: f.completion_tokens(),
            output_tokens_details: OutputDetails {
                reasoning_tokens: 0,
            },
            total_tokens: f.prompt_tokens() + f.completion_tokens(),
        });
        r.timings = Some(f.timings_out());
        r
    }
}

#[derive(Serialize)]
pub(super) struct ResponseObject<'a> {
    id: &'a str,
    object: &'static str,
    created_at: u64,
    status: &'static str,
    model: &'a str,
    output: Vec<Item>,
    instructions: Option<&'a str>,
    tools: &'a [Box<RawValue>],
    tool_choice: &'a ToolChoiceOut,
    parallel_tool_calls: bool,
    temperature: f32,
    top_p: f32,
    max_output_tokens: Option<u32>,
    previous_response_id: Option<&'a str>,
    reasoning: &'a ReasoningConfig,
    store: bool,
    text: TextOut,
    truncation: &'static str,
    metadata: &'a Value,
    incomplete_details: Option<IncompleteDetails>,
    error: Option<ResponseError>,
    usage: Option<Usage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    timings: Option<TimingsOut>,
}

/// The tool choice a response reports: a mode, or the function named.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub(super) enum ToolChoiceOut {
    Mode(&'static str),
    Function {
        #[serde(rename = "type")]
        kind: &'static str,
        name: String,
    },
}

impl From<&ToolChoice> for ToolChoiceOut {
    fn from(c: &ToolChoice) -> ToolChoiceOut {
        match c {
            ToolChoice::Auto => ToolChoiceOut::Mode("auto"),
            ToolChoice::None => ToolChoiceOut::Mode("none"),
            ToolChoice::Required => ToolChoiceOut::Mode("required"),
            ToolChoice::Named(name) => ToolChoiceOut::Function {
                kind: "function",
                name: name.clone(),
            },
        }
    }
}

/// `text`: the output is plain text.
#[derive(Serialize)]
struct TextOut {
    format: Format,
}

#[derive(Serialize)]
struct Format {
    #[serde(rename = "type")]
    kind: &'static str,
}

#[derive(Serialize)]
struct IncompleteDetails {
    reason: &'static str,
}

#[derive(Serialize)]
struct ResponseError {
    code: &'static str,
    message: String,
}

#[derive(Serialize)]
struct Usage {
    input_tokens: usize,
    input_tokens_details: InputDetails,
    output_tokens: usize,
    output_tokens_details: OutputDetails,
    total_tokens: usize,
}

#[derive(Serialize)]
struct InputDetails {
    cached_tokens: usize,
}

#[derive(Serialize)]
struct OutputDetails {
    reasoning_tokens: usize,
}

#[derive(Clone, Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(super) enum Item {
    Message {
        id: String,
        status: &'static str,
        role: &'static str,
        content: Vec<Part>,
    },
    FunctionCall {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
        status: &'static str,
    },
    Reasoning {
        id: String,
        summary: Vec<Part>,
        content: Vec<Part>,
    },
}

#[derive(Clone, Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(super) enum Part {
    OutputText {
        text: String,
        annotations: NoEntries,
        logprobs: NoEntries,
    },
    ReasoningText {
        text: String,
    },
}

/// A list this server leaves empty (a text's annotations and
/// log-probabilities).
#[derive(Clone, Copy, Debug)]
pub(super) struct NoEntries;

impl Serialize for NoEntries {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(std::iter::empty::<()>())
    }
}

impl Part {
    fn output_text(text: String) -> Part {
        Part::OutputText {
            text,
            annotations: NoEntries,
            logprobs: NoEntries,
        }
    }
}

impl Item {
    fn message(id: String, text: String, status: &'static str) -> Item {
        Item::Message {
            id,
            status,
            role: "assistant",
            content: vec![Part::output_text(text)],
        }
    }

    fn reasoning(id: String, text: String) -> Item {
        Item::Reasoning {
            id,
            summary: Vec::new(),
            content: vec![Part::ReasoningText { text }],
        }
    }

    fn call(c: ToolCall) -> Item {
        Item::FunctionCall {
            id: new_call_id("fc_"),
            call_id: c.id,
            name: c.name,
            arguments: c.arguments,
            status: "completed",
        }
    }
}

/// `response.created`, `.in_progress`, `.completed`, `.incomplete`,
/// `.failed`.
#[derive(Serialize)]
struct ResponseEvent<'a> {
    response: ResponseObject<'a>,
}

/// `response.output_item.added` and `.done`.
#[derive(Serialize)]
struct ItemEvent<'a> {
    output_index: usize,
    item: &'a Item,
}

/// `response.content_part.added` and `.done`.
#[derive(Serialize)]
struct PartEvent<'a> {
    item_id: &'a str,
    output_index: usize,
    content_index: usize,
    part: &'a Part,
}

/// `response.output_text.delta` and `response.reasoning_text.delta`
/// (`delta`), their `.done` (`text`).
#[derive(Serialize)]
struct TextEvent<'a> {
    item_id: &'a str,
    output_index: usize,
    content_index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    delta: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<&'a str>,
    /// Output text only.
    #[serde(skip_serializing_if = "Option::is_none")]
    logprobs: Option<NoEntries>,
}

/// `response.function_call_arguments.delta` (`delta`) and `.done` (`name`
/// and `arguments`).
#[derive(Serialize)]
struct ArgumentsEvent<'a> {
    item_id: &'a str,
    output_index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    delta: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    arguments: Option<&'a str>,
}

/// The item being streamed.
enum Open {
    Message {
        id: String,
        text: String,
    },
    Reasoning {
        id: String,
        text: String,
    },
    Call {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
    },
}

/// The numbering of a stream's events.
#[derive(Default)]
struct Sequence(u64);

impl Sequence {
    /// Event `kind` with `data`, `type` and the next `sequence_number`.
    fn ev(&mut self, kind: &'static str, data: impl Serialize) -> Frame {
        #[derive(Serialize)]
        struct Numbered<T> {
            sequence_number: u64,
            #[serde(flatten)]
            data: T,
        }
        let n = self.0;
        self.0 += 1;
        run::typed_event(
            kind,
            &Numbered {
                sequence_number: n,
                data,
            },
        )
    }
}

pub(super) struct ResponsesStream {
    meta: Meta,
    seq: Sequence,
    /// Finished items, in order.
    output: Vec<Item>,
    open: Option<Open>,
}

impl ResponsesStream {
    pub(super) fn new(meta: Meta) -> ResponsesStream {
        ResponsesStream {
            meta,
            seq: Sequence::default(),
            output: Vec::new(),
            open: None,
        }
    }

    /// `response.output_item.added` or `.done` of item `oi`.
    fn item_event(&mut self, kind: &'static str, oi: usize, item: &Item) -> Frame {
        let data = ItemEvent {
            output_index: oi,
            item,
        };
        self.seq.ev(kind, data)
    }

    fn close(&mut self, out: &mut Vec<Frame>) {
        let oi = self.output.len();
        let item = match self.open.take() {
            None => return,
            Some(Open::Message { id, text }) => {
                let part = Part::output_text(text.clone());
                out.push(self.seq.ev(
                    "response.output_text.done",
                    TextEvent {
                        item_id: &id,
                        output_index: oi,
                        content_index: 0,
                        delta: None,
                        text: Some(&text),
                        logprobs: Some(NoEntries),
                    },
                ));
                out.push(self.seq.ev(
                    "response.content_part.done",
                    PartEvent {
                        item_id: &id,
                        output_index: oi,
                        content_index: 0,
                        part: &part,
                    },
                ));
                Item::message(id, text, "completed")
            }
            Some(Open::Reasoning { id, text }) => {
                out.push(self.seq.ev(
                    "response.reasoning_text.done",
                    TextEvent {
                        item_id: &id,
                        output_index: oi,
                        content_index: 0,
                        delta: None,
                        text: Some(&text),
                        logprobs: None,
                    },
                ));
                Item::reasoning(id, text)
            }
            Some(Open::Call {
                id,
                call_id,
                name,
                arguments,
            }) => {
                out.push(self.seq.ev(
                    "response.function_call_arguments.done",
                    ArgumentsEvent {
                        item_id: &id,
                        output_index: oi,
                        delta: None,
                        name: Some(&name),
                        arguments: Some(&arguments),
                    },
                ));
                Item::FunctionCall {
                    id,
                    call_id,
                    name,
                    arguments,
                    status: "completed",
                }
            }
        };
        out.push(self.item_event("response.output_item.done", oi, &item));
        self.output.push(item);
    }

    /// Open the item that `t` belongs in, unless it is open.
    fn open_for(&mut self, out: &mut Vec<Frame>, reasoning: bool) {
        let fits = matches!(
            (&self.open, reasoning),
            (Some(Open::Message { .. }), false) | (Some(Open::Reasoning { .. }), true)
        );
        if fits {
            return;
        }
        self.close(out);
        let oi = self.output.len();
        if reasoning {
            let id = new_call_id("rs_");
            let item = Item::Reasoning {
                id: id.clone(),
                summary: Vec::new(),
                content: Vec::new(),
            };
            out.push(self.item_event("response.output_item.added", oi, &item));
            self.open = Some(Open::Reasoning {
                id,
                text: String::new(),
            });
        } else {
            let id = new_call_id("msg_");
            let item = Item::Message {
                id: id.clone(),
                status: "in_progress",
                role: "assistant",
                content: Vec::new(),
            };
            out.push(self.item_event("response.output_item.added", oi, &item));
            out.push(self.seq.ev(
                "response.content_part.added",
                PartEvent {
                    item_id: &id,
                    output_index: oi,
                    content_index: 0,
                    part: &Part::output_text(String::new()),
                },
            ));
            self.open = Some(Open::Message {
                id,
                text: String::new(),
            });
        }
    }

    fn text(&mut self, out: &mut Vec<Frame>, t: String, reasoning: bool) {
        self.open_for(out, reasoning);
        let oi = self.output.len();
        let (id, kind) = match &mut self.open {
            Some(Open::Message { id, text }) => {
                text.push_str(&t);
                (id.clone(), "response.output_text.delta")
            }
            Some(Open::Reasoning { id, text }) => {
                text.push_str(&t);
                (id.clone(), "response.reasoning_text.delta")
            }
            Some(Open::Call { .. }) | None => return,
        };
        out.push(self.seq.ev(
            kind,
            TextEvent {
                item_id: &id,
                output_index: oi,
                content_index: 0,
                delta: Some(&t),
                text: None,
                logprobs: (!reasoning).then_some(NoEntries),
            },
        ));
    }
}

impl Shape for ResponsesStream {
    fn start(&mut self) -> Vec<Frame> {
        ["response.created", "response.in_progress"]
            .into_iter()
            .map(|kind| {
                let response = self.meta.object("in_progress", Vec::new());
                self.seq.ev(kind, ResponseEvent { response })
            })
            .collect()
    }

    fn deltas(&mut self, deltas: Vec<Delta>) -> Vec<Frame> {
        let mut out = Vec::new();
        for d in deltas {
            match d {
                Delta::Token { .. } => {}
                Delta::Text(t) => self.text(&mut out, t, false),
                Delta::Reasoning(t) => self.text(&mut out, t, true),
                Delta::CallStart {
                    id: call_id, name, ..
                } => {
                    self.close(&mut out);
                    let oi = self.output.len();
                    let id = new_call_id("fc_");
                    let added = Item::FunctionCall {
                        id: id.clone(),
                        call_id: call_id.clone(),
                        name: name.clone(),
                        arguments: String::new(),
                        status: "in_progress",
                    };
                    out.push(self.item_event("response.output_item.added", oi, &added));
                    self.open = Some(Open::Call {
                        id,
                        call_id,
                        name,
                        arguments: String::new(),
                    });
                }
                Delta::CallArgs { delta, .. } => {
                    let oi = self.output.len();
                    let Some(Open::Call { id, arguments, .. }) = &mut self.open else {
                        continue;
                    };
                    arguments.push_str(&delta);
                    out.push(self.seq.ev(
                        "response.function_call_arguments.delta",
                        ArgumentsEvent {
                            item_id: id,
                            output_index: oi,
                            delta: Some(&delta),
                            name: None,
                            arguments: None,
                        },
                    ));
                }
                Delta::CallEnd => {
                    if matches!(self.open, Some(Open::Call { .. })) {
                        self.close(&mut out);
                    }
                }
            }
        }
        out
    }

    fn finish(&mut self, f: &Finish) -> Vec<Frame> {
        let mut out = Vec::new();
        if self.output.is_empty() && self.open.is_none() {
            // Every response has its message item, even an empty one.
            self.text(&mut out, String::new(), false);
        }
        self.close(&mut out);
        let output = std::mem::take(&mut self.output);
        let kind = if matches!(f.reason, FinishReason::Length | FinishReason::GrammarError) {
            "response.incomplete"
        } else {
            "response.completed"
        };
        let response = self.meta.response(f, output);
        out.push(self.seq.ev(kind, ResponseEvent { response }));
        out
    }

    fn error(&mut self, e: &ApiError) -> Vec<Frame> {
        let mut response = self.meta.object("failed", std::mem::take(&mut self.output));
        response.error = Some(ResponseError {
            code: e.reason(),
            message: e.to_string(),
        });
        vec![self.seq.ev("response.failed", ResponseEvent { response })]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::run::testing::{drive, envelope_run, events, thinking_run};

    fn shape() -> ResponsesStream {
        ResponsesStream::new(Meta {
            id: "resp_1".into(),
            created_at: 1,
            model: "m".into(),
            instructions: None,
            tools: Vec::new(),
            tool_choice: (&ToolChoice::Auto).into(),
            temperature: 0.0,
            top_p: 1.0,
            max_output_tokens: None,
            reasoning: ReasoningConfig::default(),
            metadata: Value::Object(Default::default()),
        })
    }

    #[tokio::test]
    async fn streamed_tool_calls_have_the_responses_event_lifecycle() {
        let frames = drive(envelope_run(None), shape()).await;
        let ev = events(&frames);
        let names: Vec<&str> = ev.iter().map(|e| e.0).collect();
        assert_eq!(
            names
                .iter()
                .filter(|n| !n.ends_with("text.delta"))
                .copied()
                .collect::<Vec<_>>(),
            vec![
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                // The arguments stream in the two pieces the model wrote.
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        for (i, (_, v)) in ev.iter().enumerate() {
            assert_eq!(v["sequence_number"], i);
        }
        let added = &ev
            .iter()
            .filter(|e| e.0 == "response.output_item.added")
            .nth(1)
            .unwrap()
            .1;
        assert_eq!(added["output_index"], 1);
        assert_eq!(added["item"]["type"], "function_call");
        assert!(added["item"]["call_id"]
            .as_str()
            .unwrap()
            .starts_with("call_"));
        let done = &ev.last().unwrap().1["response"];
        assert_eq!(done["id"], "resp_1");
        assert_eq!(done["status"], "completed");
        assert_eq!(done["output"][0]["role"], "assistant");
        assert_eq!(done["output"][0]["content"][0]["text"], "Let me check.\n");
        assert_eq!(done["output"][1]["name"], "get_weather");
        assert_eq!(done["output"][1]["arguments"], "{\"city\": \"Paris\"}");
        assert_eq!(done["usage"]["output_tokens"], 9);
    }

    #[tokio::test]
    async fn an_error_after_the_stream_started_is_response_failed() {
        let frames = drive(crate::api::run::testing::failing_run(&["Hi"]), shape()).await;
        let ev = events(&frames);
        let (name, v) = ev.last().unwrap();
        assert_eq!(*name, "response.failed");
        assert_eq!(v["response"]["status"], "failed");
        assert_eq!(v["response"]["id"], "resp_1");
        assert!(v["response"]["error"]["message"].is_string());
    }

    #[tokio::test]
    async fn a_deepseek_dsml_call_is_a_function_call_item_with_streamed_arguments() {
        use crate::api::run::testing::{dsml_run, DSML_ARGS, DSML_REASONING};
        let ev = events(&drive(dsml_run(None), shape()).await);
        for (i, (_, v)) in ev.iter().enumerate() {
            assert_eq!(v["sequence_number"], i);
        }
        let added: Vec<&Value> = ev
            .iter()
            .filter(|e| e.0 == "response.output_item.added")
            .map(|e| &e.1["item"])
            .collect();
        let kinds: Vec<&str> = added.iter().map(|i| i["type"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["reasoning", "message", "function_call"]);
        assert_eq!(added[2]["name"], "get_weather");
        assert_eq!(added[2]["arguments"], "");
        let deltas: Vec<&str> = ev
            .iter()
            .filter(|e| e.0 == "response.function_call_arguments.delta")
            .map(|e| {
                assert_eq!(e.1["output_index"], 2);
                assert_eq!(e.1["item_id"], added[2]["id"]);
                e.1["delta"].as_str().unwrap()
            })
            .collect();
        assert!(deltas.len() > 3, "arguments are streamed: {deltas:?}");
        assert_eq!(deltas.concat(), DSML_ARGS);
        let args_done = ev
            .iter()
            .find(|e| e.0 == "response.function_call_arguments.done")
            .unwrap();
        assert_eq!(args_done.1["arguments"], DSML_ARGS);
        let done = &ev.last().unwrap().1["response"];
        assert_eq!(done["status"], "completed");
        assert_eq!(done["output"][0]["content"][0]["text"], DSML_REASONING);
        assert_eq!(done["output"][1]["content"][0]["text"], "Checking.");
        assert_eq!(done["output"][2]["type"], "function_call");
        assert_eq!(done["output"][2]["status"], "completed");
        assert_eq!(done["output"][2]["arguments"], DSML_ARGS);
        assert_eq!(done["output"][2]["call_id"], added[2]["call_id"]);

        // Not streamed.
        let (c, _) = crate::api::run::collect(dsml_run(None)).await.unwrap();
        let out = serde_json::to_value(output_items(c)).unwrap();
        let kinds: Vec<&str> = out
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["type"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["reasoning", "message", "function_call"]);
        assert_eq!(out[0]["content"][0]["text"], DSML_REASONING);
        assert_eq!(out[2]["name"], "get_weather");
        assert_eq!(out[2]["arguments"], DSML_ARGS);
        assert!(out[2]["call_id"].as_str().unwrap().starts_with("call_"));
    }

    #[tokio::test]
    async fn reasoning_goes_out_as_a_reasoning_item() {
        let frames = drive(thinking_run(), shape()).await;
        let ev = events(&frames);
        let done = &ev.last().unwrap().1["response"];
        assert_eq!(done["output"][0]["type"], "reasoning");
        assert_eq!(
            done["output"][0]["content"][0]["text"],
            "France's capital is Paris."
        );
        assert_eq!(done["output"][1]["type"], "message");
        assert_eq!(done["output"][1]["content"][0]["text"], "Paris.");
        assert!(ev.iter().any(|e| e.0 == "response.reasoning_text.delta"));
    }

    #[tokio::test]
    async fn each_item_keeps_its_output_index_from_added_to_done() {
        use crate::api::run::testing::dsml_run;
        let ev = events(&drive(dsml_run(None), shape()).await);
        let index_of = |id: &Value| -> Vec<(&str, &Value)> {
            ev.iter()
                .filter(|e| e.1["item_id"] == *id || e.1["item"]["id"] == *id)
                .map(|e| (e.0, &e.1["output_index"]))
                .collect()
        };
        let added: Vec<&Value> = ev
            .iter()
            .filter(|e| e.0 == "response.output_item.added")
            .map(|e| &e.1["item"]["id"])
            .collect();
        assert_eq!(added.len(), 3);
        for (i, id) in added.into_iter().enumerate() {
            for (name, oi) in index_of(id) {
                assert_eq!(*oi, i, "{name} of item {i}");
            }
        }
    }

    #[test]
    fn a_response_echoes_the_request_settings() {
        let tools = [
            r#"{"type":"web_search"}"#,
            r#"{"type": "function", "name": "f"}"#,
        ];
        let meta = Meta {
            tools: tools
                .iter()
                .map(|t| RawValue::from_string(t.to_string()).unwrap())
                .collect(),
            tool_choice: (&ToolChoice::Named("f".into())).into(),
            reasoning: ReasoningConfig {
                effort: Some("high".into()),
                summary: None,
            },
            ..shape().meta
        };
        let r = serde_json::to_string(&meta.object("in_progress", Vec::new())).unwrap();
        assert!(
            r.contains(r#""tools":[{"type":"web_search"},{"type": "function", "name": "f"}]"#),
            "{r}"
        );
        let r: Value = serde_json::from_str(&r).unwrap();
        assert_eq!(
            r["tool_choice"],
            serde_json::json!({"type": "function", "name": "f"})
        );
        assert_eq!(r["reasoning"], serde_json::json!({"effort": "high"}));
        assert_eq!(r["text"], serde_json::json!({"format": {"type": "text"}}));
        assert_eq!(r["metadata"], serde_json::json!({}));
    }
}

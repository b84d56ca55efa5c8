//! Running a request on the engine, shared by every surface: admission
//! checks, the engine's token events turned into answer text, reasoning
//! and tool calls, collection for JSON answers, and the SSE driver that
//! streams them in a surface's own event shapes.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tokio::sync::mpsc;
use tracing::Instrument;

use super::trace_file::RunTrace;
use super::{ApiError, AppState};
use crate::engine::Event;
use crate::generate::{FinishReason, GenerateRequest, StreamOptions, Timings, TokenLogprobs};
use crate::grammar::Constraint;
use crate::sampler::SamplingParams;
use ds4_model::chat::{AnswerEvent, AnswerFormat, AnswerParser, ToolCall};

/// A request ready for the engine.
#[derive(Debug, Clone)]
pub struct Job {
    pub prompt: Vec<u32>,
    pub max_tokens: Option<u32>,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub logprobs: Option<usize>,
    /// How to read the answer (reasoning, tool calls): the chat layer's
    /// rendering says.
    pub answer: AnswerFormat,
    /// Generated tool-call ids start with this (`call_`, `toolu_`).
    pub id_prefix: &'static str,
    /// The grammar the answer must match, if any.
    pub constraint: Option<Constraint>,
}

/// What a run produces, in order.
#[derive(Clone, Debug)]
pub enum Delta {
    /// A sampled token (before the text it produced).
    Token {
        id: u32,
        logprobs: Option<TokenLogprobs>,
    },
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

impl From<AnswerEvent> for Delta {
    fn from(e: AnswerEvent) -> Delta {
        match e {
            AnswerEvent::Reasoning(r) => Delta::Reasoning(r),
            AnswerEvent::Text(t) => Delta::Text(t),
            AnswerEvent::CallStart { index, id, name } => Delta::CallStart { index, id, name },
            AnswerEvent::CallArgs { index, delta } => Delta::CallArgs { index, delta },
            AnswerEvent::CallEnd => Delta::CallEnd,
        }
    }
}

/// How a run ended.
#[derive(Clone, Debug)]
pub struct Finish {
    pub reason: FinishReason,
    /// The stop string that ended the run, if one did.
    pub stop_string: Option<String>,
    pub timings: Timings,
    /// Tool calls the model finished writing.
    pub calls: usize,
}

impl Finish {
    /// Completion tokens as clients count them (the end token included).
    pub fn completion_tokens(&self) -> usize {
        self.timings.generated_tokens
    }

    pub fn prompt_tokens(&self) -> usize {
        self.timings.prompt_tokens
    }

    pub fn timings_out(&self) -> TimingsOut {
        let t = &self.timings;
        TimingsOut {
            ttft_ms: t.ttft_ms(),
            prompt_tokens: t.prompt_tokens,
            cached_tokens: t.cached_tokens,
            prefill_tokens_per_s: t.prefill_tps(),
            decode_tokens_per_s: t.decode_tps(),
        }
    }
}

/// Server-side timings of a request, sent with its usage.
#[derive(Clone, Debug, Serialize)]
pub struct TimingsOut {
    pub ttft_ms: f64,
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub prefill_tokens_per_s: f64,
    pub decode_tokens_per_s: f64,
}

pub enum Step {
    Deltas(Vec<Delta>),
    Done(Finish),
    Failed(ApiError),
}

/// What to do with a run's whole answer at its end.
pub type OnDone = Box<dyn FnOnce(&Collected, &Finish) + Send>;

/// A request running on the engine. Dropping it cancels the generation.
pub struct Run {
    rx: mpsc::UnboundedReceiver<Event>,
    answer: AnswerParser,
    /// The end, held while the last text goes out.
    pending: Option<Finish>,
    done: bool,
    /// Everything produced so far, kept when someone needs the whole
    /// answer ([`collect`], [`Run::on_done`]).
    kept: Option<Collected>,
    on_done: Option<OnDone>,
    /// The `--trace` file's records of this run, when tracing.
    trace: Option<RunTrace>,
}

/// Check `job` against the context and queue it.
pub fn start(state: &AppState, job: Job) -> Result<Run, ApiError> {
    if job.prompt.is_empty() {
        return Err(ApiError::bad("the prompt is empty", "prompt"));
    }
    if job.prompt.len() >= state.ctx {
        return Err(ApiError::ContextLength {
            prompt: job.prompt.len(),
            ctx: state.ctx,
        });
    }
    let room = (state.ctx - job.prompt.len()).min(state.max_answer_tokens);
    let max_tokens = job.max_tokens.map_or(room, |m| (m as usize).min(room));
    if max_tokens == 0 {
        return Err(ApiError::bad("max_tokens must be at least 1", "max_tokens"));
    }
    let req = GenerateRequest {
        prompt: job.prompt,
        max_tokens,
        sampling: job.sampling,
        stop: job.stop,
        ignore_eos: false,
        constraint: job.constraint,
    };
    let mut trace = state
        .trace
        .as_ref()
        .map(|file| RunTrace::prompt(file, &req.prompt, &state.chat.tokenizer));
    let submitted = state.engine.submit(
        req,
        StreamOptions {
            logprobs: job.logprobs,
        },
    );
    let rx = match submitted {
        Ok(rx) => rx,
        Err(e) => {
            let e = ApiError::from(e);
            if let Some(t) = &mut trace {
                t.failed(&e);
            }
            return Err(e);
        }
    };
    let mut run = Run::new(rx, job.answer, job.id_prefix);
    if trace.is_some() {
        run.kept.get_or_insert_with(Collected::default);
        run.trace = trace;
    }
    Ok(run)
}

impl Run {
    /// A run over engine events whose answer is read as `answer` says.
    pub fn new(
        rx: mpsc::UnboundedReceiver<Event>,
        answer: AnswerFormat,
        id_prefix: &'static str,
    ) -> Run {
        Run {
            rx,
            answer: AnswerParser::new(answer, id_prefix),
            pending: None,
            done: false,
            kept: None,
            on_done: None,
            trace: None,
        }
    }

    /// Hand everything the run produced to `then` when it ends (streamed
    /// or collected; not when it fails or is dropped). A call the token
    /// limit cut short is left out.
    pub fn on_done(&mut self, then: impl FnOnce(&Collected, &Finish) + Send + 'static) {
        self.kept.get_or_insert_with(Collected::default);
        self.on_done = Some(Box::new(then));
    }

    /// The end-of-run handler, taken off this run (to hand it the answer
    /// that replaces this one).
    pub fn take_on_done(&mut self) -> Option<OnDone> {
        self.on_done.take()
    }

    /// The next step; cancel-safe (nothing is lost if the future is
    /// dropped before it resolves).
    pub async fn next(&mut self) -> Step {
        let step = self.step().await;
        let Some(c) = &mut self.kept else {
            return step;
        };
        match &step {
            Step::Deltas(ds) => {
                if let Some(t) = &self.trace {
                    t.deltas(ds);
                }
                ds.iter().for_each(|d| c.add(d.clone()));
            }
            Step::Done(f) => {
                if let Some(t) = &mut self.trace {
                    t.done(c, f);
                }
                // A call the token limit cut short has arguments no client
                // can run: the whole answer leaves it out (a stream has
                // sent its pieces already, and ends `length`).
                c.calls.truncate(f.calls);
                if let Some(then) = self.on_done.take() {
                    then(c, f);
                }
            }
            Step::Failed(e) => {
                if let Some(t) = &mut self.trace {
                    t.failed(e);
                }
            }
        }
        step
    }

    async fn step(&mut self) -> Step {
        if let Some(f) = self.pending.take() {
            self.done = true;
            return Step::Done(f);
        }
        if self.done {
            return Step::Failed(ApiError::Internal("the run has ended".into()));
        }
        match self.rx.recv().await {
            Some(Event::Token {
                token,
                text,
                logprobs,
            }) => {
                let mut out = vec![Delta::Token {
                    id: token,
                    logprobs,
                }];
                out.extend(self.answer.push(&text).into_iter().map(Delta::from));
                Step::Deltas(out)
            }
            Some(Event::Done(g)) => {
                let (events, calls) = self.answer.finish();
                let out: Vec<Delta> = events.into_iter().map(Delta::from).collect();
                let finish = Finish {
                    reason: g.finish,
                    stop_string: g.stop_string,
                    timings: g.timings,
                    calls,
                };
                if out.is_empty() {
                    self.done = true;
                    Step::Done(finish)
                } else {
                    // Deliver the tail first; the next call reports Done.
                    self.pending = Some(finish);
                    Step::Deltas(out)
                }
            }
            Some(Event::Failed(e)) => {
                self.done = true;
                Step::Failed(e.into())
            }
            None => {
                self.done = true;
                Step::Failed(ApiError::Internal("the engine dropped the request".into()))
            }
        }
    }
}

/// Everything a run produced, for JSON answers.
#[derive(Debug, Default)]
pub struct Collected {
    pub text: String,
    pub reasoning: String,
    pub calls: Vec<ToolCall>,
    pub tokens: Vec<(u32, Option<TokenLogprobs>)>,
}

impl Collected {
    fn add(&mut self, d: Delta) {
        match d {
            Delta::Token { id, logprobs } => self.tokens.push((id, logprobs)),
            Delta::Reasoning(r) => self.reasoning.push_str(&r),
            Delta::Text(t) => self.text.push_str(&t),
            Delta::CallStart { id, name, .. } => self.calls.push(ToolCall {
                id,
                name,
                arguments: String::new(),
            }),
            Delta::CallArgs { index, delta } => {
                if let Some(call) = self.calls.get_mut(index) {
                    call.arguments.push_str(&delta);
                }
            }
            Delta::CallEnd => {}
        }
    }
}

/// Run to the end.
pub async fn collect(mut run: Run) -> Result<(Collected, Finish), ApiError> {
    run.kept.get_or_insert_with(Collected::default);
    loop {
        match run.next().await {
            Step::Deltas(_) => {}
            Step::Done(f) => return Ok((run.kept.take().unwrap_or_default(), f)),
            Step::Failed(e) => return Err(e),
        }
    }
}

/// One SSE event: its `event:` name, if any, and its `data:` text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub event: Option<&'static str>,
    pub data: String,
}

impl Frame {
    fn into_sse(self) -> SseEvent {
        let e = SseEvent::default().data(self.data);
        match self.event {
            Some(n) => e.event(n),
            None => e,
        }
    }
}

/// A JSON event, optionally named.
pub fn event(name: Option<&'static str>, data: &impl Serialize) -> Frame {
    Frame {
        event: name,
        data: serde_json::to_string(data).unwrap_or_else(|_| "{}".into()),
    }
}

/// A named event whose data carries its name as `type` too (Anthropic
/// Messages and OpenAI Responses events); `data` is a struct (or `()`).
pub fn typed_event(kind: &'static str, data: &impl Serialize) -> Frame {
    #[derive(Serialize)]
    struct Typed<'a, T> {
        #[serde(rename = "type")]
        kind: &'static str,
        #[serde(flatten)]
        data: &'a T,
    }
    event(Some(kind), &Typed { kind, data })
}

/// OpenAI's end-of-stream marker.
pub fn done() -> Frame {
    Frame {
        event: None,
        data: "[DONE]".into(),
    }
}

/// A surface's streaming shape: which SSE events each step becomes.
pub trait Shape: Send + 'static {
    fn start(&mut self) -> Vec<Frame>;
    fn deltas(&mut self, deltas: Vec<Delta>) -> Vec<Frame>;
    fn finish(&mut self, f: &Finish) -> Vec<Frame>;
    fn error(&mut self, e: &ApiError) -> Vec<Frame>;
    /// A keep-alive sent while nothing else is (Anthropic's `ping`).
    fn ping(&mut self) -> Option<Frame> {
        None
    }
}

/// How long a stream may stay silent before a keep-alive.
const PING_EVERY: Duration = Duration::from_secs(5);

/// Stream `run` as SSE in `shape`. The stream ends after the final event;
/// when the client goes away (noticed even while nothing is sent) the run
/// is dropped, which cancels it.
pub fn sse(
    state: Arc<AppState>,
    surface: &'static str,
    mut run: Run,
    mut shape: impl Shape,
) -> Response {
    let (tx, rx) = mpsc::channel::<SseEvent>(64);
    let span = tracing::Span::current();
    tokio::spawn(
        async move {
            let metrics = state.engine.metrics().clone();
            let send_all = |evs: Vec<Frame>| {
                let tx = tx.clone();
                async move {
                    for e in evs {
                        if tx.send(e.into_sse()).await.is_err() {
                            return false;
                        }
                    }
                    true
                }
            };
            if !send_all(shape.start()).await {
                metrics.request(surface, "cancelled");
                return;
            }
            loop {
                // A client that leaves while nothing is being sent (a long
                // prefill) closes the channel: the run is dropped at once,
                // and the engine drops the sequence at its next step.
                let next = tokio::select! {
                    _ = tx.closed() => {
                        metrics.request(surface, "cancelled");
                        return;
                    }
                    next = tokio::time::timeout(PING_EVERY, run.next()) => next,
                };
                let step = match next {
                    Ok(step) => step,
                    Err(_) => {
                        if let Some(p) = shape.ping() {
                            if tx.send(p.into_sse()).await.is_err() {
                                metrics.request(surface, "cancelled");
                                return;
                            }
                        }
                        continue;
                    }
                };
                let (events, outcome) = match step {
                    Step::Deltas(ds) => (shape.deltas(ds), None),
                    Step::Done(f) => (shape.finish(&f), Some("ok")),
                    Step::Failed(e) => {
                        metrics.refusal(e.reason());
                        (shape.error(&e), Some(e.reason()))
                    }
                };
                if !send_all(events).await {
                    metrics.request(surface, "cancelled");
                    return;
                }
                if let Some(o) = outcome {
                    metrics.request(surface, o);
                    return;
                }
            }
        }
        .instrument(span),
    );
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|e| (Ok::<_, Infallible>(e), rx))
    });
    Sse::new(stream).into_response()
}

/// Runs over scripted engine events, for the surfaces' stream tests.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use crate::generate::Generation;
    use ds4_model::chat::deepseek4::THINK_DELIMITERS;
    use ds4_model::chat::tool_stream::ToolProtocol;
    use ds4_model::chat::{Delimiters, ReplayStore, ToolParsing};

    /// A run whose engine "generates" `pieces` (one token each).
    pub fn scripted(
        pieces: &[&str],
        reasoning: Option<Delimiters>,
        tools: Option<ToolParsing>,
    ) -> Run {
        let (tx, rx) = mpsc::unbounded_channel();
        for (i, p) in pieces.iter().enumerate() {
            tx.send(Event::Token {
                token: i as u32,
                text: (*p).to_string(),
                logprobs: None,
            })
            .unwrap();
        }
        tx.send(Event::Done(Generation {
            tokens: (0..pieces.len() as u32).collect(),
            text: pieces.concat(),
            finish: FinishReason::Stop,
            stop_string: None,
            timings: Timings {
                prompt_tokens: 20,
                generated_tokens: pieces.len() + 1,
                ..Timings::default()
            },
        }))
        .unwrap();
        Run::new(
            rx,
            AnswerFormat {
                reasoning,
                tools,
                calls: None,
            },
            "call_",
        )
    }

    /// Text, then a call envelope split at awkward places.
    pub fn envelope_run(forced: Option<&str>) -> Run {
        scripted(
            &[
                "Let me",
                " check.\n<tool",
                "_call>\n{\"name\": \"get_",
                "weather\", \"arguments\": {\"city\":",
                " \"Paris\"}}\n</tool_",
                "call>",
                "\n",
                "",
            ],
            None,
            Some(ToolParsing {
                names: vec!["get_weather".into()],
                forced: forced.unwrap_or_default().to_string(),
                protocol: ToolProtocol::Envelope,
                replay: None,
            }),
        )
    }

    /// DeepSeek V4 in thinking mode: reasoning, a little content, and a
    /// DSML call split at awkward places (text after the block is not
    /// part of the answer).
    pub fn dsml_run(replay: Option<Arc<ReplayStore>>) -> Run {
        scripted(
            &DSML_PIECES,
            Some(THINK_DELIMITERS.inside()),
            Some(ToolParsing {
                names: vec!["get_weather".into()],
                forced: String::new(),
                protocol: ToolProtocol::Dsml,
                replay,
            }),
        )
    }

    /// What [`dsml_run`]'s model generates.
    pub const DSML_PIECES: [&str; 11] = [
        "Rome today;",
        " call get_weather.</th",
        "ink>Checking.\n\n<｜DSML｜tool",
        "_calls>\n<｜DSML｜invoke name=\"get_",
        "weather\">\n<｜DSML｜parameter name=\"city\" string=\"true\">Ro",
        "me</｜DSML｜parameter>\n<｜DSML｜parameter name=\"days\" string=\"false\">",
        "1</｜DSML｜param",
        "eter>\n</｜DSML｜invoke>\n",
        "</｜DSML｜tool",
        "_calls>",
        " stray <think>text",
    ];

    /// The DSML block [`dsml_run`] produces, as sampled.
    pub const DSML_BLOCK: &str = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" string=\"true\">Rome</｜DSML｜parameter>\n<｜DSML｜parameter name=\"days\" string=\"false\">1</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";

    /// Reasoning and arguments of [`dsml_run`].
    pub const DSML_REASONING: &str = "Rome today; call get_weather.";
    pub const DSML_ARGS: &str = "{\"city\":\"Rome\",\"days\":1}";

    /// A family that thinks between `<think>` tags.
    pub fn thinking_run() -> Run {
        scripted(
            &["<think>France's", " capital is Paris.</th", "ink>Paris."],
            Some(Delimiters {
                open: "<think>",
                close: "</think>",
                starts_inside: false,
            }),
            None,
        )
    }

    /// A run that streams `pieces` and then loses its engine.
    pub fn failing_run(pieces: &[&str]) -> Run {
        let (tx, rx) = mpsc::unbounded_channel();
        for (i, p) in pieces.iter().enumerate() {
            tx.send(Event::Token {
                token: i as u32,
                text: (*p).to_string(),
                logprobs: None,
            })
            .unwrap();
        }
        Run::new(rx, AnswerFormat::default(), "call_")
    }

    /// Every frame `shape` produces for `run`.
    /// `(event name, data)` of SSE frames whose data carries its own
    /// `type` (Anthropic Messages and OpenAI Responses events), checking
    /// that the two agree.
    pub fn events(frames: &[Frame]) -> Vec<(&'static str, serde_json::Value)> {
        frames
            .iter()
            .map(|f| {
                let v: serde_json::Value = serde_json::from_str(&f.data).unwrap();
                assert_eq!(v["type"].as_str(), f.event);
                (f.event.unwrap(), v)
            })
            .collect()
    }

    pub async fn drive(mut run: Run, mut shape: impl Shape) -> Vec<Frame> {
        let mut out = shape.start();
        loop {
            match run.next().await {
                Step::Deltas(ds) => out.extend(shape.deltas(ds)),
                Step::Done(f) => {
                    out.extend(shape.finish(&f));
                    return out;
                }
                Step::Failed(e) => {
                    out.extend(shape.error(&e));
                    return out;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;
    use ds4_model::chat::tool_stream::ToolProtocol;
    use ds4_model::chat::{ReplayStore, ToolParsing};

    #[tokio::test]
    async fn a_call_cut_short_is_not_a_finished_call() {
        let run = scripted(
            &["<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"ci"],
            None,
            Some(ToolParsing {
                names: vec!["get_weather".into()],
                forced: String::new(),
                protocol: ToolProtocol::Envelope,
                replay: None,
            }),
        );
        let (c, f) = collect(run).await.unwrap();
        // The run did not end with a finished call, and a JSON answer
        // leaves the partial one out (a stream has sent its pieces).
        assert_eq!(f.calls, 0);
        assert!(c.calls.is_empty(), "{:?}", c.calls);
    }

    #[tokio::test]
    async fn a_generated_envelope_becomes_a_tool_call() {
        let (c, f) = collect(envelope_run(None)).await.unwrap();
        assert_eq!(c.text, "Let me check.\n");
        assert_eq!(c.calls.len(), 1);
        assert_eq!(c.calls[0].name, "get_weather");
        // The model's own bytes, streamed in two pieces.
        assert_eq!(c.calls[0].arguments, "{\"city\": \"Paris\"}");
        assert!(c.calls[0].id.starts_with("call_"));
        assert_eq!(f.calls, 1);
        assert_eq!(c.tokens.len(), 8);
    }

    #[tokio::test]
    async fn reasoning_is_kept_out_of_the_answer() {
        let (c, _) = collect(thinking_run()).await.unwrap();
        assert_eq!(c.reasoning, "France's capital is Paris.");
        assert_eq!(c.text, "Paris.");
    }

    #[tokio::test]
    async fn a_dsml_call_streams_its_arguments_and_is_remembered() {
        let store = Arc::new(ReplayStore::default());
        let mut run = dsml_run(Some(store.clone()));
        let mut deltas = Vec::new();
        let finish = loop {
            match run.next().await {
                Step::Deltas(ds) => deltas.extend(ds),
                Step::Done(f) => break f,
                Step::Failed(e) => panic!("{e}"),
            }
        };
        let arg_deltas: Vec<&str> = deltas
            .iter()
            .filter_map(|d| match d {
                Delta::CallArgs { delta, .. } => Some(delta.as_str()),
                _ => None,
            })
            .collect();
        assert!(arg_deltas.len() > 3, "arguments stream: {arg_deltas:?}");
        assert_eq!(arg_deltas.concat(), DSML_ARGS);
        let start = deltas
            .iter()
            .position(|d| matches!(d, Delta::CallStart { .. }))
            .unwrap();
        let end = deltas
            .iter()
            .position(|d| matches!(d, Delta::CallEnd))
            .unwrap();
        assert!(start < end);
        let Delta::CallStart { id, name, .. } = &deltas[start] else {
            unreachable!()
        };
        assert_eq!(name, "get_weather");
        assert_eq!(store.get(id).as_deref(), Some(DSML_BLOCK));
        assert_eq!(finish.calls, 1);
        let (c, _) = collect(dsml_run(None)).await.unwrap();
        assert_eq!(c.reasoning, DSML_REASONING);
        assert_eq!(c.text, "Checking.");
        assert_eq!(c.calls.len(), 1);
        assert_eq!(c.calls[0].arguments, DSML_ARGS);
    }

    #[tokio::test]
    async fn a_dropped_engine_is_an_error() {
        let (tx, rx) = mpsc::unbounded_channel::<Event>();
        drop(tx);
        assert!(collect(Run::new(rx, AnswerFormat::default(), "call_"))
            .await
            .is_err());
    }
}

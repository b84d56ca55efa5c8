//! `POST /v1/completions` (OpenAI Completions): a raw prompt, no template.

use std::sync::Arc;

use axum::body::Bytes;
use axum::response::IntoResponse;
use axum::Json;
use serde::{Deserialize, Serialize};

use super::fields::{penalize, LogitBias, Penalty};
use super::openai_chat::{usage, Usage};
use super::run::{self, Delta, Finish, Frame, Job, Shape, TimingsOut};
use super::structured::{self, WireGrammar};
use super::{one_choice, stop_list, ApiError, AppState, Reply, SamplingFields, Stop, Surface};
use crate::generate::{FinishReason, TokenLogprobs};
use ds4_model::chat::{new_call_id, AnswerFormat, Chat};

/// OpenAI's default when `max_tokens` is absent.
const DEFAULT_MAX_TOKENS: u32 = 16;

#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    #[serde(default)]
    pub model: String,
    pub prompt: Prompt,
    pub max_tokens: Option<u32>,
    #[serde(flatten)]
    pub sampling: SamplingFields,
    pub stop: Option<Stop>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub echo: bool,
    pub logprobs: Option<u32>,
    pub n: Option<u32>,
    pub best_of: Option<u32>,
    pub suffix: Option<String>,
    #[serde(default)]
    pub return_token_ids: bool,
    /// A Lark grammar or regular expression the completion must match
    /// (an extension, as llama-server and vLLM have).
    pub grammar: Option<WireGrammar>,
    pub presence_penalty: Option<Penalty>,
    pub frequency_penalty: Option<Penalty>,
    pub logit_bias: Option<LogitBias>,
    /// Read (so that a wrong type is refused); no effect here.
    #[allow(dead_code)]
    pub user: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// A prompt: text or token ids, alone or as a one-element batch.
#[derive(Debug, Deserialize)]
#[serde(
    untagged,
    expecting = "a string, a list of token ids, or a list of one of those"
)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
    TextBatch(Vec<String>),
    TokenBatch(Vec<Vec<u32>>),
}

impl Surface for CompletionRequest {
    const NAME: &'static str = "completions";

    /// `POST /v1/completions`.
    async fn answer(mut self, state: Arc<AppState>, _body: Bytes) -> Result<Reply, ApiError> {
        one_choice(self.n, "n")?;
        one_choice(self.best_of, "best_of")?;
        if self.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::bad(
                "suffix (insertion) is not supported by this model",
                "suffix",
            ));
        }
        if self.echo && self.logprobs.is_some() {
            return Err(ApiError::bad(
                "echo with logprobs (prompt log-probabilities) is not supported",
                "logprobs",
            ));
        }
        let mut sampling = self.sampling.params()?;
        penalize(
            &mut sampling,
            self.presence_penalty,
            self.frequency_penalty,
            self.logit_bias.take(),
            state.chat.tokenizer.vocab_size(),
        )?;
        let stop = stop_list(self.stop.take())?;
        let p = state.chat.clone();
        let (text, tokens) = match self.prompt {
            Prompt::Text(t) => prompt_text(&p, t).await?,
            Prompt::TextBatch(mut v) if v.len() == 1 => prompt_text(&p, v.remove(0)).await?,
            Prompt::Tokens(t) => prompt_tokens(&p, t)?,
            Prompt::TokenBatch(mut v) if v.len() == 1 => prompt_tokens(&p, v.remove(0))?,
            _ => {
                return Err(ApiError::bad(
                    "only one prompt per request is supported",
                    "prompt",
                ))
            }
        };
        let prompt_ids = self.return_token_ids.then(|| tokens.clone());
        let logprobs = self.logprobs.map(|n| n.min(20) as usize);
        let spec = self.grammar.take().map(|g| (g.spec(), "grammar"));
        let constraint = structured::compile(&state, spec, &AnswerFormat::default()).await?;
        let job = Job {
            prompt: tokens,
            max_tokens: Some(self.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS)),
            sampling,
            stop,
            logprobs,
            // A raw completion is the generated text verbatim, reasoning
            // delimiters and tool syntax included.
            answer: AnswerFormat::default(),
            id_prefix: "call_",
            constraint,
        };
        let run = run::start(&state, job)?;
        let id = new_call_id("cmpl-");
        let created = super::unix_now();
        let echo = if self.echo { text } else { String::new() };
        if self.stream {
            let shape = CompletionStream {
                id,
                created,
                model: state.model_id.clone(),
                chat: p,
                include_usage: self.stream_options.is_some_and(|o| o.include_usage),
                echo,
            };
            return Ok(Reply::stream::<Self>(&state, run, shape));
        }
        let (c, f) = run::collect(run).await?;
        let lp = logprobs.map(|_| {
            let entries: Vec<_> = c
                .tokens
                .iter()
                .filter_map(|(id, lp)| lp.as_ref().map(|lp| (*id, lp)))
                .collect();
            legacy_logprobs(&p, &entries, echo.len())
        });
        let resp = CompletionResponse {
            id,
            object: "text_completion",
            created,
            model: state.model_id.clone(),
            choices: vec![Choice {
                index: 0,
                text: echo + &c.text,
                finish_reason: Some(finish_reason(&f)),
                logprobs: lp,
                token_ids: self
                    .return_token_ids
                    .then(|| c.tokens.iter().map(|t| t.0).collect()),
            }],
            usage: Some(usage(&f)),
            timings: Some(f.timings_out()),
            prompt_token_ids: prompt_ids,
        };
        Ok(Reply::Json(Json(resp).into_response()))
    }

    fn model(&self) -> &str {
        &self.model
    }
}

async fn prompt_text(p: &Chat, text: String) -> Result<(String, Vec<u32>), ApiError> {
    let p = p.clone();
    tokio::task::spawn_blocking(move || {
        let ids = p
            .raw_prompt(&text)
            .map_err(|e| ApiError::Internal(e.to_string()))?;
        Ok((text, ids))
    })
    .await
    .map_err(|e| ApiError::Internal(e.to_string()))?
}

fn prompt_tokens(p: &Chat, ids: Vec<u32>) -> Result<(String, Vec<u32>), ApiError> {
    let vocab = p.tokenizer.vocab_size();
    if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::bad(
            format!("token id {bad} is outside the vocabulary of {vocab} tokens"),
            "prompt",
        ));
    }
    Ok((p.tokenizer.decode(&ids), ids))
}

fn finish_reason(f: &Finish) -> &'static str {
    match f.reason {
        FinishReason::Stop | FinishReason::Cancelled => "stop",
        FinishReason::Length => "length",
        // The answer's grammar could not go on (logged).
        FinishReason::GrammarError => "error",
    }
}

/// The Completions log-probability shape; offsets start at `offset`.
fn legacy_logprobs(p: &Chat, entries: &[(u32, &TokenLogprobs)], offset: usize) -> LegacyLogprobs {
    let mut out = LegacyLogprobs::default();
    let mut at = offset;
    for (id, lp) in entries {
        let tok = p.tokenizer.decode(&[*id]);
        out.text_offset.push(at);
        at += tok.len();
        out.tokens.push(tok);
        out.token_logprobs.push(lp.logprob);
        out.top_logprobs.push(
            lp.top
                .iter()
                .map(|&(t, l)| (p.tokenizer.decode(&[t]), l))
                .collect(),
        );
    }
    out
}

#[derive(Serialize)]
struct CompletionResponse {
    id: String,
    object: &'static str,
    created: u64,
    model: String,
    choices: Vec<Choice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Usage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    timings: Option<TimingsOut>,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_token_ids: Option<Vec<u32>>,
}

#[derive(Serialize)]
struct Choice {
    index: u32,
    text: String,
    finish_reason: Option<&'static str>,
    logprobs: Option<LegacyLogprobs>,
    #[serde(skip_serializing_if = "Option::is_none")]
    token_ids: Option<Vec<u32>>,
}

#[derive(Serialize, Default)]
struct LegacyLogprobs {
    tokens: Vec<String>,
    token_logprobs: Vec<f32>,
    top_logprobs: Vec<std::collections::BTreeMap<String, f32>>,
    text_offset: Vec<usize>,
}

struct CompletionStream {
    id: String,
    created: u64,
    model: String,
    chat: Chat,
    include_usage: bool,
    /// Echoed prompt, sent with the first chunk.
    echo: String,
}

impl CompletionStream {
    fn chunk(&self, choices: Vec<Choice>, f: Option<&Finish>) -> Frame {
        run::event(
            None,
            &CompletionResponse {
                id: self.id.clone(),
                object: "text_completion",
                created: self.created,
                model: self.model.clone(),
                choices,
                usage: f.map(usage),
                timings: f.map(Finish::timings_out),
                prompt_token_ids: None,
            },
        )
    }

    fn text(
        &self,
        text: String,
        finish: Option<&'static str>,
        lp: Option<LegacyLogprobs>,
    ) -> Frame {
        self.chunk(
            vec![Choice {
                index: 0,
                text,
                finish_reason: finish,
                logprobs: lp,
                token_ids: None,
            }],
            None,
        )
    }
}

impl Shape for CompletionStream {
    fn start(&mut self) -> Vec<Frame> {
        if self.echo.is_empty() {
            Vec::new()
        } else {
            let echo = std::mem::take(&mut self.echo);
            vec![self.text(echo, None, None)]
        }
    }

    fn deltas(&mut self, deltas: Vec<Delta>) -> Vec<Frame> {
        let mut text = String::new();
        let mut lps = Vec::new();
        for d in deltas {
            match d {
                Delta::Token {
                    id,
                    logprobs: Some(lp),
                } => lps.push((id, lp)),
                Delta::Text(t) | Delta::Reasoning(t) => text.push_str(&t),
                Delta::Token { .. }
                | Delta::CallStart { .. }
                | Delta::CallArgs { .. }
                | Delta::CallEnd => {}
            }
        }
        if text.is_empty() && lps.is_empty() {
            return Vec::new();
        }
        let lp = (!lps.is_empty()).then(|| {
            let refs: Vec<_> = lps.iter().map(|(id, lp)| (*id, lp)).collect();
            legacy_logprobs(&self.chat, &refs, 0)
        });
        vec![self.text(text, None, lp)]
    }

    fn finish(&mut self, f: &Finish) -> Vec<Frame> {
        let mut out = vec![self.text(String::new(), Some(finish_reason(f)), None)];
        if self.include_usage {
            out.push(self.chunk(Vec::new(), Some(f)));
        }
        out.push(run::done());
        out
    }

    fn error(&mut self, e: &ApiError) -> Vec<Frame> {
        vec![run::event(None, &e.openai_body()), run::done()]
    }
}

//! One generation: prefill (reusing the sequence's cached prefix), then
//! decode token by token until a stop token, a stop string, the token
//! limit or the context ends it.

use std::ops::ControlFlow;
use std::time::Instant;

use ds4_kernels::Backend;
use ds4_model::tokenizer::{StreamDecoder, Tokenizer};
use ds4_model::{Logits, ModelError, Sequence};

use crate::grammar::{Constraint, NextMask};
use crate::runtime::LoadedModel;
use crate::sampler::{Sampler, SamplingParams};
use crate::stop::{StopEvent, StopMatcher};

/// Prompt tokens evaluated per forward call during prefill.
pub const PREFILL_CHUNK: usize = 512;

#[derive(Clone, Debug)]
pub struct GenerateRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    /// Keep generating through the model's stop tokens (benchmarks).
    pub ignore_eos: bool,
    /// A grammar the answer must match (structured output).
    pub constraint: Option<Constraint>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token or stop string.
    Stop,
    /// `max_tokens` or the context ran out.
    Length,
    /// The caller asked to stop (client gone).
    Cancelled,
    /// The grammar could not go on (its error is logged); the text so far
    /// is what matched it.
    GrammarError,
}

#[derive(Clone, Debug, Default)]
pub struct Timings {
    pub prompt_tokens: usize,
    /// Prompt tokens whose state was already cached.
    pub cached_tokens: usize,
    /// How the cached prefix was found, and why it ends where it does.
    pub prefix: PrefixReuse,
    pub generated_tokens: usize,
    pub prefill_ms: f64,
    pub decode_ms: f64,
}

/// The prefix cache's decision for one prompt, in KV blocks: a prompt
/// can resume after its whole blocks (the last token always runs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixReuse {
    pub block_size: usize,
    /// Whole blocks the prompt could resume after.
    pub resumable: usize,
    /// Blocks found in memory.
    pub memory: usize,
    /// Blocks found in memory but not resumable: the compressed-attention
    /// window state after them was not kept.
    pub no_window: usize,
    /// Blocks restored from the disk KV cache past those in memory.
    pub disk: usize,
}

impl PrefixReuse {
    /// Blocks reused in all.
    pub fn reused(&self) -> usize {
        self.memory + self.disk
    }

    /// Why the reused prefix ends where it does, in words.
    pub fn why(&self) -> String {
        let at = self.reused() * self.block_size;
        if self.resumable == 0 {
            "the prompt is shorter than one block and a token".into()
        } else if self.reused() == self.resumable {
            "every whole block of the prompt was cached".into()
        } else if self.no_window > 0 {
            format!(
                "{} cached blocks after token {at} have no window state kept to resume from",
                self.no_window
            )
        } else if at == 0 {
            "no cached prefix starts this prompt (new, or evicted)".into()
        } else {
            format!("the prompt differs from every cached prefix after token {at} (or the rest was evicted)")
        }
    }
}

impl Timings {
    /// Time to first token: the prefill plus sampling of the first token.
    pub fn ttft_ms(&self) -> f64 {
        self.prefill_ms
    }

    pub fn prefill_tps(&self) -> f64 {
        rate(self.prompt_tokens - self.cached_tokens, self.prefill_ms)
    }

    pub fn decode_tps(&self) -> f64 {
        rate(self.generated_tokens.saturating_sub(1), self.decode_ms)
    }
}

fn rate(tokens: usize, ms: f64) -> f64 {
    if ms > 0.0 {
        tokens as f64 * 1000.0 / ms
    } else {
        0.0
    }
}

#[derive(Clone, Debug)]
pub struct Generation {
    pub tokens: Vec<u32>,
    pub text: String,
    pub finish: FinishReason,
    /// The stop string that ended the generation, if one did.
    pub stop_string: Option<String>,
    pub timings: Timings,
}

#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error("prompt of {prompt} tokens does not fit the {ctx}-token context (at least one token must be generated)")]
    PromptTooLong { prompt: usize, ctx: usize },
    #[error("empty prompt")]
    EmptyPrompt,
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The forward pass of a batch failed; every sequence in it gets the
    /// same message.
    #[error("the forward pass of the batch failed: {0}")]
    BatchFailed(String),
}

/// Log-probabilities of one sampled token under the model's distribution
/// (before temperature and truncation).
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    pub logprob: f32,
    /// The most likely tokens and their log-probabilities, best first.
    pub top: Vec<(u32, f32)>,
}

/// One sampled token as the engine streams it.
#[derive(Clone, Debug)]
pub struct TokenStep<'a> {
    pub token: u32,
    /// Text that became final with this token (may be empty: held back by
    /// an incomplete character or a possible stop string).
    pub text: &'a str,
    pub logprobs: Option<TokenLogprobs>,
}

/// Options beyond [`GenerateRequest`] that only streaming callers use.
#[derive(Clone, Copy, Debug, Default)]
pub struct StreamOptions {
    /// Compute log-probabilities with this many alternatives per token.
    pub logprobs: Option<usize>,
}

/// Run one generation on `seq`. The longest common prefix of the
/// sequence's tokens and the prompt is reused; the rest is recomputed.
/// `on_text` receives text as it becomes final; returning `Break` cancels.
pub fn generate<B: Backend>(
    lm: &LoadedModel<B>,
    seq: &mut Sequence<B>,
    req: &GenerateRequest,
    on_text: &mut dyn FnMut(&str) -> ControlFlow<()>,
) -> Result<Generation, GenerateError> {
    let mut on_step = |s: &TokenStep<'_>| {
        if s.text.is_empty() {
            ControlFlow::Continue(())
        } else {
            on_text(s.text)
        }
    };
    generate_stream(lm, seq, req, StreamOptions::default(), &mut on_step)
}

/// [`generate`] reporting every sampled token (with its log-probabilities
/// when asked); text held back at the end arrives as a final step whose
/// token is the last one sampled. Returning `Break` cancels.
pub fn generate_stream<B: Backend>(
    lm: &LoadedModel<B>,
    seq: &mut Sequence<B>,
    req: &GenerateRequest,
    opts: StreamOptions,
    on_step: &mut dyn FnMut(&TokenStep<'_>) -> ControlFlow<()>,
) -> Result<Generation, GenerateError> {
    let prompt = &req.prompt;
    if prompt.is_empty() {
        return Err(GenerateError::EmptyPrompt);
    }
    if prompt.len() >= seq.ctx() {
        return Err(GenerateError::PromptTooLong {
            prompt: prompt.len(),
            ctx: seq.ctx(),
        });
    }
    let be = &lm.backend;
    let t0 = Instant::now();
    // Keep the shared prefix, but always recompute the last prompt token:
    // its logits are what the first generated token is sampled from.
    let shared = seq
        .tokens()
        .iter()
        .zip(prompt)
        .take_while(|(a, b)| a == b)
        .count();
    let reuse = shared.min(prompt.len() - 1);
    seq.truncate(reuse);
    let mut logits = Vec::new();
    for chunk in prompt[reuse..].chunks(PREFILL_CHUNK) {
        logits = lm.model.forward(be, seq, chunk, Logits::Last)?;
    }
    let mut timings = Timings {
        prompt_tokens: prompt.len(),
        cached_tokens: reuse,
        ..Default::default()
    };

    let mut dec = Decoding::new(&lm.chat.tokenizer, req, opts);
    let mut t_decode = None;
    loop {
        let room = seq.tokens().len() + 1 < seq.ctx();
        let next = dec.step(&logits, room, on_step);
        if t_decode.is_none() {
            timings.prefill_ms = t0.elapsed().as_secs_f64() * 1e3;
            t_decode = Some(Instant::now());
        }
        let Next::Feed(token) = next else { break };
        logits = lm.model.forward(be, seq, &[token], Logits::Last)?;
    }
    timings.decode_ms = t_decode.map_or(0.0, |t| t.elapsed().as_secs_f64() * 1e3);
    Ok(dec.finish(timings, on_step))
}

/// What to do after a sampled token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Run this token and sample again from its logits.
    Feed(u32),
    /// The generation is over ([`Decoding::finish`] gives the result).
    Finished,
}

/// The token-by-token half of a generation, independent of how logits are
/// computed: sampling, stop tokens and strings, the token limit, streamed
/// text. The engine keeps one per live sequence.
pub struct Decoding<'t> {
    sampler: Sampler,
    /// The grammar's mask for the next token, being computed while the
    /// logits are.
    grammar: Option<NextMask>,
    /// The logits with the grammar's mask applied (reused).
    masked: Vec<f32>,
    stops: StopMatcher,
    decoder: StreamDecoder<'t>,
    stop_tokens: &'t [u32],
    logprobs: Option<usize>,
    max_tokens: usize,
    out: Generation,
}

impl<'t> Decoding<'t> {
    pub fn new(tokenizer: &'t Tokenizer, req: &GenerateRequest, opts: StreamOptions) -> Self {
        Decoding {
            sampler: Sampler::new(req.sampling.clone()),
            grammar: req.constraint.clone().map(Constraint::next_mask),
            masked: Vec::new(),
            stops: StopMatcher::new(req.stop.clone()),
            decoder: StreamDecoder::new(tokenizer),
            stop_tokens: if req.ignore_eos {
                &[]
            } else {
                tokenizer.stop_tokens()
            },
            logprobs: opts.logprobs,
            max_tokens: req.max_tokens,
            out: Generation {
                tokens: Vec::new(),
                text: String::new(),
                finish: FinishReason::Length,
                stop_string: None,
                timings: Timings::default(),
            },
        }
    }

    /// Tokens sampled so far (the stop token excluded).
    pub fn tokens(&self) -> &[u32] {
        &self.out.tokens
    }

    /// Sample from `logits` and report the token through `on_step`; `room`
    /// says whether the context can take the sampled token and produce
    /// another one. `on_step` returning `Break` cancels.
    pub fn step(
        &mut self,
        logits: &[f32],
        room: bool,
        on_step: &mut dyn FnMut(&TokenStep<'_>) -> ControlFlow<()>,
    ) -> Next {
        let out = &mut self.out;
        let mut constraint = None;
        let token = match self.grammar.take() {
            None => self.sampler.sample(logits),
            Some(next) => match next.wait() {
                Ok((c, allowed)) => {
                    constraint = Some(c);
                    Constraint::mask_into(&allowed, logits, &mut self.masked);
                    self.sampler.sample(&self.masked)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the grammar cannot go on; the answer ends here");
                    out.finish = FinishReason::GrammarError;
                    return Next::Finished;
                }
            },
        };
        if self.stop_tokens.contains(&token) {
            out.finish = FinishReason::Stop;
            return Next::Finished;
        }
        if let Some(c) = &mut constraint {
            if let Err(e) = c.commit(token) {
                tracing::warn!(error = %e, token, "the grammar refused a sampled token");
                out.finish = FinishReason::GrammarError;
                return Next::Finished;
            }
        }
        out.tokens.push(token);
        let lp = self.logprobs.map(|k| token_logprobs(logits, token, k));
        let piece = self.decoder.push(token);
        match self.stops.push(&piece) {
            StopEvent::Text(t) => {
                out.text.push_str(&t);
                let step = TokenStep {
                    token,
                    text: &t,
                    logprobs: lp,
                };
                if on_step(&step).is_break() {
                    out.finish = FinishReason::Cancelled;
                    return Next::Finished;
                }
            }
            StopEvent::Stopped { text, stop } => {
                out.text.push_str(&text);
                out.stop_string = Some(stop);
                let _ = on_step(&TokenStep {
                    token,
                    text: &text,
                    logprobs: lp,
                });
                out.finish = FinishReason::Stop;
                return Next::Finished;
            }
        }
        if constraint.as_ref().is_some_and(Constraint::is_complete) {
            // Nothing but a stop token could follow.
            out.finish = FinishReason::Stop;
            return Next::Finished;
        }
        if out.tokens.len() >= self.max_tokens || !room {
            out.finish = FinishReason::Length;
            return Next::Finished;
        }
        self.grammar = constraint.map(Constraint::next_mask);
        Next::Feed(token)
    }

    /// Mark the generation cancelled (its client went away).
    pub fn cancel(&mut self) {
        self.out.finish = FinishReason::Cancelled;
    }

    /// The finished generation: text held back (an incomplete character,
    /// a possible stop string) is flushed as a last step unless a stop
    /// ended it; `timings` gets the generated token count.
    pub fn finish(
        mut self,
        mut timings: Timings,
        on_step: &mut dyn FnMut(&TokenStep<'_>) -> ControlFlow<()>,
    ) -> Generation {
        let out = &mut self.out;
        if out.finish != FinishReason::Stop {
            let rest = self.decoder.finish() + &self.stops.finish();
            if !rest.is_empty() {
                out.text.push_str(&rest);
                if let Some(&token) = out.tokens.last() {
                    let _ = on_step(&TokenStep {
                        token,
                        text: &rest,
                        logprobs: None,
                    });
                }
            }
        }
        timings.generated_tokens = out.tokens.len() + usize::from(out.finish == FinishReason::Stop);
        out.timings = timings;
        self.out
    }
}

/// Log-softmax of `logits` at `token`, plus the `k` most likely tokens.
pub fn token_logprobs(logits: &[f32], token: u32, k: usize) -> TokenLogprobs {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
    let log_z = max + sum.ln() as f32;
    let lp = |i: usize| logits[i] - log_z;
    let mut top: Vec<(u32, f32)> = Vec::new();
    if k > 0 {
        let mut idx: Vec<usize> = (0..logits.len()).collect();
        let k = k.min(idx.len());
        idx.select_nth_unstable_by(k - 1, |&a, &b| logits[b].total_cmp(&logits[a]));
        idx.truncate(k);
        idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        top = idx.into_iter().map(|i| (i as u32, lp(i))).collect();
    }
    TokenLogprobs {
        logprob: lp(token as usize),
        top,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_are_a_log_softmax_with_sorted_alternatives() {
        let l = [1.0f32, 3.0, 2.0, 0.0];
        let t = token_logprobs(&l, 2, 2);
        let z: f32 = l.iter().map(|x| x.exp()).sum();
        assert!((t.logprob - (2.0f32.exp() / z).ln()).abs() < 1e-5);
        assert_eq!(t.top.iter().map(|x| x.0).collect::<Vec<_>>(), vec![1, 2]);
        assert!(token_logprobs(&l, 0, 0).top.is_empty());
    }
}

//! Constrained decoding: an answer held to a JSON schema, a Lark grammar
//! or a regular expression, token by token, with llguidance (the engine
//! behind llama.cpp's and vLLM's llguidance backends).
//!
//! [`Grammars`] is built once per loaded model (the vocabulary as a token
//! trie, [`vocab`]); [`Grammars::compile`] turns a request's [`Spec`]
//! into a [`Constraint`] before the request is queued, so a schema that
//! does not compile is the client's 400, not a failed generation. A
//! family that thinks keeps its reasoning free: the grammar starts after
//! the reasoning's closing delimiter. The engine asks the constraint for
//! the tokens allowed next, samples among them, and commits the token;
//! the answer ends when the grammar is complete.
//!
//! A mask is computed off the engine thread: [`Constraint::next_mask`]
//! hands the constraint to a small pool of grammar threads as soon as a
//! token is committed (the first one as the request is admitted), so the
//! masks of every constrained stream of a step are computed together,
//! while the forward pass that produces the step's logits runs; the
//! engine waits only for a mask not ready by then.
//!
//! A JSON schema is held to bounded whitespace and number digits
//! ([`json_bounds`]), so a sampled answer cannot loop until its limit.

mod json_bounds;
mod vocab;

use std::fmt;
use std::sync::mpsc;
use std::sync::{Arc, OnceLock};

use ds4_model::chat::Delimiters;
use ds4_model::tokenizer::Tokenizer;
use llguidance::api::{GrammarWithLexer, TopLevelGrammar};
use llguidance::toktrie::{SimpleVob, TokEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;

/// What an answer must match.
#[derive(Clone, Debug, PartialEq)]
pub enum Spec {
    /// A JSON value valid against this schema (`{"type": "object"}`: any
    /// object).
    JsonSchema(Value),
    /// A grammar in llguidance's Lark dialect.
    Lark(String),
    /// A regular expression (Rust `regex` syntax) matching the whole answer.
    Regex(String),
}

impl Spec {
    /// Any JSON object (`response_format: json_object`).
    pub fn json_object() -> Spec {
        Spec::JsonSchema(serde_json::json!({"type": "object"}))
    }

    fn grammar(&self, name: &str) -> GrammarWithLexer {
        let mut g = match self {
            Spec::JsonSchema(s) => GrammarWithLexer::from_json_schema(json_bounds::bounded(s)),
            Spec::Lark(l) => GrammarWithLexer::from_lark(l.clone()),
            Spec::Regex(r) => GrammarWithLexer::from_regex(r),
        };
        g.name = Some(name.to_string());
        g
    }
}

/// A grammar the library refused, with its reason.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{0}")]
pub struct GrammarError(pub String);

/// Grammar compilation for one loaded model.
pub struct Grammars {
    factory: Arc<ParserFactory>,
}

impl fmt::Debug for Grammars {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Grammars")
    }
}

impl Grammars {
    /// The grammar compiler for `tokenizer`'s vocabulary (a few hundred
    /// milliseconds for a large vocabulary: build once per model).
    pub fn new(tokenizer: Arc<Tokenizer>) -> Result<Grammars, GrammarError> {
        let env: TokEnv = Arc::new(vocab::VocabEnv::new(tokenizer));
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| GrammarError(e.to_string()))?;
        // Errors reach the client; nothing goes to stderr.
        factory.quiet();
        Ok(Grammars {
            factory: Arc::new(factory),
        })
    }

    /// The constraint for an answer matching `spec`. With `reasoning`
    /// (a family that thinks), the reasoning before the closing delimiter
    /// is free and the grammar applies to what follows it.
    /// `content` is a grammar `spec` may name as `@content`.
    pub fn compile(
        &self,
        spec: &Spec,
        content: Option<&Spec>,
        reasoning: Option<&Delimiters>,
    ) -> Result<Constraint, GrammarError> {
        let mut grammars = Vec::new();
        if let Some(d) = reasoning {
            grammars.push(GrammarWithLexer::from_lark(reasoning_then_answer(d)));
        }
        grammars.push(spec.grammar("answer"));
        grammars.extend(content.map(|c| c.grammar("content")));
        let grammar = TopLevelGrammar {
            grammars,
            max_tokens: None,
        };
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| GrammarError(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(GrammarError(e));
        }
        Ok(Constraint { matcher })
    }
}

/// A Lark grammar: free reasoning up to its closing delimiter (opened by
/// the model unless the prompt opened it), then the grammar `@answer`.
fn reasoning_then_answer(d: &Delimiters) -> String {
    let lit = |s: &str| serde_json::to_string(s).unwrap_or_default();
    let think = format!("think[suffix={}]: /(.|\\n)*/", lit(d.close));
    if d.starts_inside {
        format!("start: think @answer\n{think}\n")
    } else {
        format!("start: ({} think)? @answer\n{think}\n", lit(d.open))
    }
}

/// One answer's grammar state.
#[derive(Clone)]
pub struct Constraint {
    matcher: Matcher,
}

impl fmt::Debug for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Constraint")
            .field("stopped", &self.matcher.is_stopped())
            .finish()
    }
}

impl Constraint {
    /// The tokens the grammar allows next (the stop tokens once it is
    /// complete).
    pub fn allowed(&mut self) -> Result<SimpleVob, GrammarError> {
        self.matcher
            .compute_mask_or_eos()
            .map_err(|e| GrammarError(e.to_string()))
    }

    /// Advance past a sampled token.
    pub fn commit(&mut self, token: u32) -> Result<(), GrammarError> {
        self.matcher
            .consume_token(token)
            .map_err(|e| GrammarError(e.to_string()))
    }

    /// Whether the answer is complete (nothing but a stop token may follow).
    pub fn is_complete(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// Compute the tokens allowed next on the grammar threads; the
    /// constraint comes back with them.
    pub fn next_mask(mut self) -> NextMask {
        let (tx, rx) = mpsc::sync_channel(1);
        grammar_pool().spawn(move || {
            let allowed = self.allowed();
            let _ = tx.send((self, allowed));
        });
        NextMask(rx)
    }

    /// Set `out` to `logits` with every token the grammar does not allow
    /// at minus infinity (`out` is reused between steps).
    pub fn mask_into(allowed: &SimpleVob, logits: &[f32], out: &mut Vec<f32>) {
        out.clear();
        out.resize(logits.len(), f32::NEG_INFINITY);
        allowed.iter_set_entries(|i| {
            if let Some(&l) = logits.get(i) {
                out[i] = l;
            }
        });
    }
}

/// A mask being computed on the grammar threads, with its constraint.
#[derive(Debug)]
pub struct NextMask(mpsc::Receiver<(Constraint, Result<SimpleVob, GrammarError>)>);

impl NextMask {
    /// The constraint and the tokens it allows next (waits for them).
    pub fn wait(self) -> Result<(Constraint, SimpleVob), GrammarError> {
        let (c, allowed) = self
            .0
            .recv()
            .map_err(|_| GrammarError("the grammar thread failed".into()))?;
        Ok((c, allowed?))
    }
}

/// The grammar threads: a few, apart from the compute threads (a mask
/// takes tens to hundreds of microseconds; a step has one per
/// constrained stream).
fn grammar_pool() -> &'static rayon::ThreadPool {
    static POOL: OnceLock<rayon::ThreadPool> = OnceLock::new();
    POOL.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        rayon::ThreadPoolBuilder::new()
            .num_threads((cores / 4).clamp(2, 8))
            .thread_name(|i| format!("ds4-grammar-{i}"))
            .build()
            .expect("the grammar threads start")
    })
}

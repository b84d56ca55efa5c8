//! Prefix reuse that survives re-tokenization. A client sends the model's
//! own answer back in the next request's history; rendered again, that
//! text does not always tokenize into the tokens the model sampled ("Hel"
//! "lo" sampled, "Hello" when the text is tokenized), and the KV cache,
//! indexed by tokens, would be lost from the first differing token on.
//!
//! [`Seams`] remembers the token sequences the engine computed recently
//! (each prompt with its answer). A new prompt is tokenized as usual;
//! when a remembered sequence covers a longer prefix of its rendered
//! bytes than the new tokens share with it, the prompt becomes that
//! sequence's tokens up to the last whole token inside the common bytes,
//! followed by the rest of the text tokenized from there. The model reads
//! the same bytes either way; only the seam between the two parts is not
//! where a tokenizer would put it. Shallow or unrelated prompts keep their
//! own tokens.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use crate::tokenizer::{Tokenizer, TokenizerError};

/// Sequences remembered at most.
const MAX_SEQUENCES: usize = 64;

/// Tokens remembered at most, over all sequences (4 bytes each).
const MAX_TOKENS: usize = 8 << 20;

/// Recently computed token sequences, most recent first.
#[derive(Debug, Default)]
pub struct Seams {
    inner: Mutex<Remembered>,
}

#[derive(Debug, Default)]
struct Remembered {
    seqs: VecDeque<Arc<[u32]>>,
    tokens: usize,
}

/// Where a remembered sequence's bytes stop matching a text.
struct Match {
    seq: Arc<[u32]>,
    /// Tokens of `seq` whose bytes the text starts with (lead included).
    tokens: usize,
    /// Bytes of text those tokens cover.
    bytes: usize,
}

impl Seams {
    pub fn new() -> Seams {
        Seams::default()
    }

    /// Remember a computed sequence (a prompt and the tokens generated
    /// after it). A remembered sequence it extends is dropped.
    pub fn remember(&self, tokens: &[u32]) {
        if tokens.is_empty() || tokens.len() > MAX_TOKENS {
            return;
        }
        let mut r = self.inner.lock().expect("seams");
        let mut i = 0;
        while i < r.seqs.len() {
            let s = &r.seqs[i];
            if tokens.starts_with(s) || s.starts_with(tokens) {
                let gone = r.seqs.remove(i).map_or(0, |s| s.len());
                r.tokens -= gone;
            } else {
                i += 1;
            }
        }
        r.seqs.push_front(tokens.into());
        r.tokens += tokens.len();
        while r.seqs.len() > MAX_SEQUENCES || r.tokens > MAX_TOKENS {
            let gone = r.seqs.pop_back().map_or(0, |s| s.len());
            r.tokens -= gone;
        }
    }

    /// How many sequences are remembered.
    pub fn len(&self) -> usize {
        self.inner.lock().expect("seams").seqs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `text`'s tokens (special tokens recognised; BOS/EOS as
    /// `add_special` and the model say), starting with a remembered
    /// sequence's tokens where that covers more of the text than the
    /// text's own tokens share with it.
    pub fn encode(
        &self,
        tok: &Tokenizer,
        text: &str,
        add_special: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        let own = tok.encode_with(text, true, add_special)?;
        let lead: Vec<u32> = tok
            .bos()
            .filter(|_| add_special && tok.add_bos())
            .into_iter()
            .collect();
        let Some(m) = self.longest(tok, &lead, text) else {
            return Ok(own);
        };
        let shared = own
            .iter()
            .zip(m.seq.iter())
            .take_while(|(a, b)| a == b)
            .count();
        if m.tokens <= shared {
            return Ok(own);
        }
        let mut out = m.seq[..m.tokens].to_vec();
        out.extend(tok.encode_with(&text[m.bytes..], true, false)?);
        if add_special && tok.add_eos() {
            out.extend(tok.eos());
        }
        Ok(out)
    }

    /// The remembered sequence whose bytes cover the longest prefix of
    /// `text` (ending on a character boundary), if any covers a byte; it
    /// becomes the most recent.
    fn longest(&self, tok: &Tokenizer, lead: &[u32], text: &str) -> Option<Match> {
        // Walked outside the lock: the engine thread remembers sequences
        // while prompts are tokenized.
        let seqs: Vec<Arc<[u32]>> = self
            .inner
            .lock()
            .expect("seams")
            .seqs
            .iter()
            .cloned()
            .collect();
        let mut best: Option<Match> = None;
        for seq in seqs {
            if !seq.starts_with(lead) {
                continue;
            }
            let (tokens, bytes) = covered(tok, &seq, lead.len(), text);
            if bytes > 0 && best.as_ref().is_none_or(|b| bytes > b.bytes) {
                best = Some(Match { seq, tokens, bytes });
            }
        }
        let m = best?;
        let mut r = self.inner.lock().expect("seams");
        if let Some(i) = r.seqs.iter().position(|s| Arc::ptr_eq(s, &m.seq)) {
            if let Some(s) = r.seqs.remove(i) {
                r.seqs.push_front(s);
            }
        }
        Some(m)
    }
}

/// How many tokens of `seq` (from `from` on) `text` starts with, and the
/// bytes they cover, stopping at the last token that ends on a character
/// boundary.
fn covered(tok: &Tokenizer, seq: &[u32], from: usize, text: &str) -> (usize, usize) {
    let b = text.as_bytes();
    let (mut pos, mut good) = (0, (from, 0));
    for (i, &t) in seq.iter().enumerate().skip(from) {
        let piece = tok.token_bytes(t);
        if piece.is_empty() || !b[pos..].starts_with(piece) {
            break;
        }
        pos += piece.len();
        if text.is_char_boundary(pos) {
            good = (i + 1, pos);
        }
    }
    good
}

//! The loaded model's vocabulary as llguidance sees it: every token's
//! bytes in a token trie (control tokens marked as special, so grammars
//! name them `<|im_end|>`-style and never produce them from text), the
//! model's stop tokens as end-of-sequence, and the model's own tokenizer
//! for the canonical tokenization of forced text.

use std::sync::Arc;

use ds4_model::tokenizer::Tokenizer;
use llguidance::toktrie::{TokRxInfo, TokTrie, TokenId, TokenizerEnv};

pub(crate) struct VocabEnv {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl VocabEnv {
    pub(crate) fn new(tokenizer: Arc<Tokenizer>) -> VocabEnv {
        let n = tokenizer.vocab_size();
        let words: Vec<Vec<u8>> = (0..n as u32)
            .map(|id| {
                let bytes = tokenizer.token_bytes(id);
                if tokenizer.is_control(id) {
                    // llguidance's marker for special tokens.
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend_from_slice(tokenizer.token_str(id).unwrap_or_default().as_bytes());
                    w
                } else {
                    bytes.to_vec()
                }
            })
            .collect();
        let stops = tokenizer.stop_tokens();
        // The token a chat turn ends with; every stop token ends a grammar.
        let eos = tokenizer
            .eot()
            .or(tokenizer.eos())
            .or(stops.first().copied())
            .unwrap_or(0);
        let info = TokRxInfo {
            vocab_size: n as u32,
            tok_eos: eos,
            tok_bos: tokenizer.bos(),
            tok_pad: tokenizer.pad(),
            tok_unk: tokenizer.unk(),
            tok_end_of_turn: tokenizer.eot(),
        };
        let mut eos_tokens = vec![eos];
        eos_tokens.extend(stops.iter().copied().filter(|&t| t != eos));
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&eos_tokens);
        VocabEnv { trie, tokenizer }
    }
}

impl TokenizerEnv for VocabEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// The model's own tokenization of text (special tokens as text);
    /// bytes that are not UTF-8 fall back to the longest trie matches.
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        match std::str::from_utf8(s) {
            Ok(text) => self
                .tokenizer
                .encode_with(text, false, false)
                .unwrap_or_else(|_| self.trie.greedy_tokenize(s)),
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}

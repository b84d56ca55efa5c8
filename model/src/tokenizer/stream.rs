//! Incremental detokenization for streaming: a byte-level token may end in
//! the middle of a UTF-8 character (emoji and CJK are often split over two
//! or three tokens), so text is handed out only up to the last complete
//! character, and the tail is held until the next token completes it.

use super::Tokenizer;

/// Push token ids, get back the text they complete.
///
/// Invariant: the concatenation of everything `push` and `finish` return is
/// `String::from_utf8_lossy` of the concatenated token bytes, i.e. what
/// [`Tokenizer::decode`] returns for the same ids.
#[derive(Debug)]
pub struct StreamDecoder<'a> {
    tokenizer: &'a Tokenizer,
    /// Bytes of an incomplete UTF-8 sequence at the end (at most 3).
    pending: Vec<u8>,
}

impl<'a> StreamDecoder<'a> {
    pub fn new(tokenizer: &'a Tokenizer) -> StreamDecoder<'a> {
        StreamDecoder {
            tokenizer,
            pending: Vec::new(),
        }
    }

    /// Add one token; returns the text completed by it (possibly empty).
    pub fn push(&mut self, id: u32) -> String {
        self.pending
            .extend_from_slice(self.tokenizer.token_bytes(id));
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    out.push_str(std::str::from_utf8(valid).expect("checked by valid_up_to"));
                    match e.error_len() {
                        // Invalid bytes: replace them, as a lossy decode does.
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[n..];
                        }
                        // An incomplete character at the end: wait for more.
                        None => {
                            rest = after;
                            break;
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        let start = self.pending.len() - keep;
        self.pending.drain(..start);
        out
    }

    /// Whether bytes of an unfinished character are being held.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// End of stream: whatever is held, with an unfinished character
    /// replaced by U+FFFD.
    pub fn finish(self) -> String {
        String::from_utf8_lossy(&self.pending).into_owned()
    }
}

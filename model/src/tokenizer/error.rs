//! Typed errors of the tokenizer: every variant names the metadata key or
//! value that was wrong, what was expected, and what to do about it.

/// Why a tokenizer could not be built from GGUF metadata, or could not
/// encode a text.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("GGUF metadata has no `{key}`; the file carries no usable tokenizer (re-convert the model with a current llama.cpp convert_hf_to_gguf.py)")]
    MissingKey { key: &'static str },

    #[error("GGUF metadata `{key}` is {found}, expected {expected}")]
    WrongType {
        key: &'static str,
        expected: &'static str,
        found: String,
    },

    #[error("GGUF metadata `{key}`[{index}] is {found}, expected {expected}")]
    WrongElementType {
        key: &'static str,
        index: usize,
        expected: &'static str,
        found: &'static str,
    },

    #[error("GGUF metadata `{key}` has {found} entries but the vocabulary has {expected} tokens")]
    LengthMismatch {
        key: &'static str,
        expected: usize,
        found: usize,
    },

    #[error("tokenizer.ggml.model = `{model}` is not supported (supported: {supported})")]
    UnsupportedModel {
        model: String,
        supported: &'static str,
    },

    #[error("tokenizer.ggml.pre = `{pre}` is not a known pre-tokenizer (known: {known}); add its split expressions to tokenizer/pretokenizer.rs")]
    UnknownPreTokenizer { pre: String, known: String },

    #[error("the vocabulary `tokenizer.ggml.tokens` is empty")]
    EmptyVocab,

    #[error("the vocabulary has {count} tokens, more than token ids (u32) can address")]
    VocabTooLarge { count: usize },

    #[error(
        "token `{text}` appears twice in `tokenizer.ggml.tokens`, as ids {first} and {second}"
    )]
    DuplicateToken {
        text: String,
        first: u32,
        second: u32,
    },

    #[error("`{key}` = {id} is out of range for a vocabulary of {vocab_size} tokens")]
    IdOutOfRange {
        key: &'static str,
        id: u64,
        vocab_size: usize,
    },

    #[error("`{flag}` is true but `{id_key}` is not set")]
    MissingSpecialToken {
        flag: &'static str,
        id_key: &'static str,
    },

    #[error("`tokenizer.ggml.merges`[{index}] = {merge:?} is not two tokens separated by a space")]
    BadMerge { index: usize, merge: String },

    #[error("`tokenizer.ggml.merges`[{index}] = {merge:?} uses `{token}`, which is not in the vocabulary")]
    MergeNotInVocab {
        index: usize,
        merge: String,
        token: String,
    },

    #[error("pre-tokenizer `{pre}`: split expression {pattern:?} does not compile: {message}")]
    Regex {
        pre: &'static str,
        pattern: &'static str,
        message: String,
    },

    #[error("BPE model could not be built: {message}")]
    Bpe { message: String },

    #[error("encoding failed: {message}")]
    Encode { message: String },
}

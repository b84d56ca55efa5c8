//! Pre-tokenizers: how a text is cut into words before BPE runs on each.
//!
//! One variant per `tokenizer.ggml.pre` family, each a list of split
//! expressions applied in order. Every expression splits every piece left by
//! the previous one; both the matches and the text between matches are kept
//! as pieces (Hugging Face's `Split` with `Isolated` behaviour), and a piece
//! is matched on its own, so look-aheads never see past its end. This is
//! llama.cpp's `unicode_regex_split` (`src/unicode.cpp`); the expressions are
//! those of llama.cpp's `llm_tokenizer_bpe` (`src/llama-vocab.cpp`), which
//! are the `tokenizer.json` expressions with `(?i:...)` spelled out.

use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::SplitDelimiterBehavior;

use super::TokenizerError;

/// GPT-2's word expression (also the second step of `smollm`).
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

/// Llama 3's expression: case-insensitive contractions, up to three digits
/// per word, newlines kept with the punctuation before them.
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen 2's expression: Llama 3's with one digit per word.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// DeepSeek V3's word expression (after digits and CJK runs are split off).
const DEEPSEEK3_WORDS: &str = r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##;

/// The pre-tokenizer families this crate knows, chosen by `tokenizer.ggml.pre`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreTokenizerKind {
    /// `gpt-2`, `phi-2`: the GPT-2 expression alone.
    Gpt2,
    /// `smollm`, `starcoder`, `refact`, `codeshell`: every digit on its
    /// own, then the GPT-2 expression.
    Smollm,
    /// `llama3`, `llama-v3`, `llama-bpe`: the Llama 3 expression; a word
    /// that is itself a token skips the merges; BOS added by default.
    Llama3,
    /// `qwen2`, `deepseek-r1-qwen`: the Qwen 2 expression.
    Qwen2,
    /// `deepseek-v3`, and `joyai-llm` (the name DeepSeek V4's GGUFs
    /// declare; the same three splits): up to three digits, CJK runs, then
    /// DeepSeek's words.
    DeepseekV3,
}

/// Name accepted in `tokenizer.ggml.pre` -> family. Aliases are those that
/// llama.cpp gives the same expressions and flags that this tokenizer models.
const NAMES: &[(&str, PreTokenizerKind)] = &[
    ("gpt-2", PreTokenizerKind::Gpt2),
    ("phi-2", PreTokenizerKind::Gpt2),
    ("smollm", PreTokenizerKind::Smollm),
    ("starcoder", PreTokenizerKind::Smollm),
    ("refact", PreTokenizerKind::Smollm),
    ("codeshell", PreTokenizerKind::Smollm),
    ("llama3", PreTokenizerKind::Llama3),
    ("llama-v3", PreTokenizerKind::Llama3),
    ("llama-bpe", PreTokenizerKind::Llama3),
    ("qwen2", PreTokenizerKind::Qwen2),
    ("deepseek-r1-qwen", PreTokenizerKind::Qwen2),
    ("deepseek-v3", PreTokenizerKind::DeepseekV3),
    ("joyai-llm", PreTokenizerKind::DeepseekV3),
];

impl PreTokenizerKind {
    /// The family for a `tokenizer.ggml.pre` value; an unknown value is an
    /// error naming it.
    pub fn from_gguf_name(pre: &str) -> Result<PreTokenizerKind, TokenizerError> {
        NAMES
            .iter()
            .find(|(name, _)| *name == pre)
            .map(|&(_, kind)| kind)
            .ok_or_else(|| TokenizerError::UnknownPreTokenizer {
                pre: pre.to_string(),
                known: NAMES.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", "),
            })
    }

    /// A short name for messages.
    pub fn name(self) -> &'static str {
        match self {
            PreTokenizerKind::Gpt2 => "gpt-2",
            PreTokenizerKind::Smollm => "smollm",
            PreTokenizerKind::Llama3 => "llama3",
            PreTokenizerKind::Qwen2 => "qwen2",
            PreTokenizerKind::DeepseekV3 => "deepseek-v3",
        }
    }

    /// The split expressions, applied in order.
    pub fn expressions(self) -> &'static [&'static str] {
        match self {
            PreTokenizerKind::Gpt2 => &[GPT2],
            PreTokenizerKind::Smollm => &[r"\p{N}", GPT2],
            PreTokenizerKind::Llama3 => &[LLAMA3],
            PreTokenizerKind::Qwen2 => &[QWEN2],
            PreTokenizerKind::DeepseekV3 => &[r"\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+", DEEPSEEK3_WORDS],
        }
    }

    /// Whether a word that is already a token is emitted whole, without
    /// running the merges (llama.cpp's `ignore_merges`).
    pub fn ignore_merges(self) -> bool {
        matches!(self, PreTokenizerKind::Llama3)
    }

    /// Whether BOS is added when `tokenizer.ggml.add_bos_token` is absent.
    pub fn default_add_bos(self) -> bool {
        matches!(self, PreTokenizerKind::Llama3)
    }

    /// The pre-tokenizer pipeline: the split expressions, then the GPT-2
    /// byte-to-character mapping that byte-level BPE vocabularies are
    /// written in.
    pub(crate) fn build(self) -> Result<PreTokenizerWrapper, TokenizerError> {
        let mut steps = Vec::new();
        for &pattern in self.expressions() {
            let split = Split::new(
                SplitPattern::Regex(pattern.to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| TokenizerError::Regex {
                pre: self.name(),
                pattern,
                message: e.to_string(),
            })?;
            steps.push(PreTokenizerWrapper::Split(split));
        }
        steps.push(PreTokenizerWrapper::ByteLevel(ByteLevel::new(
            false, false, false,
        )));
        Ok(PreTokenizerWrapper::Sequence(Sequence::new(steps)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

    fn words(kind: PreTokenizerKind, text: &str) -> Vec<String> {
        let pre = kind.build().unwrap();
        let mut pts = PreTokenizedString::from(text);
        pre.pre_tokenize(&mut pts).unwrap();
        pts.get_splits(OffsetReferential::Original, OffsetType::None)
            .into_iter()
            .map(|(s, _, _)| s.to_string())
            .collect()
    }

    #[test]
    fn every_family_compiles() {
        for &(_, kind) in NAMES {
            kind.build().unwrap();
        }
    }

    #[test]
    fn unknown_name_is_named_in_the_error() {
        let err = PreTokenizerKind::from_gguf_name("tekken").unwrap_err();
        assert!(matches!(&err, TokenizerError::UnknownPreTokenizer { pre, .. } if pre == "tekken"));
        assert!(err.to_string().contains("`tekken`"));
    }

    #[test]
    fn smollm_splits_digits_and_keeps_gaps() {
        // Words are shown byte-level encoded: 'Ġ' is a space, 'Ċ' a newline.
        assert_eq!(
            words(PreTokenizerKind::Smollm, "a 123"),
            ["a", "Ġ", "1", "2", "3"]
        );
        assert_eq!(
            words(PreTokenizerKind::Smollm, "I'm  ok\n"),
            ["I", "'m", "Ġ", "Ġok", "Ċ"]
        );
    }

    #[test]
    fn llama3_groups_three_digits() {
        assert_eq!(
            words(PreTokenizerKind::Llama3, "12345 ok"),
            ["123", "45", "Ġok"]
        );
        assert_eq!(words(PreTokenizerKind::Qwen2, "123"), ["1", "2", "3"]);
    }
}

#[cfg(test)]
mod deepseek_tests {
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

    use super::PreTokenizerKind;

    /// Pieces of `text` as byte ranges of the original text.
    fn pieces(kind: PreTokenizerKind, text: &str) -> Vec<String> {
        let pre = kind.build().unwrap();
        let mut s = PreTokenizedString::from(text);
        pre.pre_tokenize(&mut s).unwrap();
        s.get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(_, (a, b), _)| text[a..b].to_string())
            .collect()
    }

    #[test]
    fn deepseek_v4_declares_joyai_llm() {
        assert_eq!(
            PreTokenizerKind::from_gguf_name("joyai-llm").unwrap(),
            PreTokenizerKind::DeepseekV3
        );
    }

    /// The three sequential splits of DeepSeek V4's tokenizer (spec §5.3).
    #[test]
    fn deepseek_v4_splits() {
        let k = PreTokenizerKind::DeepseekV3;
        // Punctuation keeps its trailing newlines.
        assert_eq!(pieces(k, "a>;\nb"), ["a", ">;\n", "b"]);
        // The last space of a run joins the next word.
        assert_eq!(pieces(k, "    int"), ["   ", " int"]);
        // Digits in runs of at most three.
        assert_eq!(pieces(k, "2048 is"), ["204", "8", " is"]);
        // CJK and kana runs are split off before the words.
        assert_eq!(pieces(k, "答案abc カナ"), ["答案", "abc", " ", "カナ"]);
        // One ASCII punctuation character glued to letters.
        assert_eq!(pieces(k, "x.foo(bar)"), ["x", ".foo", "(bar", ")"]);
        // A non-letter prefix character joins the letters after it.
        assert_eq!(pieces(k, "\tword"), ["\tword"]);
    }
}

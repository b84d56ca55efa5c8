//! Shared helpers of the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;

use ds4_model::gguf::GgufFile;
use ds4_model::tokenizer::Tokenizer;

/// The default model; see [`ds4_tests::model_path`].
pub use ds4_tests::model_path;

/// The default model's (SmolLM2's) tokenizer, built once per test binary.
pub fn smollm2_tokenizer() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let path = model_path();
        let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        Tokenizer::from_gguf(file.metadata()).expect("SmolLM2 tokenizer builds")
    })
}

/// A fixture file of this crate's tests.
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

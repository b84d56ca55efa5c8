//! Shared helpers of the deepseek4 tests: the generated miniature models
//! and the fixtures beside their generator.
#![allow(dead_code)]

use std::path::PathBuf;

/// The folder holding the miniature models (`DS4_TINY_DIR`, else the
/// default output folder of `scripts/gen-ds4-tiny.sh`).
pub fn tiny_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("DS4_TINY_DIR") {
        return PathBuf::from(d);
    }
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/ds4-tiny");
    assert!(
        d.join("ds4-tiny.gguf").exists(),
        "the miniature DeepSeek V4 model is missing: run ./scripts/gen-ds4-tiny.sh \
         (or ./scripts/test.sh), or set DS4_TINY_DIR to a folder holding ds4-tiny.gguf"
    );
    d
}

/// A miniature model made by `scripts/gen-ds4-tiny.sh` (`ds4-tiny.gguf`,
/// `ds4-tiny-b.gguf`).
pub fn tiny_model(file: &str) -> PathBuf {
    let p = tiny_dir().join(file);
    assert!(
        p.exists(),
        "{} is missing: run ./scripts/gen-ds4-tiny.sh (or ./scripts/test.sh)",
        p.display()
    );
    p
}

/// A file of `tests/fixtures/deepseek4/`.
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/deepseek4")
        .join(name)
}

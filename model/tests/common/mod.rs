//! Shared helpers of the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

const HINT: &str =
    "run ./scripts/fetch-model.sh from the repository root, or set DS4_TEST_MODEL to a GGUF file";

/// The default model: `DS4_TEST_MODEL`, else `ds4.gguf` in the repository
/// root. Tests that need it fail (never skip) when it is missing: the test
/// command fetches it first.
pub fn model_path() -> PathBuf {
    if let Some(p) = std::env::var_os("DS4_TEST_MODEL") {
        let p = PathBuf::from(p);
        assert!(
            p.exists(),
            "DS4_TEST_MODEL={} does not exist; {HINT}",
            p.display()
        );
        return p;
    }
    let mut dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    loop {
        let candidate = dir.join("ds4.gguf");
        if candidate.exists() {
            return candidate;
        }
        assert!(
            dir.pop(),
            "ds4.gguf not found above {}; {HINT}",
            env!("CARGO_MANIFEST_DIR")
        );
    }
}

/// A fixture file of this crate's tests.
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

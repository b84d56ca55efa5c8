//! Shared helpers of the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

/// The default model; see [`ds4_tests::model_path`].
pub use ds4_tests::model_path;

/// A fixture file of this crate's tests.
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

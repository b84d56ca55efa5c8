//! The inference worker: loads a model, generates, and serves HTTP.
//!
//! - [`runtime`]: a model ready to serve (weights, chat layer);
//! - [`generate`]: one generation with prefix reuse, stop handling and timings;
//! - [`sampler`], [`stop`]: token selection and stop strings;
//! - [`grammar`]: answers held to a JSON schema or grammar;
//! - [`engine`]: the single owner of the model that requests queue to;
//! - [`metrics`]: Prometheus metrics;
//! - [`api`]: the HTTP surfaces;
//! - [`weights`]: weights imported from the weight owner, or placed standalone.

pub mod api;
pub mod bench;
pub mod cli;
pub mod engine;
pub mod generate;
pub mod grammar;
pub mod metrics;
pub mod runtime;
pub mod sampler;
pub mod stop;
pub mod weights;

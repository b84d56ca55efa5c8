//! The inference worker: loads a model, generates, and serves HTTP.
//!
//! - [`runtime`]: a model ready to serve (weights, tokenizer, template);
//! - [`generate`]: one generation with prefix reuse, stop handling and timings;
//! - [`sampler`], [`stop`]: token selection and stop strings;
//! - [`engine`]: the single owner of the model that requests queue to;
//! - [`api`]: the HTTP surfaces.

pub mod api;
pub mod cli;
pub mod engine;
pub mod generate;
pub mod runtime;
pub mod sampler;
pub mod stop;

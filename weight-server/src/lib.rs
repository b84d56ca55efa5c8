//! The weight owner (`ds4-weight-server`).
//!
//! It will open a GGUF, validate its family, place the weights in CUDA VMM
//! or host shared memory, publish a manifest and hand region file
//! descriptors to workers. Nothing is implemented here yet; the crate
//! exists so that the workspace states the architecture.

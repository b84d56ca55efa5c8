//! Cross-process contracts of ds4.
//!
//! - [`control`]: the `ds4.control.v1` gRPC control plane between the
//!   weight owner (`ds4-weight-server`) and its workers (`ds4-server`),
//!   generated from `ds4/control/v1/control.proto` into `OUT_DIR`.
//! - [`manifest`]: the weight manifest (`ds4.weights.manifest/1`) the owner
//!   publishes and workers read.
//! - [`layout`]: the region plan and the identities, computed the same way
//!   by the owner and by a standalone worker, so both place every tensor at
//!   the same region and offset ([`layout::gguf`]: of a GGUF file).
//! - [`broker`]: the fd broker wire messages.
//! - [`client`]: connecting to the control plane (`unix:PATH` or `host:port`).
//! - [`auth`]: the control plane's shared secret on TCP (token file,
//!   bearer token, the owner's check).
//!
//! Every contract that crosses a process boundary lives here and nowhere
//! else; see `docs/contracts/`.

pub mod auth;
pub mod broker;
pub mod client;
pub mod layout;
pub mod manifest;

/// The generated `ds4.control.v1` types, client and server.
pub mod control {
    #![allow(clippy::all, missing_docs, unreachable_pub)]
    tonic::include_proto!("ds4.control.v1");
}

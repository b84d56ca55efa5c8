//! The weight owner (`ds4-weight-server`).
//!
//! [`owner::Owner::start`] ([`start`]) runs an owner from its settings to
//! its exit: it opens a GGUF, validates its family, plans regions
//! ([`plan`]), places the weights in CUDA VMM or sealed host memfds
//! ([`backend`]) while computing the content identity ([`load`]), then
//! (`serve`) starts the fd broker ([`broker`]) and the gRPC control
//! plane ([`grpc`], who may reach it: [`peer`], [`access`]) over the lease
//! book ([`owner`]), publishes the manifest and serves until a signal or a
//! drain. [`dryrun`] is the preflight,
//! [`notify`] the systemd protocol, [`progress`] the load display.

pub mod access;
pub mod backend;
pub mod broker;
pub mod dryrun;
pub mod grpc;
pub mod load;
pub mod notify;
pub mod owner;
pub mod peer;
pub mod plan;
pub mod progress;
mod serve;
pub mod start;

//! The fd broker's wire messages (Unix stream socket beside the manifest).
//!
//! 1. The worker connects and writes one [`FdRequest`] as a JSON line.
//! 2. The owner checks the peer's credentials and the lease, and answers
//!    one [`FdReply`] JSON line (an error ends the exchange).
//! 3. For each of `reply.batches` batches, the worker writes one byte and
//!    the owner answers one byte carrying at most [`MAX_FDS_PER_MESSAGE`]
//!    file descriptors as SCM_RIGHTS, in region order.
//!
//! The worker asks for each batch only after it has read everything
//! before it, so plain reads never swallow a message carrying fds.

use serde::{Deserialize, Serialize};

/// The most descriptors one message carries (the kernel's limit is 253).
pub const MAX_FDS_PER_MESSAGE: usize = 250;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct FdRequest {
    pub lease_id: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct FdReply {
    /// Set when the request is refused; nothing follows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Region ids, in the order their fds follow.
    #[serde(default)]
    pub regions: Vec<u32>,
    #[serde(default)]
    pub batches: u32,
}

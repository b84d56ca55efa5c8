//! Cross-process contracts of ds4.
//!
//! This crate will hold the `ds4.control.v1` gRPC protos (tonic) and the
//! weight manifest schema shared by `ds4-weight-server` and `ds4-server`.
//! Every contract that crosses a process boundary lives here and nowhere
//! else; see `ARCHITECTURE.md` and `docs/contracts/`.

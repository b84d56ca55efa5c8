//! End-to-end tests of ds4 live in `tests/tests/`; they start the real
//! binaries and talk to them over real sockets.

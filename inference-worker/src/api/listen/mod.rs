//! The worker's HTTP/1.1 listener: the accept loop, the connection cap and
//! every connection's time limits, and the drain at shutdown.
//!
//! - `conn`: one connection's phases and deadlines (header, idle), and its
//!   hyper task; a request in flight is never cut by them.
//! - `body`: the request body's timeout and the response body that keeps
//!   its request in flight until written out.
//! - `slots`: the table of open connections: room is made by closing
//!   connections that only wait on their clients; over the cap a few
//!   reserve slots answer `/health` and refuse the rest with a 503.
//!
//! A failed accept (out of file descriptors) frees a waiting connection
//! and backs off, logging at most once per [`LOG_EVERY`].

mod body;
mod conn;
mod slots;

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use nix::errno::Errno;
use tokio::net::TcpListener;
use tokio::sync::watch;

pub(super) use body::BodyTimeout;

use super::AppState;
use crate::metrics::Metrics;
use slots::{Admitted, Kind, Slots};

/// At most one log line per this long about refused or evicted
/// connections and accept errors.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// Longest pause between accepts while out of file descriptors.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// What a client may hold: time to send a request head and body, time a
/// connection may sit idle, and how many connections may be open.
#[derive(Clone, Debug)]
pub struct ConnectionLimits {
    /// A request head must be complete within this of the connection's
    /// accept (first request) or of its first byte (later requests).
    pub header_timeout: Duration,
    /// A declared request body must arrive within this of its head.
    pub body_timeout: Duration,
    /// A connection with no request in flight is closed after this.
    pub idle_timeout: Duration,
    /// Connections served at once; a few more get an answer over the cap.
    pub max_connections: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(75),
            max_connections: default_max_connections(),
        }
    }
}

impl ConnectionLimits {
    /// Connections over the cap that still get an answer (`/health`, or a
    /// 503): an eighth of the cap, 4 to 64.
    pub fn reserve(&self) -> usize {
        (self.max_connections / 8).clamp(4, 64)
    }
}

/// Half the open-file limit (`ulimit -n`), 16 to 4096: the rest is left
/// for model files, the disk KV cache, weight regions and the reserve.
pub fn default_max_connections() -> usize {
    let soft = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_or(1024, |(soft, _)| soft);
    usize::try_from(soft / 2)
        .unwrap_or(usize::MAX)
        .clamp(16, 4096)
}

/// Marks a request that came over the connection cap: only `/health` is
/// answered, anything else gets a 503.
#[derive(Clone, Copy, Debug)]
pub(super) struct OverCapacity {
    pub max_connections: usize,
}

/// What every connection task shares.
struct Server {
    router: Router,
    limits: ConnectionLimits,
}

/// Serve `state`'s router on `tcp` until `shutdown` completes, then stop
/// accepting, let every connection finish its requests, and return.
pub async fn run(tcp: TcpListener, state: Arc<AppState>, shutdown: impl Future<Output = ()>) {
    let limits = state.limits.clone();
    let metrics = state.engine.metrics().clone();
    let slots = Slots::new(limits.max_connections, limits.reserve());
    let server = Arc::new(Server {
        router: super::router(state),
        limits,
    });
    let (stop_tx, stop_rx) = watch::channel(false);
    let (open_tx, open_rx) = watch::channel(());
    let mut log = Logs::default();
    let mut backoff = Duration::ZERO;
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            r = tcp.accept() => r,
            () = &mut shutdown => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => {
                backoff = Duration::ZERO;
                stream
            }
            Err(e) => {
                if let Some(pause) = accept_failed(&e, &slots, &metrics, &mut log, &mut backoff) {
                    tokio::select! {
                        () = tokio::time::sleep(pause) => {}
                        () = &mut shutdown => break,
                    }
                }
                continue;
            }
        };
        let (conn, slot, evicted) = match slots.admit() {
            Admitted::In {
                conn,
                slot,
                evicted,
            } => (conn, slot, evicted),
            Admitted::Refused => {
                drop(stream);
                metrics.connection_closed("refused");
                if let Some(skipped) = log.refused.ready() {
                    tracing::warn!(
                        max_connections = server.limits.max_connections,
                        refused_since_last_log = skipped + 1,
                        "connection refused: every connection is answering a request and the reserve is full"
                    );
                }
                continue;
            }
        };
        if evicted {
            if let Some(skipped) = log.evicted.ready() {
                tracing::warn!(
                    max_connections = server.limits.max_connections,
                    evicted_since_last_log = skipped + 1,
                    "at the connection limit: closed the longest-open connection waiting on its client to make room"
                );
            }
        }
        let over = (slot.kind == Kind::Reserve).then_some(OverCapacity {
            max_connections: server.limits.max_connections,
        });
        let open = OpenGauge::new(metrics.clone());
        let (server, stop, done) = (server.clone(), stop_rx.clone(), open_rx.clone());
        tokio::spawn(async move {
            let closed = conn::serve(conn, stream, server, over, stop, done).await;
            drop(slot);
            if let Some(why) = closed {
                open.metrics.connection_closed(why.label());
                tracing::debug!(reason = why.label(), "connection closed");
            }
        });
    }
    drop(tcp);
    let _ = stop_tx.send(true);
    drop(open_rx);
    let open = slots.len();
    if open > 0 {
        tracing::info!(
            connections = open,
            "stopped accepting; draining open connections"
        );
    }
    open_tx.closed().await;
}

/// Handle a failed accept: the pause before the next one, if any.
fn accept_failed(
    e: &io::Error,
    slots: &Slots,
    metrics: &Metrics,
    log: &mut Logs,
    backoff: &mut Duration,
) -> Option<Duration> {
    // The client gave up before we took its connection: nothing to do.
    if matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
    ) {
        return None;
    }
    metrics.accept_error();
    let out_of_fds = matches!(
        e.raw_os_error().map(Errno::from_raw),
        Some(Errno::EMFILE | Errno::ENFILE | Errno::ENOBUFS | Errno::ENOMEM)
    );
    // Free a descriptor held by a connection that is only waiting.
    let freed = out_of_fds && slots.evict_one();
    *backoff = if freed {
        Duration::from_millis(1)
    } else {
        (*backoff * 2).clamp(Duration::from_millis(10), MAX_BACKOFF)
    };
    if let Some(skipped) = log.accept.ready() {
        if out_of_fds {
            tracing::error!(
                error = %e,
                open_connections = slots.len(),
                failed_since_last_log = skipped + 1,
                "accept failed: out of file descriptors; backing off. Lower --max-connections or raise the open-file limit (ulimit -n)"
            );
        } else {
            tracing::error!(error = %e, failed_since_last_log = skipped + 1, "accept failed; backing off");
        }
    }
    Some(*backoff)
}

/// The open-connections gauge, up while held.
struct OpenGauge {
    metrics: Arc<Metrics>,
}

impl OpenGauge {
    fn new(metrics: Arc<Metrics>) -> OpenGauge {
        metrics.connections_open.inc();
        OpenGauge { metrics }
    }
}

impl Drop for OpenGauge {
    fn drop(&mut self) {
        self.metrics.connections_open.dec();
    }
}

/// The accept loop's throttled log lines.
#[derive(Default)]
struct Logs {
    accept: Throttle,
    refused: Throttle,
    evicted: Throttle,
}

/// At most one log line per [`LOG_EVERY`], counting the ones left out.
#[derive(Default)]
struct Throttle {
    last: Option<Instant>,
    skipped: u64,
}

impl Throttle {
    /// `Some(lines left out since the last one)` when a line may go out.
    fn ready(&mut self) -> Option<u64> {
        let now = Instant::now();
        if self.last.is_some_and(|t| now.duration_since(t) < LOG_EVERY) {
            self.skipped += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.skipped))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_throttle_lets_one_line_through_and_counts_the_rest() {
        let mut t = Throttle::default();
        assert_eq!(t.ready(), Some(0));
        assert_eq!(t.ready(), None);
        assert_eq!(t.ready(), None);
        t.last = Some(Instant::now() - LOG_EVERY);
        assert_eq!(t.ready(), Some(2));
    }

    #[test]
    fn the_default_cap_is_within_the_open_file_limit() {
        let (soft, _) =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
        let l = ConnectionLimits::default();
        assert!((16..=4096).contains(&l.max_connections));
        if soft >= 64 {
            assert!(((l.max_connections + l.reserve()) as u64) < soft);
        }
    }
}

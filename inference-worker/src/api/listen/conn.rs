//! One connection: what it is doing (waiting for a request head, with
//! requests in flight, idle between requests), the deadline that allows,
//! and the task that serves it with hyper until it ends, times out, is
//! evicted to make room, or is drained at shutdown.
//!
//! A connection's clock: the first request head must be complete within
//! the header timeout of the accept; once a response has gone out, the
//! connection may sit idle for the idle timeout, and a next head must be
//! complete within the header timeout of its first byte. While a request
//! is in flight (head read, response not yet written out) no connection
//! timer runs: a long prefill or a long stream is never cut; its body has
//! its own timeout ([`super::body::TimedBody`]).

use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::Body;
use axum::extract::Request;
use http_body::Body as _;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{watch, Notify};
use tower::ServiceExt;

use super::body::{TimedBody, Tracked};
use super::{OverCapacity, Server};

/// Why the listener closed a connection (the `reason` of the metric).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Closed {
    HeaderTimeout,
    IdleTimeout,
    Evicted,
}

impl Closed {
    pub fn label(self) -> &'static str {
        match self {
            Closed::HeaderTimeout => "header_timeout",
            Closed::IdleTimeout => "idle_timeout",
            Closed::Evicted => "evicted",
        }
    }
}

/// One connection's state, shared by its task, its requests and the
/// connection table.
pub struct Conn {
    pub id: u64,
    phase: Mutex<Phase>,
    /// Set while the next byte read would start a request head's clock.
    watch_reads: AtomicBool,
    /// The phase changed: the task recomputes its deadline.
    wake: Notify,
}

#[derive(Debug)]
struct Phase {
    /// Start of the current wait: the accept, the end of the last
    /// response, or the first byte of the next head.
    since: Instant,
    /// Requests whose head was read and whose response is not written out.
    requests: usize,
    /// Of those, requests whose body has not fully arrived.
    receiving: usize,
    /// Bytes of a next head arrived since the connection went idle.
    head_started: bool,
    /// Responses finished on this connection.
    served: u64,
    evicted: bool,
}

impl Conn {
    pub fn new(id: u64) -> Arc<Conn> {
        Arc::new(Conn {
            id,
            phase: Mutex::new(Phase {
                since: Instant::now(),
                requests: 0,
                receiving: 0,
                head_started: false,
                served: 0,
                evicted: false,
            }),
            watch_reads: AtomicBool::new(true),
            wake: Notify::new(),
        })
    }

    fn phase(&self) -> MutexGuard<'_, Phase> {
        // A panic while holding this lock leaves counters, not broken data.
        self.phase.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes arrived from the client.
    fn on_read(&self) {
        if !self.watch_reads.swap(false, Ordering::AcqRel) {
            return;
        }
        let mut p = self.phase();
        if p.requests == 0 && !p.head_started {
            p.head_started = true;
            // The first head's clock runs from the accept.
            if p.served > 0 {
                p.since = Instant::now();
            }
            drop(p);
            self.wake.notify_one();
        }
    }

    /// A request head was read; `None` when the connection is being
    /// evicted.
    pub fn begin(self: &Arc<Self>, has_body: bool) -> Option<(InFlight, Arc<BodyWatch>)> {
        let mut p = self.phase();
        if p.evicted {
            return None;
        }
        p.requests += 1;
        p.receiving += usize::from(has_body);
        p.head_started = false;
        drop(p);
        self.watch_reads.store(false, Ordering::Release);
        self.wake.notify_one();
        let watch = Arc::new(BodyWatch {
            conn: self.clone(),
            pending: AtomicBool::new(has_body),
        });
        Some((
            InFlight {
                watch: watch.clone(),
            },
            watch,
        ))
    }

    /// Mark the connection evicted if it is only waiting on its client
    /// (idle, reading a head, or reading request bodies); its task then
    /// closes it.
    pub fn try_evict(&self) -> bool {
        let mut p = self.phase();
        if p.evicted || p.receiving < p.requests {
            return false;
        }
        p.evicted = true;
        drop(p);
        self.wake.notify_one();
        true
    }

    /// What the connection's task waits for in its current phase.
    fn next(&self, l: &Server) -> Next {
        let p = self.phase();
        if p.evicted {
            Next::Close(Closed::Evicted)
        } else if p.requests > 0 {
            Next::InFlight
        } else if p.head_started || p.served == 0 {
            Next::Deadline(p.since + l.limits.header_timeout, Closed::HeaderTimeout)
        } else {
            Next::Deadline(p.since + l.limits.idle_timeout, Closed::IdleTimeout)
        }
    }
}

/// A connection's next step if nothing changes.
enum Next {
    /// Close it now.
    Close(Closed),
    /// Close it at this instant.
    Deadline(Instant, Closed),
    /// A request is in flight: no timer runs.
    InFlight,
}

/// Whether a request's body is still arriving.
pub struct BodyWatch {
    conn: Arc<Conn>,
    pending: AtomicBool,
}

impl BodyWatch {
    /// The body has arrived (or will not be read any more).
    pub fn done(&self) {
        if self.pending.swap(false, Ordering::AcqRel) {
            self.conn.phase().receiving -= 1;
            self.conn.wake.notify_one();
        }
    }
}

/// A request in flight on its connection, until dropped.
pub struct InFlight {
    watch: Arc<BodyWatch>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.watch.done();
        let conn = &self.watch.conn;
        let mut p = conn.phase();
        p.requests -= 1;
        p.served += 1;
        if p.requests == 0 {
            p.since = Instant::now();
            p.head_started = false;
            conn.watch_reads.store(true, Ordering::Release);
        }
        drop(p);
        conn.wake.notify_one();
    }
}

/// The socket, telling its connection when bytes arrive.
struct Watched {
    stream: TcpStream,
    conn: Arc<Conn>,
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.stream).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.conn.on_read();
        }
        r
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// Serve `stream` until it ends or the listener closes it. A connection
/// `over` the cap answers one request and closes; its requests carry the
/// [`OverCapacity`] mark. `_open` is held until the connection is gone
/// (shutdown waits for all of them).
pub async fn serve(
    conn: Arc<Conn>,
    stream: TcpStream,
    server: Arc<Server>,
    over: Option<OverCapacity>,
    mut stop: watch::Receiver<bool>,
    _open: watch::Receiver<()>,
) -> Option<Closed> {
    let io = TokioIo::new(Watched {
        stream,
        conn: conn.clone(),
    });
    let svc = {
        let (conn, server) = (conn.clone(), server.clone());
        service_fn(move |req: hyper::Request<Incoming>| {
            let (conn, server) = (conn.clone(), server.clone());
            async move { Ok::<_, Infallible>(answer(&conn, &server, over, req).await) }
        })
    };
    let mut builder = http1::Builder::new();
    builder.keep_alive(over.is_none());
    let http = builder.serve_connection(io, svc);
    tokio::pin!(http);
    let mut draining = false;
    loop {
        if !draining && *stop.borrow() {
            draining = true;
            http.as_mut().graceful_shutdown();
        }
        let deadline = match conn.next(&server) {
            Next::Close(why) => return Some(why),
            Next::Deadline(at, _) => Some(at),
            Next::InFlight => None,
        };
        let timer = async {
            match deadline {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = http.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "connection ended");
                }
                return None;
            }
            () = conn.wake.notified() => {}
            () = timer => {
                if let Next::Deadline(at, why) = conn.next(&server) {
                    if at <= Instant::now() {
                        return Some(why);
                    }
                }
            }
            r = stop.changed(), if !draining => {
                if r.is_err() {
                    // The listener is gone: drain as on a signal.
                    draining = true;
                    http.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

/// One request through the router, timed and tracked on its connection.
async fn answer(
    conn: &Arc<Conn>,
    server: &Server,
    over: Option<OverCapacity>,
    req: hyper::Request<Incoming>,
) -> hyper::Response<Tracked<Body>> {
    let has_body = !req.body().is_end_stream();
    let Some((flight, watch)) = conn.begin(has_body) else {
        // Evicted between its head and now: the connection is closing.
        return hyper::Response::new(Tracked::new(Body::empty(), None));
    };
    let timeout = server.limits.body_timeout;
    let mut req: Request = req.map(|b| {
        if has_body {
            Body::new(TimedBody::new(b, timeout, watch))
        } else {
            Body::new(b)
        }
    });
    if let Some(o) = over {
        req.extensions_mut().insert(o);
    }
    let resp = server
        .router
        .clone()
        .oneshot(req)
        .await
        .unwrap_or_else(|e| match e {});
    resp.map(|b| Tracked::new(b, Some(flight)))
}

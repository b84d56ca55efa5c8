//! `ds4-server` against clients that hold connections: stalled heads,
//! bodies and idle keep-alives are closed on time and cannot crowd out
//! `/health` or real requests; in-flight requests are never cut; bodies
//! declared too large, non-JSON content types and wrong methods are
//! refused up front in the API's envelope.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use ds4_tests::{read_response, Response, Server};
use serde_json::json;

/// The tests here time liveness: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// Send `bytes` on a new connection and read one response.
fn raw(port: u16, bytes: &[u8]) -> Response {
    let mut s = connect(port);
    s.write_all(bytes).expect("write");
    read_response(&s).expect("response")
}

fn post(port: u16, path: &str, content_type: Option<&str>, body: &str) -> Response {
    let ct = content_type.map_or_else(String::new, |c| format!("content-type: {c}\r\n"));
    raw(
        port,
        format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\n{ct}content-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
}

fn chat(max_tokens: u32) -> String {
    json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": max_tokens, "temperature": 0})
        .to_string()
}

/// How long until the server closes `s` (reading and keeping what it
/// sends), or `None` if it is still open after `limit`.
fn closed_within(s: &mut TcpStream, limit: Duration) -> Option<(Duration, Vec<u8>)> {
    let t0 = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    while t0.elapsed() < limit {
        match s.read(&mut buf) {
            Ok(0) => return Some((t0.elapsed(), got)),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return Some((t0.elapsed(), got)),
        }
    }
    None
}

/// Whether the server has closed `s` (without waiting).
fn is_closed(s: &TcpStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 1];
    let closed = match (&*s).read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != ErrorKind::WouldBlock,
    };
    s.set_nonblocking(false).unwrap();
    closed
}

fn assert_openai(r: &Response, status: u16, needle: &str) {
    assert_eq!(r.status, status, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    let m = v["error"]["message"].as_str().expect("error.message");
    assert!(m.contains(needle), "{m:?} lacks {needle:?}");
    assert!(v["error"]["type"].is_string(), "{v}");
}

fn assert_anthropic(r: &Response, status: u16, kind: &str) {
    assert_eq!(r.status, status, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], kind, "{v}");
    assert!(v["error"]["message"].is_string(), "{v}");
}

/// Seconds between `lo` and `hi`.
fn assert_between(d: Duration, lo: f64, hi: f64, what: &str) {
    let s = d.as_secs_f64();
    assert!(
        lo <= s && s <= hi,
        "{what}: {s:.2} s, expected {lo}..{hi} s"
    );
}

#[test]
fn stalled_connections_do_not_crowd_out_health_or_requests() {
    let _g = serial();
    // Fewer file descriptors than the stalled connections below, as when
    // the fd limit was exhausted; long timeouts, so only the cap helps.
    let mut server = Server::start_with_fd_limit(
        256,
        &[
            "--max-connections",
            "64",
            "--header-timeout-s",
            "60",
            "--body-timeout-s",
            "60",
            "--idle-timeout-s",
            "60",
        ],
        None,
    );
    let port = server.port;
    // The prompt's cached prefix keeps the timed request below about
    // liveness rather than prefill speed.
    let warm = post(
        port,
        "/v1/chat/completions",
        Some("application/json"),
        &chat(1),
    );
    assert_eq!(warm.status, 200);
    let mut stalled = Vec::new();
    for i in 0..300 {
        let mut s = connect(port);
        match i % 3 {
            0 => {}
            1 => s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-").unwrap(),
            _ => s
                .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{\"messages\": [")
                .unwrap(),
        }
        stalled.push(s);
    }
    thread::sleep(Duration::from_millis(300));

    let t0 = Instant::now();
    let h = server.request("GET", "/health", None).expect("health");
    assert_eq!(h.status, 200);
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    let t0 = Instant::now();
    let r = post(
        port,
        "/v1/chat/completions",
        Some("application/json"),
        &chat(1),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());

    // The server holds no more than its cap of the stalled connections.
    let open = stalled.iter().filter(|s| !is_closed(s)).count();
    assert!(open <= 64, "{open} stalled connections still open");
    assert!(server.alive());
}

#[test]
fn out_of_file_descriptors_the_server_backs_off_and_keeps_serving() {
    let _g = serial();
    // A cap above the open-file limit: accepts fail with EMFILE.
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("server.log");
    let mut server = Server::start_with_fd_limit(
        128,
        &["--max-connections", "1000", "--header-timeout-s", "60"],
        Some(&log),
    );
    let port = server.port;
    let stalled: Vec<TcpStream> = (0..300).map(|_| connect(port)).collect();
    thread::sleep(Duration::from_millis(500));
    // Connections that only wait give their descriptors up.
    let t0 = Instant::now();
    let h = server.request("GET", "/health", None).expect("health");
    assert_eq!(h.status, 200);
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    thread::sleep(Duration::from_millis(1500));
    let text = std::fs::read_to_string(&log).unwrap();
    let lines = text.matches("accept failed").count();
    assert!(
        (1..=2).contains(&lines),
        "{lines} accept-failure lines in the log:\n{text}"
    );
    assert!(text.contains("out of file descriptors"), "{text}");
    assert!(server.alive());
    drop(stalled);
}

#[test]
fn a_stalled_request_head_is_closed_after_the_header_timeout() {
    let _g = serial();
    let server = Server::start(&["--header-timeout-s", "1"]);
    let port = server.port;
    let t0 = Instant::now();
    let mut silent = connect(port);
    let mut partial = connect(port);
    partial
        .write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n")
        .unwrap();
    // A head trickled a byte at a time is timed from its start.
    let mut trickle = connect(port);
    let trickler = {
        let mut t = trickle.try_clone().unwrap();
        thread::spawn(move || {
            for b in b"GET /health HTTP/1.1\r\nx-slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" {
                if t.write_all(&[*b]).is_err() {
                    break;
                }
                thread::sleep(Duration::from_millis(100));
            }
        })
    };
    for (name, s) in [
        ("silent", &mut silent),
        ("partial", &mut partial),
        ("trickle", &mut trickle),
    ] {
        let limit = Duration::from_secs(4).saturating_sub(t0.elapsed());
        let (_, got) =
            closed_within(s, limit).unwrap_or_else(|| panic!("{name} connection still open"));
        assert!(got.is_empty(), "{name}: {}", String::from_utf8_lossy(&got));
        assert_between(t0.elapsed(), 0.9, 3.0, name);
    }
    trickler.join().unwrap();

    // A kept-alive connection's next head is timed from its first byte.
    let mut ka = connect(port);
    ka.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        .unwrap();
    assert_eq!(read_response(&ka).unwrap().status, 200);
    ka.write_all(b"GET /health HTTP/1.1\r\n").unwrap();
    let (after, _) = closed_within(&mut ka, Duration::from_secs(4)).expect("still open");
    assert_between(after, 0.9, 3.0, "next head");
    assert_eq!(server.request("GET", "/health", None).unwrap().status, 200);
}

#[test]
fn a_partial_body_is_cut_after_the_body_timeout() {
    let _g = serial();
    let server = Server::start(&["--body-timeout-s", "1"]);
    let port = server.port;
    for (path, anthropic) in [("/v1/chat/completions", false), ("/v1/messages", true)] {
        let mut s = connect(port);
        write!(
            s,
            "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{{\"messages\""
        )
        .unwrap();
        let t0 = Instant::now();
        let r = read_response(&s).expect("a 408");
        assert_between(t0.elapsed(), 0.9, 3.0, path);
        if anthropic {
            assert_anthropic(&r, 408, "invalid_request_error");
        } else {
            assert_openai(&r, 408, "--body-timeout-s");
        }
        assert!(
            closed_within(&mut s, Duration::from_secs(2)).is_some(),
            "{path}: left open"
        );
    }
    // A body that trickles in but never ends is cut all the same.
    let mut s = connect(port);
    s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n").unwrap();
    let t0 = Instant::now();
    let mut w = s.try_clone().unwrap();
    let trickler = thread::spawn(move || {
        for _ in 0..30 {
            if w.write_all(b" ").is_err() {
                break;
            }
            thread::sleep(Duration::from_millis(100));
        }
    });
    let r = read_response(&s).expect("a 408");
    assert_between(t0.elapsed(), 0.9, 3.0, "trickled body");
    assert_openai(&r, 408, "did not arrive");
    trickler.join().unwrap();
    let r = post(
        port,
        "/v1/chat/completions",
        Some("application/json"),
        &chat(2),
    );
    assert_eq!(r.status, 200);
}

#[test]
fn idle_connections_close_but_slow_streams_and_health_go_on() {
    let _g = serial();
    let server = Server::start(&[
        "--idle-timeout-s",
        "1",
        "--header-timeout-s",
        "1",
        "--max-seqs",
        "1",
        "--max-connections",
        "2",
    ]);
    let port = server.port;

    // A kept-alive connection with nothing in flight is closed.
    let mut ka = connect(port);
    ka.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        .unwrap();
    assert_eq!(read_response(&ka).unwrap().status, 200);
    let (after, _) = closed_within(&mut ka, Duration::from_secs(4)).expect("idle connection open");
    assert_between(after, 0.9, 3.0, "idle");

    // A stream that goes on (counting) holds the one sequence; a second
    // stream queued behind it gets no token, and sends and receives no
    // byte, for longer than the idle timeout.
    let mut first = connect(port);
    let counting = json!({"prompt": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", "max_tokens": 4000, "temperature": 0, "stream": true}).to_string();
    write!(
        first,
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{counting}",
        counting.len()
    )
    .unwrap();
    let mut buf = [0u8; 4096];
    let n = first.read(&mut buf).expect("the first stream's head");
    assert!(
        buf[..n].starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&buf[..n])
    );
    let stream = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0, "stream": true}).to_string();
    let t0 = Instant::now();
    let queued = thread::spawn(move || {
        let r = post(
            port,
            "/v1/chat/completions",
            Some("application/json"),
            &stream,
        );
        (r, t0.elapsed())
    });
    thread::sleep(Duration::from_millis(300));

    // Both connections are answering: over the cap /health still answers,
    // other requests get a 503 in their API's envelope.
    let t1 = Instant::now();
    assert_eq!(
        raw(port, b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n").status,
        200
    );
    let busy = post(
        port,
        "/v1/chat/completions",
        Some("application/json"),
        &chat(2),
    );
    assert_openai(&busy, 503, "connections");
    assert_eq!(busy.header("retry-after"), Some("1"));
    let busy = post(port, "/v1/messages", Some("application/json"), &chat(2));
    assert_anthropic(&busy, 503, "overloaded_error");
    assert!(t1.elapsed() < Duration::from_secs(1), "{:?}", t1.elapsed());

    // The first stream keeps flowing past the idle timeout; then its
    // client leaves, and the queued stream runs to its end.
    let mut events = 0;
    while t0.elapsed() < Duration::from_millis(1800) {
        let n = first.read(&mut buf).expect("the first stream goes on");
        assert!(n > 0, "the first stream was cut");
        events += buf[..n].windows(5).filter(|w| w == b"data:").count();
    }
    assert!(events >= 2, "{events} events");
    drop(first);
    let (r, took) = queued.join().unwrap();
    assert_eq!(r.status, 200);
    let text = String::from_utf8_lossy(&r.body);
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert!(
        took > Duration::from_millis(1500),
        "the stream waited only {took:?}"
    );
    assert_eq!(server.request("GET", "/health", None).unwrap().status, 200);
}

#[test]
fn a_declared_body_over_the_limit_is_refused_at_once() {
    let _g = serial();
    let mut server = Server::start(&["--max-body-mb", "1"]);
    let port = server.port;
    for (path, anthropic) in [("/v1/chat/completions", false), ("/v1/messages", true)] {
        let t0 = Instant::now();
        let r = raw(
            port,
            format!("POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 99999999999999\r\n\r\n").as_bytes(),
        );
        assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
        if anthropic {
            assert_anthropic(&r, 413, "request_too_large");
        } else {
            assert_openai(&r, 413, "1048576-byte limit");
        }
    }
    assert!(server.alive());
    assert_eq!(server.request("GET", "/health", None).unwrap().status, 200);
}

#[test]
fn json_endpoints_refuse_other_content_types() {
    let _g = serial();
    let server = Server::start(&[]);
    let port = server.port;
    let r = post(port, "/v1/chat/completions", Some("text/plain"), &chat(2));
    assert_openai(&r, 415, "text/plain");
    assert_eq!(r.json()["error"]["code"], "unsupported_media_type");
    let r = post(
        port,
        "/v1/completions",
        None,
        r#"{"prompt":"a","max_tokens":1}"#,
    );
    assert_openai(&r, 415, "found none");
    let r = post(
        port,
        "/v1/messages",
        Some("application/x-www-form-urlencoded"),
        "{}",
    );
    assert_anthropic(&r, 415, "invalid_request_error");
    let r = post(
        port,
        "/v1/chat/completions",
        Some("application/json; charset=utf-8"),
        &chat(2),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    drop(server);

    let server = Server::start(&["--allow-any-content-type"]);
    let r = post(
        server.port,
        "/v1/chat/completions",
        Some("text/plain"),
        &chat(2),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
}

#[test]
fn wrong_methods_and_paths_are_refused_in_the_envelope() {
    let _g = serial();
    let server = Server::start(&[]);
    let port = server.port;
    let r = raw(
        port,
        b"GET /v1/chat/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    );
    assert_openai(&r, 405, "GET is not allowed on /v1/chat/completions");
    assert_eq!(r.header("allow"), Some("POST"));
    let r = raw(
        port,
        b"GET /v1/messages HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    );
    assert_anthropic(&r, 405, "invalid_request_error");
    assert_eq!(r.header("allow"), Some("POST"));
    let r = post(port, "/health", Some("application/json"), "{}");
    assert_openai(&r, 405, "POST is not allowed on /health");
    assert!(
        r.header("allow").is_some_and(|a| a.contains("GET")),
        "{:?}",
        r.headers
    );
    let r = raw(
        port,
        b"GET /v1/messages/nope HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    );
    assert_anthropic(&r, 404, "not_found_error");
}

#[test]
fn sigterm_drains_requests_in_flight_and_closes_idle_connections() {
    let _g = serial();
    let mut server = Server::start(&[]);
    let port = server.port;
    let mut idle = connect(port);
    idle.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        .unwrap();
    assert_eq!(read_response(&idle).unwrap().status, 200);
    let mut s = connect(port);
    let body = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 16, "temperature": 0, "stream": true}).to_string();
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut got = vec![0u8; 4096];
    let n = s.read(&mut got).expect("the stream's head");
    got.truncate(n);
    let stop = thread::spawn(move || server.terminate());
    // The idle connection is closed at once, the stream runs to its end.
    let (after, _) =
        closed_within(&mut idle, Duration::from_secs(5)).expect("idle connection open");
    assert!(after < Duration::from_secs(2), "{after:?}");
    let (_, rest) = closed_within(&mut s, Duration::from_secs(60)).expect("the stream never ended");
    got.extend_from_slice(&rest);
    let text = String::from_utf8_lossy(&got);
    assert!(text.contains("data: [DONE]"), "{text}");
    assert!(
        stop.join().unwrap(),
        "ds4-server exits cleanly after draining"
    );
}

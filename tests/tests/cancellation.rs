//! A client that disconnects during a long prefill cancels its request on
//! every surface, streaming or not: the engine drops the sequence within a
//! few engine steps and counts it as cancelled, instead of prefilling the
//! whole prompt for nobody.

use std::net::Shutdown;
use std::time::{Duration, Instant};

use ds4_tests::Server;
use serde_json::{json, Value};

/// A prompt of about `words` tokens, unique per `tag` (no prefix reuse
/// between the cases).
fn long_text(tag: usize, words: usize) -> String {
    let mut s = format!("Case {tag}. Repeat after me:");
    for i in 0..words {
        s.push_str([" alpha", " beta", " gamma", " delta"][(i + tag) % 4]);
    }
    s
}

/// A request body for `path` with a long prompt.
fn body(path: &str, tag: usize, stream: bool) -> Value {
    let text = long_text(tag, 6000);
    let msgs = json!([{"role": "user", "content": text}]);
    match path {
        "/v1/chat/completions" => json!({"messages": msgs, "max_tokens": 4, "stream": stream}),
        "/v1/completions" => json!({"prompt": text, "max_tokens": 4, "stream": stream}),
        "/v1/responses" => json!({"input": text, "max_output_tokens": 4, "stream": stream}),
        "/v1/messages" => json!({"messages": msgs, "max_tokens": 4, "stream": stream}),
        _ => unreachable!(),
    }
}

fn totals(server: &Server) -> Value {
    server.stats()
}

/// Poll until `f` holds; the time it took, or `None` after `limit`.
fn wait_for(limit: Duration, mut f: impl FnMut() -> bool) -> Option<Duration> {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if f() {
            return Some(t0.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

#[test]
fn a_client_leaving_during_prefill_cancels_on_every_surface() {
    // Small steps: a 6,000-token prompt takes many of them.
    let server = Server::start(&["--prefill-chunk", "64", "--batch-tokens", "64"]);
    let paths = [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/messages",
    ];
    let mut tag = 0;
    for path in paths {
        for stream in [true, false] {
            tag += 1;
            let case = format!("{path} stream={stream}");
            let cancelled = totals(&server)["cancelled"].as_u64().unwrap();
            let conn = server.send_json(path, &body(path, tag, stream));
            let admitted = wait_for(Duration::from_secs(30), || {
                totals(&server)["active_sequences"] == 1
            });
            assert!(admitted.is_some(), "{case}: never admitted");
            // Prefilling now; the client goes away.
            std::thread::sleep(Duration::from_millis(200));
            conn.shutdown(Shutdown::Both).expect("shutdown");
            drop(conn);
            let gone = wait_for(Duration::from_secs(3), || {
                let t = totals(&server);
                t["active_sequences"] == 0 && t["cancelled"].as_u64().unwrap() > cancelled
            });
            let t = totals(&server);
            eprintln!("{case}: gone after {gone:?}");
            assert!(
                gone.is_some(),
                "{case}: the sequence outlived its client by 3 s (active {}, cancelled {} -> {})",
                t["active_sequences"],
                cancelled,
                t["cancelled"]
            );
        }
    }
    // And the server still answers.
    let r = server.post_json(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}),
    );
    assert_eq!(r.status, 200);
}

//! Following one request through the server's log: the request id (the
//! client's `x-request-id`, else a generated one) comes back in the
//! response headers, and every line the server logs about the request,
//! from the HTTP layer through the engine, carries it.

use ds4_tests::Server;
use serde_json::json;

/// Messages the server logs once per request.
const PER_REQUEST: [&str; 3] = ["request answered", "request done", "request refused"];

#[test]
fn request_ids_come_back_and_tag_every_log_line_of_their_request() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("server.log");
    let mut server = Server::start_logged(&ds4_tests::model_path(), &[], Some(&log));
    let chat = |stream: bool| {
        serde_json::to_vec(&json!({
            "messages": [{"role": "user", "content": "Say hi."}],
            "max_tokens": 4, "temperature": 0, "stream": stream,
        }))
        .unwrap()
    };
    let post = |id: Option<&str>, body: &[u8]| {
        let headers: Vec<(&str, &str)> = id.map(|i| ("x-request-id", i)).into_iter().collect();
        server
            .request_with("POST", "/v1/chat/completions", &headers, Some(body))
            .expect("request")
    };

    let r = post(Some("trace-json-1"), &chat(false));
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-request-id"), Some("trace-json-1"));
    let r = post(Some("trace-stream-2"), &chat(true));
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-request-id"), Some("trace-stream-2"));
    let r = post(Some("trace-bad-3"), b"{not json");
    assert_eq!(r.status, 400);
    assert_eq!(r.header("x-request-id"), Some("trace-bad-3"));
    // Without one (or with one that is not a sensible id) the server
    // makes one up.
    let r = post(None, &chat(false));
    let made = r
        .header("x-request-id")
        .expect("a generated id")
        .to_string();
    assert!(made.starts_with("req_"), "{made}");
    let r = post(Some("two words"), &chat(false));
    let replaced = r.header("x-request-id").expect("an id").to_string();
    assert!(
        replaced.starts_with("req_") && replaced != made,
        "{replaced}"
    );

    assert!(server.terminate(), "ds4-server exits cleanly on SIGTERM");
    let text = std::fs::read_to_string(&log).unwrap();
    let lines_of = |id: &str| -> Vec<&str> {
        text.lines()
            .filter(|l| l.contains(&format!("request_id={id}")))
            .collect()
    };
    let has = |id: &str, msg: &str| lines_of(id).iter().any(|l| l.contains(msg));
    for id in ["trace-json-1", "trace-stream-2", made.as_str()] {
        assert!(
            has(id, "request answered"),
            "{id}: no access line in\n{text}"
        );
        assert!(has(id, "request done"), "{id}: no engine line in\n{text}");
    }
    assert!(has("trace-bad-3", "request refused"), "{text}");
    assert!(has("trace-bad-3", "request answered"), "{text}");
    // No line about a request goes out without its id.
    for line in text.lines() {
        if PER_REQUEST.iter().any(|m| line.contains(m)) {
            assert!(line.contains("request_id="), "untagged: {line}");
        }
    }
}

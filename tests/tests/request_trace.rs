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

/// `--trace FILE`: each request's prompt, the prefix cache's decision with
/// its reason, the tool calls as the parser finds them and the answer, one
/// JSON line each, under the request's id.
#[test]
fn the_trace_file_tells_each_request_s_story() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("trace.jsonl");
    let server = Server::start(&["--trace", file.to_str().unwrap()]);
    let body = serde_json::to_vec(&json!({
        "messages": [{"role": "user", "content": "What is the weather in Paris today?"}],
        "tools": [{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}}}],
        "tool_choice": "required", "parallel_tool_calls": false, "max_tokens": 60, "temperature": 0,
    }))
    .unwrap();
    for id in ["story-1", "story-2"] {
        let r = server
            .request_with(
                "POST",
                "/v1/chat/completions",
                &[("x-request-id", id)],
                Some(&body),
            )
            .expect("request");
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    }
    let text = std::fs::read_to_string(&file).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let of = |id: &str, event: &str| {
        lines
            .iter()
            .find(|l| l["request_id"] == id && l["event"] == event)
            .unwrap_or_else(|| panic!("no {event} of {id} in {text}"))
    };
    for id in ["story-1", "story-2"] {
        let prompt = of(id, "prompt");
        assert_eq!(prompt["path"], "/v1/chat/completions");
        assert!(prompt["text"]
            .as_str()
            .unwrap()
            .contains("weather in Paris"));
        assert_eq!(of(id, "tool_call_start")["name"], "get_weather");
        let answer = of(id, "answer");
        assert_eq!(answer["finish"], "stop", "{answer}");
        assert_eq!(answer["calls"][0]["name"], "get_weather");
        assert!(answer["calls"][0]["arguments"]
            .as_str()
            .unwrap()
            .contains("city"));
    }
    let cold = of("story-1", "cache");
    assert_eq!(cold["cached_tokens"], 0, "{cold}");
    assert!(
        cold["why"].as_str().unwrap().contains("no cached prefix"),
        "{cold}"
    );
    let warm = of("story-2", "cache");
    let (n, bs) = (
        warm["prompt_tokens"].as_u64().unwrap(),
        warm["block_size"].as_u64().unwrap(),
    );
    assert_eq!(
        warm["cached_tokens"].as_u64().unwrap(),
        (n - 1) / bs * bs,
        "{warm}"
    );
    assert_eq!(
        warm["why"], "every whole block of the prompt was cached",
        "{warm}"
    );

    // A streaming client that leaves mid-answer: its run ends `dropped`.
    let conn = server.send_json(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Write a very long story about zebras."}],
                "max_tokens": 2000, "stream": true, "temperature": 1,
                // SmolLM2's end tokens banned: the answer cannot end first.
                "logit_bias": {"0": -100, "2": -100}}),
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    conn.shutdown(std::net::Shutdown::Both).unwrap();
    drop(conn);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let lines: Vec<serde_json::Value> = std::fs::read_to_string(&file)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let id = lines
            .iter()
            .find(|l| l["event"] == "prompt" && l["text"].as_str().unwrap().contains("zebras"))
            .map(|l| l["request_id"].clone())
            .expect("the prompt record");
        let end = lines.iter().find(|l| {
            l["request_id"] == id
                && ["dropped", "answer", "failed"].contains(&l["event"].as_str().unwrap())
        });
        if let Some(end) = end {
            assert_eq!(end["event"], "dropped", "{end}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no end record for {id}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

//! The API surfaces over raw HTTP: SSE framing as each API defines it, and
//! errors in each API's own envelope. (The official SDKs drive the same
//! surfaces in `tests/python/`.)

use ds4_tests::Server;
use serde_json::{json, Value};

const QUESTION: &str = "What is the capital of France? Answer in one sentence.";
const ANSWER: &str = "The capital of France is Paris.";

/// `(event name, data)` of every SSE event in `body`.
fn sse(body: &[u8]) -> Vec<(Option<String>, String)> {
    let text = String::from_utf8_lossy(body);
    text.split("\n\n")
        .filter(|b| !b.trim().is_empty())
        .map(|block| {
            let mut name = None;
            let mut data = String::new();
            for line in block.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = Some(n.to_string());
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data.push_str(d);
                }
            }
            (name, data)
        })
        .collect()
}

#[test]
fn streams_are_framed_per_api_and_errors_use_each_envelope() {
    let server = Server::start(&[]);

    let r = server.post_json(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": QUESTION}], "temperature": 0, "stream": true}),
    );
    assert_eq!(r.status, 200);
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("text/event-stream"));
    let events = sse(&r.body);
    assert_eq!(events.last().unwrap().1, "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(&e.1).unwrap())
        .collect();
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, ANSWER);
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "stop"
    );

    let r = server.post_json(
        "/v1/messages",
        &json!({"max_tokens": 32, "messages": [{"role": "user", "content": QUESTION}], "temperature": 0, "stream": true}),
    );
    let events = sse(&r.body);
    for (name, data) in &events {
        let v: Value = serde_json::from_str(data).unwrap();
        assert_eq!(
            v["type"].as_str(),
            name.as_deref(),
            "event name matches data.type"
        );
    }
    assert_eq!(events.first().unwrap().0.as_deref(), Some("message_start"));
    assert_eq!(events.last().unwrap().0.as_deref(), Some("message_stop"));

    // Anthropic errors: its own envelope, also for malformed JSON.
    let r = server
        .request("POST", "/v1/messages", Some(b"{\"messages\": ["))
        .unwrap();
    assert_eq!(r.status, 400);
    let v = r.json();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    let r = server.post_json(
        "/v1/messages",
        &json!({"messages": [{"role": "user", "content": "x"}]}),
    );
    assert_eq!(r.status, 400);
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("max_tokens"));

    // OpenAI surfaces: typed 400 for what cannot be honoured.
    let r = server.post_json("/v1/completions", &json!({"prompt": "x", "best_of": 3}));
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["param"], "best_of");
    let r = server.post_json(
        "/v1/responses",
        &json!({"input": "x", "text": {"format": {"type": "json_schema", "name": "x"}}}),
    );
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["param"], "text");
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("schema"));
    let r = server.post_json("/v1/completions", &json!({"prompt": [999999999]}));
    assert_eq!(r.status, 400);
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("vocabulary"));
}

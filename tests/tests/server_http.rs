//! `ds4-server` over real HTTP on the default model: answers, refusals in
//! the OpenAI error envelope, and that the server keeps serving after bad
//! input and vanished clients.

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use ds4_tests::Server;
use serde_json::json;

const QUESTION: &str = "What is the capital of France? Answer in one sentence.";

fn assert_openai_error(r: &ds4_tests::Response, status: u16, needle: &str) {
    assert_eq!(r.status, status, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    let msg = v["error"]["message"].as_str().expect("error.message");
    assert!(msg.contains(needle), "message {msg:?} lacks {needle:?}");
    assert!(v["error"]["type"].is_string(), "error.type");
}

#[test]
fn chat_completion_answers_and_bad_input_is_refused() {
    let mut server = Server::start(&[]);

    let models = server.request("GET", "/v1/models", None).expect("models");
    assert_eq!(models.status, 200);
    let models = models.json();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "SmolLM2-135M-Instruct.Q4_1");

    let r = server.post_json(
        "/v1/chat/completions",
        &json!({"model": "SmolLM2-135M-Instruct.Q4_1", "messages": [{"role": "user", "content": QUESTION}], "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(
        v["choices"][0]["message"]["content"],
        "The capital of France is Paris."
    );
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["prompt_tokens"], 42);
    assert_eq!(
        v["usage"]["completion_tokens"], 8,
        "7 tokens and <|im_end|>"
    );
    assert_eq!(v["usage"]["total_tokens"], 50);
    assert!(v["timings"]["decode_tokens_per_s"].as_f64().unwrap() > 0.0);

    // The same conversation again reuses the cached prompt in whole
    // 16-token KV blocks, leaving the last prompt token to run: 32 of 42.
    let again = server.post_json(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": QUESTION}], "temperature": 0, "max_tokens": 3}),
    );
    let again = again.json();
    assert_eq!(again["usage"]["prompt_tokens_details"]["cached_tokens"], 32);
    assert_eq!(again["choices"][0]["finish_reason"], "length");
    assert_eq!(again["usage"]["completion_tokens"], 3);
    assert_eq!(again["choices"][0]["message"]["content"], "The capital of");

    // Stop strings end the answer before the stop text.
    let stopped = server.post_json(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": QUESTION}], "temperature": 0, "stop": [" is"]}),
    );
    let stopped = stopped.json();
    assert_eq!(
        stopped["choices"][0]["message"]["content"],
        "The capital of France"
    );
    assert_eq!(stopped["choices"][0]["finish_reason"], "stop");

    // Malformed and unsupported requests: typed 4xx in the OpenAI envelope.
    let bad = server
        .request("POST", "/v1/chat/completions", Some(b"{\"messages\": ["))
        .unwrap();
    assert_openai_error(&bad, 400, "invalid JSON");
    let r = server.post_json("/v1/chat/completions", &json!({"messages": []}));
    assert_openai_error(&r, 400, "must not be empty");
    let r = server.post_json(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "wizard", "content": "x"}]}),
    );
    assert_openai_error(&r, 400, "wizard");
    let r = server.post_json(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "x"}], "n": 2}),
    );
    assert_openai_error(&r, 400, "n = 1");
    let r = server.post_json(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "x"}], "temperature": -1}),
    );
    assert_openai_error(&r, 400, "temperature");
    let r = server.post_json(
        "/v1/chat/completions",
        &json!({"model": "gpt-17", "messages": [{"role": "user", "content": "x"}]}),
    );
    assert_openai_error(&r, 404, "gpt-17");
    let r = server.request("GET", "/v1/nothing", None).unwrap();
    assert_openai_error(&r, 404, "/v1/nothing");
    let huge = vec![b' '; 33 * 1024 * 1024];
    match server.request("POST", "/v1/chat/completions", Some(&huge)) {
        Ok(r) => assert_openai_error(&r, 413, "limit"),
        // The server may close the connection before reading the whole body.
        Err(e) => assert!(
            matches!(
                e.kind(),
                std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
            ),
            "{e}"
        ),
    }

    // A client that sends a request and disappears does not hurt the server.
    {
        let mut s = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
        let body = json!({"messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 200}).to_string();
        write!(
            s,
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        std::thread::sleep(Duration::from_millis(200));
    }
    let r = server.post_json(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": QUESTION}], "temperature": 0}),
    );
    assert_eq!(
        r.json()["choices"][0]["message"]["content"],
        "The capital of France is Paris."
    );
    assert!(server.alive());
}

/// A prompt whose text was computed before as other tokens than the
/// tokenizer would choose (the model sampled "Hel" "lo" where the
/// tokenizer writes "Hello") reuses that state: the KV cache survives the
/// re-tokenization. The first run is sent as token ids (SmolLM2's "ĠHel"
/// "lo" "Ġworld" "Ġfriends", ten times), the second as their text.
#[test]
fn prefix_reuse_survives_retokenization() {
    let server = Server::start(&[]);
    let ids: Vec<u32> = [5362, 5365, 905, 2428].repeat(10);
    let first = server
        .post_json(
            "/v1/completions",
            &json!({"prompt": ids, "max_tokens": 1, "temperature": 0}),
        )
        .json();
    assert_eq!(first["usage"]["prompt_tokens"], 40, "{first}");
    let text = " Hello world friends".repeat(10) + " and more";
    let again = server
        .post_json(
            "/v1/completions",
            &json!({"prompt": text, "max_tokens": 1, "temperature": 0}),
        )
        .json();
    // The 40 ids and " and" " more": two whole 16-token blocks cached.
    // Tokenized as the tokenizer would, the text shares no token with
    // the ids ("ĠHello" is one token), and nothing would be reused.
    assert_eq!(again["usage"]["prompt_tokens"], 42, "{again}");
    assert_eq!(
        again["usage"]["prompt_tokens_details"]["cached_tokens"], 32,
        "{again}"
    );
}

/// `--max-tokens N` caps every answer: a request naming no limit, or a
/// larger one, gets N tokens and finish reason `length`; a smaller limit
/// stands.
#[test]
fn the_server_caps_answers_at_max_tokens() {
    let server = Server::start(&["--max-tokens", "5"]);
    for (limit, want) in [(None, 5), (Some(100), 5), (Some(3), 3)] {
        let mut body = json!({"messages": [{"role": "user", "content": "Tell me a long story."}],
                              "temperature": 0});
        if let Some(l) = limit {
            body["max_tokens"] = json!(l);
        }
        let v = server.post_json("/v1/chat/completions", &body).json();
        assert_eq!(v["usage"]["completion_tokens"], want, "{limit:?}: {v}");
        assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    }
}

#[test]
fn prompt_over_the_context_is_refused() {
    let mut server = Server::start(&["--ctx", "32"]);
    let r = server.post_json(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": QUESTION}]}),
    );
    assert_openai_error(&r, 400, "context");
    assert_eq!(r.json()["error"]["code"], "context_length_exceeded");
    assert!(server.alive());
    let h = server.request("GET", "/health", None).unwrap();
    assert_eq!(h.status, 200);
}

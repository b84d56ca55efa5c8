//! Structured output on every surface: answers held to a JSON schema
//! (Chat `response_format`, Responses `text.format`, Anthropic
//! `output_config.format`), to a regular expression or a Lark grammar (the
//! `grammar` extension of Chat and Completions), streamed or not; schemas
//! and grammars that cannot be enforced are a 400 naming the field.
//! (The official SDKs' `parse()` helpers are driven in `tests/python/`.)

use ds4_tests::Server;
use serde_json::{json, Value};

/// A person: a name, an age in range, one or two tags from an enum.
fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"enum": ["friend", "colleague"]},
                     "minItems": 1, "maxItems": 2}
        },
        "required": ["name", "age", "tags"],
        "additionalProperties": false
    })
}

/// Whether `v` is a person as [`person_schema`] says.
fn check_person(v: &Value) {
    let o = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"));
    assert_eq!(o.len(), 3, "{v}");
    assert!(o["name"].as_str().unwrap().chars().count() <= 20, "{v}");
    let age = o["age"].as_i64().unwrap_or_else(|| panic!("age: {v}"));
    assert!((0..=120).contains(&age), "{v}");
    let tags = o["tags"].as_array().unwrap();
    assert!((1..=2).contains(&tags.len()), "{v}");
    for t in tags {
        assert!(t == "friend" || t == "colleague", "{v}");
    }
}

fn sse_data(body: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(body)
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

#[test]
fn answers_match_their_schema_on_every_surface() {
    let server = Server::start(&[]);
    let ask = "Describe a friend of mine called Ann as JSON.";
    for temperature in [0.0, 1.0] {
        for seed in 0..3 {
            let r = server.post_json(
                "/v1/chat/completions",
                &json!({"messages": [{"role": "user", "content": ask}], "max_tokens": 120,
                        "temperature": temperature, "seed": seed,
                        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "person", "schema": person_schema(), "strict": true}}}),
            );
            let v = r.json();
            assert_eq!(r.status, 200, "{v}");
            assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
            let content = v["choices"][0]["message"]["content"].as_str().unwrap();
            check_person(&serde_json::from_str(content).unwrap());
        }
    }

    // Streamed: the deltas concatenate to a valid answer.
    let r = server.post_json(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": ask}], "max_tokens": 120, "stream": true,
                "response_format": {"type": "json_schema",
                    "json_schema": {"name": "person", "schema": person_schema()}}}),
    );
    assert_eq!(r.status, 200);
    let text: String = sse_data(&r.body)
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    check_person(&serde_json::from_str(&text).unwrap());

    // Any object.
    let r = server.post_json(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": ask}], "max_tokens": 200,
                "response_format": {"type": "json_object"}}),
    );
    let v = r.json();
    let content = v["choices"][0]["message"]["content"].as_str().unwrap();
    if v["choices"][0]["finish_reason"] == "stop" {
        assert!(serde_json::from_str::<Value>(content).unwrap().is_object());
    } else {
        assert!(content.starts_with('{'), "{content}");
    }

    // Responses: text.format.
    let r = server.post_json(
        "/v1/responses",
        &json!({"input": ask, "max_output_tokens": 120,
                "text": {"format": {"type": "json_schema", "name": "person", "schema": person_schema()}}}),
    );
    let v = r.json();
    assert_eq!(v["status"], "completed", "{v}");
    let text = v["output"][0]["content"][0]["text"].as_str().unwrap();
    check_person(&serde_json::from_str(text).unwrap());

    // Anthropic Messages: output_config.format.
    let r = server.post_json(
        "/v1/messages",
        &json!({"messages": [{"role": "user", "content": ask}], "max_tokens": 120,
                "output_config": {"format": {"type": "json_schema", "schema": person_schema()}}}),
    );
    let v = r.json();
    assert_eq!(v["stop_reason"], "end_turn", "{v}");
    check_person(&serde_json::from_str(v["content"][0]["text"].as_str().unwrap()).unwrap());
}

/// A number's digits are bounded (8 after the point, 15 before it), so a
/// model asked for many digits still ends its answer: greedy SmolLM2
/// writes pi's digits on and on when nothing stops it.
#[test]
fn numbers_in_a_schema_have_bounded_digits() {
    let server = Server::start(&[]);
    let schema = json!({"type": "object", "properties": {"pi": {"type": "number"}},
                        "required": ["pi"], "additionalProperties": false});
    let r = server.post_json(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user",
                              "content": "Write pi to 60 decimal places, as JSON with the key pi."}],
                "max_tokens": 200, "temperature": 0,
                "response_format": {"type": "json_schema",
                    "json_schema": {"name": "pi", "schema": schema}}}),
    );
    let v = r.json();
    assert_eq!(r.status, 200, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    let content = v["choices"][0]["message"]["content"].as_str().unwrap();
    let pi: Value = serde_json::from_str(content).unwrap();
    let digits = content
        .split('.')
        .nth(1)
        .map_or(0, |f| f.bytes().take_while(u8::is_ascii_digit).count());
    assert!((1..=8).contains(&digits), "{content}");
    assert!(
        (pi["pi"].as_f64().unwrap() - std::f64::consts::PI).abs() < 1e-2,
        "{content}"
    );
}

#[test]
fn raw_grammars_hold_completions_and_chat() {
    let server = Server::start(&[]);
    for seed in 0..4 {
        let r = server.post_json(
            "/v1/completions",
            &json!({"prompt": "Call me at", "max_tokens": 20, "temperature": 1, "seed": seed,
                    "grammar": {"syntax": "regex", "definition": " [0-9]{3}-[0-9]{4}"}}),
        );
        let v = r.json();
        let text = v["choices"][0]["text"].as_str().unwrap();
        let b = text.as_bytes();
        assert_eq!(b.len(), 9, "{text:?}");
        assert!(b[0] == b' ' && b[4] == b'-', "{text:?}");
        assert!(
            b[1..4].iter().chain(&b[5..]).all(u8::is_ascii_digit),
            "{text:?}"
        );
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
    }
    let r = server.post_json(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Is the sky blue?"}], "max_tokens": 10,
                "temperature": 1, "grammar": "start: \"Yes\" | \"No\""}),
    );
    let v = r.json();
    let content = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(content == "Yes" || content == "No", "{v}");
}

#[test]
fn grammars_that_cannot_be_enforced_are_refused() {
    let server = Server::start(&[]);
    let chat = |extra: Value| {
        let mut body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        server.post_json("/v1/chat/completions", &body)
    };
    let cases = [
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}}),
            "response_format",
        ),
        (
            json!({"response_format": {"type": "xml"}}),
            "response_format",
        ),
        (json!({"grammar": "start: ("}), "grammar"),
        (
            json!({"grammar": {"syntax": "regex", "definition": "(unclosed"}}),
            "grammar",
        ),
        (
            json!({"grammar": "start: \"a\"", "response_format": {"type": "json_object"}}),
            "grammar",
        ),
    ];
    for (extra, param) in cases {
        let r = chat(extra.clone());
        let v = r.json();
        assert_eq!(r.status, 400, "{extra}: {v}");
        assert_eq!(v["error"]["param"], param, "{extra}: {v}");
    }
    let r = server.post_json(
        "/v1/messages",
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                "output_config": {"format": {"type": "json_schema", "schema": {"type": "nonsense"}}}}),
    );
    let v = r.json();
    assert_eq!(r.status, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("output_config.format"),
        "{v}"
    );
    // The server goes on serving.
    let r = chat(json!({}));
    assert_eq!(r.status, 200);
}

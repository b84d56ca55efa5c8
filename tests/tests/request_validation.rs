//! Requests are checked against each API's documented types: malformed
//! tools, a `tool_choice` no answer can honour and wrong-typed known
//! fields get a 400 in the API's envelope naming the field; unknown fields
//! stay accepted, and the documented fields ds4 applies (penalties, logit
//! bias) work.

use ds4_tests::Server;
use serde_json::{json, Value};

/// A surface's minimal valid request, with `extra` merged in.
fn request(path: &str, extra: Value) -> Value {
    let mut base = match path {
        "/v1/chat/completions" => {
            json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
        }
        "/v1/completions" => json!({"prompt": "Hi", "max_tokens": 2}),
        "/v1/responses" => json!({"input": "Hi", "max_output_tokens": 2}),
        "/v1/messages" => {
            json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
        }
        _ => unreachable!(),
    };
    for (k, v) in extra.as_object().unwrap() {
        base[k] = v.clone();
    }
    base
}

#[test]
fn malformed_fields_are_refused_naming_the_field() {
    let server = Server::start(&[]);
    let chat = "/v1/chat/completions";
    let completions = "/v1/completions";
    let responses = "/v1/responses";
    let messages = "/v1/messages";
    let cases: Vec<(&str, Value, &str)> = vec![
        // Tools without a name, or with a schema that is not an object.
        (
            chat,
            json!({"tools": [{"type": "function", "function": {"name": ""}}]}),
            "tools",
        ),
        (
            chat,
            json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}),
            "tools",
        ),
        (
            responses,
            json!({"tools": [{"type": "function", "name": "f", "parameters": 5}]}),
            "tools",
        ),
        (
            responses,
            json!({"tools": [{"type": "function", "parameters": {}}]}),
            "tools",
        ),
        (
            messages,
            json!({"tools": [{"name": "f", "input_schema": "x"}]}),
            "tools",
        ),
        (
            messages,
            json!({"tools": [{"input_schema": {"type": "object"}}]}),
            "tools",
        ),
        // A call required of a request without tools, or of a tool it
        // does not offer.
        (chat, json!({"tool_choice": "required"}), "tool_choice"),
        (responses, json!({"tool_choice": "required"}), "tool_choice"),
        (
            messages,
            json!({"tool_choice": {"type": "any"}}),
            "tool_choice",
        ),
        (
            messages,
            json!({"tool_choice": {"type": "tool", "name": "f"}}),
            "tool_choice",
        ),
        // Wrong-typed or out-of-range known fields.
        (chat, json!({"presence_penalty": "x"}), "presence_penalty"),
        (chat, json!({"frequency_penalty": 2.5}), "frequency_penalty"),
        (chat, json!({"logit_bias": {"abc": 1}}), "logit_bias"),
        (chat, json!({"logit_bias": {"99999999": 1}}), "logit_bias"),
        (chat, json!({"metadata": "x"}), "metadata"),
        (chat, json!({"thinking": {"type": "ultra"}}), "thinking"),
        (
            chat,
            json!({"parallel_tool_calls": "yes"}),
            "parallel_tool_calls",
        ),
        (
            completions,
            json!({"presence_penalty": "x"}),
            "presence_penalty",
        ),
        (completions, json!({"logit_bias": [1]}), "logit_bias"),
        (responses, json!({"metadata": "x"}), "metadata"),
        (responses, json!({"metadata": {"k": 1}}), "metadata"),
        (messages, json!({"metadata": "x"}), "metadata"),
        (messages, json!({"thinking": {"type": "ultra"}}), "thinking"),
    ];
    for (path, extra, field) in cases {
        let body = request(path, extra.clone());
        let r = server.post_json(path, &body);
        let v = r.json();
        assert_eq!(r.status, 400, "{path} {extra}: {v}");
        if path == messages {
            assert_eq!(v["type"], "error", "{v}");
            assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
            let m = v["error"]["message"].as_str().unwrap();
            assert!(m.contains(field), "{path} {extra}: {m}");
        } else {
            assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
            assert_eq!(v["error"]["param"], field, "{path} {extra}: {v}");
        }
    }
}

#[test]
fn documented_fields_are_accepted_and_unknown_ones_ignored() {
    let server = Server::start(&[]);
    let ok: Vec<(&str, Value)> = vec![
        (
            "/v1/chat/completions",
            json!({"presence_penalty": 0.5, "frequency_penalty": -0.5, "logit_bias": {"7": 1.5},
                   "metadata": {"who": "test"}, "user": "u1", "parallel_tool_calls": false,
                   "store": false, "thinking": {"type": "disabled"}, "some_future_field": [1, 2]}),
        ),
        (
            "/v1/completions",
            json!({"presence_penalty": 1, "logit_bias": {}, "user": "u1"}),
        ),
        (
            "/v1/responses",
            json!({"metadata": {"k": "v"}, "parallel_tool_calls": true, "user": "u"}),
        ),
        (
            "/v1/messages",
            json!({"metadata": {"user_id": "u1"}, "thinking": {"type": "adaptive"}}),
        ),
    ];
    for (path, extra) in ok {
        let r = server.post_json(path, &request(path, extra.clone()));
        assert_eq!(r.status, 200, "{path} {extra}: {:?}", r.json());
    }
    // The Responses API echoes metadata in the client's order.
    let r = server.post_json(
        "/v1/responses",
        &request("/v1/responses", json!({"metadata": {"z": "1", "a": "2"}})),
    );
    let echoed: Vec<String> = r.json()["metadata"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    assert_eq!(echoed, ["z", "a"]);
}

#[test]
fn logit_bias_steers_greedy_decoding() {
    let server = Server::start(&[]);
    let ask = |bias: Value| {
        let r = server.post_json(
            "/v1/completions",
            &json!({"prompt": "The capital of France is", "max_tokens": 3, "temperature": 0,
                    "logit_bias": bias, "return_token_ids": true}),
        );
        assert_eq!(r.status, 200, "{:?}", r.json());
        r.json()["choices"][0]["token_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap())
            .collect::<Vec<_>>()
    };
    let plain = ask(json!({}));
    // Forbid the first greedy token: the answer starts differently.
    let banned = ask(json!({ plain[0].to_string(): -100 }));
    assert_ne!(banned[0], plain[0], "{plain:?} {banned:?}");
    // Force a token: every step takes it.
    let forced = ask(json!({"42": 100}));
    assert_eq!(forced, [42, 42, 42]);
}

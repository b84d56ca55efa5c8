//! `ds4-server` on the miniature DeepSeek V4 model: the family's prompt
//! protocol (DSML tools, thinking modes) through the HTTP surfaces. The
//! miniature model's text is random, so these check the protocol, not the
//! answers.

use ds4_tests::{tiny_model_path, Owner, Server};
use serde_json::Value;

const PARAMETERS: &str =
    r#"{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}"#;

fn post(server: &Server, path: &str, body: &str) -> ds4_tests::Response {
    server
        .request("POST", path, Some(body.as_bytes()))
        .expect("request")
}

/// `(event name, data)` of every SSE event in `body`.
fn sse(body: &[u8]) -> Vec<(Option<String>, Value)> {
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
            (name, serde_json::from_str(&data).expect("JSON event"))
        })
        .collect()
}

#[test]
fn tools_and_thinking_requests_are_accepted_and_answered() {
    let server = Server::start_model(&tiny_model_path(), &["--ctx", "2048"]);

    let models = server.request("GET", "/v1/models", None).unwrap().json();
    assert_eq!(models["data"][0]["id"], "ds4-tiny");

    // The DSML tools block is in the prompt: offering a tool costs tokens.
    let count = |tools: &str| {
        let r = post(
            &server,
            "/v1/messages/count_tokens",
            &format!(
                r#"{{"model":"ds4-tiny","max_tokens":8,"messages":[{{"role":"user","content":"Weather in Rome?"}}]{tools}}}"#
            ),
        );
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        r.json()["input_tokens"].as_u64().unwrap()
    };
    // deepseek-chat answers without thinking, deepseek-reasoner thinks.
    for (model, thinks) in [("deepseek-chat", false), ("deepseek-reasoner", true)] {
        let v = post(
            &server,
            "/v1/chat/completions",
            &format!(
                r#"{{"model":"{model}","max_tokens":3,"temperature":0,"messages":[{{"role":"user","content":"Hi"}}]}}"#
            ),
        )
        .json();
        let reasoning = v["choices"][0]["message"]["reasoning_content"].as_str();
        assert_eq!(
            reasoning.is_some_and(|r| !r.is_empty()),
            thinks,
            "{model}: {v}"
        );
    }
    let plain = count("");
    let with_tools = count(&format!(
        r#","tools":[{{"name":"get_weather","description":"Weather of a city","input_schema":{PARAMETERS}}}]"#
    ));
    assert!(with_tools > plain + 100, "{with_tools} vs {plain}");

    // Chat with tools, a prior call and its result, thinking off.
    let chat = format!(
        r#"{{"model":"ds4-tiny","max_tokens":3,"temperature":0,"reasoning_effort":"none","messages":[{{"role":"user","content":"Weather in Rome?"}},{{"role":"assistant","content":null,"tool_calls":[{{"id":"call_x","type":"function","function":{{"name":"get_weather","arguments":"{{\"city\":\"Rome\"}}"}}}}]}},{{"role":"tool","tool_call_id":"call_x","content":"sunny"}}],"tools":[{{"type":"function","function":{{"name":"get_weather","description":"Weather of a city","parameters":{PARAMETERS}}}}}]}}"#
    );
    let r = post(&server, "/v1/chat/completions", &chat);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    let finish = v["choices"][0]["finish_reason"].as_str().unwrap();
    assert!(
        ["length", "stop", "tool_calls"].contains(&finish),
        "{finish}"
    );
    assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() > with_tools);

    // An unknown effort is the client's error.
    let bad = post(
        &server,
        "/v1/chat/completions",
        &chat.replace(
            r#""reasoning_effort":"none""#,
            r#""reasoning_effort":"huge""#,
        ),
    );
    assert_eq!(bad.status, 400);
    assert_eq!(bad.json()["error"]["param"], "reasoning_effort");

    // Responses, streamed, thinking on: a well-formed event sequence.
    let r = post(
        &server,
        "/v1/responses",
        &format!(
            r#"{{"model":"ds4-tiny","stream":true,"max_output_tokens":3,"temperature":0,"reasoning":{{"effort":"high"}},"input":"Weather in Rome?","tools":[{{"type":"function","name":"get_weather","description":"Weather of a city","parameters":{PARAMETERS}}}]}}"#
        ),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let events = sse(&r.body);
    assert_eq!(events[0].0.as_deref(), Some("response.created"));
    for (i, (name, v)) in events.iter().enumerate() {
        assert_eq!(v["sequence_number"], i);
        assert_eq!(v["type"].as_str(), name.as_deref());
    }
    let (last, v) = events.last().unwrap();
    assert!(
        matches!(
            last.as_deref(),
            Some("response.incomplete" | "response.completed")
        ),
        "{last:?}"
    );
    assert!(v["response"]["output"]
        .as_array()
        .is_some_and(|o| !o.is_empty()));
}

/// The miniature model served from a weight owner (host backend): the
/// worker binds every tensor, routed-expert slices included, to the
/// owner's regions, and answers exactly as a standalone worker does.
#[test]
fn tiny_model_through_the_weight_owner_answers_like_standalone() {
    let tiny = tiny_model_path();
    let ask = |server: &Server| {
        let r = post(
            server,
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"Hello"}],"temperature":0,"max_tokens":12,"reasoning_effort":"none"}"#,
        );
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let v = r.json();
        assert_eq!(
            v["usage"]["completion_tokens"].as_u64().map(|n| n > 0),
            Some(true)
        );
        v["choices"][0]["message"].clone()
    };
    let standalone = ask(&Server::start_model(&tiny, &["--ctx", "512"]));
    let owner = Owner::start_model(&tiny, &[]);
    let attached = Server::start_model(
        &tiny,
        &["--ctx", "512", "--weights-manifest", &owner.manifest_arg()],
    );
    assert_eq!(ask(&attached), standalone);
    assert_eq!(owner.status()["leases"].as_array().map(Vec::len), Some(1));
}

/// Arguments of a forced call on the miniature model: `days` 1 to 7 and
/// `unit` one of two (the model's text is random; the grammar holds it).
fn check_args(args: &Value) {
    let o = args
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {args}"));
    assert_eq!(o.len(), 2, "{args}");
    let days = o["days"].as_i64().unwrap_or_else(|| panic!("{args}"));
    assert!((1..=7).contains(&days), "{args}");
    assert!(o["unit"] == "c" || o["unit"] == "f", "{args}");
}

#[test]
fn a_required_call_is_written_in_dsml_and_mapped_to_each_api() {
    let server = Server::start_model(&tiny_model_path(), &["--ctx", "2048"]);
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"days": {"type": "integer", "minimum": 1, "maximum": 7},
                       "unit": {"type": "string", "enum": ["c", "f"]}},
        "required": ["days", "unit"],
        "additionalProperties": false
    });
    let msgs = serde_json::json!([{"role": "user", "content": "Weather in Rome?"}]);
    for seed in 0..3 {
        // Chat: a named function, thinking off.
        let r = server.post_json(
            "/v1/chat/completions",
            &serde_json::json!({"messages": msgs, "temperature": 1, "seed": seed, "max_tokens": 200,
                "reasoning_effort": "none",
                "tools": [{"type": "function", "function": {"name": "get_weather", "strict": true, "parameters": schema}}],
                "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}),
        );
        let v = r.json();
        assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
        let call = &v["choices"][0]["message"]["tool_calls"][0]["function"];
        assert_eq!(call["name"], "get_weather");
        check_args(&serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap());

        // Responses: the named function as a function_call item.
        let r = server.post_json(
            "/v1/responses",
            &serde_json::json!({"input": "Weather in Rome?", "temperature": 1, "seed": seed,
                "max_output_tokens": 200, "reasoning": {"effort": "none"},
                "tools": [{"type": "function", "name": "get_weather", "strict": true, "parameters": schema}],
                "tool_choice": {"type": "function", "name": "get_weather"}}),
        );
        let v = r.json();
        let item = v["output"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["type"] == "function_call")
            .unwrap_or_else(|| panic!("no function_call: {v}"));
        assert_eq!(item["name"], "get_weather");
        check_args(&serde_json::from_str(item["arguments"].as_str().unwrap()).unwrap());

        // Anthropic Messages: the tool as a tool_use block.
        let r = server.post_json(
            "/v1/messages",
            &serde_json::json!({"messages": msgs, "temperature": 1, "max_tokens": 200,
                "thinking": {"type": "disabled"},
                "tools": [{"name": "get_weather", "strict": true, "input_schema": schema}],
                "tool_choice": {"type": "tool", "name": "get_weather"}}),
        );
        let v = r.json();
        assert_eq!(v["stop_reason"], "tool_use", "{v}");
        let block = v["content"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["type"] == "tool_use")
            .unwrap_or_else(|| panic!("no tool_use: {v}"));
        check_args(&block["input"]);
    }
    // Required (any tool): at least one finished call, in DSML.
    let r = server.post_json(
        "/v1/chat/completions",
        &serde_json::json!({"messages": msgs, "temperature": 1, "seed": 5, "max_tokens": 200,
            "reasoning_effort": "none",
            "tools": [{"type": "function", "function": {"name": "get_weather", "strict": true, "parameters": schema}}],
            "tool_choice": "required"}),
    );
    let v = r.json();
    let call = &v["choices"][0]["message"]["tool_calls"][0]["function"];
    check_args(&serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap());
}

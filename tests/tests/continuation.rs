//! The continuation registry: an output-only follow-up (Responses'
//! `previous_response_id` with the calls' outputs; an Anthropic request
//! holding only the `tool_result` blocks) continues the turn that made the
//! calls from its cached prefix; one that does not match exactly is a 409
//! in the API's envelope. On SmolLM2 and on the tiny DeepSeek V4 model.

use ds4_tests::{tiny_model_path, Server};
use serde_json::{json, Value};

fn weather() -> Value {
    json!({"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
           "required": ["city"], "additionalProperties": false})
}

/// `slack`: tokens a resumed prompt may recompute (the dense cache reuses
/// 16-token blocks; DeepSeek V4 resumes at prefill chunk boundaries).
fn responses(server: &Server, stream: bool, max_tokens: u32, slack: u64) {
    let tools = json!([{"type": "function", "name": "get_weather", "strict": true, "parameters": weather()}]);
    let first = json!({"input": "What is the weather in Paris?", "tools": tools,
        "tool_choice": "required", "parallel_tool_calls": false, "temperature": 0,
        "max_output_tokens": max_tokens, "stream": stream, "reasoning": {"effort": "none"}});
    let (id, call, first_input) = if stream {
        let r = server.post_json("/v1/responses", &first);
        let text = String::from_utf8(r.body).unwrap();
        let done: Value = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .find(|e| e["type"] == "response.completed")
            .unwrap_or_else(|| panic!("{text}"));
        let resp = done["response"].clone();
        let call = resp["output"]
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["type"] == "function_call")
            .cloned();
        let input = resp["usage"]["input_tokens"].as_u64().unwrap();
        (
            resp["id"].as_str().unwrap().to_string(),
            call.unwrap_or_else(|| panic!("{resp}")),
            input,
        )
    } else {
        let v = server.post_json("/v1/responses", &first).json();
        let call = v["output"]
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["type"] == "function_call")
            .cloned();
        let input = v["usage"]["input_tokens"].as_u64().unwrap();
        (
            v["id"].as_str().unwrap().to_string(),
            call.unwrap_or_else(|| panic!("{v}")),
            input,
        )
    };
    let call_id = call["call_id"].as_str().unwrap();
    let follow = |prev: &str, call_id: &str| {
        server.post_json(
            "/v1/responses",
            &json!({"previous_response_id": prev, "tools": tools, "temperature": 0,
                    "tool_choice": "required", "parallel_tool_calls": false,
                    "max_output_tokens": 8, "reasoning": {"effort": "none"},
                    "input": [{"type": "function_call_output", "call_id": call_id, "output": "sunny"}]}),
        )
    };
    let r = follow(&id, call_id);
    let v = r.json();
    assert_eq!(r.status, 200, "{v}");
    // The first turn's prompt is cached (the call itself is rendered
    // again, canonically, and may tokenize differently).
    let cached = v["usage"]["input_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    eprintln!(
        "responses: first prompt {first_input}, follow-up cached {cached}: {}",
        v["usage"]
    );
    assert!(
        cached > 0 && cached + slack >= first_input,
        "cached {cached}, first prompt {first_input}: {v}"
    );
    for (prev, call) in [(id.as_str(), "call_other"), ("resp_unknown", call_id)] {
        let r = follow(prev, call);
        let v = r.json();
        assert_eq!(r.status, 409, "{v}");
        assert_eq!(v["error"]["param"], "previous_response_id", "{v}");
        assert_eq!(v["error"]["code"], "continuation_unavailable", "{v}");
    }
}

fn messages(server: &Server, max_tokens: u32, slack: u64) {
    let tools = json!([{"name": "get_weather", "strict": true, "input_schema": weather()}]);
    let v = server
        .post_json(
            "/v1/messages",
            &json!({"max_tokens": max_tokens, "temperature": 0, "tools": tools,
                    "tool_choice": {"type": "tool", "name": "get_weather"},
                    "thinking": {"type": "disabled"},
                    "messages": [{"role": "user", "content": "What is the weather in Paris?"}]}),
        )
        .json();
    let first_input = v["usage"]["input_tokens"].as_u64().unwrap();
    let use_id = v["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "tool_use")
        .unwrap_or_else(|| panic!("{v}"))["id"]
        .as_str()
        .unwrap()
        .to_string();
    let follow = |id: &str, tools: &Value| {
        server.post_json(
            "/v1/messages",
            &json!({"max_tokens": 8, "temperature": 0, "tools": tools,
                    "tool_choice": {"type": "tool", "name": "get_weather"},
                    "thinking": {"type": "disabled"},
                    "messages": [{"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": id, "content": "sunny"}]}]}),
        )
    };
    let r = follow(&use_id, &tools);
    let v = r.json();
    assert_eq!(r.status, 200, "{v}");
    let cached = v["usage"]["cache_read_input_tokens"].as_u64().unwrap();
    eprintln!(
        "messages: first prompt {first_input}, follow-up cached {cached}: {}",
        v["usage"]
    );
    assert!(
        cached > 0 && cached + slack >= first_input,
        "cached {cached}, first prompt {first_input}: {v}"
    );
    let other_tools = json!([{"name": "get_time", "input_schema": {"type": "object"}}]);
    for (id, tools) in [("toolu_unknown", &tools), (use_id.as_str(), &other_tools)] {
        let r = follow(id, tools);
        let v = r.json();
        assert_eq!(r.status, 409, "{v}");
        assert_eq!(v["type"], "error", "{v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    }
}

#[test]
fn output_only_follow_ups_continue_on_smollm2() {
    let server = Server::start(&[]);
    responses(&server, false, 64, 16);
    responses(&server, true, 64, 16);
    messages(&server, 64, 16);
}

#[test]
fn output_only_follow_ups_continue_on_deepseek4() {
    let server = Server::start_model(&tiny_model_path(), &["--ctx", "2048"]);
    responses(&server, false, 600, 512);
    messages(&server, 600, 512);
}

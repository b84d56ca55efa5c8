//! Tool slips (a tools-armed turn that ends with `stop` and no call): the
//! dump writes one file per slip, resampling draws once more, and both
//! are counted; an answer with a call is no slip.

use ds4_tests::Server;
use serde_json::{json, Value};

fn counter(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from:\n{metrics}"))
}

#[test]
fn slips_are_dumped_redrawn_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let dump = dir.path().join("slips");
    let server = Server::start(&[
        "--tool-slip-dump",
        dump.to_str().unwrap(),
        "--tool-slip-resample",
    ]);
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    // The first line break ends the answer (a stop string is a `stop`).
    let ask = |content: &str, choice: Value| {
        server
            .post_json(
                "/v1/chat/completions",
                &json!({"messages": [{"role": "user", "content": content}], "tools": tools,
                        "tool_choice": choice, "temperature": 0, "max_tokens": 200,
                        "stop": ["\n"]}),
            )
            .json()
    };
    // A greeting answered in prose: a slip, dumped and drawn again.
    let v = ask("Just say hello to me, nothing else.", json!("auto"));
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    let files: Vec<_> = std::fs::read_dir(&dump).unwrap().collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let record: Value =
        serde_json::from_slice(&std::fs::read(files[0].as_ref().unwrap().path()).unwrap()).unwrap();
    assert_eq!(record["request"]["tool_choice"], "auto", "{record}");
    assert_eq!(record["resampled"], true);
    assert!(!record["text"].as_str().unwrap().is_empty(), "{record}");
    // A forced call is no slip.
    let v = ask("Weather in Paris?", json!("required"));
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
    // Without tools there is nothing to slip.
    server.post_json(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}),
    );
    let metrics = String::from_utf8(server.request("GET", "/metrics", None).unwrap().body).unwrap();
    assert_eq!(counter(&metrics, "ds4_tool_slips_total"), 1.0);
    assert_eq!(counter(&metrics, "ds4_tool_slip_resamples_total"), 1.0);
    assert_eq!(std::fs::read_dir(&dump).unwrap().count(), 1);
}

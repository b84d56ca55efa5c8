//! Real qwen2 chat templates rendered by our minijinja `ChatTemplate` give,
//! byte for byte, what Python's jinja2 renders with `transformers`'
//! settings (`fixtures/qwen2/gen_qwen2_templates.py`): Qwen2.5-Instruct's
//! template with tools, parallel tool calls and tool responses, and the
//! template of the DeepSeek-R1-Distill-Qwen GGUF (its thinking cut and
//! tool-call markup).
//!
//! Tool definitions are rendered with `tojson`, which keeps the keys in
//! the order the client sent them (serde_json and minijinja are built with
//! `preserve_order`), as Python does.

use ds4_model::chat::{ChatTemplate, RenderInput};
use serde_json::Value;

fn fixture(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/qwen2")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Render every fixture case whose `key_order_matters` is `key_order`;
/// returns how many were checked.
fn check_cases(key_order: bool) -> usize {
    let r: Value = serde_json::from_str(&fixture("qwen2-templates-jinja2.json")).unwrap();
    let cases = r["cases"].as_array().unwrap();
    let mut checked = 0;
    for case in cases {
        if case["key_order_matters"].as_bool().unwrap() != key_order {
            continue;
        }
        checked += 1;
        let name = case["name"].as_str().unwrap();
        let template = ChatTemplate::new(
            fixture(case["template"].as_str().unwrap()),
            case["bos_token"].as_str().unwrap(),
            case["eos_token"].as_str().unwrap(),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        let tools = case["tools"].as_array().map(Vec::as_slice);
        let got = template
            .render_with(&RenderInput {
                messages: case["messages"].as_array().unwrap(),
                tools,
                add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
                extra: None,
            })
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(got, case["expected"].as_str().unwrap(), "{name}");
    }
    checked
}

#[test]
fn qwen2_templates_render_like_jinja2() {
    assert_eq!(check_cases(false), 5);
}

#[test]
fn qwen2_templates_keep_tool_key_order_like_jinja2() {
    assert_eq!(check_cases(true), 2);
}

#[test]
fn qwen25_template_lists_every_tool_in_the_system_turn() {
    let template = ChatTemplate::new(fixture("qwen2.5-instruct.jinja"), "", "<|im_end|>").unwrap();
    let tools = [serde_json::json!({"function": {"name": "a_tool"}, "type": "function"})];
    let messages = [serde_json::json!({"role": "user", "content": "hi"})];
    let with = template
        .render_with(&RenderInput {
            messages: &messages,
            tools: Some(&tools),
            add_generation_prompt: true,
            extra: None,
        })
        .unwrap();
    let system = with.split("<|im_end|>").next().unwrap();
    assert!(
        system.contains(
            "<tools>\n{\"function\": {\"name\": \"a_tool\"}, \"type\": \"function\"}\n</tools>"
        ),
        "{with}"
    );
    assert!(with.ends_with("<|im_start|>assistant\n"), "{with}");
}

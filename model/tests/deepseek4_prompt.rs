//! DeepSeek V4's prompt protocol: the specification's complete rendered
//! example (thinking mode, one tool call and its result; 2,091 bytes,
//! `fixtures/deepseek4/prompt-example.txt`, copied verbatim from the
//! spec) is reproduced byte for byte, both from the canonical DSML form
//! and by replaying the bytes the model sampled.

use ds4_model::chat::deepseek4::{render, Message, Transcript};
use ds4_model::chat::dsml::{parse_complete, DsmlEvent, DsmlStreamParser, ReplayMap, ToolCall};
use ds4_model::chat::Thinking;

const SCHEMA: &str = r#"{"name":"get_weather","description":"Get current weather for a city","parameters":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}},"required":["city"]}}"#;

fn messages(arguments: &str) -> Vec<Message> {
    vec![
        Message::System("You are a concise assistant.".into()),
        Message::User("What's the weather in Rome today?".into()),
        Message::Assistant {
            reasoning: Some("The user wants today's weather in Rome; call get_weather.".into()),
            content: String::new(),
            tool_calls: vec![ToolCall {
                id: "call_0".into(),
                name: "get_weather".into(),
                arguments: arguments.into(),
            }],
        },
        Message::Tool {
            call_id: "call_0".into(),
            content: r#"{"city":"Rome","temp_c":21,"sky":"clear"}"#.into(),
        },
    ]
}

fn expected() -> String {
    std::fs::read_to_string(ds4_tests::deepseek4::fixture("prompt-example.txt")).unwrap()
}

#[test]
fn spec_example_renders_byte_for_byte() {
    let want = expected();
    assert_eq!(want.len(), 2091);
    let tools = [SCHEMA.to_string()];
    let msgs = messages(r#"{"city": "Rome", "days": 1}"#);
    let conv = Transcript {
        tools: &tools,
        messages: &msgs,
        thinking: Thinking::High,
        reasoning_replay: true,
        add_generation_prompt: true,
    };
    assert_eq!(render(&conv, &ReplayMap::new()).unwrap(), want);
}

#[test]
fn sampled_tool_call_is_replayed_exactly() {
    let want = expected();
    // What the model generated after `<｜Assistant｜><think>` in the first turn.
    let start = want.find("<think>The user").unwrap() + "<think>".len();
    let end = start
        + want[start..].find("</｜DSML｜tool_calls>").unwrap()
        + "</｜DSML｜tool_calls>".len();
    let generated = &want[start..end];
    let (reasoning, answer) = generated.split_once("</think>").unwrap();

    // Stream it in small pieces, as tokens arrive.
    let mut parser = DsmlStreamParser::new();
    let mut events = Vec::new();
    let chars: Vec<char> = answer.chars().collect();
    for piece in chars.chunks(3) {
        events.extend(parser.push(&piece.iter().collect::<String>()).unwrap());
    }
    assert!(parser.is_done(), "the closing tag is the stop condition");
    let mut replay = ReplayMap::new();
    let mut name = None;
    let mut args = String::new();
    for e in events {
        match e {
            DsmlEvent::CallStart { name: n, .. } => name = Some(n),
            DsmlEvent::ArgumentsDelta { delta, .. } => args.push_str(&delta),
            DsmlEvent::Done { raw } => replay.insert(["call_0"], &raw),
            DsmlEvent::Text(t) => panic!("no visible content expected, got {t:?}"),
            DsmlEvent::CallEnd { .. } => {}
        }
    }
    assert_eq!(name.as_deref(), Some("get_weather"));
    assert_eq!(args, r#"{"city":"Rome","days":1}"#);

    let tools = [SCHEMA.to_string()];
    let mut msgs = messages(&args);
    if let Message::Assistant { reasoning: r, .. } = &mut msgs[2] {
        *r = Some(reasoning.to_string());
    }
    let conv = Transcript {
        tools: &tools,
        messages: &msgs,
        thinking: Thinking::High,
        reasoning_replay: true,
        add_generation_prompt: true,
    };
    assert_eq!(render(&conv, &replay).unwrap(), want);
    assert_eq!(parse_complete(answer).unwrap().calls.len(), 1);
}

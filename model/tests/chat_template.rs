//! The SmolLM2 chat template rendered from the real GGUF must give, byte for
//! byte, the prompt llama.cpp built (`fixtures/smollm2-llamacpp.json`), and
//! that prompt must tokenize to llama.cpp's ids.
//!
//! The model is found through `DS4_TEST_MODEL` or as `ds4.gguf` in a parent
//! folder of this crate; run `./scripts/fetch-model.sh` to get it.

mod common;
use common::model_path;

use ds4_model::chat::{ChatMessage, ChatTemplate, PromptError, RenderInput};
use ds4_model::gguf::GgufFile;
use ds4_model::tokenizer::Tokenizer;
use serde::Deserialize;

fn open_model() -> GgufFile {
    let path = model_path();
    GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[derive(Deserialize)]
struct Reference {
    prompts: Vec<ReferencePrompt>,
}

#[derive(Deserialize)]
struct ReferencePrompt {
    name: String,
    prompt: String,
    parse_special: bool,
    token_ids: Vec<u32>,
}

const QUESTION: &str = "What is the capital of France? Answer in one sentence.";

fn reference_chat() -> ReferencePrompt {
    let r: Reference =
        serde_json::from_str(include_str!("fixtures/smollm2-llamacpp.json")).unwrap();
    r.prompts
        .into_iter()
        .find(|p| p.name == "chat")
        .expect("reference has the chat prompt")
}

#[test]
fn smollm2_template_renders_llama_cpp_prompt() {
    let file = open_model();
    let template = ChatTemplate::from_gguf(file.metadata())
        .unwrap()
        .expect("SmolLM2 ships a chat template");
    assert_eq!(template.bos_token(), "<|im_start|>");
    assert_eq!(template.eos_token(), "<|im_end|>");

    let reference = reference_chat();
    let prompt = template
        .render(&[ChatMessage::new("user", QUESTION)], true)
        .unwrap();
    assert_eq!(
        prompt, reference.prompt,
        "rendered prompt differs from llama.cpp's"
    );

    // And end to end: the rendered prompt tokenizes to llama.cpp's ids.
    let tok = Tokenizer::from_gguf(file.metadata()).unwrap();
    let ids = tok.encode(&prompt, reference.parse_special).unwrap();
    assert_eq!(ids, reference.token_ids);
}

#[test]
fn generation_prompt_and_system_message() {
    let file = open_model();
    let template = ChatTemplate::from_gguf(file.metadata()).unwrap().unwrap();
    let without = template
        .render(&[ChatMessage::new("user", "Hi")], false)
        .unwrap();
    assert!(without.ends_with("Hi<|im_end|>\n"), "{without:?}");
    assert!(!without.contains("<|im_start|>assistant"));

    // A system message replaces the template's default one.
    let messages = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Hi"),
    ];
    let out = template.render(&messages, true).unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );

    // JSON messages render the same as typed ones.
    let json = [serde_json::json!({"role": "user", "content": "Hi"})];
    let via_json = template
        .render_with(&RenderInput {
            messages: &json,
            add_generation_prompt: false,
            ..RenderInput::default()
        })
        .unwrap();
    assert_eq!(via_json, without);
}

#[test]
fn gguf_without_template_gives_none_and_bad_type_is_typed() {
    use ds4_model::gguf::writer::write_gguf;
    use ds4_model::gguf::{parse_header, MetaValue, DEFAULT_ALIGNMENT};

    let meta = |kv: Vec<(String, MetaValue)>| {
        parse_header(&write_gguf(&kv, &[], DEFAULT_ALIGNMENT))
            .unwrap()
            .metadata
    };
    assert!(ChatTemplate::from_gguf(&meta(vec![])).unwrap().is_none());

    let err = ChatTemplate::from_gguf(&meta(vec![(
        "tokenizer.chat_template".into(),
        MetaValue::U32(1),
    )]))
    .unwrap_err();
    assert!(
        matches!(
            err,
            PromptError::WrongType {
                key: "tokenizer.chat_template",
                ..
            }
        ),
        "{err:?}"
    );

    let err = ChatTemplate::from_gguf(&meta(vec![(
        "tokenizer.chat_template".into(),
        MetaValue::String("{% if %}".into()),
    )]))
    .unwrap_err();
    assert!(matches!(err, PromptError::Syntax { .. }), "{err:?}");
}

//! The serving engine on the miniature DeepSeek V4 model: many sequences
//! in one batched pass give each what it gets alone; a conversation resent
//! with a new turn resumes from its cached compressed state (blocks plus
//! the window block kept at its end) and answers as a cold run does; the
//! disk KV cache restores that state in a worker started later. The
//! miniature model's text is random: the checks compare token ids.

use std::path::Path;

use ds4_tests::{tiny_model_path, Server};
use serde_json::{json, Value};

/// Greedy chat answer to `messages`: (generated token ids, usage).
fn chat(server: &Server, messages: &Value, max_tokens: usize) -> (Vec<u64>, Value) {
    let (ids, _, usage) = chat_text(server, messages, max_tokens);
    (ids, usage)
}

/// [`chat`] with the answer's text.
fn chat_text(server: &Server, messages: &Value, max_tokens: usize) -> (Vec<u64>, String, Value) {
    let r = server.post_json(
        "/v1/chat/completions",
        &json!({
            "messages": messages,
            "temperature": 0,
            "max_tokens": max_tokens,
            "reasoning_effort": "none",
            "return_token_ids": true,
        }),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    let ids = v["choices"][0]["token_ids"]
        .as_array()
        .expect("token_ids")
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    let text = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    (ids, text, v["usage"].clone())
}

fn cached(usage: &Value) -> u64 {
    usage["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .expect("cached_tokens")
}

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

/// A long message: a numbered list of distinct lines (about 22 tokens each
/// with the miniature tokenizer).
fn long_text(tag: &str, lines: usize) -> String {
    (0..lines)
        .map(|i| format!("Item {i}: the {tag} value is {}.\n", i * 7 + 3))
        .collect()
}

fn server(extra: &[&str], log: Option<&Path>) -> Server {
    let mut args = vec!["--ctx", "4096", "--max-seqs", "8"];
    args.extend_from_slice(extra);
    Server::start_logged(&tiny_model_path(), &args, log)
}

const PROMPTS: [&str; 8] = [
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
    "The three primary colors are",
    "Water boils at a temperature of",
    "My favourite programming language is",
    "The quick brown fox",
    "In 1969, the first humans",
];

#[test]
fn concurrent_greedy_requests_equal_each_alone() {
    let n = 20;
    let alone: Vec<Vec<u64>> = {
        let s = server(&[], None);
        PROMPTS.iter().map(|p| chat(&s, &user(p), n).0).collect()
    };
    let s = server(&[], None);
    let together: Vec<Vec<u64>> = std::thread::scope(|sc| {
        let handles: Vec<_> = PROMPTS
            .iter()
            .map(|p| sc.spawn(|| chat(&s, &user(p), n).0))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(a.len(), n, "prompt {i} stopped early");
        assert_eq!(a, t, "prompt {i} ({:?}) differs when batched", PROMPTS[i]);
    }
}

/// A 2,000-token conversation and the same with its answer and a new turn.
fn conversation(server: &Server) -> (Value, Value, u64) {
    let first = user(&long_text("alpha", 90));
    let (_, answer_text, usage) = chat_text(server, &first, 8);
    let prompt = usage["prompt_tokens"].as_u64().unwrap();
    assert!(prompt >= 1900, "a {prompt}-token conversation");
    let mut next = first.clone();
    let turns = next.as_array_mut().unwrap();
    turns.push(json!({"role": "assistant", "content": answer_text}));
    turns.push(json!({"role": "user", "content": "And item 12?"}));
    (first, next, prompt)
}

#[test]
fn a_resent_conversation_resumes_from_its_cached_state() {
    let s = server(&[], None);
    let (_, next, prompt) = conversation(&s);
    let (warm, usage) = chat(&s, &next, 12);
    assert!(
        cached(&usage) >= 1800,
        "a {prompt}-token conversation resent gave {} cached tokens",
        cached(&usage)
    );
    // The same request on a server that has seen nothing.
    let cold_server = server(&[], None);
    let (cold, usage) = chat(&cold_server, &next, 12);
    assert_eq!(cached(&usage), 0);
    assert_eq!(warm, cold, "a resumed sequence answers as a cold one");
}

fn disk_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    v.retain(|p| p.extension().and_then(|e| e.to_str()) == Some("ds4kv"));
    v
}

#[test]
fn the_disk_cache_restores_a_conversation_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("server.log");
    let cache = dir.path().join("kv");
    let args = ["--kv-disk-dir", cache.to_str().unwrap()];

    let mut s = server(&args, Some(&log));
    let (_, next, _) = conversation(&s);
    // The long prefill was checkpointed at once; a clean stop writes the
    // conversation up to its last full block too.
    assert!(
        !disk_files(&cache).is_empty(),
        "a checkpoint after the prefill"
    );
    assert!(s.terminate(), "clean exit on SIGTERM");
    assert!(disk_files(&cache).len() >= 2, "{:?}", disk_files(&cache));

    let s = server(&args, Some(&log));
    let (warm, usage) = chat(&s, &next, 12);
    assert!(
        cached(&usage) >= 1800,
        "{} tokens restored from disk",
        cached(&usage)
    );
    let cold_server = server(&[], None);
    let (cold, _) = chat(&cold_server, &next, 12);
    assert_eq!(warm, cold, "a restored sequence answers as a cold one");
    drop(s);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("prefix restored"), "{text}");
}

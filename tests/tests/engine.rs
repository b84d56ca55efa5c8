//! The serving engine end to end on the default model: continuous batching
//! gives each request exactly what it gets alone, shared prefixes are
//! reused, the disk KV cache survives a restart and skips bad files, and a
//! small memory budget refuses excess requests with a retryable 503.

use std::path::Path;

use ds4_tests::{model_path, Server};
use serde_json::{json, Value};

/// Greedy completion of `prompt`: (text, usage).
fn complete(server: &Server, prompt: &str, max_tokens: usize) -> (String, Value) {
    let r = server.post_json(
        "/v1/completions",
        &json!({"prompt": prompt, "temperature": 0, "max_tokens": max_tokens}),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    (
        v["choices"][0]["text"].as_str().expect("text").to_string(),
        v["usage"].clone(),
    )
}

fn cached(usage: &Value) -> u64 {
    usage["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .expect("cached_tokens")
}

/// A long prompt: a numbered list of distinct lines (about 11 tokens each).
fn long_prompt(tag: &str, lines: usize) -> String {
    let mut s = format!("Notes of {tag}.\n");
    for i in 0..lines {
        s.push_str(&format!("Item {i}: the {tag} value is {}.\n", i * 7 + 3));
    }
    s
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
    let n_tokens = 24;
    // Alone, each on a server that has seen nothing else.
    let alone: Vec<String> = {
        let server = Server::start(&[]);
        PROMPTS
            .iter()
            .map(|p| complete(&server, p, n_tokens).0)
            .collect()
    };
    // All at once on a fresh server: batched steps, no cached prefixes.
    let server = Server::start(&[]);
    let together: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = PROMPTS
            .iter()
            .map(|p| s.spawn(|| complete(&server, p, n_tokens).0))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect()
    });
    for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(a, t, "prompt {i} ({:?}) differs when batched", PROMPTS[i]);
    }
    assert!(alone.iter().all(|a| !a.is_empty()));
}

#[test]
fn a_burst_of_requests_is_never_refused_while_the_queue_has_room() {
    // 16 clients, 16 short requests each: far below the queue's depth, so
    // none may be refused as busy (a queue count updated after the engine
    // had already taken the request once wrapped below zero and refused
    // everything for a moment).
    let server = Server::start(&[]);
    let statuses: Vec<u16> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..16)
            .map(|c| {
                let server = &server;
                s.spawn(move || {
                    (0..16)
                        .map(|i| {
                            server
                                .post_json(
                                    "/v1/completions",
                                    &json!({"prompt": format!("{c} {i}"), "max_tokens": 1}),
                                )
                                .status
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("thread"))
            .collect()
    });
    assert_eq!(statuses.len(), 256);
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
}

#[test]
fn a_shared_prefix_is_served_from_the_cache_on_every_surface() {
    let server = Server::start(&[]);
    let base = long_prompt("alpha", 90);
    let (_, first) = complete(&server, &format!("{base}Question one: what is item 3?"), 4);
    let prompt_tokens = first["prompt_tokens"].as_u64().unwrap();
    assert!(prompt_tokens > 1000, "{prompt_tokens} prompt tokens");
    assert_eq!(cached(&first), 0);
    let (_, second) = complete(&server, &format!("{base}Question two: what is item 5?"), 4);
    assert!(
        cached(&second) >= 960,
        "a 1000+-token shared prefix gave {} cached tokens",
        cached(&second)
    );

    // The same prefix through the other APIs reports it in their fields.
    let msg = |content: &str| json!([{"role": "user", "content": content}]);
    let chat = |content: String| {
        server
            .post_json(
                "/v1/chat/completions",
                &json!({"messages": msg(&content), "temperature": 0, "max_tokens": 2}),
            )
            .json()
    };
    chat(format!("{base}A?"));
    let c = chat(format!("{base}B?"));
    assert!(
        c["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            >= 960
    );
    let r = server
        .post_json(
            "/v1/responses",
            &json!({"input": format!("{base}C?"), "temperature": 0, "max_output_tokens": 2}),
        )
        .json();
    assert!(
        r["usage"]["input_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            >= 960,
        "{r}"
    );
    let models = server.request("GET", "/v1/models", None).unwrap().json();
    let model = models["data"][0]["id"].clone();
    let m = server
        .post_json(
            "/v1/messages",
            &json!({"model": model, "messages": msg(&format!("{base}D?")), "temperature": 0, "max_tokens": 2}),
        )
        .json();
    assert!(
        m["usage"]["cache_read_input_tokens"].as_u64().unwrap() >= 960,
        "{m}"
    );
}

fn disk_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    v.retain(|p| p.extension().and_then(|e| e.to_str()) == Some("ds4kv"));
    v.sort();
    v
}

#[test]
fn the_disk_cache_restores_a_prefix_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("server.log");
    let cache = dir.path().join("kv");
    let args = ["--kv-disk-dir", cache.to_str().unwrap()];
    let prompt = long_prompt("beta", 70);

    let mut server = Server::start_logged(&model_path(), &args, Some(&log));
    let (cold, usage) = complete(&server, &prompt, 16);
    assert_eq!(cached(&usage), 0);
    // A cold prefill of 512+ tokens is checkpointed right away.
    assert_eq!(
        disk_files(&cache).len(),
        1,
        "one checkpoint after a long prefill"
    );
    // Killed, not stopped: the checkpoint must already be complete.
    drop(server);

    server = Server::start_logged(&model_path(), &args, Some(&log));
    let (warm, usage) = complete(&server, &prompt, 16);
    assert!(cached(&usage) >= 512, "restored {} tokens", cached(&usage));
    assert_eq!(warm, cold, "tokens after a restore equal a cold run's");

    // A clean stop writes the cached prefixes (here: this conversation with
    // its answer, longer than the prefill checkpoint).
    let longer = format!("{prompt}{warm} And then");
    complete(&server, &longer, 4);
    assert!(server.terminate(), "clean exit on SIGTERM");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("prefix restored"), "{text}");
    assert!(disk_files(&cache).len() >= 2, "{:?}", disk_files(&cache));
}

#[test]
fn bad_disk_cache_files_are_skipped_and_the_budget_holds() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("server.log");
    let cache = dir.path().join("kv");
    // A 512-token checkpoint of this model is about 11.5 MiB: the budget
    // holds two.
    let args = [
        "--kv-disk-dir",
        cache.to_str().unwrap(),
        "--kv-disk-space-mb",
        "25",
    ];
    let prompt = long_prompt("gamma", 60);
    let server = Server::start_logged(&model_path(), &args, Some(&log));
    let (cold, _) = complete(&server, &prompt, 8);
    drop(server);
    let good = disk_files(&cache).pop().expect("a checkpoint");
    let bytes = std::fs::read(&good).unwrap();

    // Truncated, corrupt (a flipped byte in the body), not a cache file at
    // all, and one claiming another model.
    std::fs::write(cache.join("0123.ds4kv"), b"not a cache file").unwrap();
    let mut corrupt = bytes.clone();
    let mid = corrupt.len() / 2;
    corrupt[mid] ^= 0x40;
    std::fs::write(&good, &corrupt).unwrap();
    let truncated = cache.join("fedc.ds4kv");
    std::fs::write(&truncated, &bytes[..bytes.len() - 1000]).unwrap();
    let text = String::from_utf8_lossy(&bytes);
    let model_at = text.find("\"model\":\"").expect("model field") + 9;
    let mut foreign = bytes.clone();
    foreign[model_at] = if foreign[model_at] == b'0' {
        b'1'
    } else {
        b'0'
    };
    std::fs::write(cache.join("abcd.ds4kv"), &foreign).unwrap();

    let server = Server::start_logged(&model_path(), &args, Some(&log));
    let (again, usage) = complete(&server, &prompt, 8);
    assert_eq!(again, cold, "a corrupt checkpoint is recomputed, not used");
    assert_eq!(cached(&usage), 0);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("not a ds4 KV cache file"), "{text}");
    assert!(text.contains("truncated or padded"), "{text}");
    assert!(text.contains("another model"), "{text}");
    assert!(text.contains("checksum mismatch"), "{text}");

    // Four more long prefixes: the oldest files go, the budget holds.
    for tag in ["d1", "d2", "d3", "d4"] {
        complete(&server, &long_prompt(tag, 60), 2);
        let ours: u64 = disk_files(&cache)
            .iter()
            .filter(|p| !p.ends_with("abcd.ds4kv") && !p.ends_with("0123.ds4kv"))
            .map(|p| p.metadata().unwrap().len())
            .sum();
        assert!(ours <= 25 << 20, "{ours} bytes on disk");
    }
}

#[test]
fn a_tiny_memory_budget_refuses_excess_requests_with_a_retryable_503() {
    // Room for about one 256-token request at a time.
    let server = Server::start(&[
        "--ctx",
        "256",
        "--batch-tokens",
        "64",
        "--prefill-chunk",
        "64",
        "--max-seqs",
        "4",
        "--kv-memory-gb",
        "0.02",
    ]);
    let results: Vec<ds4_tests::Response> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..6)
            .map(|i| {
                let server = &server;
                s.spawn(move || {
                    let body = json!({"prompt": format!("Count to fifty: {i}"), "temperature": 0, "max_tokens": 200});
                    server.post_json("/v1/completions", &body)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let ok = results.iter().filter(|r| r.status == 200).count();
    let refused: Vec<_> = results.iter().filter(|r| r.status == 503).collect();
    assert!(ok >= 1, "an admitted request completes");
    assert!(!refused.is_empty(), "excess requests are refused");
    assert_eq!(ok + refused.len(), results.len());
    for r in &refused {
        assert_eq!(r.header("retry-after"), Some("1"));
        let v = r.json();
        assert_eq!(v["error"]["type"], "server_overloaded", "{v}");
        assert!(v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("KV cache memory"));
    }
    for r in results.iter().filter(|r| r.status == 200) {
        let v = r.json();
        assert!(v["usage"]["completion_tokens"].as_u64().unwrap() > 0, "{v}");
        assert!(["stop", "length"].contains(&v["choices"][0]["finish_reason"].as_str().unwrap()));
    }
    let metrics = server.request("GET", "/metrics", None).unwrap();
    let text = String::from_utf8_lossy(&metrics.body);
    assert!(text.contains("reason=\"busy_memory\""), "{text}");
}

//! A model split over several GPUs, expert-parallel (`ds4-weight-server
//! --rank INDEX/COUNT`), on the miniature DeepSeek V4 model and the host
//! backend: each rank's manifest holds its range of every routed expert
//! tensor and every other tensor whole, the ranks together hold every
//! expert once, `--dry-run` gives each rank's bytes, a model without
//! routed experts is refused, and a worker refuses a rank's manifest in
//! one line.

use std::collections::BTreeMap;
use std::process::Command;

use ds4_tests::{binary, tiny_model_path, Owner};
use serde_json::Value;

/// The manifest's base tensors by name.
fn tensors(owner: &Owner) -> BTreeMap<String, Value> {
    let m: Value = serde_json::from_slice(&std::fs::read(&owner.manifest).unwrap()).unwrap();
    m["scopes"]["base"]["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["name"].as_str().unwrap().to_string(), t.clone()))
        .collect()
}

fn manifest(owner: &Owner) -> Value {
    serde_json::from_slice(&std::fs::read(&owner.manifest).unwrap()).unwrap()
}

#[test]
fn two_ranks_hold_every_expert_once_and_everything_else_whole() {
    let model = tiny_model_path();
    let whole = Owner::start_model(&model, &[]);
    let ranks = [
        Owner::start_model(&model, &["--rank", "0/2"]),
        Owner::start_model(&model, &["--rank", "1/2"]),
    ];
    assert!(manifest(&whole).get("rank").is_none());
    for (i, r) in ranks.iter().enumerate() {
        assert_eq!(
            manifest(r)["rank"],
            serde_json::json!({"index": i, "of": 2})
        );
        assert_eq!(
            manifest(r)["model"]["layout_identity"],
            manifest(&whole)["model"]["layout_identity"],
            "every rank names the same model"
        );
    }
    let all = tensors(&whole);
    let parts: Vec<_> = ranks.iter().map(tensors).collect();
    let mut split = 0;
    for (name, t) in &all {
        let (a, b) = (&parts[0][name], &parts[1][name]);
        if name.contains("_exps.") {
            split += 1;
            let n_expert = t["shape"]
                .as_array()
                .unwrap()
                .last()
                .unwrap()
                .as_u64()
                .unwrap();
            let half = n_expert / 2;
            assert_eq!(a["layout"], "gguf-experts", "{name}");
            assert_eq!(a["experts"], serde_json::json!([0, half]), "{name}");
            assert_eq!(b["experts"], serde_json::json!([half, n_expert]), "{name}");
            assert_eq!(
                a["bytes"].as_u64().unwrap() + b["bytes"].as_u64().unwrap(),
                t["bytes"].as_u64().unwrap(),
                "{name}"
            );
            assert_eq!(
                a["shape"].as_array().unwrap().last().unwrap(),
                half,
                "{name}"
            );
        } else {
            for p in [a, b] {
                assert_eq!(p["layout"], "gguf", "{name}");
                assert_eq!(
                    (&p["bytes"], &p["shape"]),
                    (&t["bytes"], &t["shape"]),
                    "{name}"
                );
            }
        }
    }
    assert!(split > 0, "the tiny model has routed experts");

    // A worker serves whole models only: one line naming the rank.
    let out = Command::new(binary("ds4-server"))
        .args([
            "--weights-manifest",
            &ranks[1].manifest_arg(),
            "--port",
            "1",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("holds rank 1/2"), "{err}");
}

fn dry_run(model: &std::path::Path, rank: Option<&str>) -> (i32, String) {
    let mut cmd = Command::new(binary("ds4-weight-server"));
    cmd.arg("--base").arg(model).args([
        "--backend",
        "host",
        "--dry-run",
        "--manifest",
        "/nonexistent/w.json",
    ]);
    if let Some(r) = rank {
        cmd.args(["--rank", r]);
    }
    let out = cmd.output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

/// The routed expert bytes a rank's dry-run says it holds, and all of
/// them.
fn routed_bytes(report: &str) -> (u64, u64) {
    let line = report
        .lines()
        .find(|l| l.starts_with("rank "))
        .unwrap_or_else(|| panic!("{report}"));
    let inner = line.split('(').nth(1).unwrap();
    let words: Vec<&str> = inner.split_whitespace().collect();
    (words[0].parse().unwrap(), words[2].parse().unwrap())
}

#[test]
fn the_dry_run_gives_each_rank_its_bytes_and_dense_models_are_refused() {
    let model = tiny_model_path();
    let (code, whole) = dry_run(&model, None);
    assert_eq!(code, 0, "{whole}");
    assert!(!whole.contains("rank "), "{whole}");
    let mut sum = 0;
    for i in 0..4 {
        let (code, r) = dry_run(&model, Some(&format!("{i}/4")));
        assert_eq!(code, 0, "{r}");
        assert!(
            r.contains(&format!(
                "rank       {i}/4: routed experts {}..{} of 8",
                2 * i,
                2 * i + 2
            )),
            "{r}"
        );
        let (held, all) = routed_bytes(&r);
        assert_eq!(held * 4, all, "{r}");
        sum += held;
        if i == 3 {
            assert_eq!(sum, all);
        }
    }

    for bad in ["4/4", "1", "x/2"] {
        let (code, text) = dry_run(&model, Some(bad));
        assert_eq!(code, 2, "{bad}: {text}");
        assert!(text.contains("--rank"), "{bad}: {text}");
    }
    let (code, text) = dry_run(&ds4_tests::model_path(), Some("0/2"));
    assert_ne!(code, 0, "{text}");
    assert!(text.contains("has no routed experts to split"), "{text}");
}

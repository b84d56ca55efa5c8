//! What the weight owner and its workers refuse, each with a message that
//! names the values and says what to do: another model file, a truncated
//! or unknown manifest, a draining owner, a stranger on the sockets; and
//! the dry-run preflight.

use std::path::Path;

use ds4_tests::{model_path, run_to_exit, Owner};

fn worker(manifest: &Path, model: Option<&Path>) -> (Option<i32>, String) {
    let m = manifest.display().to_string();
    let mut args = vec!["--weights-manifest", &m, "--port", "1"];
    let model_s;
    if let Some(p) = model {
        model_s = p.display().to_string();
        args.extend(["-m", &model_s]);
    }
    let (code, _, err) = run_to_exit("ds4-server", &args);
    (code, err)
}

/// A copy of the model with one metadata value changed (same length).
fn altered_model(dir: &Path) -> std::path::PathBuf {
    let mut bytes = std::fs::read(model_path()).expect("read model");
    let key = b"general.name";
    let at = bytes
        .windows(key.len())
        .position(|w| w == key)
        .expect("general.name in the header");
    // key, value type (u32), string length (u64), then the string.
    let value = at + key.len() + 4 + 8;
    bytes[value] = if bytes[value] == b'X' { b'Y' } else { b'X' };
    let path = dir.join("altered.gguf");
    std::fs::write(&path, bytes).expect("write model");
    path
}

#[test]
fn worker_refuses_other_model_bad_manifests_and_draining_owner() {
    let owner = Owner::start(&[]);
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&owner.manifest).unwrap()).unwrap();
    let identity = manifest["model"]["layout_identity"]
        .as_str()
        .unwrap()
        .to_string();

    // Another model file than the owner's.
    let other = altered_model(owner.dir.path());
    let (code, err) = worker(&owner.manifest, Some(&other));
    assert_ne!(code, Some(0));
    assert!(err.contains("layout identity mismatch"), "{err}");
    assert!(
        err.contains(&identity),
        "names the manifest's identity: {err}"
    );
    let line = err.lines().find(|l| l.contains("mismatch")).unwrap();
    assert_eq!(
        line.matches("sha256:").count(),
        2,
        "names both identities: {line}"
    );

    // A truncated manifest.
    let text = std::fs::read(&owner.manifest).unwrap();
    let truncated = owner.dir.path().join("truncated.json");
    std::fs::write(&truncated, &text[..text.len() / 2]).unwrap();
    let (code, err) = worker(&truncated, None);
    assert_ne!(code, Some(0));
    assert!(
        err.contains("not valid JSON") && err.contains("truncated"),
        "{err}"
    );

    // An unknown schema.
    let unknown = owner.dir.path().join("unknown.json");
    let replaced = String::from_utf8(text)
        .unwrap()
        .replace("ds4.weights.manifest/1", "ds4.weights.manifest/9");
    std::fs::write(&unknown, replaced).unwrap();
    let (code, err) = worker(&unknown, None);
    assert_ne!(code, Some(0));
    assert!(
        err.contains("ds4.weights.manifest/9") && err.contains("ds4.weights.manifest/1"),
        "{err}"
    );

    // A backend this machine cannot import (a vmm manifest without a GPU).
    let text = std::fs::read(&owner.manifest).unwrap();
    let mut v: serde_json::Value = serde_json::from_slice(&text).unwrap();
    v["backend"] = serde_json::json!({"kind": "vmm", "device": {"ordinal": 0, "uuid": "GPU-00000000-0000-0000-0000-000000000000", "arch": "sm_90"}});
    let vmm = owner.dir.path().join("vmm.json");
    std::fs::write(&vmm, serde_json::to_vec(&v).unwrap()).unwrap();
    let (code, err) = worker(&vmm, None);
    assert_ne!(code, Some(0));
    assert!(err.contains("backend vmm cannot be imported here"), "{err}");

    // A draining owner.
    let m = owner.manifest_arg();
    let (code, out, err) = run_to_exit("ds4-weight-server", &["drain", "--manifest", &m]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("draining"), "{out}");
    assert_eq!(owner.status()["state"], "draining");
    let (code, err) = worker(&owner.manifest, None);
    assert_ne!(code, Some(0));
    assert!(err.contains("draining"), "{err}");
}

#[test]
fn stranger_uid_is_refused_by_the_owner() {
    let owner = Owner::start(&[]);
    let setpriv = Path::new("/usr/bin/setpriv");
    let root = run_to_exit_plain("id", &["-u"]).trim() == "0";
    if !root || !setpriv.exists() {
        println!("skipped the cross-uid connection: needs root and setpriv (the policy itself is unit-tested)");
        return;
    }
    // uid 65534 in group 0: the 0660 socket lets it connect, the
    // credential check must refuse it.
    let m = owner.manifest_arg();
    let bin = ds4_tests::binary("ds4-weight-server").display().to_string();
    let out = std::process::Command::new(setpriv)
        .args([
            "--reuid=65534",
            "--regid=0",
            "--clear-groups",
            &bin,
            "status",
            "--manifest",
            &m,
        ])
        .output()
        .expect("setpriv");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a stranger got the status");
    assert!(
        err.contains("uid 65534") && err.contains("not allowed"),
        "{err}"
    );
    // The owner still serves its own user.
    assert_eq!(owner.status()["state"], "ready");
}

fn run_to_exit_plain(cmd: &str, args: &[&str]) -> String {
    std::process::Command::new(cmd)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

#[test]
fn dry_run_reports_fit_and_allocates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("weights.json");
    let model = model_path().display().to_string();
    let m = manifest.display().to_string();
    let base = [
        "--base",
        &model,
        "--manifest",
        &m,
        "--backend",
        "host",
        "--dry-run",
    ];

    let mut args = base.to_vec();
    args.extend(["--reserve-gb", "0.5"]);
    let (code, out, err) = run_to_exit("ds4-weight-server", &args);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains("family llama") && out.contains("FITS"),
        "{out}"
    );
    assert!(
        out.contains("regions") && out.contains("embedding"),
        "{out}"
    );

    let mut args = base.to_vec();
    args.extend(["--reserve-gb", "1000000"]);
    let (code, out, _) = run_to_exit("ds4-weight-server", &args);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("DOES NOT FIT"), "{out}");

    let not_gguf = dir.path().join("not.gguf");
    std::fs::write(&not_gguf, b"definitely not a model").unwrap();
    let bad = not_gguf.display().to_string();
    let (code, _, err) = run_to_exit(
        "ds4-weight-server",
        &[
            "--base",
            &bad,
            "--manifest",
            &m,
            "--backend",
            "host",
            "--dry-run",
        ],
    );
    assert_eq!(code, Some(2), "{err}");

    // Nothing was published or bound.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

//! What the weight owner and its workers refuse at start, quickly and in
//! one line that names the file and says what to do: a control plane on a
//! non-loopback address, TCP calls without the owner's token, a FIFO
//! where a model file belongs (and one among the disk KV cache's files,
//! which is skipped), a damaged model, and weights holding NaN with
//! `--check-tensors`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ds4_tests::{free_port, model_path, run_within, Owner, Server};

/// Long enough for a start on the default model; a blocked start fails.
const LIMIT: Duration = Duration::from_secs(30);

fn s(p: &Path) -> String {
    p.display().to_string()
}

fn mkfifo(path: &Path) {
    let ok = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("mkfifo")
        .success();
    assert!(ok, "mkfifo {}", path.display());
}

/// The lines of stderr that are not empty.
fn lines(err: &str) -> Vec<&str> {
    err.lines().filter(|l| !l.trim().is_empty()).collect()
}

fn token_file(dir: &Path, name: &str, token: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    std::fs::write(&p, format!("{token}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p
}

#[test]
fn tcp_control_plane_is_loopback_only_and_checks_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = s(&dir.path().join("weights.json"));
    let model = s(&model_path());
    let owner = |extra: &[&str]| {
        let mut args = vec![
            "--base",
            &model,
            "--manifest",
            &manifest,
            "--backend",
            "host",
        ];
        args.extend(extra);
        run_within("ds4-weight-server", &args, &[], LIMIT)
    };
    let any = format!("0.0.0.0:{}", free_port());
    let (code, _, err) = owner(&["--grpc", &any]);
    assert_ne!(code, Some(0));
    assert!(
        err.contains("is not a loopback address") && err.contains("--grpc-allow-remote"),
        "{err}"
    );
    let (code, _, err) = owner(&["--grpc", &any, "--grpc-allow-remote"]);
    assert_ne!(code, Some(0));
    assert!(err.contains("needs --grpc-token-file"), "{err}");

    // Remote clients allowed, with a token; loopback TCP stands in here.
    let good = token_file(dir.path(), "token", "0123456789abcdef-the-owners-token");
    let wrong = token_file(dir.path(), "wrong", "0123456789abcdef-another-token");
    let addr = format!("127.0.0.1:{}", free_port());
    let owner = Owner::start(&[
        "--grpc",
        &addr,
        "--grpc-allow-remote",
        "--grpc-token-file",
        &s(&good),
    ]);
    let m = owner.manifest_arg();
    let status = |env: &[(&str, &str)]| {
        let args = ["status", "--json", "--manifest", &m];
        run_within("ds4-weight-server", &args, env, LIMIT)
    };
    let (code, _, err) = status(&[]);
    assert_ne!(code, Some(0));
    assert!(err.contains("needs a token"), "{err}");
    let (code, _, err) = status(&[("DS4_WEIGHT_GRPC_TOKEN_FILE", &s(&wrong))]);
    assert_ne!(code, Some(0));
    assert!(err.contains("wrong token"), "{err}");
    let (code, _, err) = run_within(
        "ds4-weight-server",
        &["drain", "--exit-when-idle", "--manifest", &m],
        &[],
        LIMIT,
    );
    assert_ne!(code, Some(0), "a drain without the token: {err}");
    let (code, out, err) = status(&[("DS4_WEIGHT_GRPC_TOKEN_FILE", &s(&good))]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("\"state\": \"ready\""), "{out}");

    // A worker without the token is refused; with it, it attaches.
    let (code, _, err) = run_within(
        "ds4-server",
        &["--weights-manifest", &m, "--port", "1"],
        &[],
        LIMIT,
    );
    assert_ne!(code, Some(0));
    assert!(err.contains("needs a token"), "{err}");
    let worker = Server::start(&["--weights-manifest", &m, "--grpc-token-file", &s(&good)]);
    let health = worker.request("GET", "/health", None).expect("health");
    assert_eq!(health.json()["weights"], "owner");
}

#[test]
fn a_fifo_as_the_model_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("model.gguf");
    mkfifo(&fifo);
    let (f, manifest) = (s(&fifo), s(&dir.path().join("weights.json")));
    let owner = ["--base", &f, "--manifest", &manifest, "--backend", "host"];
    let dry_run = [&owner[..], &["--dry-run"]].concat();
    let worker = ["-m", &f, "--port", "1"];
    for (bin, args) in [
        ("ds4-weight-server", &owner[..]),
        ("ds4-weight-server", &dry_run[..]),
        ("ds4-server", &worker[..]),
    ] {
        let (code, _, err) = run_within(bin, args, &[], LIMIT);
        assert_ne!(code, Some(0), "{bin} {args:?}");
        let line = lines(&err);
        assert_eq!(line.len(), 1, "{bin} {args:?}: one line: {err}");
        assert!(
            line[0].contains(&f) && line[0].contains("FIFO (named pipe), not a regular file"),
            "{bin} {args:?}: {err}"
        );
    }
}

#[test]
fn a_fifo_among_the_disk_cache_files_is_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("kv");
    std::fs::create_dir(&cache).unwrap();
    mkfifo(&cache.join(format!("{}.ds4kv", "0f".repeat(32))));
    let log = dir.path().join("server.log");
    let server = Server::start_logged(&model_path(), &["--kv-disk-dir", &s(&cache)], Some(&log));
    assert_eq!(
        server
            .request("GET", "/health", None)
            .expect("health")
            .status,
        200
    );
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(
        log.lines()
            .any(|l| l.contains("file skipped") && l.contains("FIFO")),
        "{log}"
    );
}

#[test]
fn a_damaged_model_is_one_line_without_the_fetch_hint() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(model_path()).unwrap();
    let damaged = dir.path().join("damaged.gguf");
    std::fs::write(&damaged, &bytes[..bytes.len() / 2]).unwrap();
    let missing = dir.path().join("missing.gguf");
    let manifest = s(&dir.path().join("weights.json"));
    for (model, hint) in [(&damaged, false), (&missing, true)] {
        let m = s(model);
        let (code, _, err) = run_within("ds4-server", &["-m", &m, "--port", "1"], &[], LIMIT);
        assert_eq!(code, Some(1), "{err}");
        let line = lines(&err);
        assert_eq!(line.len(), 1, "one line: {err}");
        assert!(
            line[0].starts_with("error: model ") && line[0].contains(&m),
            "{err}"
        );
        assert_eq!(line[0].contains("fetch-model.sh"), hint, "{err}");
        assert_eq!(line[0].matches(&m).count(), 1, "the path once: {err}");

        let args = ["--base", &m, "--manifest", &manifest, "--backend", "host"];
        let (code, _, err) = run_within("ds4-weight-server", &args, &[], LIMIT);
        assert_eq!(code, Some(2), "{err}");
        assert_eq!(lines(&err).len(), 1, "one line: {err}");
        assert!(err.contains(&m) && !err.contains("fetch-model"), "{err}");
    }
    let (_, _, err) = run_within(
        "ds4-server",
        &["-m", &s(&damaged), "--port", "1"],
        &[],
        LIMIT,
    );
    assert!(err.contains("damaged"), "says what to do: {err}");
}

#[test]
fn nan_weights_are_refused_with_check_tensors() {
    const TENSOR: &str = "blk.3.attn_q.weight";
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = std::fs::read(model_path()).unwrap();
    let at = ds4_tests::gguf::tensor_at(&bytes, TENSOR).expect("tensor in the default model");
    assert_eq!(
        at.ggml_type, 3,
        "{TENSOR} is Q4_1 (20-byte blocks, f16 d first)"
    );
    // Block 7's scale d: an f16 NaN.
    let d = at.offset + 7 * 20;
    bytes[d..d + 2].copy_from_slice(&0x7e00u16.to_le_bytes());
    let nan = dir.path().join("nan.gguf");
    std::fs::write(&nan, bytes).unwrap();
    let (n, manifest) = (s(&nan), s(&dir.path().join("weights.json")));
    let owner = [
        "--base",
        &n,
        "--manifest",
        &manifest,
        "--backend",
        "host",
        "--check-tensors",
    ];
    let dry_run = [&owner[..], &["--dry-run"]].concat();
    let unchecked = [&owner[..6], &["--dry-run"]].concat();
    let (code, _, err) = run_within("ds4-weight-server", &unchecked, &[], LIMIT);
    assert_eq!(code, Some(0), "not checked by default: {err}");

    let worker = ["-m", &n, "--port", "1", "--check-tensors"];
    for (bin, args) in [
        ("ds4-weight-server", &owner[..]),
        ("ds4-weight-server", &dry_run[..]),
        ("ds4-server", &worker[..]),
    ] {
        let (code, _, err) = run_within(bin, args, &[], LIMIT);
        assert_ne!(code, Some(0), "{bin} {args:?}: {err}");
        let line = lines(&err);
        assert_eq!(line.len(), 1, "one line: {err}");
        assert!(
            line[0].contains(&format!(
                "tensor \"{TENSOR}\" (q4_1): block 7's scale d is NaN"
            )),
            "{bin} {args:?}: {err}"
        );
    }
}

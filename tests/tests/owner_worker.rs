//! The weight owner and restartable workers, as real processes on the
//! host backend: attached workers answer exactly like a standalone one,
//! a restarted worker reuses the owner's weights, a worker outlives its
//! owner, and two workers share one owner.

use std::io::Write;
use std::time::{Duration, Instant};

use ds4_tests::{Owner, Server};

const QUESTION: &str = "What is the capital of France? Answer in one sentence.";
const ANSWER: &str = "The capital of France is Paris.";

#[test]
fn attached_workers_answer_like_standalone_and_share_one_owner() {
    let owner = Owner::start(&[]);
    let m = owner.manifest_arg();
    let standalone = Server::start(&[]);
    // Two workers attach to the same owner at once.
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| Server::start(&["--weights-manifest", &m]));
        let b = s.spawn(|| Server::start(&["--weights-manifest", &m]));
        (a.join().expect("worker a"), b.join().expect("worker b"))
    });
    let status = owner.status();
    assert_eq!(status["state"], "ready");
    assert_eq!(status["backend"], "host");
    assert_eq!(
        status["leases"].as_array().map(Vec::len),
        Some(2),
        "{status}"
    );

    let want = standalone.ask(QUESTION);
    assert_eq!(want, ANSWER);
    let (got_a, got_b) = std::thread::scope(|s| {
        let ja = s.spawn(|| a.ask(QUESTION));
        let jb = s.spawn(|| b.ask(QUESTION));
        (ja.join().expect("a"), jb.join().expect("b"))
    });
    assert_eq!(got_a, want);
    assert_eq!(got_b, want);
    assert_eq!(owner.status()["load_count"], 1);
}

#[test]
fn restarted_worker_reuses_the_owners_weights() {
    let owner = Owner::start(&[]);
    let m = owner.manifest_arg();
    let mut first = Server::start(&["--weights-manifest", &m]);
    assert_eq!(first.ask(QUESTION), ANSWER);
    let before = owner.status();
    first.kill();

    let t0 = Instant::now();
    let second = Server::start(&["--weights-manifest", &m]);
    let ready = t0.elapsed();
    let answer = second.ask(QUESTION);
    let first_answer = t0.elapsed();
    assert_eq!(answer, ANSWER);
    // Straight to stderr so that the number shows in a passing run.
    let _ = writeln!(
        std::io::stderr(),
        "worker restart (SIGKILL, new process): healthy after {:.0} ms, first answer after {:.0} ms",
        ready.as_secs_f64() * 1e3,
        first_answer.as_secs_f64() * 1e3
    );
    let after = owner.status();
    assert_eq!(after["load_count"], before["load_count"]);
    assert_eq!(after["generation"], before["generation"]);
}

#[test]
fn worker_keeps_serving_when_the_owner_dies() {
    let mut owner = Owner::start(&["--lease-timeout-s", "2"]);
    let m = owner.manifest_arg();
    let mut worker = Server::start(&["--weights-manifest", &m]);
    assert_eq!(worker.ask(QUESTION), ANSWER);
    let health = worker
        .request("GET", "/health", None)
        .expect("health")
        .json();
    assert_eq!(health["weights"], "owner");
    owner.kill();
    // Past a keep-alive or two: the worker notices and keeps serving.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(worker.alive());
    assert_eq!(worker.ask(QUESTION), ANSWER);
    let health = worker.request("GET", "/health", None).expect("health");
    assert_eq!(health.status, 200);
    // The worker says where it stands.
    assert_eq!(health.json()["weights"], "owner_gone");
    let stats = worker.request("GET", "/v1/stats", None).expect("stats");
    assert!(String::from_utf8_lossy(&stats.body).contains("owner_gone"));

    // A new worker refuses the dead owner's manifest, saying what to do.
    let (code, _, err) =
        ds4_tests::run_to_exit("ds4-server", &["--weights-manifest", &m, "--port", "1"]);
    assert_ne!(code, Some(0));
    assert!(
        err.contains("is gone") && err.contains("restart ds4-weight-server"),
        "{err}"
    );
}

#[test]
fn owner_tells_systemd_ready_only_after_publishing() {
    use std::os::unix::net::UnixDatagram;
    let dir = tempfile::tempdir().unwrap();
    let sock_path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let manifest = dir.path().join("weights.json");
    let mut child = std::process::Command::new(ds4_tests::binary("ds4-weight-server"))
        .arg("--base")
        .arg(ds4_tests::model_path())
        .arg("--manifest")
        .arg(&manifest)
        .args(["--backend", "host"])
        .env("NOTIFY_SOCKET", &sock_path)
        .env("WATCHDOG_USEC", "400000")
        .env("RUST_LOG", "warn")
        .spawn()
        .expect("spawn owner");
    let mut buf = [0u8; 512];
    let mut seen = Vec::new();
    let result = (|| {
        loop {
            let n = sock
                .recv(&mut buf)
                .map_err(|e| format!("no READY=1 ({e}); got {seen:?}"))?;
            let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
            if msg.contains("READY=1") {
                if !manifest.exists() {
                    return Err(format!("READY=1 before the manifest: {msg}"));
                }
                seen.push(msg);
                break;
            }
            seen.push(msg);
        }
        // A watchdog ping follows (WATCHDOG_USEC / 2).
        loop {
            let n = sock
                .recv(&mut buf)
                .map_err(|e| format!("no WATCHDOG=1 ({e})"))?;
            if String::from_utf8_lossy(&buf[..n]).contains("WATCHDOG=1") {
                return Ok(());
            }
        }
    })();
    let _ = child.kill();
    let _ = child.wait();
    result.unwrap();
    assert!(seen.iter().any(|m| m.starts_with("STATUS=")), "{seen:?}");
}

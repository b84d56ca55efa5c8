//! Helpers for the end-to-end tests in `tests/tests/`: find the built
//! binaries, start them on free ports, and speak plain HTTP/1.1 to them.
//!
//! The binaries are built by `cargo build --workspace --bins` (the test
//! command does this first) into the same target directory as the tests.

pub mod deepseek4;
pub mod gguf;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const HINT: &str =
    "run ./scripts/fetch-model.sh from the repository root, or set DS4_TEST_MODEL to a GGUF file";

/// The default model (`DS4_TEST_MODEL`, else `ds4.gguf` in the repository root).
pub fn model_path() -> PathBuf {
    if let Some(p) = std::env::var_os("DS4_TEST_MODEL") {
        let p = PathBuf::from(p);
        assert!(
            p.exists(),
            "DS4_TEST_MODEL={} does not exist; {HINT}",
            p.display()
        );
        return p;
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("ds4.gguf");
    assert!(root.exists(), "{} is missing; {HINT}", root.display());
    root
}

/// The miniature DeepSeek V4 model (`ds4-tiny.gguf` in `DS4_TINY_DIR`,
/// else in `target/ds4-tiny`; `./scripts/gen-ds4-tiny.sh` makes it).
pub fn tiny_model_path() -> PathBuf {
    deepseek4::tiny_model("ds4-tiny.gguf")
}

/// A workspace binary built next to the running test executable.
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test>-<hash> -> target/<profile>/<name>
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target profile dir");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is not built; run `cargo build --workspace --bins` first (./scripts/test.sh does)",
        path.display()
    );
    path
}

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// A running `ds4-server`, killed on drop.
pub struct Server {
    child: Child,
    pub port: u16,
}

impl Server {
    /// Start `ds4-server` on the default model with extra arguments and
    /// wait until `/health` answers.
    pub fn start(extra: &[&str]) -> Server {
        Server::start_model(&model_path(), extra)
    }

    /// Start `ds4-server` on `model` with extra arguments and wait until
    /// `/health` answers.
    pub fn start_model(model: &std::path::Path, extra: &[&str]) -> Server {
        Server::start_logged(model, extra, None)
    }

    /// Like [`Server::start_model`], with the server's log (at `info`)
    /// appended to `log` when given.
    pub fn start_logged(
        model: &std::path::Path,
        extra: &[&str],
        log: Option<&std::path::Path>,
    ) -> Server {
        Server::spawn(model, extra, log, None)
    }

    /// [`Server::start`] with the server's open-file limit (`ulimit -n`)
    /// set to `nofile`, its log (at `info`) appended to `log` when given.
    pub fn start_with_fd_limit(
        nofile: u64,
        extra: &[&str],
        log: Option<&std::path::Path>,
    ) -> Server {
        Server::spawn(&model_path(), extra, log, Some(nofile))
    }

    fn spawn(
        model: &std::path::Path,
        extra: &[&str],
        log: Option<&std::path::Path>,
        nofile: Option<u64>,
    ) -> Server {
        let port = free_port();
        let (level, stderr) = match log {
            Some(path) => (
                "info",
                Stdio::from(
                    std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(path)
                        .expect("open server log"),
                ),
            ),
            None => ("warn", Stdio::inherit()),
        };
        let mut cmd = match nofile {
            None => Command::new(binary("ds4-server")),
            Some(n) => {
                let mut c = Command::new("sh");
                c.args(["-c", "ulimit -n \"$0\" && exec \"$@\"", &n.to_string()])
                    .arg(binary("ds4-server"));
                c
            }
        };
        let child = cmd
            .arg("-m")
            .arg(model)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(extra)
            .env("RUST_LOG", level)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn ds4-server");
        let mut server = Server { child, port };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = server.child.try_wait().expect("wait") {
                panic!("ds4-server exited during start-up: {status}");
            }
            if let Ok(r) = server.request("GET", "/health", None) {
                if r.status == 200 {
                    return server;
                }
            }
            assert!(
                Instant::now() < deadline,
                "ds4-server did not become healthy in 60 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stop the server the way an operator does (SIGTERM) and wait for it
    /// to exit; returns whether it exited successfully.
    pub fn terminate(&mut self) -> bool {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        self.child.wait().expect("wait").success()
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        self.child.try_wait().expect("wait").is_none()
    }

    /// Send one request and read the whole response.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
    ) -> std::io::Result<Response> {
        self.request_with(method, path, &[], body)
    }

    /// [`Server::request`] with extra request headers.
    pub fn request_with(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
    ) -> std::io::Result<Response> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port))?;
        s.set_read_timeout(Some(Duration::from_secs(300)))?;
        let body = body.unwrap_or_default();
        let extra: String = headers
            .iter()
            .map(|(k, v)| format!("{k}: {v}\r\n"))
            .collect();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{extra}connection: close\r\n\r\n",
            body.len()
        )?;
        s.write_all(body)?;
        read_response(&s)
    }

    /// Write a JSON POST and return the open connection without reading
    /// the answer (a client that may walk away: drop the stream).
    pub fn send_json(&self, path: &str, v: &serde_json::Value) -> TcpStream {
        let body = serde_json::to_vec(v).expect("json");
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
        write!(
            s,
            "POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        )
        .and_then(|_| s.write_all(&body))
        .expect("send request");
        s
    }

    /// `/v1/stats` as JSON (the engine's counters and gauges).
    pub fn stats(&self) -> serde_json::Value {
        self.request_with("GET", "/v1/stats", &[("accept", "application/json")], None)
            .expect("stats")
            .json()
    }

    /// POST a JSON value.
    pub fn post_json(&self, path: &str, v: &serde_json::Value) -> Response {
        self.request("POST", path, Some(&serde_json::to_vec(v).expect("json")))
            .expect("request")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Read one response from `s`: a body of its `Content-Length`, chunked, or
/// up to the end of the stream.
pub fn read_response(s: &TcpStream) -> std::io::Result<Response> {
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line {line:?}")))?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        r.read_line(&mut line)?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let length = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse::<usize>().ok());
    let mut body = Vec::new();
    if let (Some(n), false) = (length, chunked) {
        body.resize(n, 0);
        r.read_exact(&mut body)?;
    } else if chunked {
        loop {
            line.clear();
            r.read_line(&mut line)?;
            let n = usize::from_str_radix(line.trim(), 16).map_err(std::io::Error::other)?;
            if n == 0 {
                break;
            }
            let mut chunk = vec![0; n + 2];
            r.read_exact(&mut chunk)?;
            body.extend_from_slice(&chunk[..n]);
        }
    } else {
        r.read_to_end(&mut body)?;
    }
    Ok(Response {
        status,
        headers,
        body,
    })
}

/// A running `ds4-weight-server` on the host backend, its manifest and
/// sockets in a temporary directory; killed (SIGKILL) on drop.
pub struct Owner {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub manifest: PathBuf,
}

impl Owner {
    /// Start the owner on the default model and wait for its manifest.
    pub fn start(extra: &[&str]) -> Owner {
        Owner::start_model(&model_path(), extra)
    }

    /// Start the owner on `model` and wait for its manifest.
    pub fn start_model(model: &std::path::Path, extra: &[&str]) -> Owner {
        let dir = tempfile::tempdir().expect("tempdir");
        // Traversable by other users (the credential test runs as one).
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .expect("chmod");
        let manifest = dir.path().join("weights.json");
        let child = Command::new(binary("ds4-weight-server"))
            .arg("--base")
            .arg(model)
            .arg("--manifest")
            .arg(&manifest)
            .args(["--backend", "host"])
            .args(extra)
            .env("RUST_LOG", "warn")
            .env_remove("NOTIFY_SOCKET")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn ds4-weight-server");
        let mut owner = Owner {
            child: Some(child),
            dir,
            manifest,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !owner.manifest.exists() {
            if let Some(status) = owner
                .child
                .as_mut()
                .and_then(|c| c.try_wait().expect("wait"))
            {
                panic!("ds4-weight-server exited during start-up: {status}");
            }
            assert!(Instant::now() < deadline, "no manifest after 60 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        owner
    }

    /// SIGKILL the owner and reap it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// `ds4-weight-server status --json`.
    pub fn status(&self) -> serde_json::Value {
        let out = Command::new(binary("ds4-weight-server"))
            .args(["status", "--json", "--manifest"])
            .arg(&self.manifest)
            .output()
            .expect("run status");
        assert!(
            out.status.success(),
            "status failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("status JSON")
    }

    /// The manifest path as a string argument.
    pub fn manifest_arg(&self) -> String {
        self.manifest.display().to_string()
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Run a binary to completion; (exit code, stdout, stderr).
pub fn run_to_exit(name: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(binary(name))
        .args(args)
        .env("RUST_LOG", "warn")
        .env("RUST_BACKTRACE", "0")
        .env_remove("RUST_LIB_BACKTRACE")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {name}: {e}"));
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Run a binary to completion with `env` set, as [`run_to_exit`], but
/// kill it and panic if it has not exited within `limit` (a start-up that
/// blocks).
pub fn run_within(
    name: &str,
    args: &[&str],
    env: &[(&str, &str)],
    limit: Duration,
) -> (Option<i32>, String, String) {
    let mut child = Command::new(binary(name))
        .args(args)
        .env("RUST_LOG", "warn")
        .env("RUST_BACKTRACE", "0")
        .env("NO_COLOR", "1")
        .env_remove("RUST_LIB_BACKTRACE")
        .env_remove("NOTIFY_SOCKET")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {name}: {e}"));
    // Drain both pipes on threads so that a chatty child never blocks.
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("stdout")));
    let err = drain(Box::new(child.stderr.take().expect("stderr")));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{name} {args:?} did not exit within {limit:?}; stderr: {}",
                err.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (
        status.code(),
        out.join().expect("stdout"),
        err.join().expect("stderr"),
    )
}

impl Server {
    /// SIGKILL the server and reap it (drop does the same).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// A greedy chat answer to `question`.
    pub fn ask(&self, question: &str) -> String {
        let r = self.post_json(
            "/v1/chat/completions",
            &serde_json::json!({"messages": [{"role": "user", "content": question}], "temperature": 0}),
        );
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        r.json()["choices"][0]["message"]["content"]
            .as_str()
            .expect("content")
            .to_string()
    }
}

"""Start a real ds4-server for the SDK tests.

The server binary comes from DS4_SERVER_BIN (default: the debug build in
target/), the model from DS4_TEST_MODEL (default: ds4.gguf in the
repository root).
"""

import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
QUESTION = "What is the capital of France? Answer in one sentence."
ANSWER = "The capital of France is Paris."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, *extra: str):
        binary = os.environ.get("DS4_SERVER_BIN", str(ROOT / "target" / "debug" / "ds4-server"))
        model = os.environ.get("DS4_TEST_MODEL", str(ROOT / "ds4.gguf"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, RUST_LOG="warn")
        env.pop("DS4_API_KEY", None)
        self.proc = subprocess.Popen(
            [binary, "-m", model, "--host", "127.0.0.1", "--port", str(self.port), *extra],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        deadline = time.time() + 60
        while True:
            assert self.proc.poll() is None, "ds4-server exited during start-up"
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            assert time.time() < deadline, "ds4-server did not become healthy in 60 s"
            time.sleep(0.1)

    def get(self, path: str, headers=None) -> tuple[int, dict, bytes]:
        req = urllib.request.Request(self.url + path, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture(scope="session")
def server():
    # A small context keeps the over-long-prompt test cheap.
    s = Server("--ctx", "1024", "--max-body-mb", "1")
    yield s
    s.stop()

"""Metrics, stats, authentication, CORS and disconnects, over plain HTTP."""

import json
import socket
import time
import urllib.request

import openai
import anthropic
from prometheus_client.parser import text_string_to_metric_families

from conftest import QUESTION, Server


def metrics(server) -> dict:
    status, headers, body = server.get("/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    out = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            key = s.name + "".join(f"|{k}={v}" for k, v in sorted(s.labels.items()))
            out[key] = s.value
    return out


def test_metrics_move_with_requests(server):
    before = metrics(server)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    client.chat.completions.create(model="", messages=[{"role": "user", "content": QUESTION}], temperature=0, max_tokens=4)
    try:
        client.chat.completions.create(model="", messages=[], temperature=0)
    except openai.BadRequestError:
        pass
    after = metrics(server)
    ok = "ds4_requests_total|outcome=ok|surface=chat"
    assert after[ok] == before.get(ok, 0) + 1
    bad = "ds4_refusals_total|reason=bad_request"
    assert after[bad] == before.get(bad, 0) + 1
    assert after["ds4_generated_tokens_total"] >= before.get("ds4_generated_tokens_total", 0) + 4
    assert after["ds4_prompt_tokens_total"] >= before.get("ds4_prompt_tokens_total", 0) + 42
    assert after["ds4_time_to_first_token_seconds_count"] >= 1
    # The paged KV pool holds --max-seqs (16) full 1024-token contexts.
    assert after["ds4_kv_tokens_capacity"] == 16 * 1024
    assert "ds4_queue_depth" in after and "ds4_active_sequences" in after

    status, headers, body = server.get("/v1/stats", {"Accept": "application/json"})
    stats = json.loads(body)
    assert status == 200 and stats["generated_tokens"] == after["ds4_generated_tokens_total"]
    status, headers, body = server.get("/v1/stats")
    assert status == 200 and headers["content-type"].startswith("text/plain") and b"decode tok/s" in body


def test_disconnect_frees_the_sequence(server):
    before = metrics(server)
    body = json.dumps({"messages": [{"role": "user", "content": "Write a very long story about a dragon."}],
                       "max_tokens": 900, "stream": True}).encode()
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
              + f"content-length: {len(body)}\r\n\r\n".encode() + body)
    assert b"200 OK" in s.recv(4096)
    time.sleep(0.3)
    s.close()
    deadline = time.time() + 30
    while True:
        m = metrics(server)
        if m["ds4_active_sequences"] == 0 and m["ds4_cancelled_generations_total"] > before.get("ds4_cancelled_generations_total", 0):
            break
        assert time.time() < deadline, m
        time.sleep(0.2)
    cancelled = "ds4_requests_total|outcome=cancelled|surface=chat"
    assert m.get(cancelled, 0) == before.get(cancelled, 0) + 1
    # Far fewer than the 900 tokens asked for were generated.
    assert m["ds4_generated_tokens_total"] - before["ds4_generated_tokens_total"] < 800


def test_api_key_and_cors():
    s = Server("--api-key", "sekrit", "--cors")
    try:
        assert s.get("/health")[0] == 200
        status, headers, body = s.get("/v1/models")
        assert status == 401 and json.loads(body)["error"]["type"] == "authentication_error"
        assert headers["access-control-allow-origin"] == "*"
        assert s.get("/v1/models", {"Authorization": "Bearer sekrit"})[0] == 200
        assert s.get("/metrics", {"x-api-key": "sekrit"})[0] == 200
        try:
            anthropic.Anthropic(base_url=s.url, api_key="wrong", max_retries=0).messages.count_tokens(
                model="", messages=[{"role": "user", "content": "hi"}])
            raise AssertionError("expected 401")
        except anthropic.AuthenticationError as e:
            assert e.body["type"] == "error" and e.body["error"]["type"] == "authentication_error"
        n = anthropic.Anthropic(base_url=s.url, api_key="sekrit", max_retries=0).messages.count_tokens(
            model="", messages=[{"role": "user", "content": "hi"}])
        assert n.input_tokens > 0
        req = urllib.request.Request(s.url + "/v1/chat/completions", method="OPTIONS",
                                     headers={"Origin": "http://x", "Access-Control-Request-Method": "POST"})
        with urllib.request.urlopen(req) as r:
            assert r.status == 204 and r.headers["access-control-allow-methods"]
    finally:
        s.stop()

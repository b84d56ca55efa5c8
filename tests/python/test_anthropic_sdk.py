"""Messages and count_tokens through the official anthropic SDK.

Recent SDKs no longer take sampling arguments; they travel in extra_body
(GREEDY), as older clients send them.
"""

import json

import anthropic
import pytest

from conftest import ANSWER, QUESTION

GREEDY = {"temperature": 0}
MSGS = [{"role": "user", "content": QUESTION}]
TOOL = {
    "name": "get_weather",
    "description": "Current weather of a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)


def test_messages_greedy_and_stream_agree(client):
    r = client.messages.create(model="deepseek-v4-pro", max_tokens=64, messages=MSGS, extra_body=GREEDY)
    assert r.content[0].type == "text" and r.content[0].text == ANSWER
    assert r.stop_reason == "end_turn"
    u = r.usage
    assert u.input_tokens + u.cache_read_input_tokens == 42 and u.output_tokens == 8

    with client.messages.stream(model="", max_tokens=64, messages=MSGS, extra_body=GREEDY) as s:
        events = list(s)
        final = s.get_final_message()
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 1
    assert "message_delta" in kinds
    assert final.content[0].text == ANSWER
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == 8


def test_stop_sequences_and_limits(client):
    r = client.messages.create(model="", max_tokens=64, messages=MSGS, extra_body=GREEDY, stop_sequences=[" is"])
    assert r.content[0].text == "The capital of France"
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == " is"
    r = client.messages.create(model="", max_tokens=2, messages=MSGS, extra_body={"temperature": 0.7, "top_k": 1, "top_p": 1.0})
    assert r.stop_reason == "max_tokens" and r.usage.output_tokens == 2


def test_count_tokens(client):
    n = client.messages.count_tokens(model="", messages=MSGS)
    assert n.input_tokens == 42


def test_tool_round_trip_and_ignored_fields(client):
    r = client.messages.create(
        model="",
        max_tokens=16,
        system=[{"type": "text", "text": "You are a weather bot.", "cache_control": {"type": "ephemeral"}}],
        tools=[TOOL, {"type": "web_search_20250305", "name": "web_search"}],
        tool_choice={"type": "auto"},
        thinking={"type": "enabled", "budget_tokens": 1024},
        metadata={"user_id": "u"},
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01", "content": [{"type": "text", "text": "Sunny"}]}]},
        ],
        extra_body={"context_management": {"edits": []}, **GREEDY},
    )
    assert r.usage.input_tokens + r.usage.cache_read_input_tokens > 100
    assert r.stop_reason in ("end_turn", "max_tokens", "tool_use")


def test_errors_use_the_anthropic_envelope(client):
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="", max_tokens=8, messages=[{"role": "wizard", "content": "x"}])
    assert e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "invalid_request_error"
    assert "wizard" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="", max_tokens=8, messages=[{"role": "user", "content": "word " * 1100}])
    assert "context" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError) as e:
        client.messages.create(model="claude-nope", max_tokens=8, messages=MSGS)
    assert e.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="", max_tokens=8, messages=MSGS, extra_body={"temperature": -2})
    assert "temperature" in e.value.body["error"]["message"]

"""Chat Completions, Completions and Responses through the official openai SDK."""

import json

import openai
import pytest

from conftest import ANSWER, QUESTION

MSGS = [{"role": "user", "content": QUESTION}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather of a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_models(client):
    ids = [m.id for m in client.models.list()]
    assert ids == ["SmolLM2-135M-Instruct.Q4_1"]
    assert client.models.retrieve("deepseek-v4-flash").id == "deepseek-v4-flash"


def test_chat_greedy_and_stream_agree(client):
    r = client.chat.completions.create(model="SmolLM2-135M-Instruct.Q4_1", messages=MSGS, temperature=0)
    assert r.choices[0].message.content == ANSWER
    assert r.choices[0].finish_reason == "stop"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (42, 8, 50)
    assert r.model_extra["timings"]["prompt_tokens"] == 42

    stream = client.chat.completions.create(
        model="deepseek-v4-flash",
        messages=MSGS,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage = "", None, None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage:
            usage = chunk.usage
            assert chunk.model_extra["timings"]["ttft_ms"] > 0
    assert text == ANSWER
    assert finish == "stop"
    assert (usage.prompt_tokens, usage.completion_tokens) == (42, 8)


def test_chat_logprobs_and_token_ids(client):
    r = client.chat.completions.create(
        model="", messages=MSGS, temperature=0, max_tokens=3, logprobs=True, top_logprobs=2,
        extra_body={"return_token_ids": True},
    )
    c = r.choices[0]
    assert c.message.content == "The capital of"
    assert [t.token for t in c.logprobs.content] == ["The", " capital", " of"]
    for t in c.logprobs.content:
        assert t.logprob <= 0 and t.top_logprobs[0].token == t.token
    assert len(c.model_extra["token_ids"]) == 3
    assert len(r.model_extra["prompt_token_ids"]) == 42


def test_completions_greedy_and_stream_agree(client):
    prompt = "The capital of France is"
    r = client.completions.create(model="", prompt=prompt, temperature=0, max_tokens=5)
    assert r.usage.completion_tokens == 5
    assert r.choices[0].finish_reason == "length"
    text = r.choices[0].text
    assert text.strip()
    chunks = list(client.completions.create(model="", prompt=prompt, temperature=0, max_tokens=5, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
    echoed = client.completions.create(model="", prompt=prompt, temperature=0, max_tokens=5, echo=True)
    assert echoed.choices[0].text == prompt + text
    ids = client.completions.create(model="", prompt=[1, 504, 3575], temperature=0, max_tokens=2)
    assert ids.usage.prompt_tokens == 3


def test_responses_greedy_and_stream_agree(client):
    r = client.responses.create(model="", input=QUESTION, temperature=0, store=False)
    assert r.output_text == ANSWER
    assert r.status == "completed"
    assert (r.usage.input_tokens, r.usage.output_tokens) == (42, 8)

    events = list(client.responses.create(model="", input=QUESTION, temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    for k in ["response.output_item.added", "response.content_part.added", "response.output_text.done",
              "response.content_part.done", "response.output_item.done"]:
        assert k in kinds, k
    assert kinds[-1] == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == ANSWER
    done = events[-1].response
    assert done.output_text == ANSWER and done.usage.output_tokens == 8 and done.id == events[0].response.id
    assert [e.sequence_number for e in events] == list(range(len(events)))

    short = client.responses.create(model="", input=QUESTION, temperature=0, max_output_tokens=2)
    assert short.status == "incomplete"
    assert short.incomplete_details.reason == "max_output_tokens"


def test_chat_tool_round_trip(client):
    msgs = [
        {"role": "system", "content": "You are a weather bot."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_abc", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
        {"role": "tool", "tool_call_id": "call_abc", "content": "Sunny, 21 C"},
    ]
    r = client.chat.completions.create(model="", messages=msgs, tools=TOOLS, temperature=0, max_tokens=20)
    assert r.usage.prompt_tokens > 100  # the tool schema was rendered
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")

    # A forced named call: the parser turns the envelope into tool_calls.
    forced = client.chat.completions.create(
        model="", messages=[{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, temperature=0, max_tokens=40)
    calls = forced.choices[0].message.tool_calls
    if forced.choices[0].finish_reason == "tool_calls":
        assert calls[0].function.name == "get_weather" and calls[0].id.startswith("call_")
        json.loads(calls[0].function.arguments)


def test_responses_tool_round_trip(client):
    tools = [{"type": "function", "name": "get_weather", "parameters": TOOLS[0]["function"]["parameters"]},
             {"type": "web_search"}]
    r = client.responses.create(
        model="",
        instructions="You are a weather bot.",
        input=[
            {"role": "user", "content": "Weather in Paris?"},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "Sunny"},
            {"role": "developer", "content": "Answer briefly."},
        ],
        tools=tools, temperature=0, max_output_tokens=10, store=False, include=[], parallel_tool_calls=True,
        prompt_cache_key="k", metadata={"a": "b"},
    )
    assert r.usage.input_tokens > 100
    assert r.output[0].type in ("message", "function_call")


def check_error(exc, status, needle):
    assert exc.value.status_code == status
    body = exc.value.body
    assert needle in body["message"], body
    assert body["type"]


def test_errors_use_the_openai_envelope(client, server):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="", messages=MSGS, n=2)
    check_error(e, 400, "n = 1")
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="",
            messages=MSGS,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}},
        )
    check_error(e, 400, "response_format")
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="", messages=[{"role": "wizard", "content": "x"}])
    check_error(e, 400, "wizard")
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="", messages=[{"role": "user", "content": 5}])
    check_error(e, 400, "invalid JSON")
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="", messages=[{"role": "user", "content": "word " * 1100}])
    check_error(e, 400, "context")
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-17", messages=MSGS)
    check_error(e, 404, "gpt-17")
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="", input="hi", store=True)
    check_error(e, 400, "full input")
    # A response this server does not hold cannot be continued.
    with pytest.raises(openai.ConflictError) as e:
        client.responses.create(model="", input="hi", previous_response_id="resp_1")
    check_error(e, 409, "send the whole conversation")
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="", prompt="hi", n=3)
    check_error(e, 400, "n = 1")
    with pytest.raises(openai.APIStatusError) as e:
        client.chat.completions.create(model="", messages=[{"role": "user", "content": "x" * (2 << 20)}])
    assert e.value.status_code == 413
    assert "limit" in e.value.body["message"]
    status, _, body = server.get("/v1/nothing")
    assert status == 404 and "error" in json.loads(body)

"""Structured output through the official SDKs' parse helpers.

Five schemas (nested objects, arrays, enums, required and nullable
fields, number ranges) and twenty prompts, at the default temperature:
every answer must parse, and validate against the schema with an
independent validator (jsonschema). Strict tools: a forced call's
arguments always validate against the tool's schema.
"""

import enum
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Literal, Optional

import anthropic
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field


class Address(BaseModel):
    city: str = Field(max_length=30)
    country: str = Field(max_length=30)


class Person(BaseModel):
    """Nested objects."""

    name: str = Field(max_length=30)
    address: Address


class Item(BaseModel):
    name: str = Field(max_length=30)
    quantity: int = Field(ge=1, le=99)


class ShoppingList(BaseModel):
    """Arrays."""

    items: list[Item] = Field(min_length=1, max_length=4)


class Priority(str, enum.Enum):
    low = "low"
    medium = "medium"
    high = "high"


class Ticket(BaseModel):
    """Enums."""

    priority: Priority
    category: Literal["bug", "feature", "question"]


class Event(BaseModel):
    """Required and nullable fields."""

    title: str = Field(max_length=40)
    year: int = Field(ge=1900, le=2100)
    location: Optional[str] = Field(default=None, max_length=30)


class Rating(BaseModel):
    """Number ranges."""

    stars: int = Field(ge=1, le=5)
    score: float = Field(ge=0, le=10)


SCHEMAS = [Person, ShoppingList, Ticket, Event, Rating]

PROMPTS = [
    "my neighbour Maria who lives in Lisbon",
    "groceries for a pancake breakfast",
    "the login page crashes on submit",
    "please add a dark mode",
    "how do I reset my password?",
    "the 1969 moon landing",
    "a concert in Berlin next summer",
    "a great pizza place downtown",
    "my old teacher Mr. Tanaka from Osaka",
    "ingredients for a tomato soup",
    "the app is slow when loading photos",
    "a movie I watched yesterday, it was fine",
    "the world cup final of 2014 in Rio",
    "a hotel with a view of the sea",
    "supplies for a camping trip",
    "my cousin Lena, she moved to Toronto",
    "can you support exporting to CSV?",
    "a wedding in Rome in 2031",
    "a restaurant whose soup was cold",
    "a friend called Omar from Cairo",
]

WORKERS = 8
# Room for an answer that pads its JSON with the whitespace the grammar
# allows between tokens (a line break and up to 20 blanks each).
PARSE_BUDGET = 800


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)


def cases():
    return [(schema, prompt) for schema in SCHEMAS for prompt in PROMPTS]


def instruction(schema, prompt):
    return f"Write a {schema.__name__} about: {prompt}. Answer in JSON."


def test_chat_parse_matches_every_schema(oai):
    def one(case):
        schema, prompt = case
        r = oai.chat.completions.parse(
            model="default",
            messages=[{"role": "user", "content": instruction(schema, prompt)}],
            response_format=schema,
            max_tokens=PARSE_BUDGET,
        )
        msg = r.choices[0].message
        assert isinstance(msg.parsed, schema), (prompt, msg.content)
        jsonschema.validate(json.loads(msg.content), schema.model_json_schema())
        return r.choices[0].finish_reason

    with ThreadPoolExecutor(WORKERS) as pool:
        reasons = list(pool.map(one, cases()))
    assert len(reasons) == 100 and set(reasons) == {"stop"}


def test_responses_parse_matches_every_schema(oai):
    def one(case):
        schema, prompt = case
        r = oai.responses.parse(
            model="default",
            input=instruction(schema, prompt),
            text_format=schema,
            max_output_tokens=PARSE_BUDGET,
        )
        assert r.status == "completed", r
        assert isinstance(r.output_parsed, schema), (prompt, r.output_text)
        jsonschema.validate(json.loads(r.output_text), schema.model_json_schema())

    with ThreadPoolExecutor(WORKERS) as pool:
        list(pool.map(one, cases()))


class Triage(BaseModel):
    """Enums and a boolean."""

    area: Literal["ui", "api", "storage", "docs"]
    reproducible: bool
    priority: Priority


def test_anthropic_parse_matches_its_schema(claude):
    # The SDK moves length and range constraints into descriptions before
    # sending, so these schemas have none, and no free strings or numbers
    # (without their bounds a small model may write one until max_tokens):
    # what it sends is the whole schema its parse checks.
    schemas = [Triage, Ticket]

    def one(case):
        schema, prompt = case
        r = claude.messages.parse(
            model="default",
            max_tokens=PARSE_BUDGET,
            messages=[{"role": "user", "content": instruction(schema, prompt)}],
            output_format=schema,
        )
        assert r.stop_reason == "end_turn", r
        assert isinstance(r.parsed_output, schema), r
        text = "".join(b.text for b in r.content if b.type == "text")
        jsonschema.validate(json.loads(text), schema.model_json_schema())

    with ThreadPoolExecutor(WORKERS) as pool:
        list(pool.map(one, [(s, p) for s in schemas for p in PROMPTS[:10]]))


WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 30},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "unit": {"type": "string", "enum": ["c", "f"]},
    },
    "required": ["city", "days", "unit"],
    "additionalProperties": False,
}
ASK = "What will the weather be in Paris this week?"
RUNS = 20
# A small model may call again and again until the token limit: a call
# cut short is left out of the answer. One run in two allows one call.
# At temperature 1 it may also pad a call's JSON until the limit cuts it:
# an answer without a call is accepted only when the limit ended it, and
# only rarely.
CUT_AT_MOST = 2


def test_chat_forced_strict_calls_match_the_schema(oai):
    tool = {"type": "function", "function": {"name": "get_weather", "strict": True, "parameters": WEATHER}}

    def one(i):
        r = oai.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": ASK}],
            tools=[tool],
            tool_choice="required" if i % 2 else {"type": "function", "function": {"name": "get_weather"}},
            parallel_tool_calls=i % 4 < 2,
            temperature=1,
            seed=i,
            max_tokens=300,
        )
        calls = r.choices[0].message.tool_calls
        if not calls:
            assert r.choices[0].finish_reason == "length", r
            return 1
        if i % 4 >= 2:
            assert len(calls) == 1 and r.choices[0].finish_reason == "tool_calls", r
        for c in calls:
            assert c.function.name == "get_weather"
            jsonschema.validate(json.loads(c.function.arguments), WEATHER)
        return 0

    with ThreadPoolExecutor(WORKERS) as pool:
        assert sum(pool.map(one, range(RUNS))) <= CUT_AT_MOST


def test_responses_forced_strict_calls_match_the_schema(oai):
    tool = {"type": "function", "name": "get_weather", "strict": True, "parameters": WEATHER}

    def one(i):
        r = oai.responses.create(
            model="default",
            input=ASK,
            tools=[tool],
            tool_choice="required",
            parallel_tool_calls=i % 2 == 0,
            temperature=1,
            max_output_tokens=300,
        )
        calls = [o for o in r.output if o.type == "function_call"]
        if not calls:
            assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens", r
            return 1
        if i % 2:
            assert len(calls) == 1 and r.status == "completed", r
        for c in calls:
            jsonschema.validate(json.loads(c.arguments), WEATHER)
        return 0

    with ThreadPoolExecutor(WORKERS) as pool:
        assert sum(pool.map(one, range(RUNS))) <= CUT_AT_MOST


def test_anthropic_forced_strict_calls_match_the_schema(claude):
    tool = {"name": "get_weather", "description": "Weather forecast", "input_schema": WEATHER, "strict": True}

    def one(i):
        r = claude.messages.create(
            model="default",
            max_tokens=300,
            messages=[{"role": "user", "content": ASK}],
            tools=[tool],
            tool_choice={"type": "any", "disable_parallel_tool_use": i % 4 >= 2}
            if i % 2
            else {"type": "tool", "name": "get_weather"},
            # The 2.x SDK has no sampling keyword arguments: extra_body.
            extra_body={"temperature": 1},
        )
        uses = [b for b in r.content if b.type == "tool_use"]
        if not uses:
            assert r.stop_reason == "max_tokens", r
            return 1
        if i % 4 == 3:
            assert r.stop_reason == "tool_use" and len(uses) == 1, r
        for u in uses:
            jsonschema.validate(u.input, WEATHER)
        return 0

    with ThreadPoolExecutor(WORKERS) as pool:
        assert sum(pool.map(one, range(RUNS))) <= CUT_AT_MOST

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
            max_tokens=300,
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
            max_output_tokens=300,
        )
        assert r.status == "completed", r
        assert isinstance(r.output_parsed, schema), (prompt, r.output_text)
        jsonschema.validate(json.loads(r.output_text), schema.model_json_schema())

    with ThreadPoolExecutor(WORKERS) as pool:
        list(pool.map(one, cases()))


class Place(BaseModel):
    city: str
    country: str


class Traveller(BaseModel):
    name: str
    home: Place


def test_anthropic_parse_matches_its_schema(claude):
    # The SDK moves length and range constraints into descriptions before
    # sending, so these schemas have none: what it sends is the whole
    # schema its parse checks.
    schemas = [Traveller, Ticket]

    def one(case):
        schema, prompt = case
        r = claude.messages.parse(
            model="default",
            max_tokens=300,
            messages=[{"role": "user", "content": instruction(schema, prompt)}],
            output_format=schema,
        )
        assert r.stop_reason == "end_turn", r
        assert isinstance(r.parsed_output, schema), r
        text = "".join(b.text for b in r.content if b.type == "text")
        jsonschema.validate(json.loads(text), schema.model_json_schema())

    with ThreadPoolExecutor(WORKERS) as pool:
        list(pool.map(one, [(s, p) for s in schemas for p in PROMPTS[:10]]))

"""Structured output through a real flare-serve and the official SDKs (demo core; a GPU core too).

Each constraint reaches the model's sampling step: the outputs are checked with the
constraint's own meaning (pydantic and jsonschema for schemas, re.fullmatch for regexes).
The shapes and their 400s are in test_structured_requests.py; the engine-level interplay
(logprobs, prefix-cache hits, mixed batches) in tests/runtime/test_structured_output.py.
"""

from __future__ import annotations

import json
import re
import shlex
import socket
import time
from pathlib import Path

import anthropic
import jsonschema
import ollama
import openai
import pydantic
import pytest
from server_harness import ENGINE_KINDS, launch, metric, post_json, wait_idle

CAT = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                        "age": {"type": "integer", "minimum": 0, "maximum": 30}},
       "required": ["name", "age"], "additionalProperties": False}
ASK = [{"role": "user", "content": "Give a JSON object with a cat's name and age."}]


class Cat(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=20)
    age: int = pydantic.Field(ge=0, le=30)


@pytest.fixture(scope="module", params=[k for k in ENGINE_KINDS if k != "fake"])
def served(request):
    """A real server: the fake engine's executor samples no masks (it answers a 400)."""
    server = launch(request.param)
    yield server
    server.stop()


def _whole_json(served, reason: str, text: str) -> bool:
    """Whether an unbounded-JSON reply (json_object) completed; the random-weight GPU core
    may not close a string within the budget, and then its text is a cut-off object."""
    if reason == "stop":
        return True
    assert served.kind == "core" and reason == "length" and text.startswith("{"), (reason, text)
    return False


def _openai(served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.base_url + "/v1", api_key=served.api_key or "unused", max_retries=0)


def test_openai_parse_with_a_pydantic_model(served):
    completion = _openai(served).chat.completions.parse(model=served.model, messages=ASK, response_format=Cat,
                                                        temperature=0, max_tokens=64)
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, Cat) and choice.message.parsed.name


def test_openai_json_object_and_json_schema(served):
    client = _openai(served)
    reply = client.chat.completions.create(model=served.model, messages=ASK, response_format={"type": "json_object"},
                                           temperature=0, max_tokens=64)
    if _whole_json(served, reply.choices[0].finish_reason, reply.choices[0].message.content):
        assert isinstance(json.loads(reply.choices[0].message.content), dict)
    reply = client.chat.completions.create(
        model=served.model, messages=ASK, temperature=0, max_tokens=64,
        response_format={"type": "json_schema", "json_schema": {"name": "cat", "schema": CAT, "strict": True}})
    jsonschema.validate(json.loads(reply.choices[0].message.content), CAT)


def test_openai_streamed_json_schema(served):
    stream = _openai(served).chat.completions.create(
        model=served.model, messages=ASK, temperature=0.8, seed=11, max_tokens=64, stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "cat", "schema": CAT}})
    parts, reasons = [], []
    for chunk in stream:
        for choice in chunk.choices:
            parts.append(choice.delta.content or "")
            if choice.finish_reason:
                reasons.append(choice.finish_reason)
    assert reasons == ["stop"] and len([p for p in parts if p]) > 3  # streamed in pieces
    jsonschema.validate(json.loads("".join(parts)), CAT)


def test_structured_outputs_regex_and_choice(served):
    client = _openai(served)
    reply = client.chat.completions.create(model=served.model, messages=[{"role": "user", "content": "A code?"}],
                                           temperature=1.0, seed=5, max_tokens=20,
                                           extra_body={"structured_outputs": {"regex": r"[A-Z]{2}-[0-9]{3}"}})
    assert re.fullmatch(r"[A-Z]{2}-[0-9]{3}", reply.choices[0].message.content)
    assert reply.choices[0].finish_reason == "stop"
    reply = client.chat.completions.create(model=served.model, temperature=1.0, seed=2, max_tokens=20,
                                           messages=[{"role": "user", "content": "Is water wet?"}],
                                           extra_body={"structured_outputs": {"choice": ["yes", "no", "it depends"]}})
    assert reply.choices[0].message.content in ("yes", "no", "it depends")
    completion = client.completions.create(model=served.model, prompt="The answer is", max_tokens=10,
                                           temperature=0, extra_body={"structured_outputs": {"choice": ["A", "B"]}})
    assert completion.choices[0].text in ("A", "B")
    completion = client.completions.create(model=served.model, prompt=ASK[0]["content"], max_tokens=64,
                                           temperature=0, extra_body={"response_format": {"type": "json_object"}})
    if _whole_json(served, completion.choices[0].finish_reason, completion.choices[0].text):
        assert isinstance(json.loads(completion.choices[0].text), dict)


def test_responses_text_format_and_parse(served):
    client = _openai(served)
    response = client.responses.create(
        model=served.model, input=ASK[0]["content"], temperature=0, max_output_tokens=64,
        text={"format": {"type": "json_schema", "name": "cat", "schema": CAT, "strict": True}})
    assert response.status == "completed"
    jsonschema.validate(json.loads(response.output_text), CAT)
    assert response.text.format.type == "json_schema"
    parsed = client.responses.parse(model=served.model, input=ASK[0]["content"], text_format=Cat,
                                    temperature=0, max_output_tokens=64)
    assert isinstance(parsed.output_parsed, Cat)


def test_anthropic_output_config_format(served):
    client = anthropic.Anthropic(base_url=served.base_url, api_key=served.api_key or "unused", max_retries=0)
    message = client.messages.create(model=served.model, max_tokens=64, messages=ASK, extra_body={
        "temperature": 0, "output_config": {"format": {"type": "json_schema", "schema": CAT}}})
    assert message.stop_reason == "end_turn"
    jsonschema.validate(json.loads(message.content[0].text), CAT)


def test_ollama_format_json_and_schema(served):
    client = ollama.Client(host=served.base_url)
    reply = client.chat(model=served.model, messages=ASK, format=Cat.model_json_schema(),
                        options={"temperature": 0, "num_predict": 64})
    assert reply.done_reason == "stop"
    Cat.model_validate_json(reply.message.content)
    reply = client.generate(model=served.model, prompt=ASK[0]["content"], format="json",
                            options={"temperature": 0, "num_predict": 64})
    if _whole_json(served, reply.done_reason, reply.response):
        assert isinstance(json.loads(reply.response), dict)


def test_a_constraint_that_cannot_be_enforced_is_a_400_in_each_family(served):
    unique = {"type": "array", "uniqueItems": True}
    status, body = post_json(served, "/v1/chat/completions", {
        "model": served.model, "messages": ASK,
        "response_format": {"type": "json_schema", "json_schema": {"name": "u", "schema": unique}}})
    assert status == 400 and body["error"]["code"] == "invalid_grammar"
    assert body["error"]["param"] == "response_format.json_schema.schema" and "uniqueItems" in body["error"]["message"]
    status, body = post_json(served, "/v1/chat/completions", {
        "model": served.model, "messages": ASK, "structured_outputs": {"regex": "(open"}})
    assert status == 400 and body["error"]["param"] == "structured_outputs.regex"
    status, body = post_json(served, "/api/chat", {"model": served.model, "messages": ASK, "format": unique})
    assert status == 400 and set(body) == {"error"} and "uniqueItems" in body["error"]
    status, body = post_json(served, "/v1/messages", {
        "model": served.model, "max_tokens": 16, "messages": ASK,
        "output_config": {"format": {"type": "json_schema", "schema": unique}}})
    assert status == 400 and body["type"] == "error" and "uniqueItems" in body["error"]["message"]
    assert metric(served, "flare_grammar_compile_errors_total") >= 3


def test_compiled_grammars_are_cached_and_counted(served):
    body = {"model": served.model, "messages": [{"role": "user", "content": "Pick."}], "max_tokens": 8,
            "temperature": 0, "structured_outputs": {"choice": ["left", "right", "ahead"]}}
    post_json(served, "/v1/chat/completions", body)
    compiles, hits = metric(served, "flare_grammar_compiles_total"), metric(served, "flare_grammar_cache_hits_total")
    status, reply = post_json(served, "/v1/chat/completions", body)
    assert status == 200 and reply["choices"][0]["message"]["content"] in ("left", "right", "ahead")
    assert metric(served, "flare_grammar_compiles_total") == compiles
    assert metric(served, "flare_grammar_cache_hits_total") == hits + 1
    assert metric(served, "flare_grammar_steps_total") > 0


def test_a_client_that_leaves_a_constrained_stream_frees_its_slot(served):
    host, port = served.host_port
    payload = json.dumps({"model": served.model, "messages": [{"role": "user", "content": "Write a long JSON list."}],
                          "max_tokens": 300, "temperature": 1.0, "seed": 3, "stream": True,
                          "response_format": {"type": "json_object"}}).encode()
    with socket.create_connection((host, port), timeout=30) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
        received = b""
        while received.count(b"data: ") < 3:  # a few tokens arrived: the request is decoding
            received += sock.recv(65536)
    deadline = time.monotonic() + 30
    while metric(served, "flare_requests_cancelled_total") < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    wait_idle(served)
    status, reply = post_json(served, "/v1/chat/completions", {
        "model": served.model, "messages": ASK, "max_tokens": 64, "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "cat", "schema": CAT}}})
    assert status == 200
    jsonschema.validate(json.loads(reply["choices"][0]["message"]["content"]), CAT)


def test_the_readme_structured_output_example(served):
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    section = text.split("## Structured output", 1)[1].split("\n## ", 1)[0]
    argv = shlex.split(re.search(r"```bash\n(.*?)```", section, re.S).group(1).replace("\\\n", " "))
    body = json.loads(argv[argv.index("-d") + 1])
    assert argv[argv.index("curl") + 2].endswith("/v1/chat/completions") and body["model"] == "smollm2"
    status, reply = post_json(served, "/v1/chat/completions", {**body, "model": served.model, "max_tokens": 64})
    assert status == 200
    choice = reply["choices"][0]
    if choice["finish_reason"] == "stop" or served.kind == "demo":
        jsonschema.validate(json.loads(choice["message"]["content"]),
                            body["response_format"]["json_schema"]["schema"])

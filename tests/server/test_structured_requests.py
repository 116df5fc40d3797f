"""Structured-output request fields of every family -> SamplingParams.grammar, and the 400s for bad shapes.

The parse results are checked on the parsers directly; the 400s go through a real server
(the fake and the demo engine, conftest.py) in each family's error shape. Whether a grammar
compiles, and constrained generation itself, are not tested here.
"""

from __future__ import annotations

import pytest
from server_harness import post_json

from flare.errors import AdmissionError
from flare.request import GenerationDefaults
from flare.server.api import structured
from flare.server.api.anthropic.schema import parse_count_tokens, parse_messages
from flare.server.api.ollama import schema as ollama_schema
from flare.server.api.openai.schema import parse_chat, parse_completion
from flare.server.api.responses.schema import parse_responses

DEFAULTS = GenerationDefaults()
USER = [{"role": "user", "content": "hi"}]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
BIG = 64 * 1024 + 1


def _grammar(grammar) -> tuple | None:
    return None if grammar is None else (grammar.kind, grammar.value, grammar.param)


def _refused(call, *args) -> AdmissionError:
    with pytest.raises(AdmissionError) as info:
        call(*args)
    assert info.value.status == 400
    return info.value


# -- structured.py ---------------------------------------------------------------------

@pytest.mark.parametrize("value,expected", [
    (None, None),
    ({"type": "text"}, None),
    ({"type": "json_object"}, ("json_object", None, "response_format")),
    ({"type": "json_schema", "json_schema": {"name": "answer-1_x", "schema": SCHEMA, "strict": True,
                                             "description": "d"}},
     ("json_schema", SCHEMA, "response_format.json_schema.schema")),
    ({"type": "json_schema", "json_schema": {"name": "a", "strict": None}},
     ("json_schema", {}, "response_format.json_schema.schema")),
    ({"type": "json_schema", "json_schema": {"name": "a", "schema": True}},
     ("json_schema", {}, "response_format.json_schema.schema")),
])
def test_response_format_shapes(value, expected):
    assert _grammar(structured.response_format(value)) == expected


@pytest.mark.parametrize("value,expected", [
    (None, None),
    ({"json": SCHEMA}, ("json_schema", SCHEMA, "structured_outputs.json")),
    ({"json": '{"type": "string"}'}, ("json_schema", {"type": "string"}, "structured_outputs.json")),
    ({"regex": r"\d+", "choice": None}, ("regex", r"\d+", "structured_outputs.regex")),
    ({"choice": ["yes", "no"]}, ("choice", ("yes", "no"), "structured_outputs.choice")),
    ({"grammar": 'start: "a"+'}, ("grammar", 'start: "a"+', "structured_outputs.grammar")),
    ({"json_object": True, "disable_fallback": True}, ("json_object", None, "structured_outputs.json_object")),
    ({"regex": "a", "disable_any_whitespace": False, "disable_additional_properties": False,
      "whitespace_pattern": None, "structural_tag": None}, ("regex", "a", "structured_outputs.regex")),
])
def test_structured_outputs_shapes(value, expected):
    assert _grammar(structured.structured_outputs(value)) == expected


@pytest.mark.parametrize("value,param", [
    ("json", "response_format"),
    ({"type": "xml"}, "response_format.type"),
    ({"type": "json_object", "schema": {}}, "response_format.schema"),
    ({"type": "json_schema"}, "response_format.json_schema"),
    ({"type": "json_schema", "json_schema": "x"}, "response_format.json_schema"),
    ({"type": "json_schema", "json_schema": {"schema": SCHEMA}}, "response_format.json_schema.name"),
    ({"type": "json_schema", "json_schema": {"name": "has space"}}, "response_format.json_schema.name"),
    ({"type": "json_schema", "json_schema": {"name": "n" * 65}}, "response_format.json_schema.name"),
    ({"type": "json_schema", "json_schema": {"name": "a", "schema": [1]}}, "response_format.json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"name": "a", "schema": False}}, "response_format.json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"name": "a", "strict": "yes"}}, "response_format.json_schema.strict"),
    ({"type": "json_schema", "json_schema": {"name": "a", "description": 3}},
     "response_format.json_schema.description"),
    ({"type": "json_schema", "json_schema": {"name": "a", "extra": 1}}, "response_format.json_schema.extra"),
    ({"type": "json_schema", "json_schema": {"name": "a", "schema": {"enum": ["x" * BIG]}}},
     "response_format.json_schema.schema"),
])
def test_response_format_refusals_name_the_field(value, param):
    error = _refused(structured.response_format, value)
    assert error.param == param and param in error.message


@pytest.mark.parametrize("value,param", [
    ([], "structured_outputs"),
    ({}, "structured_outputs"),
    ({"regex": "a", "choice": ["a"]}, "structured_outputs"),
    ({"regex": 5}, "structured_outputs.regex"),
    ({"regex": "a" * BIG}, "structured_outputs.regex"),
    ({"grammar": ""}, "structured_outputs.grammar"),
    ({"choice": []}, "structured_outputs.choice"),
    ({"choice": ["a", ""]}, "structured_outputs.choice"),
    ({"choice": ["a", 1]}, "structured_outputs.choice"),
    ({"choice": ["c"] * 1025}, "structured_outputs.choice"),
    ({"json": "{not json"}, "structured_outputs.json"),
    ({"json": "[1, 2]"}, "structured_outputs.json"),
    ({"json": 7}, "structured_outputs.json"),
    ({"json_object": False}, "structured_outputs.json_object"),
    ({"regex": "a", "whitespace_pattern": " "}, "structured_outputs.whitespace_pattern"),
    ({"regex": "a", "structural_tag": "{}"}, "structured_outputs.structural_tag"),
    ({"regex": "a", "disable_any_whitespace": True}, "structured_outputs.disable_any_whitespace"),
    ({"regex": "a", "disable_additional_properties": True}, "structured_outputs.disable_additional_properties"),
    ({"regex": "a", "disable_fallback": "no"}, "structured_outputs.disable_fallback"),
    ({"regex": "a", "frobnicate": 1}, "structured_outputs.frobnicate"),
])
def test_structured_outputs_refusals_name_the_field(value, param):
    error = _refused(structured.structured_outputs, value)
    assert error.param == param and param in error.message


def test_not_supported_options_say_so():
    error = _refused(structured.structured_outputs, {"regex": "a", "whitespace_pattern": " "})
    assert error.code == "unsupported_parameter" and "not supported" in error.message


def test_response_format_and_structured_outputs_exclude_each_other():
    both = {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}}
    error = _refused(structured.openai_grammar, both)
    assert "response_format" in error.message and "structured_outputs" in error.message
    text = {"response_format": {"type": "text"}, "structured_outputs": {"regex": "a"}}
    assert _grammar(structured.openai_grammar(text)) == ("regex", "a", "structured_outputs.regex")


@pytest.mark.parametrize("value,expected", [
    (None, None),
    ({"type": "text"}, None),
    ({"type": "json_object"}, ("json_object", None, "text.format")),
    ({"type": "json_schema", "name": "n", "schema": SCHEMA, "strict": False, "description": "d"},
     ("json_schema", SCHEMA, "text.format.schema")),
])
def test_text_format_shapes(value, expected):
    assert _grammar(structured.text_format(value)) == expected


@pytest.mark.parametrize("value,param", [
    ("json_object", "text.format"),
    ({"type": "json"}, "text.format.type"),
    ({"type": "json_schema", "name": "n"}, "text.format.schema"),
    ({"type": "json_schema", "schema": SCHEMA}, "text.format.name"),
    ({"type": "json_schema", "name": "n", "json_schema": {"schema": SCHEMA}}, "text.format.json_schema"),
    ({"type": "text", "name": "n"}, "text.format.name"),
])
def test_text_format_refusals_name_the_field(value, param):
    error = _refused(structured.text_format, value)
    assert error.param == param and param in error.message


def test_anthropic_and_ollama_formats():
    assert _grammar(structured.anthropic_format({"type": "json_schema", "schema": SCHEMA})) == (
        "json_schema", SCHEMA, "output_config.format.schema")
    assert _grammar(structured.ollama_format("json")) == ("json_object", None, "format")
    assert _grammar(structured.ollama_format(SCHEMA)) == ("json_schema", SCHEMA, "format")
    assert structured.ollama_format("") is None and structured.ollama_format(None) is None
    for value, param in (({"type": "json_object"}, "output_config.format.type"), ({"type": "json_schema"},
                         "output_config.format.schema"), ({"type": "json_schema", "schema": {}, "name": "n"},
                         "output_config.format.name")):
        assert _refused(structured.anthropic_format, value).param == param
    for value in ("yaml", 1, ["json"], True):
        assert _refused(structured.ollama_format, value).param == "format"


# -- each family's parser ---------------------------------------------------------------

def test_openai_chat_and_completions_carry_the_grammar():
    chat = parse_chat({"messages": USER, "response_format": {
        "type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}}, DEFAULTS)
    assert _grammar(chat.sampling_params(10, 100).grammar) == (
        "json_schema", SCHEMA, "response_format.json_schema.schema")
    chat = parse_chat({"messages": USER, "structured_outputs": {"choice": ["x"]}}, DEFAULTS)
    assert _grammar(chat.sampling_params(10, 100).grammar) == ("choice", ("x",), "structured_outputs.choice")
    assert parse_chat({"messages": USER, "response_format": {"type": "text"}}, DEFAULTS).sampling_params(
        10, 100).grammar is None
    completion = parse_completion({"prompt": "p", "response_format": {"type": "json_object"}}, DEFAULTS)
    assert _grammar(completion.sampling_params(10, 100).grammar) == ("json_object", None, "response_format")
    completion = parse_completion({"prompt": "p", "structured_outputs": {"regex": "[ab]+"}}, DEFAULTS)
    assert _grammar(completion.sampling_params(10, 100).grammar) == ("regex", "[ab]+", "structured_outputs.regex")
    assert parse_completion({"prompt": "p"}, DEFAULTS).sampling_params(10, 100).grammar is None


def test_responses_carry_the_grammar_and_echo_the_format():
    fmt = {"type": "json_schema", "name": "answer", "schema": SCHEMA, "strict": True, "description": None}
    gen = parse_responses({"input": "hi", "text": {"format": fmt}}, DEFAULTS)
    assert _grammar(gen.sampling_params(10, 100).grammar) == ("json_schema", SCHEMA, "text.format.schema")
    assert gen.echo["text"] == {"format": {"type": "json_schema", "name": "answer", "schema": SCHEMA,
                                           "strict": True}}
    gen = parse_responses({"input": "hi", "text": {"format": {"type": "json_object"}}}, DEFAULTS)
    assert _grammar(gen.sampling_params(10, 100).grammar) == ("json_object", None, "text.format")
    gen = parse_responses({"input": "hi"}, DEFAULTS)
    assert gen.sampling_params(10, 100).grammar is None and gen.echo["text"] == {"format": {"type": "text"}}
    assert _refused(parse_responses, {"input": "hi", "text": {"verbosity": "low"}}, DEFAULTS).param == \
        "text.verbosity"


def test_anthropic_carries_the_grammar():
    body = {"model": "m", "max_tokens": 8, "messages": USER}
    fmt = {"type": "json_schema", "schema": SCHEMA}
    gen = parse_messages({**body, "output_config": {"format": fmt, "effort": "low"}}, DEFAULTS)
    assert _grammar(gen.sampling_params(10, 100).grammar) == ("json_schema", SCHEMA, "output_config.format.schema")
    assert gen.prompt.options["reasoning_effort"] == "low"
    gen = parse_messages({**body, "output_format": fmt}, DEFAULTS)
    assert _grammar(gen.sampling_params(10, 100).grammar) == ("json_schema", SCHEMA, "output_format.schema")
    assert parse_messages(body, DEFAULTS).sampling_params(10, 100).grammar is None
    parse_count_tokens({"model": "m", "messages": USER, "output_config": {"format": fmt}})
    error = _refused(parse_messages, {**body, "output_format": fmt, "output_config": {"format": fmt}}, DEFAULTS)
    assert error.param == "output_format" and "output_config.format" in error.message


def test_ollama_carries_the_grammar():
    body = {"model": "m", "messages": USER}
    gen = ollama_schema.parse_chat({**body, "format": "json"}, DEFAULTS, 4096)
    assert _grammar(gen.sampling_params(10, 100).grammar) == ("json_object", None, "format")
    gen = ollama_schema.parse_generate({"model": "m", "prompt": "p", "raw": True, "format": SCHEMA}, DEFAULTS, 4096)
    assert _grammar(gen.sampling_params(10, 100).grammar) == ("json_schema", SCHEMA, "format")
    assert ollama_schema.parse_chat({**body, "format": ""}, DEFAULTS, 4096).sampling_params(10, 100).grammar is None


def test_what_the_sdks_parse_helpers_send_is_accepted():
    """The bodies of openai's ``chat.completions.parse``/``responses.parse`` and anthropic's
    ``messages.parse`` for a pydantic model (the SDKs' own schema conversion)."""
    pydantic = pytest.importorskip("pydantic")
    completions = pytest.importorskip("openai.lib._parsing._completions")
    responses = pytest.importorskip("openai.lib._parsing._responses")
    import anthropic

    class Answer(pydantic.BaseModel):
        value: int
        tags: list[str]

    fmt = completions.type_to_response_format_param(Answer)
    schema = fmt["json_schema"]["schema"]
    assert _grammar(structured.response_format(fmt)) == ("json_schema", schema, "response_format.json_schema.schema")
    fmt = responses.type_to_text_format_param(Answer)
    assert _grammar(structured.text_format(fmt)) == ("json_schema", fmt["schema"], "text.format.schema")
    schema = anthropic.transform_schema(Answer.model_json_schema())
    assert _grammar(structured.anthropic_format({"type": "json_schema", "schema": schema})) == (
        "json_schema", schema, "output_config.format.schema")


# -- the 400s through a server, in each family's shape ----------------------------------------

def _openai_error(status: int, payload, param: str) -> None:
    assert status == 400, payload
    error = payload["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["param"] == param and param in error["message"], error


@pytest.mark.parametrize("fields,param", [
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}},
     "response_format.json_schema.name"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": "object"}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "grammar"}}, "response_format.type"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
    ({"structured_outputs": {"json": "{"}}, "structured_outputs.json"),
    ({"structured_outputs": {"regex": "a", "whitespace_pattern": " "}}, "structured_outputs.whitespace_pattern"),
    ({"structured_outputs": {"grammar": "x" * BIG}}, "structured_outputs.grammar"),
    ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}}, "structured_outputs"),
])
@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
def test_openai_bad_shapes_are_400(server, route, fields, param):
    prompt = {"messages": USER} if route == "/v1/chat/completions" else {"prompt": "hi"}
    status, payload = post_json(server, route, {"model": server.model, "max_tokens": 1, **prompt, **fields})
    _openai_error(status, payload, param)


@pytest.mark.parametrize("fmt,param", [
    ({"type": "json_schema", "name": "n"}, "text.format.schema"),
    ({"type": "json_schema", "schema": SCHEMA}, "text.format.name"),
    ({"type": "json_schema", "name": "n", "schema": SCHEMA, "strict": 1}, "text.format.strict"),
    ({"type": "regex"}, "text.format.type"),
    ("json_object", "text.format"),
])
def test_responses_bad_shapes_are_400(server, fmt, param):
    body = {"model": server.model, "input": "hi", "max_output_tokens": 1, "store": False, "text": {"format": fmt}}
    status, payload = post_json(server, "/v1/responses", body)
    _openai_error(status, payload, param)


@pytest.mark.parametrize("fields,field", [
    ({"output_config": {"format": {"type": "json_object"}}}, "output_config.format.type"),
    ({"output_config": {"format": {"type": "json_schema"}}}, "output_config.format.schema"),
    ({"output_config": {"format": {"type": "json_schema", "schema": ["object"]}}}, "output_config.format.schema"),
    ({"output_format": {"type": "json_schema", "schema": 1}}, "output_format.schema"),
    ({"output_format": {"type": "json_schema", "schema": SCHEMA},
      "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}}, "output_format"),
])
@pytest.mark.parametrize("route", ["/v1/messages", "/v1/messages/count_tokens"])
def test_anthropic_bad_shapes_are_400(server, route, fields, field):
    body = {"model": server.model, "messages": USER, **fields}
    if route == "/v1/messages":
        body["max_tokens"] = 1
    status, payload = post_json(server, route, body)
    assert status == 400, payload
    assert set(payload) == {"type", "error"} and payload["type"] == "error", payload
    assert payload["error"]["type"] == "invalid_request_error" and field in payload["error"]["message"], payload


@pytest.mark.parametrize("fmt", ["yaml", 7, ["json"], True, {"enum": ["x" * BIG]}])
@pytest.mark.parametrize("route", ["/api/chat", "/api/generate"])
def test_ollama_bad_formats_are_400(server, route, fmt):
    body = {"model": server.model, "stream": False, "format": fmt, "options": {"num_predict": 1}}
    body.update({"messages": USER} if route == "/api/chat" else {"prompt": "hi"})
    status, payload = post_json(server, route, body)
    assert status == 400, payload
    assert set(payload) == {"error"} and isinstance(payload["error"], str), payload
    assert "'format'" in payload["error"], payload

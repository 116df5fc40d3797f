"""Tool calls and reasoning through a real flare-serve and the official SDKs (demo core).

The demo core is served with the Qwen3 template (serve-time ``--chat-template``), which
makes the served parsers ``hermes`` (tool calls) and ``think`` (reasoning). The small
model is not trusted to call tools on its own: ``tool_choice`` required or named forces the
call through a grammar over the Hermes syntax, and every call's arguments are checked
against the tool's schema with jsonschema. Model text that must take a given shape (a
reasoning block, a broken call) is forced with a regex constraint, so it is the real
engine's output that the parsers see.
"""

from __future__ import annotations

import json

import anthropic
import jsonschema
import ollama
import openai
import pytest
from server_harness import launch, metric, post_json

from flare import fixtures

WEATHER_PARAMS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                                                   "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                  "required": ["city", "unit"], "additionalProperties": False}
TIME_PARAMS = {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 24}},
               "required": ["timezone"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                            "parameters": WEATHER_PARAMS}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time in a timezone",
                                         "parameters": TIME_PARAMS}}
SCHEMAS = {"get_weather": WEATHER_PARAMS, "get_time": TIME_PARAMS}
ASK = [{"role": "user", "content": "What's the weather in Paris right now?"}]


@pytest.fixture(scope="module")
def served():
    template = fixtures.ensure_fixtures() / "templates" / "Qwen-Qwen3-0.6B.jinja"
    server = launch("demo", extra_flags=("--chat-template", str(template)))
    yield server
    server.stop()


def _openai(served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.base_url + "/v1", api_key="unused", max_retries=0)


def _valid(name: str, arguments) -> dict:
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    jsonschema.validate(args, SCHEMAS[name])
    return args


def test_models_report_the_served_parsers(served):
    status, body = post_json(served, "/tokenize", {"prompt": "x"})
    assert status == 200
    card = _openai(served).models.list().data[0].model_extra
    assert card["output_parsers"] == {"tool_calls": "hermes", "reasoning": "think"}


def test_openai_chat_required_returns_a_call_that_validates(served):
    completion = _openai(served).chat.completions.create(
        model=served.model, messages=ASK, tools=[WEATHER, TIME], tool_choice="required", temperature=0,
        max_tokens=160)
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    calls = choice.message.tool_calls
    assert calls and all(call.type == "function" and call.id.startswith("call_") for call in calls)
    for call in calls:
        _valid(call.function.name, call.function.arguments)
    assert not (choice.message.content or "").strip()


def test_openai_chat_named_streams_the_call(served):
    stream = _openai(served).chat.completions.create(
        model=served.model, messages=ASK, tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_time"}}, temperature=0, max_tokens=160,
        stream=True)
    calls: dict[int, dict] = {}
    finish = None
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        for part in delta.tool_calls or ():
            if part.index not in calls:  # the first fragment of a call carries its id and name
                assert part.id and part.function.name and part.type == "function"
                calls[part.index] = {"name": part.function.name, "arguments": ""}
            calls[part.index]["arguments"] += part.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and calls
    for call in calls.values():
        assert call["name"] == "get_time"
        _valid("get_time", call["arguments"])


def test_parallel_tool_calls_false_allows_one_call(served):
    completion = _openai(served).chat.completions.create(
        model=served.model, messages=ASK, tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False,
        temperature=1.0, seed=3, max_tokens=200)
    calls = completion.choices[0].message.tool_calls
    assert len(calls) == 1
    _valid(calls[0].function.name, calls[0].function.arguments)


def test_responses_required_returns_a_function_call_item(served):
    client = _openai(served)
    tools = [{"type": "function", "name": "get_weather", "description": "Current weather",
              "parameters": WEATHER_PARAMS}]
    response = client.responses.create(model=served.model, input="Weather in Paris?", tools=tools,
                                       tool_choice="required", temperature=0, max_output_tokens=160)
    calls = [item for item in response.output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and calls[0].call_id
    _valid("get_weather", calls[0].arguments)
    events = list(client.responses.create(model=served.model, input="Weather in Paris?", tools=tools,
                                          tool_choice={"type": "function", "name": "get_weather"}, temperature=0,
                                          max_output_tokens=160, stream=True))
    kinds = [event.type for event in events]
    assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    done = next(event for event in events if event.type == "response.function_call_arguments.done")
    _valid("get_weather", done.arguments)


def test_anthropic_any_returns_a_tool_use_block(served):
    client = anthropic.Anthropic(base_url=served.base_url, api_key="unused", max_retries=0)
    tools = [{"name": "get_weather", "description": "Current weather", "input_schema": WEATHER_PARAMS},
             {"name": "get_time", "description": "The time", "input_schema": TIME_PARAMS}]
    message = client.messages.create(model=served.model, max_tokens=160, messages=ASK, tools=tools,
                                     tool_choice={"type": "any"}, extra_body={"temperature": 0})
    assert message.stop_reason == "tool_use"
    uses = [block for block in message.content if block.type == "tool_use"]
    assert uses and all(block.id for block in uses)
    for block in uses:
        _valid(block.name, block.input)
    with client.messages.stream(model=served.model, max_tokens=160, messages=ASK, tools=tools,
                                tool_choice={"type": "tool", "name": "get_time"},
                                extra_body={"temperature": 0}) as stream:
        deltas = [event.delta.type for event in stream if event.type == "content_block_delta"]
        final = stream.get_final_message()
    assert "input_json_delta" in deltas and final.stop_reason == "tool_use"
    block = next(block for block in final.content if block.type == "tool_use")
    assert block.name == "get_time"
    _valid("get_time", block.input)


# What the ollama SDK sends of a tool's schema: its Tool model keeps types, enums and
# required, and drops maxLength and additionalProperties.
OLLAMA_WEATHER = {"type": "object", "properties": {"city": {"type": "string"},
                                                   "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                  "required": ["city", "unit"]}


def test_ollama_required_returns_tool_calls_with_object_arguments(served):
    client = ollama.Client(host=served.base_url)
    tool = {"type": "function", "function": {**WEATHER["function"], "parameters": OLLAMA_WEATHER}}
    options = {"tool_choice": "required", "temperature": 0, "num_predict": 200}
    response = client.chat(model=served.model, messages=ASK, tools=[tool], options=options)
    calls = response.message.tool_calls
    assert calls and calls[0].function.name == "get_weather", response
    assert isinstance(calls[0].function.arguments, dict)
    jsonschema.validate(calls[0].function.arguments, OLLAMA_WEATHER)
    chunks = list(client.chat(model=served.model, messages=ASK, tools=[tool], stream=True, options=options))
    streamed = [call for chunk in chunks for call in (chunk.message.tool_calls or ())]
    assert streamed and streamed[0].function.name == "get_weather"
    jsonschema.validate(streamed[0].function.arguments, OLLAMA_WEATHER)


def test_the_tool_result_turn_re_renders_the_generated_call(served):
    """Turn two re-renders the model's call byte for byte as it was generated (the arguments
    string goes back verbatim, the grammar wrote the template's spacing), and token for token:
    the grammar let the model spell the call with tokens the tokenizer would not choose (the
    demo writes '"' then ',' where the tokenizer has '",'), and the prompt takes the tokens
    the call was generated with in place of their re-encoding (frontend/continuations.py),
    so the prefix cache covers turn one's prompt and the call."""
    client = _openai(served)
    messages = list(ASK)
    reused = metric(served, "flare_outputs_carried_back_total")
    first = client.chat.completions.create(model=served.model, messages=messages, tools=[WEATHER],
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                           temperature=0, max_tokens=160, logprobs=True)
    reply = first.choices[0].message
    assert reply.tool_calls
    generated = [token.token for token in first.choices[0].logprobs.content]
    messages += [reply.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": reply.tool_calls[0].id, "content": '{"temperature": 21}'}]
    status, tokens = post_json(served, "/tokenize", {"model": served.model, "messages": messages, "tools": [WEATHER]})
    assert status == 200
    call = tokens["tokens"][first.usage.prompt_tokens:first.usage.prompt_tokens + len(generated)]
    spelled = [post_json(served, "/detokenize", {"tokens": [token]})[1]["prompt"] for token in call]
    assert spelled == generated
    # the demo's call is not the tokenizer's own spelling of it, so the tokens came from the record
    assert metric(served, "flare_outputs_carried_back_total") > reused
    second = client.chat.completions.create(model=served.model, messages=messages, tools=[WEATHER],
                                            temperature=0, max_tokens=4)
    # the call's last token was sampled, never fed: the cache holds everything before it
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens + len(generated) - 1


def test_without_reused_output_tokens_the_call_is_re_encoded():
    """--no-reuse-output-tokens: the prompt is the tokenizer's encoding of the rendered text,
    so the demo's non-canonical '"' ',' comes back as '",' and the cache stops inside the call."""
    template = fixtures.ensure_fixtures() / "templates" / "Qwen-Qwen3-0.6B.jinja"
    server = launch("demo", extra_flags=("--chat-template", str(template), "--no-reuse-output-tokens"))
    try:
        client = _openai(server)
        first = client.chat.completions.create(model=server.model, messages=ASK, tools=[WEATHER],
                                               tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                               temperature=0, max_tokens=160, logprobs=True)
        reply = first.choices[0].message
        generated = [token.token for token in first.choices[0].logprobs.content]
        messages = [*ASK, reply.model_dump(exclude_none=True),
                    {"role": "tool", "tool_call_id": reply.tool_calls[0].id, "content": '{"temperature": 21}'}]
        status, tokens = post_json(server, "/tokenize", {"model": server.model, "messages": messages,
                                                         "tools": [WEATHER]})
        assert status == 200
        call = tokens["tokens"][first.usage.prompt_tokens:first.usage.prompt_tokens + len(generated)]
        spelled = [post_json(server, "/detokenize", {"tokens": [token]})[1]["prompt"] for token in call]
        assert '",' in spelled and spelled != generated
        assert metric(server, "flare_outputs_carried_back_total") == 0
    finally:
        server.stop()


REASONED = r"<think>\nThe user wants the capital\.\n</think>\n\nParis\."


def test_reasoning_is_separated_from_content(served):
    client = _openai(served)
    body = {"structured_outputs": {"regex": REASONED}}
    completion = client.chat.completions.create(model=served.model, messages=ASK, temperature=0, max_tokens=40,
                                                extra_body=body)
    message = completion.choices[0].message
    assert message.model_extra["reasoning_content"].strip() == "The user wants the capital."
    assert message.content.strip() == "Paris."
    reasoning, content = "", ""
    for chunk in client.chat.completions.create(model=served.model, messages=ASK, temperature=0, max_tokens=40,
                                                extra_body=body, stream=True):
        if chunk.choices:
            delta = chunk.choices[0].delta
            reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
            content += delta.content or ""
    assert reasoning.strip() == "The user wants the capital." and content.strip() == "Paris."


def test_a_call_that_does_not_parse_is_content_and_counted(served):
    before = metric(served, "flare_tool_call_parse_failures_total")
    broken = r'<tool_call>\n\{"name": get_weather, "arguments"\n</tool_call>'
    completion = _openai(served).chat.completions.create(
        model=served.model, messages=ASK, tools=[WEATHER], temperature=0, max_tokens=60,
        extra_body={"structured_outputs": {"regex": broken}})
    choice = completion.choices[0]
    assert not choice.message.tool_calls and choice.finish_reason == "stop"
    assert '"name": get_weather' in choice.message.content
    assert metric(served, "flare_tool_call_parse_failures_total") == before + 1


@pytest.mark.parametrize("body, needle", [
    ({"tool_choice": "required"}, "needs at least one tool"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "not among"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
     "cannot be combined"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "object"}}], "tool_choice": "required"},
     "must be a JSON Schema object"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}}}],
      "tool_choice": "required"}, "uniqueItems"),
])
def test_tool_choices_that_cannot_be_honoured_are_400(served, body, needle):
    status, payload = post_json(served, "/v1/chat/completions", {"model": served.model, "messages": ASK, **body})
    assert status == 400 and needle in payload["error"]["message"], payload


def test_without_a_tool_parser_required_is_a_400():
    """The demo core's own template (SmolLM2) has no tool syntax: no parser, no forced call."""
    server = launch("demo", extra_flags=("--tool-parser", "none"))
    try:
        status, payload = post_json(server, "/v1/chat/completions", {
            "model": server.model, "messages": ASK, "tools": [WEATHER], "tool_choice": "required"})
        assert status == 400 and "--tool-parser" in payload["error"]["message"], payload
        status, payload = post_json(server, "/v1/chat/completions", {
            "model": server.model, "messages": ASK, "tools": [WEATHER], "max_tokens": 4})
        assert status == 200 and payload["choices"][0]["finish_reason"] in ("stop", "length")
    finally:
        server.stop()

"""The Anthropic Messages routes through real sockets: the official ``anthropic`` SDK and raw requests.

Every test runs on the fake engine and on a real ``flare-serve`` over the demo core
(conftest.py); fault injection, exact fake output and a test output parser are fake only.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time

import anthropic
import pytest
from server_harness import get_json, metric, post_json, request

from flare.frontend.parsers import (
    ContentDelta,
    OutputParser,
    ReasoningDelta,
    ToolCallArguments,
    ToolCallEnd,
    ToolCallStart,
    registry,
)
from flare.request import GenerationDefaults
from flare.server.api.anthropic.schema import parse_messages

SYSTEM = "You are terse."
USER = [{"role": "user", "content": "Say hello to Flare"}]
GREEDY = {"temperature": 0}  # not in the SDK's signature any more; raw clients and older SDKs send it


def _client(served, **kwargs) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=served.base_url, api_key=served.api_key or "unused", max_retries=0,
                               **kwargs)


def _async_client(served) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=served.base_url, api_key=served.api_key or "unused", max_retries=0)


def _text(message) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


def _events(raw: bytes) -> list[tuple[str, dict]]:
    out = []
    for event in raw.decode().split("\n\n"):
        if event:
            name, data = event.split("\n", 1)
            out.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


def assert_anthropic_error(status: int, payload, expected: int, error_type: str, *needles: str) -> str:
    assert status == expected, payload
    assert set(payload) == {"type", "error"} and payload["type"] == "error", payload
    assert set(payload["error"]) == {"type", "message"} and payload["error"]["type"] == error_type, payload
    for needle in needles:
        assert needle in payload["error"]["message"], payload["error"]["message"]
    return payload["error"]["message"]


# -- messages ------------------------------------------------------------------------

def test_create_sync(server):
    reply = _client(server).messages.create(model=server.model, max_tokens=48, system=SYSTEM, messages=USER,
                                            extra_body=GREEDY)
    assert reply.type == "message" and reply.role == "assistant" and reply.id.startswith("msg_")
    assert reply.model == server.model and [block.type for block in reply.content] == ["text"]
    assert reply.stop_reason in ("end_turn", "max_tokens") and reply.stop_sequence is None
    assert reply.usage.input_tokens > 0 and 0 < reply.usage.output_tokens <= 48
    if server.kind == "fake":
        assert _text(reply) == "You said: Say hello to Flare" and reply.stop_reason == "end_turn"


def test_stream_text_and_final_message_match_create(server):
    client = _client(server)
    whole = client.messages.create(model=server.model, max_tokens=32, system=SYSTEM, messages=USER,
                                   extra_body=GREEDY)
    with client.messages.stream(model=server.model, max_tokens=32, system=SYSTEM, messages=USER,
                                extra_body=GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == _text(final) == _text(whole)
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens
    assert (final.usage.input_tokens + final.usage.cache_read_input_tokens
            == whole.usage.input_tokens + whole.usage.cache_read_input_tokens)


def test_stream_events_in_anthropics_order(server):
    status, headers, raw = request(server, "POST", "/v1/messages", {
        "model": server.model, "max_tokens": 6, "messages": USER, "stream": True})
    names = [name for name, _ in _events(raw)]
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    events = dict(_events(raw))  # the last event of each name
    assert events["message_start"]["message"]["usage"]["input_tokens"] > 0
    assert events["message_delta"]["delta"]["stop_reason"] in ("end_turn", "max_tokens")
    assert events["message_delta"]["usage"]["output_tokens"] >= len(names) - 6 > 0


def test_async_client_create_and_stream(server):
    async def run():
        client = _async_client(server)
        whole = await client.messages.create(model=server.model, max_tokens=24, messages=USER, extra_body=GREEDY)
        async with client.messages.stream(model=server.model, max_tokens=24, messages=USER,
                                          extra_body=GREEDY) as stream:
            pieces = [text async for text in stream.text_stream]
            final = await stream.get_final_message()
        many = await asyncio.gather(*(client.messages.create(model=server.model, max_tokens=6, messages=USER)
                                      for _ in range(4)))
        await client.close()
        return whole, "".join(pieces), final, many

    whole, text, final, many = asyncio.run(run())
    assert text == _text(whole) == _text(final)
    assert len(many) == 4 and all(reply.content for reply in many)


def test_count_tokens_is_the_prompt_a_message_prefills(server):
    client = _client(server)
    counted = client.messages.count_tokens(model=server.model, system=SYSTEM, messages=USER)
    reply = client.messages.create(model=server.model, max_tokens=2, system=SYSTEM, messages=USER)
    assert counted.input_tokens > 0
    assert counted.input_tokens == reply.usage.input_tokens + reply.usage.cache_read_input_tokens


def test_second_turn_reads_the_first_from_the_prefix_cache(server):
    client = _client(server)
    history = [{"role": "user", "content": "Background for a long conversation. " * 12 + "Say hi."}]
    first = client.messages.create(model=server.model, max_tokens=12, system=SYSTEM, messages=history,
                                   extra_body=GREEDY)
    history += [first.to_param(), {"role": "user", "content": "Now say bye."}]
    second = client.messages.create(model=server.model, max_tokens=4, system=SYSTEM, messages=history)
    counted = client.messages.count_tokens(model=server.model, system=SYSTEM, messages=history)
    assert second.usage.cache_read_input_tokens > 0 and second.usage.cache_creation_input_tokens == 0
    assert second.usage.input_tokens + second.usage.cache_read_input_tokens == counted.input_tokens


def test_sampling_fields_and_options_are_accepted(server):
    reply = _client(server).messages.create(
        model=server.model, max_tokens=8, messages=USER, stop_sequences=["\n\n"], metadata={"user_id": "u-1"},
        service_tier="auto", speed="standard", cache_control={"type": "ephemeral"},
        tool_choice={"type": "auto"}, thinking={"type": "disabled"}, output_config={"effort": "low"},
        extra_body={"temperature": 0.7, "top_p": 0.9, "top_k": 40},
        extra_headers={"anthropic-beta": "prompt-caching-2024-07-31"})
    assert reply.content and reply.usage.output_tokens <= 8


def test_max_tokens_ends_with_max_tokens(server):
    reply = _client(server).messages.create(model=server.model, max_tokens=3, messages=USER)
    assert reply.stop_reason == "max_tokens" and reply.usage.output_tokens == 3


@pytest.mark.fake_only("exact fake output")
def test_stop_sequence_is_reported(server, fake_only):
    client = _client(server)
    reply = client.messages.create(model=server.model, max_tokens=40, messages=USER, stop_sequences=["hello"])
    assert _text(reply) == "You said: Say " and (reply.stop_reason, reply.stop_sequence) == ("stop_sequence", "hello")
    with client.messages.stream(model=server.model, max_tokens=40, messages=USER,
                                stop_sequences=["hello"]) as stream:
        final = stream.get_final_message()
    assert _text(final) == "You said: Say " and final.stop_sequence == "hello"


# -- conversion: the template sees what the equivalent OpenAI request would send ------------

ANTHROPIC_HISTORY = [
    {"role": "user", "content": [{"type": "text", "text": "What is the weather"},
                                 {"type": "text", "text": "in Paris?", "cache_control": {"type": "ephemeral"}}]},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "weather",
                                       "input": {"city": "Paris"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C, sunny"}]},
    {"role": "assistant", "content": "It is 18 C."},
    {"role": "user", "content": "Thanks"},
    {"role": "user", "content": [{"type": "text", "text": "And tomorrow?"}]},  # combined with the turn before
]
OPENAI_HISTORY = [
    {"role": "system", "content": [{"type": "text", "text": SYSTEM}]},
    {"role": "user", "content": [{"type": "text", "text": "What is the weather"},
                                 {"type": "text", "text": "in Paris?"}]},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "toolu_1", "type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "tool_call_id": "toolu_1", "name": "weather", "content": "18 C, sunny"},
    {"role": "assistant", "content": "It is 18 C."},
    {"role": "user", "content": [{"type": "text", "text": "Thanks"}, {"type": "text", "text": "And tomorrow?"}]},
]
ANTHROPIC_TOOLS = [{"name": "weather", "description": "Weather by city",
                    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
OPENAI_TOOLS = [{"type": "function", "function": {"name": "weather", "description": "Weather by city",
                                                  "parameters": ANTHROPIC_TOOLS[0]["input_schema"]}}]


def test_blocks_and_tools_render_as_the_equivalent_openai_messages(server):
    counted = _client(server).messages.count_tokens(model=server.model, messages=ANTHROPIC_HISTORY,
                                                    system=[{"type": "text", "text": SYSTEM}],
                                                    tools=ANTHROPIC_TOOLS)
    status, tokenized = post_json(server, "/tokenize", {"model": server.model, "messages": OPENAI_HISTORY,
                                                        "tools": OPENAI_TOOLS})
    assert status == 200 and counted.input_tokens == tokenized["count"]
    reply = _client(server).messages.create(model=server.model, max_tokens=8, messages=ANTHROPIC_HISTORY,
                                            system=[{"type": "text", "text": SYSTEM}], tools=ANTHROPIC_TOOLS)
    assert reply.usage.input_tokens + reply.usage.cache_read_input_tokens == tokenized["count"]


def test_a_final_assistant_turn_is_continued(server):
    prefill = USER + [{"role": "assistant", "content": "Hello"}]
    counted = _client(server).messages.count_tokens(model=server.model, messages=prefill)
    status, tokenized = post_json(server, "/tokenize", {
        "model": server.model, "messages": prefill, "add_generation_prompt": False,
        "continue_final_message": True})
    assert status == 200 and counted.input_tokens == tokenized["count"]
    assert _client(server).messages.create(model=server.model, max_tokens=4, messages=prefill).content


def test_thinking_combined_turns_options_and_defaults_reach_the_chat_request():
    body = {"model": "m", "max_tokens": 2048, "system": "S", "stop_sequences": ["END", ""],
            "thinking": {"type": "enabled", "budget_tokens": 1024}, "output_config": {"effort": "high"},
            "messages": [
                {"role": "user", "content": "Q"},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "sig"},
                                                  {"type": "text", "text": "A"}]},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"x": 1}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "is_error": True,
                                              "content": [{"type": "text", "text": "boom"}]},
                                             {"type": "text", "text": "again"}]}]}
    parsed = parse_messages(body, GenerationDefaults(temperature=0.6, top_k=20, repetition_penalty=1.05))
    assert parsed.prompt.messages == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": [{"type": "text", "text": "A"}], "reasoning_content": "hmm",
         "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]},
        {"role": "tool", "tool_call_id": "t1", "content": [{"type": "text", "text": "boom"}], "name": "f",
         "is_error": True},
        {"role": "user", "content": [{"type": "text", "text": "again"}]}]
    assert parsed.prompt.options == {"add_generation_prompt": True, "enable_thinking": True,
                                     "reasoning_effort": "high"}
    params = parsed.sampling_params(100, 4096)
    assert (params.max_tokens, params.temperature, params.top_k, params.repetition_penalty, params.stop) == (
        2048, 0.6, 20, 1.05, ("END",))
    params = parse_messages({**body, "temperature": 0, "top_k": 0}, GenerationDefaults(temperature=0.6, top_k=20)
                            ).sampling_params(100, 4096)
    assert (params.temperature, params.top_k) == (0.0, 0)


# -- errors ----------------------------------------------------------------------------

def test_unknown_model_is_not_found(server):
    with pytest.raises(anthropic.NotFoundError) as info:
        _client(server).messages.create(model="no-such-model", max_tokens=4, messages=USER)
    assert "no-such-model" in str(info.value) and info.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.NotFoundError):
        _client(server).messages.count_tokens(model="no-such-model", messages=USER)


def test_missing_max_tokens_is_bad_request(server):
    # The SDK refuses a call without max_tokens itself: send the body raw through it.
    with pytest.raises(anthropic.BadRequestError) as info:
        _client(server).post("/v1/messages", cast_to=object, body={"model": server.model, "messages": USER})
    assert "max_tokens" in str(info.value) and info.value.body["error"]["type"] == "invalid_request_error"


def test_context_overflow_is_bad_request(launcher):
    served = launcher(context_hint="raise it with flare export --context", context_len=512)
    card_len = get_json(served, "/v1/models")[1]["data"][0]["max_model_len"]
    with pytest.raises(anthropic.BadRequestError) as info:
        # An explicit timeout: without one the SDK refuses a large non-streamed max_tokens itself.
        _client(served).messages.create(model=served.model, max_tokens=card_len, messages=USER, timeout=60)
    message = info.value.body["error"]["message"]
    assert f"max_tokens of {card_len}" in message and f"context of {card_len} tokens" in message
    assert "raise it with flare export --context" in message
    with pytest.raises(anthropic.BadRequestError, match="context of"):
        _client(served).messages.create(model=served.model, max_tokens=4,
                                        messages=[{"role": "user", "content": "word " * card_len}])


IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}


@pytest.mark.parametrize("fields,needle", [
    ({"output_config": {"format": {"type": "json_object"}}}, "output_config.format.type"),
    ({"output_config": {"effort": "extreme"}}, "output_config.effort"),
    ({"messages": [{"role": "user", "content": [IMAGE]}]}, "image"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [IMAGE]}]}]},
     "image"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}, "document"),
    ({"messages": [{"role": "assistant", "content": [{"type": "redacted_thinking", "data": "x"}]}]},
     "redacted_thinking"),
    ({"messages": [{"role": "user", "content": [{"type": "thinking", "thinking": "x", "signature": ""}]}]},
     "in a user message"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "citations": [{"a": 1}]}]}]},
     "citations"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "role"),
    ({"messages": [{"role": "user", "content": "x", "name": "n"}]}, "name"),
    ({"messages": []}, "messages"),
    ({"messages": USER + [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f",
                                                            "input": {}}]}]}, "tool_result"),
    ({"tool_choice": {"type": "any"}}, "needs at least one tool"),
    ({"tool_choice": {"type": "tool"}}, "tool_choice.name"),
    ({"tool_choice": {"type": "none", "disable_parallel_tool_use": True}}, "disable_parallel_tool_use"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "web_search_20250305"),
    ({"tools": [{**ANTHROPIC_TOOLS[0], "strict": True}]}, "strict"),
    ({"tools": [{**ANTHROPIC_TOOLS[0], "defer_loading": True}]}, "defer_loading"),
    ({"tools": [{"name": "f"}]}, "input_schema"),
    ({"thinking": {"type": "between_tools"}}, "between_tools"),
    ({"thinking": {"type": "enabled", "budget_tokens": 100}}, "budget_tokens"),
    ({"thinking": {"type": "enabled", "budget_tokens": 2048}}, "less than max_tokens"),
    ({"container": "container_1"}, "container"),
    ({"diagnostics": {"previous_message_id": None}}, "diagnostics"),
    ({"inference_geo": "us"}, "inference_geo"),
    ({"speed": "fast"}, "speed"),
    ({"service_tier": "priority"}, "service_tier"),
    ({"metadata": {"user_id": "u", "team": "t"}}, "team"),
    ({"stop_sequences": "stop"}, "stop_sequences"),
    ({"temperature": 1.5}, "temperature"),
    ({"top_k": "many"}, "top_k"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"model": None}, "model"),
    ({"frobnicate": True}, "frobnicate"),
    ({"cache_control": {"type": "persistent"}}, "cache_control"),
])
def test_refused_fields_are_400_naming_them(server, fields, needle):
    body = {"model": server.model, "max_tokens": 16, "messages": USER, **fields}
    status, payload = post_json(server, "/v1/messages", {k: v for k, v in body.items() if v is not None})
    assert_anthropic_error(status, payload, 400, "invalid_request_error", needle)


def test_sdk_raises_bad_request_for_refused_fields(server):
    client = _client(server)
    with pytest.raises(anthropic.BadRequestError, match="output_config.format.schema"):
        client.messages.create(model=server.model, max_tokens=8, messages=USER,
                               output_config={"format": {"type": "json_schema", "schema": "object"}})
    with pytest.raises(anthropic.BadRequestError, match="text only"):
        client.messages.count_tokens(model=server.model, messages=[{"role": "user", "content": [IMAGE]}])
    with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
        client.post("/v1/messages/count_tokens", cast_to=object,
                    body={"model": server.model, "messages": USER, "max_tokens": 3})


def test_invalid_json_is_400_in_anthropics_shape(server):
    status, _, body = request(server, "POST", "/v1/messages", raw_body=b'{"messages": [')
    assert_anthropic_error(status, json.loads(body), 400, "invalid_request_error", "JSON")


def test_x_api_key_and_bearer_auth(launcher):
    served = launcher(api_key="s3cret-key")
    keyed = anthropic.Anthropic(base_url=served.base_url, api_key=None, default_headers={"x-api-key": "s3cret-key"},
                                max_retries=0)
    assert keyed.messages.create(model=served.model, max_tokens=2, messages=USER).content
    assert _client(served).messages.count_tokens(model=served.model, messages=USER).input_tokens > 0  # Bearer
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=served.base_url, api_key=None, default_headers={"x-api-key": "wrong"},
                            max_retries=0).messages.create(model=served.model, max_tokens=2, messages=USER)
    for headers in ({}, {"x-api-key": "wrong"}, {"x-api-key": "Bearer s3cret-key"}):
        status, _, body = request(served, "POST", "/v1/messages", {"model": served.model, "max_tokens": 2,
                                                                   "messages": USER}, headers=headers, auth=False)
        assert_anthropic_error(status, json.loads(body), 401, "authentication_error", "x-api-key")
    # x-api-key works on every route, the OpenAI ones included.
    status, _, _ = request(served, "GET", "/v1/models", headers={"x-api-key": "s3cret-key"}, auth=False)
    assert status == 200


# -- execution failures, capacity, disconnects ---------------------------------------------

CRASH = [{"role": "user", "content": "please FLARE_FAKE_CRASH"}]


@pytest.mark.fake_only("fault injection: the FLARE_FAKE_CRASH marker")
def test_execution_failure_is_500_and_an_error_event_mid_stream(launcher, fake_only):
    # The marker fails the runtime (as a device fault would), so each request gets a fresh server.
    served = launcher()
    with pytest.raises(anthropic.InternalServerError) as info:
        _client(served).messages.create(model=served.model, max_tokens=20, messages=CRASH)
    assert info.value.status_code == 500 and info.value.body["error"]["type"] == "api_error"
    message = info.value.body["error"]["message"]
    assert "fake execution failure" in message
    served = launcher()
    status, _, raw = request(served, "POST", "/v1/messages", {"model": served.model, "max_tokens": 20,
                                                              "messages": CRASH, "stream": True})
    events = _events(raw)
    assert status == 200 and events[0][0] == "message_start" and "message_stop" not in dict(events)
    assert events[-1] == ("error", {"type": "error", "error": {"type": "api_error", "message": message}})
    served = launcher()
    with pytest.raises(anthropic.APIStatusError) as info:
        with _client(served).messages.stream(model=served.model, max_tokens=20, messages=CRASH) as stream:
            "".join(stream.text_stream)
    assert info.value.body == {"type": "error", "error": {"type": "api_error", "message": message}}


def _open_stream(served, *, wait: bool = True) -> socket.socket:
    """A long /v1/messages stream on a raw socket; (``wait``) its first bytes read."""
    host, port = served.host_port
    sock = socket.create_connection((host, port))
    # The fake echoes the prompt: at 50 tokens/s this reply takes 6 s.
    data = json.dumps({"model": served.model, "max_tokens": 300, "stream": True,
                       "messages": [{"role": "user", "content": "Tell me a long story. " * 20}]}).encode()
    sock.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(data) + data)
    received = b""
    while wait and b"message_start" not in received:
        chunk = sock.recv(65536)
        assert chunk, received
        received += chunk
    return sock


def _wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


@pytest.mark.fake_only("the model queue is sized by the fake's --model-queue; the runtime's queue is the core's")
def test_capacity_is_rate_limit_and_overloaded(launcher, fake_only):
    # HTTP capacity (1 + 1) is exhausted first: 429; then a model queue of 1 behind 1 slot: 529.
    served = launcher(max_active=1, queue_capacity=1, capacity_hint="raise --queue-capacity", tokens_per_s=50)
    held = [_open_stream(served), _open_stream(served, wait=False)]
    _wait_for(lambda: metric(served, "flare_http_admitted") == 2)
    with pytest.raises(anthropic.RateLimitError) as info:
        _client(served).messages.create(model=served.model, max_tokens=2, messages=USER)
    assert info.value.body["error"]["type"] == "rate_limit_error" and "raise --queue-capacity" in str(info.value)
    assert info.value.response.headers["retry-after"] == "1"
    for sock in held:
        sock.close()
    served = launcher(max_active=1, queue_capacity=4, model_queue=1, capacity_hint="see --max-active",
                      tokens_per_s=50)
    held = [_open_stream(served), _open_stream(served, wait=False)]
    _wait_for(lambda: metric(served, "flare_requests_pending") == 1)
    with pytest.raises(anthropic.OverloadedError) as info:
        _client(served).messages.create(model=served.model, max_tokens=2, messages=USER)
    assert info.value.status_code == 529 and info.value.body["error"]["type"] == "overloaded_error"
    assert info.value.response.headers["retry-after"] == "1"
    assert "see --max-active" in str(info.value)
    for sock in held:
        sock.close()


@pytest.mark.fake_only("pause/resume is the embedding API of an in-process session")
def test_paused_admission_is_503_overloaded(launcher, fake_only):
    served = launcher()
    served.session.pause_admission()
    try:
        with pytest.raises(anthropic.ServiceUnavailableError) as info:
            _client(served).messages.create(model=served.model, max_tokens=2, messages=USER)
        assert info.value.body["error"]["type"] == "overloaded_error" and "paused" in str(info.value)
    finally:
        served.session.resume_admission()


@pytest.mark.fake_only("a paced reply (tokens_per_s): the demo model may end its story before the client leaves")
def test_disconnect_mid_stream_cancels_and_frees_the_slot(launcher, fake_only):
    served = launcher(max_active=2, tokens_per_s=50)
    before = metric(served, "flare_requests_cancelled_total")
    sock = _open_stream(served)
    sock.close()
    _wait_for(lambda: metric(served, "flare_requests_cancelled_total") == before + 1)
    _wait_for(lambda: metric(served, "flare_slots_live") == 0 and metric(served, "flare_http_admitted") == 0)


def test_requests_are_counted_like_openai_ones(server):
    before = {name: metric(server, name) for name in (
        'flare_http_responses_total{code="200"}', "flare_time_to_first_token_seconds_count",
        "flare_e2e_request_latency_seconds_count")}
    _client(server).messages.create(model=server.model, max_tokens=2, messages=USER)
    with _client(server).messages.stream(model=server.model, max_tokens=2, messages=USER) as stream:
        stream.get_final_message()
    for name, value in before.items():
        assert metric(server, name) >= value + 2, name


# -- typed deltas (a test parser) ----------------------------------------------------------

class ThinkThenCall(OutputParser):
    """Every piece is reasoning; the output ends with a sentence and one tool call."""

    name = "test-think-then-call"
    kind = "reasoning"  # served as the reasoning parser: every chat request goes through it

    def __init__(self, opened=False):
        pass

    def feed(self, text):
        return [ReasoningDelta(text)]

    def finish(self):
        return [ContentDelta("Checking."), ToolCallStart(0, "toolu_0", "weather"),
                ToolCallArguments(0, '{"city":'), ToolCallArguments(0, '"Paris"}'), ToolCallEnd(0)]


@pytest.fixture
def parsed(monkeypatch, launcher, fake_only):
    monkeypatch.setattr(registry, "_PARSERS", {**registry._PARSERS, ThinkThenCall.name: ThinkThenCall})
    served = launcher(tokens_per_s=0)
    served.session._server.state.reasoning_parser = ThinkThenCall.name
    return served


@pytest.mark.fake_only("a test parser installed in process")
def test_reasoning_and_tool_calls_are_thinking_and_tool_use_blocks(parsed):
    client = _client(parsed)
    reply = client.messages.create(model=parsed.model, max_tokens=40, messages=USER, tools=ANTHROPIC_TOOLS)
    assert reply.stop_reason == "tool_use"
    assert [block.model_dump(exclude_none=True) for block in reply.content] == [
        {"type": "thinking", "thinking": "You said: Say hello to Flare", "signature": ""},
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "toolu_0", "name": "weather", "input": {"city": "Paris"}}]
    with client.messages.stream(model=parsed.model, max_tokens=40, messages=USER, tools=ANTHROPIC_TOOLS) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    assert [block.model_dump(exclude_none=True) for block in final.content] == [
        block.model_dump(exclude_none=True) for block in reply.content]
    status, _, raw = request(parsed, "POST", "/v1/messages", {"model": parsed.model, "max_tokens": 40,
                                                              "messages": USER, "stream": True})
    deltas = {data["delta"]["type"] for name, data in _events(raw) if name == "content_block_delta"}
    assert status == 200 and deltas == {"thinking_delta", "text_delta", "input_json_delta"}
    # display "omitted": the thinking block stays, its text does not.
    hidden = client.messages.create(model=parsed.model, max_tokens=1500, messages=USER,
                                    thinking={"type": "enabled", "budget_tokens": 1024, "display": "omitted"})
    assert hidden.content[0].type == "thinking" and hidden.content[0].thinking == ""


def test_models_in_anthropics_shape_for_the_anthropic_sdk(server):
    """GET /v1/models is both APIs' path: the anthropic SDK (anthropic-version) gets Anthropic's shape,
    everyone else OpenAI's."""
    client = _client(server)
    page = client.models.list()
    ids = [model.id for model in page.data]
    assert ids == [server.model] and page.data[0].type == "model" and not page.has_more
    one = client.models.retrieve(server.model)
    assert one.id == server.model and one.max_input_tokens == page.data[0].max_input_tokens > 0
    with pytest.raises(anthropic.NotFoundError):
        client.models.retrieve("no-such-model")
    status, _, payload = request(server, "GET", "/v1/models")
    assert status == 200 and json.loads(payload)["object"] == "list"

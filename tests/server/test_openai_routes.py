"""The OpenAI routes through real sockets: the official SDK and raw requests."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest
from server_harness import assert_error, get_json, post_json, request

CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hello to Flare"}]


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=server.api_key or "unused", max_retries=0)


def _async_client(server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key=server.api_key or "unused", max_retries=0)


# -- discovery -------------------------------------------------------------------

def test_models_lists_one_card(server):
    models = _client(server).models.list().data
    assert len(models) == 1
    status, payload = get_json(server, "/v1/models")
    card = payload["data"][0]
    assert status == 200 and card["id"] == server.model
    assert card["max_model_len"] > 0 and card["root"] and "chat" in card["capabilities"]


def test_model_by_identifier_and_aliases(server):
    card = get_json(server, "/v1/models")[1]["data"][0]
    names = [card["root"], *card["aliases"], card["id"]]
    if server.kind == "fake":
        assert set(names) == {"flare-test/fake-model", "flare-test/alias-one", "plain-alias"}
    for name in names + [name.replace("/", "%2F") for name in names if "/" in name]:
        status, found = get_json(server, f"/v1/models/{name}")
        assert status == 200 and found["id"] == card["id"] and found["root"] == card["root"], name
    assert _client(server).models.retrieve(card["root"]).id == card["id"]


def test_unknown_model_is_json_404(server):
    status, payload = get_json(server, "/v1/models/no/such-model")
    assert_error(status, payload, 404, "no/such-model")
    status, payload = post_json(server, "/v1/chat/completions", {"model": "nope", "messages": CHAT})
    assert assert_error(status, payload, 404)["code"] == "model_not_found"


def test_health_and_metrics(server):
    status, payload = get_json(server, "/health")
    assert (status, payload) == (200, {"status": "ok"})
    status, headers, body = request(server, "GET", "/metrics")
    text = body.decode()
    assert status == 200 and headers["content-type"].startswith("text/plain")
    for name in ("flare_requests_admitted_total", "flare_slots_free", "flare_http_capacity",
                 "flare_frontend_workers", "flare_uptime_seconds", "flare_tokens_last_minute",
                 "flare_time_to_first_token_seconds_bucket", "flare_inter_token_latency_seconds_bucket",
                 "flare_e2e_request_latency_seconds_bucket", 'flare_graph_launches_total{kind="decode"}'):
        assert name in text, name


# -- chat ---------------------------------------------------------------------------

def test_chat_sync_non_streaming(server):
    reply = _client(server).chat.completions.create(model=server.model, messages=CHAT, max_tokens=48,
                                                    temperature=0)
    choice = reply.choices[0]
    assert reply.object == "chat.completion" and choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length") and choice.message.content
    usage = reply.usage
    assert usage.prompt_tokens > 0 and 0 < usage.completion_tokens <= 48
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    if server.kind == "fake":
        assert choice.message.content == "You said: Say hello to Flare"


def test_chat_sync_streaming_matches_non_streaming(server):
    client = _client(server)
    whole = client.chat.completions.create(model=server.model, messages=CHAT, max_tokens=32, temperature=0)
    chunks = list(client.chat.completions.create(model=server.model, messages=CHAT, max_tokens=32, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_streaming_without_usage_has_no_usage_chunk(server):
    chunks = list(_client(server).chat.completions.create(model=server.model, messages=CHAT, max_tokens=8,
                                                          stream=True))
    assert all(c.choices for c in chunks) and all(c.usage is None for c in chunks)


def test_async_client_streaming_and_not(server):
    async def run():
        client = _async_client(server)
        whole = await client.chat.completions.create(model=server.model, messages=CHAT, max_tokens=24,
                                                     temperature=0)
        stream = await client.chat.completions.create(model=server.model, messages=CHAT, max_tokens=24,
                                                      temperature=0, stream=True,
                                                      stream_options={"include_usage": True})
        pieces, usage = [], None
        async for chunk in stream:
            if chunk.choices:
                pieces.append(chunk.choices[0].delta.content or "")
            if chunk.usage:
                usage = chunk.usage
        many = await asyncio.gather(*(client.chat.completions.create(
            model=server.model, messages=CHAT, max_tokens=8, temperature=0) for _ in range(6)))
        await client.close()
        return whole, "".join(pieces), usage, many

    whole, text, usage, many = asyncio.run(run())
    assert text == whole.choices[0].message.content
    assert usage.prompt_tokens == whole.usage.prompt_tokens
    assert len(many) == 6 and all(r.choices[0].message.content for r in many)


def test_sampling_fields_are_accepted(server):
    reply = _client(server).chat.completions.create(
        model=server.model, messages=CHAT, temperature=0.7, top_p=0.9, seed=1234, presence_penalty=0.5,
        frequency_penalty=0.25, max_completion_tokens=8, stop=["\n\n"], n=1,
        extra_body={"top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1, "stop_token_ids": [2],
                    "ignore_eos": False})
    assert reply.choices[0].message.content is not None
    assert reply.usage.completion_tokens <= 8


def test_a_seeded_filtered_request_draws_the_same_tokens_alone_or_in_a_batch(server):
    """Ollama-style filters with a seed: the tokens depend on the seed and the request's own
    position, never on the rows it shares a step with."""
    fields = dict(model=server.model, messages=CHAT, max_tokens=12, temperature=0.9, top_p=0.9,
                  extra_body={"top_k": 40, "min_p": 0.02, "ignore_eos": True})

    async def run():
        client = _async_client(server)
        alone = await client.chat.completions.create(seed=77, **fields)
        crowd = await asyncio.gather(client.chat.completions.create(seed=77, **fields),
                                     *(client.chat.completions.create(seed=s, **fields) for s in range(5)))
        await client.close()
        return alone, crowd

    alone, crowd = asyncio.run(run())
    assert alone.usage.completion_tokens == 12
    assert crowd[0].choices[0].message.content == alone.choices[0].message.content


def test_max_tokens_ends_with_length(server):
    reply = _client(server).chat.completions.create(model=server.model, messages=CHAT, max_tokens=3,
                                                    extra_body={"ignore_eos": True})
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 3


@pytest.mark.fake_only("exact fake output; test_stop_strings.py runs the same on the demo engine")
def test_stop_string_is_withheld(server, fake_only):
    reply = _client(server).chat.completions.create(model=server.model, messages=CHAT, stop=["hello"])
    assert reply.choices[0].message.content == "You said: Say " and reply.choices[0].finish_reason == "stop"
    chunks = list(_client(server).chat.completions.create(model=server.model, messages=CHAT, stop=["hello"],
                                                          stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "You said: Say "


@pytest.mark.fake_only("exact byte token IDs; the demo engine's stop tokens are its EOS in every test")
def test_stop_token_ids(server, fake_only):
    reply = _client(server).chat.completions.create(model=server.model, messages=CHAT,
                                                    extra_body={"stop_token_ids": [ord(":")]})
    assert reply.choices[0].message.content == "You said" and reply.choices[0].finish_reason == "stop"


def test_chat_logprobs(server):
    # Greedy, so the streamed request generates the same tokens as the unary one.
    reply = _client(server).chat.completions.create(model=server.model, messages=CHAT, max_tokens=4,
                                                    logprobs=True, top_logprobs=3, temperature=0)
    content = reply.choices[0].logprobs.content
    assert 1 <= len(content) <= 4
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token
    chunks = list(_client(server).chat.completions.create(model=server.model, messages=CHAT, max_tokens=4,
                                                          logprobs=True, top_logprobs=2, stream=True,
                                                          temperature=0))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in content]
    assert all(len(e.top_logprobs) == 2 for e in streamed)
    assert "".join(e.token for e in streamed) == reply.choices[0].message.content


def test_text_content_parts_and_tool_history(server):
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "What is the weather"},
                                     {"type": "text", "text": "in Paris?"}]},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_2", "type": "function", "function": {"name": "weather", "arguments": {"city": "Lyon"}}}]},
        {"role": "tool", "tool_call_id": "call_2", "content": "20 C"},
        {"role": "user", "content": [{"type": "text", "text": "Thanks"}]},
    ]
    tools = [{"type": "function", "function": {"name": "weather", "description": "Weather by city",
                                               "parameters": {"type": "object",
                                                              "properties": {"city": {"type": "string"}}}}}]
    reply = _client(server).chat.completions.create(model=server.model, messages=messages, tools=tools,
                                                    max_tokens=8)
    assert reply.choices[0].message.content is not None
    if server.kind == "fake":
        assert reply.choices[0].message.content == "You said"  # max_tokens=8


@pytest.mark.fake_only("SmolLM2's template rejects null content, as transformers does")
def test_null_assistant_content_reaches_the_template(server, fake_only):
    # SmolLM2's template concatenates message['content'] and so rejects null content
    # (as Transformers does); the fake template accepts it.
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "done"}]
    status, payload = post_json(server, "/v1/chat/completions", {"messages": messages, "max_tokens": 4})
    assert status == 200, payload


def test_tool_call_arguments_must_be_json_objects(server):
    for arguments in ('{"city": ', '["a list"]'):
        messages = [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}]}]
        status, payload = post_json(server, "/v1/chat/completions", {"model": server.model, "messages": messages})
        assert_error(status, payload, 400, "arguments")


def test_cached_prompt_tokens_are_reported(server):
    long_messages = [{"role": "system", "content": "Background. " * 40}, {"role": "user", "content": "Hi"}]
    client = _client(server)
    client.chat.completions.create(model=server.model, messages=long_messages, max_tokens=2)
    reply = client.chat.completions.create(model=server.model, messages=long_messages, max_tokens=2)
    assert reply.usage.prompt_tokens_details.cached_tokens >= 64


# -- completions --------------------------------------------------------------------------

def test_completions_sync_and_streaming(server):
    client = _client(server)
    whole = client.completions.create(model=server.model, prompt="Once upon a time", max_tokens=12, temperature=0)
    assert whole.object == "text_completion" and whole.choices[0].text
    chunks = list(client.completions.create(model=server.model, prompt="Once upon a time", max_tokens=12,
                                            temperature=0, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_completions_without_max_tokens_stop_at_openais_16(server):
    status, payload = post_json(server, "/v1/completions", {"prompt": "Once upon a time", "ignore_eos": True})
    assert status == 200 and payload["usage"]["completion_tokens"] == 16, payload
    assert payload["choices"][0]["finish_reason"] == "length"


def test_completion_logprobs_keep_byte_pieces_apart(server):
    """Tokens that are pieces of one UTF-8 character are OpenAI's ``bytes:\\xNN`` strings, each its
    own top_logprobs key, and text_offset counts characters of the text."""
    status, payload = post_json(server, "/v1/completions", {"prompt": "日本語の文", "max_tokens": 6, "temperature": 0,
                                                            "logprobs": 5})
    assert status == 200, payload
    choice = payload["choices"][0]
    logprobs = choice["logprobs"]
    assert all(len(top) == 5 for top in logprobs["top_logprobs"]), logprobs["top_logprobs"]
    pieces = b""
    for token in logprobs["tokens"]:
        if token.startswith("bytes:"):
            raw = bytes(int(h, 16) for h in token[len("bytes:"):].split("\\x")[1:])
            assert raw and token == "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
            try:
                raw.decode("utf-8")
                raise AssertionError(f"{token} is whole UTF-8 and should be plain text")
            except UnicodeDecodeError:
                pass
            pieces += raw
        else:
            pieces += token.encode("utf-8")
    text = pieces.decode("utf-8", "replace")
    assert choice["text"] == text
    offsets = logprobs["text_offset"]
    assert offsets[0] == 0 and offsets == sorted(offsets) and offsets[-1] <= len(text)


def test_completions_with_token_ids_and_logprobs(server):
    reply = _client(server).completions.create(model=server.model, prompt=[72, 105, 33], max_tokens=3,
                                               logprobs=2)
    logprobs = reply.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) >= 1
    assert all(len(top) <= 2 for top in logprobs.top_logprobs)
    assert logprobs.text_offset[0] == 0


# -- validation errors (400) --------------------------------------------------------------------

@pytest.mark.parametrize("body,needle", [
    ({"messages": CHAT, "n": 2}, "n = 1"),
    ({"messages": CHAT, "frobnicate": True}, "frobnicate"),
    ({"messages": CHAT, "temperature": 9}, "temperature"),
    ({"messages": CHAT, "temperature": "hot"}, "temperature"),
    ({"messages": CHAT, "top_logprobs": 3}, "logprobs"),
    ({"messages": CHAT, "response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"messages": CHAT, "logit_bias": {"1": 5}}, "logit_bias"),
    ({"messages": CHAT, "stream_options": {"include_usage": True}}, "stream"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "image_url"),
    ({"messages": CHAT, "max_tokens": 0}, "max_tokens"),
    ({"messages": CHAT, "tool_choice": "required"}, "tool_choice"),
    ({"messages": CHAT, "user": 5}, "'user' must be a string"),
    ({"messages": CHAT, "tools": [{"type": "function", "function": {"name": "f", "parameters": "notobj"}}]},
     "tools[0].function.parameters"),
])
def test_chat_validation_errors(server, body, needle):
    status, payload = post_json(server, "/v1/chat/completions", {"model": server.model, **body})
    assert_error(status, payload, 400, needle)


def test_completion_validation_errors(server):
    for body, needle in (({"prompt": ["a", "b"]}, "prompt"), ({"prompt": "x", "echo": True}, "echo"),
                         ({"prompt": "x", "best_of": 3}, "best_of"), ({}, "prompt"),
                         ({"prompt": "x", "user": ["me"]}, "'user' must be a string")):
        status, payload = post_json(server, "/v1/completions", {"model": server.model, **body})
        assert_error(status, payload, 400, needle)


def test_invalid_json_is_400(server):
    status, _, body = request(server, "POST", "/v1/chat/completions", raw_body=b'{"messages": [')
    assert_error(status, json.loads(body), 400, "JSON")
    status, _, body = request(server, "POST", "/v1/chat/completions", raw_body=b"")
    assert_error(status, json.loads(body), 400, "empty")


def test_sdk_raises_bad_request(server):
    with pytest.raises(openai.BadRequestError) as info:
        _client(server).chat.completions.create(model=server.model, messages=CHAT, n=3)
    assert "n = 1" in str(info.value)


def test_context_overflow_names_counts_and_hint(launcher):
    served = launcher(context_hint="raise it with flare export --context", context_len=512)
    card_len = get_json(served, "/v1/models")[1]["data"][0]["max_model_len"]
    status, payload = post_json(served, "/v1/chat/completions",
                                {"model": served.model, "messages": CHAT, "max_tokens": card_len})
    error = assert_error(status, payload, 400, f"max_tokens of {card_len}", f"context of {card_len} tokens",
                         "raise it with flare export --context")
    assert error["code"] == "context_length_exceeded" and "prompt of " in error["message"]
    status, payload = post_json(served, "/v1/completions",
                                {"model": served.model, "prompt": "word " * card_len})
    assert_error(status, payload, 400, "context of")


@pytest.mark.fake_only("fault injection: the FLARE_FAKE_TEMPLATE_ERROR marker")
def test_frontend_errors_are_400(server, fake_only):
    status, payload = post_json(server, "/v1/chat/completions",
                                {"messages": [{"role": "user", "content": "FLARE_FAKE_TEMPLATE_ERROR"}]})
    assert_error(status, payload, 400, "template")
    status, payload = post_json(server, "/v1/completions", {"prompt": [1, 99999]})
    assert_error(status, payload, 400, "99999")


# -- execution failures (500) -----------------------------------------------------------------

@pytest.mark.fake_only("fault injection: the FLARE_FAKE_CRASH marker")
def test_execution_failure_is_500_with_same_message_in_stream(launcher, fake_only):
    # The marker fails the runtime (as a device fault would), so each request gets a fresh server.
    body = {"messages": [{"role": "user", "content": "please FLARE_FAKE_CRASH"}], "max_tokens": 20}
    status, payload = post_json(launcher(), "/v1/chat/completions", body)
    error = assert_error(status, payload, 500, "fake execution failure")
    status, _, raw = request(launcher(), "POST", "/v1/chat/completions", {**body, "stream": True})
    assert status == 200
    text = raw.decode()
    assert "event: error\ndata: " in text and "[DONE]" not in text
    event = json.loads(text.split("event: error\ndata: ", 1)[1].split("\n", 1)[0])
    assert event["error"]["message"] == error["message"]
    served = launcher()
    with pytest.raises(openai.APIError) as info:
        list(_client(served).chat.completions.create(model=served.model, stream=True, **body))
    assert error["message"] in str(info.value)


# -- routing -------------------------------------------------------------------------------------

def test_unknown_route_and_method(server):
    status, _, body = request(server, "GET", "/v2/nothing")
    assert_error(status, json.loads(body), 404, "/v2/nothing")
    status, headers, body = request(server, "GET", "/v1/chat/completions")
    assert_error(status, json.loads(body), 405)
    assert headers["allow"] == "POST"


def test_oversized_body_is_413(launcher):
    served = launcher(max_body_bytes=4096)
    status, _, body = request(served, "POST", "/v1/chat/completions",
                              {"messages": [{"role": "user", "content": "x" * 8000}]})
    assert_error(status, json.loads(body), 413, "4096")

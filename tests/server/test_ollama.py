"""The Ollama routes through real sockets: the official ``ollama`` SDK and raw requests.

Every test runs against the fake engine and a real flare-serve on the demo core
(conftest.py); the ``fake_only`` ones need fault injection or the fake's exact
replies.
"""

from __future__ import annotations

import asyncio
import json

import ollama
import pytest
from server_harness import Served, get_json, metric, post_json, request

from flare.config import ServerConfig
from flare.frontend.parsers import (
    OutputParser,
    ReasoningDelta,
    ToolCallArguments,
    ToolCallEnd,
    ToolCallStart,
    registry,
)
from flare.server.session import Server
from flare.testing.fake_engine import FakeEngine, FakeEngineConfig

CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hello to Flare"}]
GREEDY = {"temperature": 0, "num_predict": 40}


def _client(server, **kwargs) -> ollama.Client:
    headers = {"Authorization": f"Bearer {server.api_key}"} if server.api_key else None
    return ollama.Client(host=server.base_url, headers=headers, **kwargs)


def _tagged(name: str) -> str:
    return name if ":" in name.rsplit("/", 1)[-1] else name + ":latest"


def _card(server) -> dict:
    return get_json(server, "/v1/models")[1]["data"][0]


def _assert_final(part, *, prompt_eval_max: int | None = None) -> None:
    """The last line or whole body: done, a reason, counts and nanosecond durations that add up."""
    assert part.done is True and part.done_reason in ("stop", "length")
    assert part.eval_count >= 1 and part.prompt_eval_count >= 0
    for name in ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration"):
        assert isinstance(part[name], int) and part[name] >= 0, name
    assert part.total_duration > 0
    assert part.load_duration + part.prompt_eval_duration + part.eval_duration <= part.total_duration
    if prompt_eval_max is not None:
        assert part.prompt_eval_count <= prompt_eval_max


def _error(status: int, payload) -> str:
    """Ollama's error shape: one message under "error"."""
    assert set(payload) == {"error"} and isinstance(payload["error"], str), payload
    return payload["error"]


# -- discovery -----------------------------------------------------------------------

def test_list_shows_every_name_with_its_tag(server):
    listed = _client(server).list().models
    names = [model.model for model in listed]
    card = _card(server)
    assert names[0] == _tagged(card["id"])
    assert set(names) == {_tagged(name) for name in (card["id"], card["root"], *card["aliases"])}
    if server.kind == "fake":
        assert set(names) == {"flare-test/alias-one:latest", "plain-alias:latest", "flare-test/fake-model:latest"}
    for model in listed:
        assert model.digest and model.details.family and model.details.quantization_level
        assert model.modified_at is not None
    if server.kind != "fake":
        assert listed[0].size > 0 and listed[0].details.parameter_size.endswith("M")


def test_show_reports_the_model(server):
    client = _client(server)
    card = _card(server)
    for name in (server.model, _tagged(server.model), card["root"]):  # with and without the tag
        shown = client.show(name)
        assert "completion" in shown.capabilities and "chat" in shown.capabilities
        info = shown.modelinfo
        family = shown.details.family
        assert info["general.architecture"] == family
        assert info[f"{family}.context_length"] == card["max_model_len"]
        assert f"num_ctx {card['max_model_len']}" in shown.parameters
        assert f"\nFROM {card['root']}\n" in shown.modelfile
    if server.kind == "fake":
        assert shown.capabilities == ["completion", "chat", "tools"] and shown.template == ""
        assert shown.details.family == "fake"
    elif server.kind == "demo":
        # SmolLM2's template never shows tools, so the model cannot be offered any.
        assert "tools" not in shown.capabilities and "<|im_start|>" in shown.template
        assert shown.details.quantization_level == "F32" and shown.details.family == "llama"
        assert info["general.parameter_count"] > 10**8 and info["llama.block_count"] > 0
        assert "temperature 0.2" in shown.parameters  # the demo core's generation defaults
    else:  # a GPU core (tools/make_test_core.py): its own template, dtype and size
        assert shown.template and shown.details.family == "llama" and shown.details.quantization_level
        assert info["general.parameter_count"] > 0 and info["llama.block_count"] > 0


def test_ps_and_version(server):
    running = _client(server).ps().models
    card = _card(server)
    assert len(running) == 1 and running[0].model == _tagged(card["id"])
    assert running[0].context_length == card["max_model_len"] and running[0].expires_at is not None
    if server.kind != "fake":
        assert running[0].size > 0
    status, payload = get_json(server, "/api/version")
    assert status == 200 and payload["version"].count(".") == 2 and payload["flare"]


# -- chat ---------------------------------------------------------------------------

def test_chat_whole_and_streamed(server):
    client = _client(server)
    whole = client.chat(model=server.model, messages=CHAT, options=GREEDY)
    assert whole.message.role == "assistant" and whole.message.content
    assert whole.model == server.model and whole.created_at
    _assert_final(whole)
    parts = list(client.chat(model=_tagged(server.model), messages=CHAT, options=GREEDY, stream=True))
    assert all(not part.done for part in parts[:-1]) and parts[-1].done
    assert "".join(part.message.content or "" for part in parts) == whole.message.content
    assert parts[-1].message.content == "" and parts[-1].eval_count == whole.eval_count
    assert parts[-1].done_reason == whole.done_reason
    _assert_final(parts[-1])
    if server.kind == "fake":
        assert whole.message.content == "You said: Say hello to Flare" and whole.done_reason == "stop"


def test_stream_is_ndjson_and_the_default(server):
    body = {"model": server.model, "messages": CHAT, "options": GREEDY}
    status, headers, raw = request(server, "POST", "/api/chat", body)
    lines = [json.loads(line) for line in raw.decode().splitlines()]
    assert status == 200 and headers["content-type"] == "application/x-ndjson"
    assert len(lines) >= 2 and lines[-1]["done"] is True and not any(line["done"] for line in lines[:-1])
    status, headers, raw = request(server, "POST", "/api/chat", {**body, "stream": False})
    assert status == 200 and headers["content-type"] == "application/json" and json.loads(raw)["done"] is True


def test_generate_whole_streamed_and_raw(server):
    client = _client(server)
    whole = client.generate(model=server.model, prompt="Say hello to Flare", options=GREEDY)
    assert whole.response and whole.context is None
    _assert_final(whole)
    parts = list(client.generate(model=server.model, prompt="Say hello to Flare", options=GREEDY, stream=True))
    assert "".join(part.response for part in parts) == whole.response and parts[-1].done
    raw = client.generate(model=server.model, prompt="Once upon a time", raw=True, options=GREEDY)
    assert raw.response
    _assert_final(raw)
    raw_parts = list(client.generate(model=server.model, prompt="Once upon a time", raw=True, options=GREEDY,
                                     stream=True))
    assert "".join(part.response for part in raw_parts) == raw.response
    system = client.generate(model=server.model, prompt="Say hello", system="You are terse.", options=GREEDY)
    assert system.response
    if server.kind == "fake":
        assert whole.response == "You said: Say hello to Flare" and system.response == "You said: Say hello"
        assert raw.response.startswith("The quick brown fox")  # completions' filler: no template


def test_async_client(server):
    async def run():
        async with ollama.AsyncClient(host=server.base_url) as client:
            whole = await client.chat(model=server.model, messages=CHAT, options=GREEDY)
            pieces, last = [], None
            async for part in await client.chat(model=server.model, messages=CHAT, options=GREEDY, stream=True):
                pieces.append(part.message.content or "")
                last = part
            many = await asyncio.gather(*(client.generate(model=server.model, prompt=f"Count to {i}",
                                                          options={"num_predict": 8}) for i in range(6)))
            assert (await client.show(server.model)).capabilities and (await client.list()).models
        return whole, "".join(pieces), last, many

    whole, text, last, many = asyncio.run(run())
    assert text == whole.message.content and last.done and last.eval_count == whole.eval_count
    assert len(many) == 6 and all(part.done and part.eval_count <= 8 for part in many)


def test_load_requests_answer_at_once(server):
    client = _client(server)
    loaded = client.generate(model=server.model)
    assert loaded.done and loaded.done_reason == "load" and loaded.response == ""
    status, payload = post_json(server, "/api/chat", {"model": server.model, "messages": [], "keep_alive": "5m"})
    assert status == 200 and payload["done_reason"] == "load" and payload["message"]["content"] == ""


def test_options_are_honoured(server):
    client = _client(server)
    reply = client.chat(model=server.model, messages=[{"role": "user", "content": "Write a long story."}],
                        options={"num_predict": 3, "temperature": 0})
    assert reply.eval_count <= 3 and (reply.done_reason == "stop" or reply.eval_count == 3)
    sampled = client.chat(model=server.model, messages=CHAT, keep_alive=-1, options={
        "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "repeat_penalty": 1.1, "repeat_last_n": -1,
        "presence_penalty": 0.5, "frequency_penalty": 0.25, "seed": 42, "stop": ["\n\n"], "num_predict": 8,
        "num_ctx": 2048, "num_keep": 4, "mirostat": 0, "tfs_z": 1.0, "typical_p": 1.0, "num_thread": 2,
        "num_gpu": -1, "main_gpu": 0, "num_batch": 512, "use_mmap": True, "low_vram": False,
        "mirostat_tau": 5.0, "mirostat_eta": 0.1, "penalize_newline": True})
    assert sampled.done and sampled.eval_count <= 8
    # The same seed samples the same tokens.
    seeded = [client.generate(model=server.model, prompt="Pick a word", options={"seed": 7, "temperature": 1.0,
                                                                                  "num_predict": 6})
              for _ in range(2)]
    assert seeded[0].response == seeded[1].response


def test_logprobs(server):
    client = _client(server)
    whole = client.chat(model=server.model, messages=CHAT, logprobs=True, top_logprobs=2,
                        options={"temperature": 0, "num_predict": 4})
    assert 1 <= len(whole.logprobs) <= 4
    assert all(entry.logprob <= 0 and len(entry.top_logprobs) == 2 for entry in whole.logprobs)
    assert "".join(entry.token for entry in whole.logprobs) == whole.message.content
    parts = list(client.chat(model=server.model, messages=CHAT, logprobs=True, stream=True,
                             options={"temperature": 0, "num_predict": 4}))
    streamed = [entry.token for part in parts if part.logprobs for entry in part.logprobs]
    assert streamed == [entry.token for entry in whole.logprobs]


def test_history_with_tool_calls_and_thinking(server):
    messages = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": "", "thinking": "I should look it up.",
         "tool_calls": [{"function": {"name": "weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_name": "weather", "content": "18 C, sunny"},
        {"role": "user", "content": "Thanks"},
    ]
    reply = _client(server).chat(model=server.model, messages=messages, options={"num_predict": 8})
    assert reply.done
    if server.kind == "fake":
        assert reply.message.content == "You said"  # num_predict 8
        # The fake template renders tools, so they are accepted.
        tools = [{"type": "function", "function": {"name": "weather", "description": "Weather by city",
                                                   "parameters": {"type": "object",
                                                                  "properties": {"city": {"type": "string"}}}}}]
        assert _client(server).chat(model=server.model, messages=messages, tools=tools,
                                    options={"num_predict": 4}).done


def test_second_turn_reuses_the_first(server):
    """Ollama has no cached-token field: prompt_eval_count counts what the model evaluated."""
    client = _client(server)
    system = {"role": "system", "content": "You answer questions about the weather. " * 12}
    first = [system, {"role": "user", "content": "Is it sunny in Paris?"}]
    reply = client.chat(model=server.model, messages=first, options=GREEDY)
    turn_two = first + [{"role": "assistant", "content": reply.message.content},
                        {"role": "user", "content": "And in Lyon?"}]
    reused_before = metric(server, "flare_prefix_reused_tokens_total")
    second = client.chat(model=server.model, messages=turn_two, options=GREEDY)
    reused = metric(server, "flare_prefix_reused_tokens_total") - reused_before
    status, tokenized = post_json(server, "/tokenize", {"model": server.model, "messages": turn_two})
    assert status == 200
    assert reused >= 64 and second.prompt_eval_count == tokenized["count"] - reused
    assert reply.prompt_eval_count > second.prompt_eval_count


def test_metrics_count_ollama_requests(server):
    client = _client(server)
    before = (metric(server, "flare_e2e_request_latency_seconds_count"),
              metric(server, "flare_time_to_first_token_seconds_count"))
    list(client.chat(model=server.model, messages=CHAT, options={"num_predict": 4}, stream=True))
    client.generate(model=server.model, prompt="Hi", options={"num_predict": 4})
    after = (metric(server, "flare_e2e_request_latency_seconds_count"),
             metric(server, "flare_time_to_first_token_seconds_count"))
    assert after[0] - before[0] == 2 and after[1] - before[1] == 2


# -- errors ----------------------------------------------------------------------------

def test_unknown_model_is_404(server):
    client = _client(server)
    for call in (lambda: client.chat(model="no-such-model", messages=CHAT),
                 lambda: client.generate(model="no-such-model:7b", prompt="x"),
                 lambda: client.show("no-such-model"),
                 lambda: list(client.chat(model=f"{server.model}:other-tag", messages=CHAT, stream=True))):
        with pytest.raises(ollama.ResponseError) as info:
            call()
        assert info.value.status_code == 404 and "not found" in info.value.error
    status, payload = post_json(server, "/api/chat", {"model": "nope", "messages": CHAT})
    assert status == 404 and _error(status, payload) == "model 'nope' not found"


def test_context_overflow_is_400(server):
    client = _client(server)
    context = _card(server)["max_model_len"]
    with pytest.raises(ollama.ResponseError) as info:
        client.chat(model=server.model, messages=CHAT, options={"num_predict": context})
    assert info.value.status_code == 400 and f"num_predict of {context}" in info.value.error
    assert f"context of {context} tokens" in info.value.error
    with pytest.raises(ollama.ResponseError) as info:
        list(client.chat(model=server.model, messages=CHAT, options={"num_ctx": context + 1}, stream=True))
    assert info.value.status_code == 400 and f"num_ctx of {context + 1}" in info.value.error
    with pytest.raises(ollama.ResponseError) as info:
        client.generate(model=server.model, prompt="word " * 64, options={"num_ctx": 32})
    assert info.value.status_code == 400 and "options.num_ctx of 32 tokens" in info.value.error


@pytest.mark.parametrize("route,body,needle", [
    ("chat", {"format": "yaml"}, "format"),
    ("generate", {"format": ["json"]}, "format"),
    ("chat", {"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, "images"),
    ("chat", {"messages": [{"role": "user", "content": ["x"]}]}, "content"),
    ("chat", {"messages": [{"role": "wizard", "content": "x"}]}, "role"),
    ("chat", {"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}]},
     "arguments"),
    ("chat", {"think": True}, "thinking"),
    ("chat", {"think": "extreme"}, "think"),
    ("chat", {"options": {"mirostat": 2}}, "mirostat"),
    ("chat", {"options": {"typical_p": 0.5}}, "typical_p"),
    ("chat", {"options": {"repeat_penalty": 1.2, "repeat_last_n": 64}}, "repeat_last_n"),
    ("chat", {"options": {"temperature": "hot"}}, "options.temperature"),
    ("chat", {"options": {"repeat_penalty": 99}}, "options.repeat_penalty"),
    ("chat", {"options": {"num_predict": 0}}, "num_predict"),
    ("chat", {"options": {"frobnicate": 1}}, "frobnicate"),
    ("chat", {"options": {"vocab_only": True}}, "vocab_only"),
    ("chat", {"frobnicate": True}, "frobnicate"),
    ("chat", {"top_logprobs": 2}, "logprobs"),
    ("chat", {"keep_alive": "soon"}, "keep_alive"),
    ("generate", {"images": ["aGk="]}, "images"),
    ("generate", {"suffix": "end"}, "suffix"),
    ("generate", {"context": [1, 2, 3]}, "context"),
    ("generate", {"template": "{{ prompt }}"}, "--trust-request-chat-template"),
    ("generate", {"raw": True, "system": "be brief"}, "raw"),
    ("generate", {"width": 512}, "width"),
])
def test_refusals_are_400(server, route, body, needle):
    base = {"model": server.model, "messages": CHAT} if route == "chat" else {"model": server.model, "prompt": "hi"}
    status, payload = post_json(server, f"/api/{route}", {**base, **body})
    assert status == 400 and needle in _error(status, payload)


def test_tools_need_a_template_that_shows_them(server):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    status, payload = post_json(server, "/api/chat", {"model": server.model, "messages": CHAT, "tools": tools,
                                                      "stream": False, "options": {"num_predict": 2}})
    if server.kind == "fake":
        assert status == 200, payload
    else:
        assert status == 400 and "does not support tools" in _error(status, payload)
    # The SDK always sends tools: [], which is no tools.
    assert _client(server).chat(model=server.model, messages=CHAT, tools=[], options={"num_predict": 2}).done


def test_bad_bodies_are_400_in_ollama_shape(server):
    status, _, raw = request(server, "POST", "/api/chat", raw_body=b'{"model": ')
    assert status == 400 and "JSON" in _error(status, json.loads(raw))
    status, payload = post_json(server, "/api/generate", {"prompt": "hi"})
    assert status == 400 and _error(status, payload) == "model is required"
    status, payload = post_json(server, "/api/show", {})
    assert status == 400 and _error(status, payload) == "model is required"


def test_auth_refusals_in_ollama_shape(launcher):
    served = launcher(api_key="ollama-key")
    status, headers, raw = request(served, "POST", "/api/chat", {"model": served.model, "messages": CHAT},
                                   auth=False)
    assert status == 401 and "bearer token" in _error(status, json.loads(raw))
    with pytest.raises(ollama.ResponseError) as info:
        ollama.Client(host=served.base_url).list()
    assert info.value.status_code == 401
    assert _client(served).chat(model=served.model, messages=CHAT, options={"num_predict": 2}).done


@pytest.mark.fake_only("fault injection: the FLARE_FAKE_CRASH marker")
def test_execution_failure_mid_stream_ends_with_an_error_line(launcher, fake_only):
    # The marker fails the runtime (as a device fault would), so each request gets a fresh server.
    body = {"model": "flare-test/fake-model", "messages": [{"role": "user", "content": "please FLARE_FAKE_CRASH"}],
            "options": {"num_predict": 20}}
    status, payload = post_json(launcher(), "/api/chat", {**body, "stream": False})
    assert status == 500 and "fake execution failure" in _error(status, payload)
    status, headers, raw = request(launcher(), "POST", "/api/chat", body)
    lines = [json.loads(line) for line in raw.decode().splitlines()]
    assert status == 200 and headers["content-type"] == "application/x-ndjson"
    assert lines[0]["message"]["content"] and lines[-1] == {"error": payload["error"]}
    assert not any(line.get("done") for line in lines[:-1])
    served = launcher()
    with pytest.raises(ollama.ResponseError) as info:
        list(_client(served).generate(model=served.model, prompt="FLARE_FAKE_CRASH now", stream=True))
    assert "fake execution failure" in info.value.error


@pytest.mark.fake_only("the request template renders over the fake's byte tokenizer")
def test_trusted_request_template(fake_only):
    session = Server.start(FakeEngine(FakeEngineConfig(tokens_per_s=0)),
                           ServerConfig(host="127.0.0.1", port=0, trust_request_chat_template=True))
    try:
        served = Served("fake", session.base_url, session=session, model=session.engine.card.id)
        template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
        reply = _client(served).generate(model=served.model, prompt="templated", template=template)
        assert reply.response == "You said: templated"
        status, payload = post_json(served, "/api/generate", {"model": served.model, "prompt": "x",
                                                              "template": "{% if %}"})
        assert status == 400 and "line 1" in _error(status, payload)
    finally:
        session.close()


class ThinkThenCall(OutputParser):
    """Every piece is reasoning; the output ends with one tool call (its arguments in two fragments)."""

    name = "test-ollama-think-then-call"
    kind = "reasoning"  # served as the reasoning parser: every chat request goes through it

    def __init__(self, opened=False):
        pass

    def feed(self, text):
        return [ReasoningDelta(text)]

    def finish(self):
        return [ToolCallStart(0, "call_0", "lookup"), ToolCallArguments(0, '{"q":'), ToolCallArguments(0, '"x"}'),
                ToolCallEnd(0)]


@pytest.mark.fake_only("a test parser installed in process")
def test_thinking_and_tool_calls_reach_ollama_fields(monkeypatch, fake_only):
    monkeypatch.setattr(registry, "_PARSERS", {**registry._PARSERS, ThinkThenCall.name: ThinkThenCall})
    session = Server.start(FakeEngine(FakeEngineConfig(tokens_per_s=0)), ServerConfig(host="127.0.0.1", port=0))
    session._server.state.reasoning_parser = ThinkThenCall.name
    try:
        served = Served("fake", session.base_url, session=session, model=session.engine.card.id)
        client = _client(served)
        assert "thinking" in client.show(served.model).capabilities
        messages = [{"role": "user", "content": "hi"}]
        whole = client.chat(model=served.model, messages=messages, think=True)
        assert whole.message.thinking == "You said: hi" and whole.message.content == ""
        assert [(call.function.name, call.function.arguments) for call in whole.message.tool_calls] == \
            [("lookup", {"q": "x"})]
        parts = list(client.chat(model=served.model, messages=messages, think=True, stream=True))
        assert "".join(part.message.thinking or "" for part in parts) == "You said: hi"
        calls = [call for part in parts for call in part.message.tool_calls or ()]
        assert [(call.function.name, call.function.arguments) for call in calls] == [("lookup", {"q": "x"})]
        assert parts[-1].done and parts[-1].done_reason == "stop"
        generated = client.generate(model=served.model, prompt="hi", think=True)
        assert generated.thinking == "You said: hi" and generated.response == ""
        # Without think, /api/generate is not parsed: the text is the response.
        assert client.generate(model=served.model, prompt="hi").response == "You said: hi"
    finally:
        session.close()

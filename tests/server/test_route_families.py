"""Route families over the shared generation layer (server/generation.py, server/api/).

A toy family, installed beside OpenAI's through ``session.FAMILIES``, proves that
a family brings its own error shape (head-time refusals and handler errors answer
in it, unknown paths keep the default) and its own bytes over the same pipeline.
A test parser proves that reasoning and tool-call deltas reach the OpenAI format
without a route knowing which parser ran. Fake engine only: these test the
server's structure, not a model.
"""

from __future__ import annotations

import json
import types
from typing import Any, Sequence

import pytest
from server_harness import Served, assert_error, request

from flare.config import ServerConfig
from flare.errors import AdmissionError
from flare.frontend.parsers import (
    ContentDelta,
    OutputParser,
    ReasoningDelta,
    ToolCallArguments,
    ToolCallEnd,
    ToolCallStart,
    registry,
)
from flare.request import SamplingParams
from flare.server import session as session_module
from flare.server.api import openai
from flare.server.generation import generate
from flare.server.response import Response
from flare.server.tool_calls import OutputPlan
from flare.testing.fake_engine import FakeEngine, FakeEngineConfig

KEY = "family-key"
pytestmark = pytest.mark.fake_only("a toy family and a test parser installed in process; no model involved")


def toy_errors(status: int, message: str, *, code: str | None = None, param: str | None = None,
               headers: tuple[tuple[bytes, bytes], ...] = ()) -> Response:
    """An Anthropic-like shape, to tell it from OpenAI's."""
    return Response.json(status, {"type": "error", "error": {"type": code, "message": message}}, headers)


class ToyFormat:
    """Each delta as its own SSE event; a whole response as {"text", "reasoning", "stop"}."""

    errors = staticmethod(toy_errors)
    media_type = b"text/event-stream"
    end_of_stream = b"event: done\n\n"

    def opening(self) -> bytes:
        return b"event: start\n\n"

    def content_chunk(self, text: str) -> bytes:
        return b"event: text\ndata: " + json.dumps(text).encode() + b"\n\n"

    def delta_chunk(self, deltas: Sequence[Any], logprobs) -> bytes:
        return b"".join(self.content_chunk(d.text) if type(d) is ContentDelta else
                        b"event: other\ndata: " + type(d).__name__.encode() + b"\n\n" for d in deltas)

    def finish_chunk(self, finish) -> bytes:
        return b"event: stop\ndata: " + finish.reason.encode() + b"\n\n"

    def usage_chunk(self, usage) -> bytes:
        return b""

    def whole(self, output, logprobs, finish) -> Any:
        return {"text": output.content, "reasoning": output.reasoning, "stop": finish.reason}

    def error_event(self, error: Response) -> bytes:
        return b"event: error\ndata: " + error.body + b"\n\n"


def _toy_install(router, state) -> None:
    async def generate_route(request, conn):
        body = json.loads(request.body)
        if not isinstance(body.get("prompt"), str):
            raise AdmissionError("'prompt' must be a string", status=400, code="invalid_request_error")
        max_tokens = body.get("max_tokens", 8)
        return await generate(state, request, conn, ToyFormat(), lambda: state.engine.prepare_text(body["prompt"]),
                              lambda prompt_len, context_len, hint: SamplingParams(max_tokens=max_tokens,
                                                                                   ignore_eos=True),
                              stream=bool(body.get("stream")),
                              output=OutputPlan(reasoning_parser=body.get("parser")))

    router.add("POST", "/toy/generate", generate_route, generation=True, errors=toy_errors)


class ReasonThenCall(OutputParser):
    """Every piece is reasoning; the output ends with one tool call."""

    name = "test-reason-then-call"
    kind = "reasoning"  # served as the reasoning parser: every chat request goes through it

    def __init__(self, opened=False):
        pass

    def feed(self, text):
        return [ReasoningDelta(text)]

    def finish(self):
        return [ToolCallStart(0, "call_0", "lookup"), ToolCallArguments(0, '{"q":'), ToolCallArguments(0, '"x"}'),
                ToolCallEnd(0)]


@pytest.fixture
def served(monkeypatch, fake_only):
    monkeypatch.setattr(registry, "_PARSERS", {**registry._PARSERS, ReasonThenCall.name: ReasonThenCall})
    monkeypatch.setattr(session_module, "FAMILIES", (openai, types.SimpleNamespace(install=_toy_install)))
    session = session_module.Server.start(FakeEngine(FakeEngineConfig(tokens_per_s=0)),
                                          ServerConfig(host="127.0.0.1", port=0, api_key=KEY))
    yield Served("fake", session.base_url, KEY, session=session, model=session.engine.card.id)
    session.close()


def _sse(body: bytes) -> list[bytes]:
    return [event for event in body.split(b"\n\n") if event]


def test_a_family_refuses_at_head_time_in_its_own_shape(served):
    status, headers, body = request(served, "POST", "/toy/generate", {"prompt": "x"}, auth=False)
    assert status == 401 and headers["www-authenticate"] == "Bearer"
    assert json.loads(body) == {"type": "error", "error": {"type": "invalid_api_key",
                                                           "message": "missing or invalid bearer token "
                                                                      "(Authorization: Bearer KEY, or x-api-key: "
                                                                      "KEY)"}}
    served.session.pause_admission()
    try:
        status, headers, body = request(served, "POST", "/toy/generate", {"prompt": "x"})
        assert status == 503 and headers["retry-after"] == "1"
        assert json.loads(body)["error"]["type"] == "admission_paused"
        status, _, body = request(served, "POST", "/v1/completions", {"prompt": "x"})
        assert_error(status, json.loads(body), 503, "admission is paused")
    finally:
        served.session.resume_admission()


def test_a_family_answers_handler_errors_in_its_own_shape_and_unknown_paths_keep_the_default(served):
    status, _, body = request(served, "POST", "/toy/generate", {"prompt": 3})
    assert status == 400 and json.loads(body) == {"type": "error", "error": {"type": "invalid_request_error",
                                                                             "message": "'prompt' must be a string"}}
    status, _, body = request(served, "GET", "/toy/generate")
    assert_error(status, json.loads(body), 405)
    status, _, body = request(served, "GET", "/toy/nothing")
    assert_error(status, json.loads(body), 404)


def test_a_family_streams_and_collects_through_the_shared_layer(served):
    status, _, body = request(served, "POST", "/toy/generate", {"prompt": "x", "max_tokens": 3, "stream": True})
    events = _sse(body)
    assert status == 200 and events[0] == b"event: start" and events[-2:] == [b"event: stop\ndata: length",
                                                                              b"event: done"]
    assert len([event for event in events if event.startswith(b"event: text")]) == 3
    status, _, body = request(served, "POST", "/toy/generate", {"prompt": "x", "max_tokens": 3,
                                                                "parser": ReasonThenCall.name})
    payload = json.loads(body)
    assert status == 200 and payload["text"] == "" and len(payload["reasoning"]) == 3 and payload["stop"] == "length"


def test_openai_chat_formats_reasoning_and_tool_call_deltas(served):
    served.session._server.state.reasoning_parser = ReasonThenCall.name
    chat = {"model": served.model, "messages": [{"role": "user", "content": "hi"}]}
    status, _, body = request(served, "POST", "/v1/chat/completions", chat)
    message = json.loads(body)["choices"][0]
    assert status == 200 and message["finish_reason"] == "tool_calls"
    assert message["message"] == {"role": "assistant", "content": None, "reasoning_content": "You said: hi",
                                  "tool_calls": [{"id": "call_0", "type": "function",
                                                  "function": {"name": "lookup", "arguments": '{"q":"x"}'}}]}
    status, _, body = request(served, "POST", "/v1/chat/completions", {**chat, "stream": True})
    chunks = [json.loads(event[6:]) for event in _sse(body) if event != b"data: [DONE]"]
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks]
    assert status == 200 and deltas[0] == {"role": "assistant", "content": ""}
    assert "".join(delta.get("reasoning_content", "") for delta in deltas) == "You said: hi"
    assert not any(delta.get("content") for delta in deltas)
    assert deltas[-2]["tool_calls"] == [
        {"index": 0, "id": "call_0", "type": "function", "function": {"name": "lookup", "arguments": ""}},
        {"index": 0, "function": {"arguments": '{"q":'}}, {"index": 0, "function": {"arguments": '"x"}'}}]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    # Completions are raw text: never parsed.
    status, _, body = request(served, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 4})
    assert status == 200 and len(json.loads(body)["choices"][0]["text"]) == 4

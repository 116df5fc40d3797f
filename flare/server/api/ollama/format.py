"""Ollama response bodies and NDJSON lines (GenerationFormat for /api/chat and /api/generate).

A stream is one JSON object a line, each with ``"done": false``, then a last
line with ``"done": true``, ``done_reason`` (``stop``, ``length``), the counts
and the durations; a stream that fails ends with an ``{"error": ...}`` line
instead. Token lines are the hot path: each request precomputes the bytes
around its text, so a token costs one C-level JSON string encoding. Ollama
sends each tool call whole, with its arguments as an object, so the format
holds a call's argument fragments until the call ends.

Counts and durations (nanoseconds) of the last line:

- ``prompt_eval_count``: prompt tokens the model evaluated (those served from
  the prefix cache are not), ``eval_count``: output tokens;
- ``total_duration``: from the request's arrival to its last line;
- ``load_duration``: from the arrival to the model accepting the request
  (body, template, tokenizer, a frontend worker): the model is always loaded;
- ``prompt_eval_duration``: from then to the first output token (queueing and
  prefill); ``eval_duration``: from the first output token to the end.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Sequence

from ....frontend.parsers import (
    ContentDelta,
    Delta,
    ParsedOutput,
    ReasoningDelta,
    ToolCallArguments,
    ToolCallEnd,
    ToolCallStart,
)
from ....request import FinishEvent, TokenLogprob, Usage
from ...protocol import HttpRequest
from ...response import Response
from .errors import error_response
from .schema import OllamaRequest

if TYPE_CHECKING:
    from ...app import ServerState

NDJSON = b"application/x-ndjson"

# The C string encoder behind json.dumps, without building an encoder per call.
_encode_text = json.encoder.encode_basestring


def _dumps(payload: Any) -> bytes:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def timestamp(seconds: float | None = None) -> str:
    """RFC 3339 in UTC, as Ollama's ``created_at`` and ``modified_at``."""
    moment = datetime.now(timezone.utc) if seconds is None else datetime.fromtimestamp(seconds, timezone.utc)
    return moment.isoformat().replace("+00:00", "Z")


def _ns(seconds: float) -> int:
    return max(0, int(seconds * 1e9))


def tool_call(index: int, call_id: str, name: str, arguments: str) -> dict[str, Any]:
    """One whole tool call in Ollama's form: arguments as an object (the model's text if it is not one)."""
    try:
        parsed: Any = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        parsed = arguments
    return {"id": call_id, "function": {"index": index, "name": name,
                                        "arguments": parsed if isinstance(parsed, dict) else arguments}}


class _Format:
    """Shared framing: the model name as the client sent it, the creation time, the final line's figures."""

    errors = staticmethod(error_response)
    media_type = NDJSON
    end_of_stream = b""
    _content_key = b""  # the bytes between the head and a token's JSON string
    _content_end = b""  # the bytes that close what _content_key opened

    def __init__(self, state: "ServerState", request: HttpRequest, gen: OllamaRequest):
        self.state = state
        self.received_at = request.received_at  # the protocol's clock: time.monotonic
        self.head = {"model": gen.model, "created_at": timestamp()}
        self._head = _dumps(self.head)[:-1]  # every line starts the same, without its closing brace
        self._content_head = self._head + b"," + self._content_key
        self._content_tail = self._content_end + b',"done":false}\n'
        self._pending: dict[int, list] = {}  # tool calls begun: index -> [id, name, argument fragments]

    def _output(self, content: str, thinking: str, calls: list[dict[str, Any]]) -> dict[str, Any]:
        """The fields that carry output (a message for chat, a response for generate)."""
        raise NotImplementedError

    def _line(self, fields: dict[str, Any]) -> bytes:
        return self._head + b"," + _dumps(fields)[1:] + b"\n"

    def opening(self) -> bytes:
        return b""

    def content_chunk(self, text: str) -> bytes:
        return self._content_head + _encode_text(text).encode("utf-8") + self._content_tail

    def delta_chunk(self, deltas: Sequence[Delta], logprobs: Sequence[TokenLogprob] | None) -> bytes:
        content: list[str] = []
        thinking: list[str] = []
        calls: list[dict[str, Any]] = []
        for delta in deltas:
            kind = type(delta)
            if kind is ContentDelta:
                content.append(delta.text)
            elif kind is ReasoningDelta:
                thinking.append(delta.text)
            elif kind is ToolCallStart:
                self._pending[delta.index] = [delta.id, delta.name, []]
            elif kind is ToolCallArguments:
                self._pending.setdefault(delta.index, ["", "", []])[2].append(delta.fragment)
            elif kind is ToolCallEnd and delta.index in self._pending:
                calls.append(self._complete(delta.index))
        text = "".join(content)
        if logprobs is None:
            if not (thinking or calls):
                return self.content_chunk(text) if text else b""
            return self._line({**self._output(text, "".join(thinking), calls), "done": False})
        return self._line({**self._output(text, "".join(thinking), calls), "logprobs": self._logprobs(logprobs),
                           "done": False})

    def _complete(self, index: int) -> dict[str, Any]:
        call_id, name, fragments = self._pending.pop(index)
        return tool_call(index, call_id, name, "".join(fragments))

    def finish_chunk(self, finish: FinishEvent) -> bytes:
        held = b""
        if self._pending:  # calls the parser never ended: whole at the finish
            calls = [self._complete(index) for index in sorted(self._pending)]
            held = self._line({**self._output("", "", calls), "done": False})
        return held + self._line({**self._output("", "", []), "done": True, "done_reason": finish.reason,
                                  **self._figures(finish)})

    def usage_chunk(self, usage: Usage) -> bytes:
        return b""  # the counts are on the finish line

    def whole(self, output: ParsedOutput, logprobs: list[TokenLogprob] | None, finish: FinishEvent) -> dict[str, Any]:
        calls = [tool_call(call.index, call.id, call.name, call.arguments) for call in output.tool_calls]
        payload = {**self.head, **self._output(output.content, output.reasoning, calls), "done": True,
                   "done_reason": finish.reason, **self._figures(finish)}
        if logprobs is not None:
            payload["logprobs"] = self._logprobs(logprobs)
        return payload

    def loaded(self) -> dict[str, Any]:
        """The answer to a request with nothing to generate: Ollama's "load the model" (it always is)."""
        return {**self.head, **self._output("", "", []), "done": True, "done_reason": "load"}

    def error_event(self, error: Response) -> bytes:
        return error.body + b"\n"

    def _figures(self, finish: FinishEvent) -> dict[str, int]:
        """Counts and durations of the final line (see the module docstring)."""
        usage = finish.usage
        total = time.monotonic() - self.received_at
        load = prompt_eval = evaluation = 0.0
        times = finish.times
        if times is not None:  # engines that do not record them report the total only
            first = times.first_token if times.first_token is not None else times.finished
            load = times.submitted - self.received_at
            prompt_eval = first - times.submitted
            evaluation = times.finished - first
        return {"total_duration": _ns(total), "load_duration": _ns(load),
                "prompt_eval_count": usage.prompt_tokens - usage.cached_tokens,
                "prompt_eval_duration": _ns(prompt_eval), "eval_count": usage.completion_tokens,
                "eval_duration": _ns(evaluation)}

    def _logprobs(self, logprobs: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
        out = []
        for entry in logprobs:
            item: dict[str, Any] = {"token": self._token_text(entry.token_id), "logprob": entry.logprob}
            if entry.top:
                item["top_logprobs"] = [{"token": self._token_text(token_id), "logprob": value}
                                        for token_id, value in entry.top]
            out.append(item)
        return out

    def _token_text(self, token_id: int) -> str:
        return self.state.engine.token_bytes(token_id).decode("utf-8", "replace")


class ChatFormat(_Format):
    """/api/chat: output in ``message`` (``content``, ``thinking``, ``tool_calls``)."""

    _content_key = b'"message":{"role":"assistant","content":'
    _content_end = b"}"

    def _output(self, content: str, thinking: str, calls: list[dict[str, Any]]) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if thinking:
            message["thinking"] = thinking
        if calls:
            message["tool_calls"] = calls
        return {"message": message}


class GenerateFormat(_Format):
    """/api/generate: output in ``response`` (and ``thinking``; tool calls, if a parser finds any, beside)."""

    _content_key = b'"response":'

    def _output(self, content: str, thinking: str, calls: list[dict[str, Any]]) -> dict[str, Any]:
        fields: dict[str, Any] = {"response": content}
        if thinking:
            fields["thinking"] = thinking
        if calls:
            fields["tool_calls"] = calls
        return fields

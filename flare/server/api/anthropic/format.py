"""Anthropic Messages bodies and SSE events (the GenerationFormat of /v1/messages).

A stream follows Anthropic's order: ``message_start``; for each content block
``content_block_start`` (the first followed by one ``ping``),
``content_block_delta``s and ``content_block_stop``; then ``message_delta``
(stop reason and usage) and ``message_stop``. Blocks open as the output
changes kind: a ``thinking`` block for reasoning deltas (``thinking_delta``),
a ``text`` block for content (``text_delta``), a ``tool_use`` block per tool
call (``input_json_delta`` with the argument fragments). An output with no
block at all still gets one empty text block, in the stream and in the whole
body alike. A failure after the stream started is ``event: error`` with the
error body, and the stream ends there.

Usage is Anthropic's: ``input_tokens`` are the prompt tokens *not* read from
the prefix cache, ``cache_read_input_tokens`` those that were (their sum is
the prompt), ``cache_creation_input_tokens`` is 0 (caching costs nothing
extra). ``message_start`` cannot know the cache hit yet: it reports the whole
prompt as ``input_tokens``, and ``message_delta`` the final counts (the SDK
takes the later values).

Text deltas are the hot path: each text block precomputes the bytes around
its text, so a token costs one C-level JSON string encoding.
"""

from __future__ import annotations

import json
import uuid
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
from ....request import FinishEvent, SamplingParams, TokenLogprob, Usage
from ...response import EVENT_STREAM, Response
from .errors import error_response
from .schema import MessagesRequest

if TYPE_CHECKING:
    from ...app import ServerState

_encode_text = json.encoder.encode_basestring  # the C string encoder behind json.dumps

TEXT, THINKING, TOOL_USE = "text", "thinking", "tool_use"  # content block kinds


def _dumps(payload: Any) -> bytes:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _event(name: str, payload: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + _dumps(payload) + b"\n\n"


PING = _event("ping", {"type": "ping"})
MESSAGE_STOP = _event("message_stop", {"type": "message_stop"})


def usage_json(usage: Usage) -> dict[str, int]:
    return {"input_tokens": usage.prompt_tokens - usage.cached_tokens, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": usage.cached_tokens, "output_tokens": usage.completion_tokens}


def tool_input(arguments: str) -> Any:
    """A tool call's input object from the JSON text the model wrote (the text itself if it is no object)."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return arguments
    return value if isinstance(value, dict) else arguments


class MessageFormat:
    """One /v1/messages response: a ``message`` body, or its SSE events (loop thread, not thread-safe)."""

    errors = staticmethod(error_response)
    media_type = EVENT_STREAM
    end_of_stream = MESSAGE_STOP

    def __init__(self, state: "ServerState", request: MessagesRequest):
        self.request = request
        self.id = f"msg_{uuid.uuid4().hex}"
        self.model = request.model
        self.prompt_len = 0  # known once the prompt is prepared (resolve)
        self._num_blocks = 0  # blocks started so far; the open one is the last
        self._open: str | None = None  # the open block's kind
        self._calls: dict[int, int] = {}  # a parser's tool-call index -> its block index
        self._has_tool_use = False
        self._text_head = b""  # the open text block's delta bytes before the text
        self._text_tail = b"}}\n\n"

    def resolve(self, prompt_len: int, context_len: int, context_hint: str) -> SamplingParams:
        """The request's sampling parameters (generation's resolver); records the prompt length."""
        self.prompt_len = prompt_len
        return self.request.sampling_params(prompt_len, context_len, context_hint)

    # -- stream ----------------------------------------------------------------

    def opening(self) -> bytes:
        message = {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
                   "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": self.prompt_len, "cache_creation_input_tokens": 0,
                             "cache_read_input_tokens": 0, "output_tokens": 0}}
        return _event("message_start", {"type": "message_start", "message": message})

    def content_chunk(self, text: str) -> bytes:
        if self._open is not TEXT:
            return self._start(TEXT, {"type": "text", "text": ""}) + self.content_chunk(text)
        return self._text_head + _encode_text(text).encode("utf-8") + self._text_tail

    def delta_chunk(self, deltas: Sequence[Delta], logprobs: Sequence[TokenLogprob] | None) -> bytes:
        # logprobs are never asked for: Anthropic's API has none.
        out: list[bytes] = []
        for item in deltas:
            kind = type(item)
            if kind is ContentDelta:
                if item.text:
                    out.append(self.content_chunk(item.text))
            elif kind is ReasoningDelta:
                if self._open is not THINKING:
                    out.append(self._start(THINKING, {"type": "thinking", "thinking": "", "signature": ""}))
                if item.text and self.request.is_thinking_shown:
                    out.append(self._delta({"type": "thinking_delta", "thinking": item.text}))
            elif kind is ToolCallStart:
                self._has_tool_use = True
                out.append(self._start(TOOL_USE, {"type": "tool_use", "id": item.id, "name": item.name,
                                                  "input": {}}))
                self._calls[item.index] = self._num_blocks - 1
            elif kind is ToolCallArguments:
                block = self._calls.get(item.index)
                if block is not None and item.fragment:
                    out.append(self._delta({"type": "input_json_delta", "partial_json": item.fragment}, block))
            elif kind is ToolCallEnd:
                if self._open is TOOL_USE and self._calls.get(item.index) == self._num_blocks - 1:
                    out.append(self._stop())
        return b"".join(out)

    def finish_chunk(self, finish: FinishEvent) -> bytes:
        out = [self._start(TEXT, {"type": "text", "text": ""}) if not self._num_blocks else b"", self._stop()]
        reason, sequence = self.stop_reason(finish, self._has_tool_use)
        out.append(_event("message_delta", {"type": "message_delta",
                                            "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                            "usage": usage_json(finish.usage)}))
        return b"".join(out)

    def usage_chunk(self, usage: Usage) -> bytes:
        return b""  # usage went out with message_delta

    def error_event(self, error: Response) -> bytes:
        return b"event: error\ndata: " + error.body + b"\n\n"

    def _start(self, kind: str, block: dict[str, Any]) -> bytes:
        """Close the open block and start the next one (the first is followed by the ping)."""
        closing = self._stop()
        index = self._num_blocks
        self._num_blocks += 1
        self._open = kind
        if kind is TEXT:
            self._text_head = (b'event: content_block_delta\ndata: {"type":"content_block_delta","index":%d,'
                               b'"delta":{"type":"text_delta","text":' % index)
        started = _event("content_block_start", {"type": "content_block_start", "index": index,
                                                 "content_block": block})
        return closing + started + (PING if index == 0 else b"")

    def _stop(self) -> bytes:
        if self._open is None:
            return b""
        self._open = None
        return _event("content_block_stop", {"type": "content_block_stop", "index": self._num_blocks - 1})

    def _delta(self, delta: dict[str, Any], index: int | None = None) -> bytes:
        return _event("content_block_delta", {"type": "content_block_delta",
                                              "index": self._num_blocks - 1 if index is None else index,
                                              "delta": delta})

    # -- whole -------------------------------------------------------------------

    def whole(self, output: ParsedOutput, logprobs: list[TokenLogprob] | None, finish: FinishEvent) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        if output.reasoning:
            content.append({"type": "thinking", "signature": "",
                            "thinking": output.reasoning if self.request.is_thinking_shown else ""})
        if output.content or not (output.reasoning or output.tool_calls):
            content.append({"type": "text", "text": output.content})
        for call in output.tool_calls:
            content.append({"type": "tool_use", "id": call.id, "name": call.name, "input": tool_input(call.arguments)})
        reason, sequence = self.stop_reason(finish, bool(output.tool_calls))
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": reason, "stop_sequence": sequence, "usage": usage_json(finish.usage)}

    def stop_reason(self, finish: FinishEvent, has_tool_use: bool) -> tuple[str, str | None]:
        """(stop_reason, stop_sequence): max_tokens, one of the request's stop_sequences, tool_use or end_turn."""
        if finish.reason == "length":
            return "max_tokens", None
        if isinstance(finish.stop, str) and finish.stop in self.request.stop_sequences:
            return "stop_sequence", finish.stop
        return ("tool_use" if has_tool_use else "end_turn"), None

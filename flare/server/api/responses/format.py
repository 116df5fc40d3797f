"""Response objects and their SSE events (the GenerationFormat of ``POST /v1/responses``).

A stream is ``response.created`` and ``response.in_progress``, then one output
item at a time: ``response.output_item.added``, its content part
(``response.content_part.added``), its deltas (``response.output_text.delta``,
``response.reasoning_text.delta`` or ``response.function_call_arguments.delta``),
the matching ``.done`` events and ``response.output_item.done``; it ends with
``response.completed`` or ``response.incomplete`` carrying the whole response,
or, after a failure, an ``error`` event and ``response.failed``. Every event
carries its ``sequence_number``. The parser's typed deltas (frontend/parsers)
choose the item: content is a ``message`` with ``output_text``, reasoning a
``reasoning`` item, each tool call a ``function_call`` item; a delta of another
kind than the open item's closes it.

Text deltas are the hot path: the open message precomputes the bytes around
its delta, so a token costs one JSON string encoding and its sequence number.
A finished response is kept in the store when the request asked for it.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import TYPE_CHECKING, Any, Sequence

from ....frontend.parsers import (
    ContentDelta,
    Delta,
    ParsedOutput,
    ReasoningDelta,
    ToolCall,
    ToolCallArguments,
    ToolCallEnd,
    ToolCallStart,
)
from ....request import FinishEvent, TokenLogprob, Usage
from ...response import EVENT_STREAM, Response
from ..openai.errors import error_response
from .items import output_message
from .schema import ResponsesRequest
from .store import ResponseStore, StoredResponse

if TYPE_CHECKING:
    from ...app import ServerState

MESSAGE, REASONING, FUNCTION_CALL = "message", "reasoning", "function_call"
_ID_PREFIXES = {MESSAGE: "msg_", REASONING: "rs_", FUNCTION_CALL: "fc_"}
_TEXT_PARTS = {MESSAGE: "output_text", REASONING: "reasoning_text"}
_DELTA_EVENTS = {MESSAGE: "response.output_text.delta", REASONING: "response.reasoning_text.delta",
                 FUNCTION_CALL: "response.function_call_arguments.delta"}
_DONE_EVENTS = {MESSAGE: "response.output_text.done", REASONING: "response.reasoning_text.done",
                FUNCTION_CALL: "response.function_call_arguments.done"}

# The C string encoder behind json.dumps (see openai/format.py).
_encode_text = json.encoder.encode_basestring
# A text delta without logprobs: these bytes, its sequence number, the message's ids, its text, the tail.
_DELTA_HEAD = b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","sequence_number":'
_DELTA_TAIL = b',"logprobs":[]}\n\n'


def _dumps(payload: Any) -> bytes:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _usage(usage: Usage) -> dict[str, Any]:
    # reasoning_tokens: not counted apart from the output (0 while the output parser is plain).
    return {"input_tokens": usage.prompt_tokens, "input_tokens_details": {"cached_tokens": usage.cached_tokens},
            "output_tokens": usage.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.total_tokens}


def _new_id(kind: str) -> str:
    return f"{_ID_PREFIXES[kind]}{uuid.uuid4().hex}"


class _Item:
    """An output item while it streams."""

    __slots__ = ("kind", "index", "id", "pieces", "logprobs", "call_id", "name", "status")

    def __init__(self, kind: str, index: int, call_id: str = "", name: str = ""):
        self.kind = kind
        self.index = index  # output_index
        self.id = _new_id(kind)
        self.pieces: list[str] = []  # text, reasoning or argument fragments
        self.logprobs: list[dict[str, Any]] = []
        self.call_id = call_id
        self.name = name
        self.status: str | None = None  # None while it streams, then completed or incomplete

    @property
    def is_open(self) -> bool:
        return self.status is None

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def part(self) -> dict[str, Any]:
        if self.kind == MESSAGE:
            return {"type": "output_text", "text": self.text, "annotations": [], "logprobs": self.logprobs}
        return {"type": "reasoning_text", "text": self.text}

    def to_json(self, status: str, *, started: bool = False) -> dict[str, Any]:
        """The item as output lists it; ``started``: as output_item.added shows it (no content yet)."""
        if self.kind == FUNCTION_CALL:
            return {"type": FUNCTION_CALL, "id": self.id, "call_id": self.call_id, "name": self.name,
                    "arguments": "" if started else self.text, "status": status}
        content = [] if started else [self.part()]
        if self.kind == MESSAGE:
            return {"type": MESSAGE, "id": self.id, "status": status, "role": "assistant", "content": content}
        return {"type": REASONING, "id": self.id, "status": status, "summary": [], "content": content}


class ResponsesFormat:
    """One request's response object, streamed as events or returned whole; stored when asked."""

    errors = staticmethod(error_response)
    media_type = EVENT_STREAM
    end_of_stream = b""  # the terminal response event ends the stream; there is no [DONE]

    def __init__(self, state: "ServerState", gen: ResponsesRequest, store: ResponseStore,
                 earlier: tuple[dict[str, Any], ...] = ()):
        self.state = state
        self.gen = gen
        self.store = store
        self.earlier = earlier  # the stored conversation this request continues
        self.id = f"resp_{uuid.uuid4().hex}"
        self.created_at = int(time.time())
        self.model = gen.model or state.card.id
        self._seq = 0
        self._items: list[_Item] = []  # output order
        self._open: _Item | None = None  # the item text and reasoning deltas go to
        self._calls: dict[int, _Item] = {}  # tool calls by the parser's index
        self._pending_logprobs: list[dict[str, Any]] = []  # of text not shown yet (a partial character)
        self._delta_mid = b""  # set when a message opens: its ids before the delta

    # -- the response object ------------------------------------------------------

    def _response(self, status: str, output: list[dict[str, Any]], usage: Usage | None = None,
                  error: dict[str, Any] | None = None) -> dict[str, Any]:
        gen = self.gen
        return {
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "completed_at": int(time.time()) if status == "completed" else None, "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "model": self.model, "output": output, "usage": _usage(usage) if usage is not None else None,
            "previous_response_id": gen.previous_response_id, "store": gen.store,
            "max_output_tokens": gen.max_output_tokens, "truncation": "disabled", "background": False,
            "service_tier": "default", **gen.echo,
        }

    def _remember(self, response: dict[str, Any], output: ParsedOutput) -> None:
        if self.gen.store:
            conversation = (*self.earlier, *self.gen.messages, output_message(output))
            self.store.put(StoredResponse.of(response, conversation))

    def whole(self, output: ParsedOutput, logprobs: list[TokenLogprob] | None, finish: FinishEvent) -> dict[str, Any]:
        status = "incomplete" if finish.reason == "length" else "completed"
        items: list[_Item] = []
        if output.reasoning:
            items.append(_Item(REASONING, len(items)))
            items[-1].pieces.append(output.reasoning)
        if output.content or not (output.reasoning or output.tool_calls):
            items.append(_Item(MESSAGE, len(items)))
            items[-1].pieces.append(output.content)
            items[-1].logprobs = self._logprobs(logprobs) if logprobs is not None else []
        for call in output.tool_calls:
            items.append(_Item(FUNCTION_CALL, len(items), call.id, call.name))
            items[-1].pieces.append(call.arguments)
        out = [item.to_json("completed") for item in items]
        out[-1]["status"] = status
        response = self._response(status, out, finish.usage)
        self._remember(response, output)
        return response

    # -- stream events -------------------------------------------------------------

    def _event(self, kind: str, payload: dict[str, Any]) -> bytes:
        seq = self._seq
        self._seq += 1
        return (b"event: " + kind.encode() + b"\ndata: " + _dumps({"type": kind, "sequence_number": seq, **payload})
                + b"\n\n")

    def opening(self) -> bytes:
        started = self._response("in_progress", [])
        return self._event("response.created", {"response": started}) + \
            self._event("response.in_progress", {"response": started})

    def content_chunk(self, text: str) -> bytes:
        opened = b"" if self._open is not None and self._open.kind == MESSAGE else self._begin(MESSAGE)
        if self._pending_logprobs:
            return opened + self._text_delta(text, [])
        self._open.pieces.append(text)
        seq = self._seq
        self._seq += 1
        return (opened + _DELTA_HEAD + str(seq).encode() + self._delta_mid + _encode_text(text).encode("utf-8")
                + _DELTA_TAIL)

    def delta_chunk(self, deltas: Sequence[Delta], logprobs: Sequence[TokenLogprob] | None) -> bytes:
        out: list[bytes] = []
        entries = self._logprobs(logprobs) if logprobs else []
        for delta in deltas:
            kind = type(delta)
            if kind is ContentDelta:
                out.append(self._text_delta(delta.text, entries))
                entries = []  # an event's logprobs go with its first content
            elif kind is ReasoningDelta:
                out.append(self._reasoning_delta(delta.text))
            elif kind is ToolCallStart:
                out.append(self._close_open("completed"))
                call = self._calls[delta.index] = _Item(FUNCTION_CALL, len(self._items), delta.id, delta.name)
                self._items.append(call)
                out.append(self._event("response.output_item.added", {"output_index": call.index,
                                                                      "item": call.to_json("in_progress",
                                                                                           started=True)}))
            elif kind is ToolCallArguments:
                call = self._calls[delta.index]
                call.pieces.append(delta.fragment)
                out.append(self._event(_DELTA_EVENTS[FUNCTION_CALL], {"item_id": call.id, "output_index": call.index,
                                                                      "delta": delta.fragment}))
            elif kind is ToolCallEnd:
                out.append(self._close(self._calls[delta.index], "completed"))
        if entries:  # logprobs of text the detokenizer holds back (or that is not content)
            if self._open is not None and self._open.kind == MESSAGE:
                out.append(self._text_delta("", entries))
            else:
                self._pending_logprobs.extend(entries)
        return b"".join(out)

    def finish_chunk(self, finish: FinishEvent) -> bytes:
        status = "incomplete" if finish.reason == "length" else "completed"
        out = [b"" if self._items else self._begin(MESSAGE)]  # an empty answer is still a message
        out += [self._close(item, status) for item in self._items if item.is_open]
        response = self._response(status, [item.to_json(item.status) for item in self._items], finish.usage)
        self._remember(response, self._parsed())
        out.append(self._event(f"response.{status}", {"response": response}))
        return b"".join(out)

    def usage_chunk(self, usage: Usage) -> bytes:
        return b""  # the terminal response event carries the usage

    def error_event(self, error: Response) -> bytes:
        body = json.loads(error.body)["error"]
        output = [item.to_json(item.status or "incomplete") for item in self._items]
        failure = {"code": "rate_limit_exceeded" if error.status == 429 else "server_error",
                   "message": body["message"]}
        return self._event("error", {"code": body.get("code"), "message": body["message"],
                                     "param": body.get("param")}) + \
            self._event("response.failed", {"response": self._response("failed", output, error=failure)})

    # -- items ----------------------------------------------------------------------

    def _begin(self, kind: str) -> bytes:
        """Close the open item, open one of ``kind`` (message or reasoning): its added events."""
        closed = self._close_open("completed")
        item = self._open = _Item(kind, len(self._items))
        self._items.append(item)
        if kind == MESSAGE:
            self._delta_mid = (b',"item_id":"' + item.id.encode() + b'","output_index":' + str(item.index).encode()
                               + b',"content_index":0,"delta":')
        ids = {"item_id": item.id, "output_index": item.index, "content_index": 0}
        return closed + self._event("response.output_item.added", {"output_index": item.index,
                                                                   "item": item.to_json("in_progress",
                                                                                        started=True)}) + \
            self._event("response.content_part.added", {**ids, "part": {**item.part(), "text": ""}})

    def _text_delta(self, text: str, entries: list[dict[str, Any]]) -> bytes:
        opened = b"" if self._open is not None and self._open.kind == MESSAGE else self._begin(MESSAGE)
        item = self._open
        if self._pending_logprobs:
            entries = self._pending_logprobs + entries
            self._pending_logprobs = []
        item.pieces.append(text)
        item.logprobs.extend(entries)
        return opened + self._event(_DELTA_EVENTS[MESSAGE], {"item_id": item.id, "output_index": item.index,
                                                             "content_index": 0, "delta": text, "logprobs": entries})

    def _reasoning_delta(self, text: str) -> bytes:
        opened = b"" if self._open is not None and self._open.kind == REASONING else self._begin(REASONING)
        item = self._open
        item.pieces.append(text)
        return opened + self._event(_DELTA_EVENTS[REASONING], {"item_id": item.id, "output_index": item.index,
                                                               "content_index": 0, "delta": text})

    def _close_open(self, status: str) -> bytes:
        """Close the open text item and any tool call still streaming."""
        return b"".join(self._close(item, status) for item in self._items if item.is_open)

    def _close(self, item: _Item, status: str) -> bytes:
        if not item.is_open:
            return b""
        item.status = status
        if item is self._open:
            self._open = None
        done = item.to_json(status)
        ids = {"item_id": item.id, "output_index": item.index}
        if item.kind == FUNCTION_CALL:
            events = self._event(_DONE_EVENTS[FUNCTION_CALL], {**ids, "name": item.name, "arguments": item.text})
        else:
            part = item.part()
            text_done = {**ids, "content_index": 0, "text": part["text"]}
            if item.kind == MESSAGE:
                text_done["logprobs"] = item.logprobs
            events = self._event(_DONE_EVENTS[item.kind], text_done) + \
                self._event("response.content_part.done", {**ids, "content_index": 0, "part": part})
        return events + self._event("response.output_item.done", {"output_index": item.index, "item": done})

    def _parsed(self) -> ParsedOutput:
        """The streamed output as a whole response would report it (for the stored conversation)."""
        text = "".join(item.text for item in self._items if item.kind == MESSAGE)
        reasoning = "".join(item.text for item in self._items if item.kind == REASONING)
        calls = tuple(ToolCall(index, item.call_id, item.name, item.text) for index, item in self._calls.items())
        return ParsedOutput(text, reasoning, calls)

    def _logprobs(self, entries: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
        token_bytes = self.state.engine.token_bytes
        out = []
        for entry in entries:
            raw = token_bytes(entry.token_id)
            top = [{"token": alt.decode("utf-8", "replace"), "logprob": value, "bytes": list(alt)}
                   for alt, value in ((token_bytes(token_id), value) for token_id, value in entry.top)]
            out.append({"token": raw.decode("utf-8", "replace"), "logprob": entry.logprob, "bytes": list(raw),
                        "top_logprobs": top})
        return out

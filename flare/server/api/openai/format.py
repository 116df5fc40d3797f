"""OpenAI response bodies and SSE chunks (GenerationFormat for chat and completions).

Token chunks are the hot path: each request precomputes the bytes around its
content, so a token costs one C-level JSON string encoding of its text.
Chunks that carry logprobs, reasoning or tool calls are built as dicts.
"""

from __future__ import annotations

import codecs
import json
import time
import uuid
from typing import TYPE_CHECKING, Any, Sequence

from ....frontend.parsers import ContentDelta, Delta, ParsedOutput, ReasoningDelta, ToolCallArguments, ToolCallStart
from ....request import FinishEvent, TokenLogprob, Usage
from ...response import EVENT_STREAM, Response
from .errors import error_response
from .schema import GenerationRequest

if TYPE_CHECKING:
    from ...app import ServerState

DONE = b"data: [DONE]\n\n"


def _usage(usage: Usage) -> dict[str, Any]:
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens, "prompt_tokens_details": {"cached_tokens": usage.cached_tokens}}


def _dumps(payload: Any) -> bytes:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


# The C string encoder behind json.dumps, without building an encoder per call
# (json.dumps with non-default options costs ~2 us; this ~0.2 us).
_encode_text = json.encoder.encode_basestring


def _content(deltas: Sequence[Delta]) -> str:
    return "".join([delta.text for delta in deltas if type(delta) is ContentDelta])


class _Format:
    """Shared response framing: ids, creation time, the served model name."""

    object_name = ""
    chunk_object = ""
    id_prefix = ""
    errors = staticmethod(error_response)
    media_type = EVENT_STREAM
    end_of_stream = DONE

    def __init__(self, state: "ServerState", gen: GenerationRequest):
        self.state = state
        self.include_usage = gen.include_usage
        self.id = f"{self.id_prefix}{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = gen.model or state.card.id
        head = {"id": self.id, "object": self.chunk_object, "created": self.created, "model": self.model}
        # The chunk envelope without its closing brace: every chunk starts the same.
        self._chunk_head = b"data: " + _dumps(head)[:-1]
        self._usage_null = b',"usage":null' if self.include_usage else b""

    def _chunk(self, choice: dict[str, Any]) -> bytes:
        return self._chunk_head + b',"choices":[' + _dumps(choice) + b"]" + self._usage_null + b"}\n\n"

    def usage_chunk(self, usage: Usage) -> bytes:
        if not self.include_usage:
            return b""
        return self._chunk_head + b',"choices":[],"usage":' + _dumps(_usage(usage)) + b"}\n\n"

    def error_event(self, error: Response) -> bytes:
        return b"event: error\ndata: " + error.body + b"\n\n"

    def _envelope(self, choice: dict[str, Any], usage: Usage) -> dict[str, Any]:
        return {"id": self.id, "object": self.object_name, "created": self.created, "model": self.model,
                "choices": [choice], "usage": _usage(usage)}

    def _token_text(self, token_id: int) -> tuple[str, bytes]:
        raw = self.state.engine.token_bytes(token_id)
        return raw.decode("utf-8", "replace"), raw


class ChatFormat(_Format):
    """chat.completion bodies and chat.completion.chunk events.

    Reasoning goes in ``reasoning_content`` and tool calls in ``tool_calls``
    (the names vLLM and SGLang serve); a finish with tool calls is reported as
    ``tool_calls``.
    """

    object_name = "chat.completion"
    chunk_object = "chat.completion.chunk"
    id_prefix = "chatcmpl-"

    def __init__(self, state: "ServerState", gen: GenerationRequest):
        super().__init__(state, gen)
        self._content_head = self._chunk_head + b',"choices":[{"index":0,"delta":{"content":'
        self._content_tail = b'},"logprobs":null,"finish_reason":null}]' + self._usage_null + b"}\n\n"
        self._has_tool_calls = False

    def opening(self) -> bytes:
        return self._chunk({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                            "finish_reason": None})

    def content_chunk(self, text: str) -> bytes:
        return self._content_head + _encode_text(text).encode("utf-8") + self._content_tail

    def delta_chunk(self, deltas: Sequence[Delta], logprobs: Sequence[TokenLogprob] | None) -> bytes:
        delta: dict[str, Any] = {}
        content: list[str] = []
        reasoning: list[str] = []
        calls: list[dict[str, Any]] = []
        for item in deltas:
            kind = type(item)
            if kind is ContentDelta:
                content.append(item.text)
            elif kind is ReasoningDelta:
                reasoning.append(item.text)
            elif kind is ToolCallStart:
                self._has_tool_calls = True
                calls.append({"index": item.index, "id": item.id, "type": "function",
                              "function": {"name": item.name, "arguments": ""}})
            elif kind is ToolCallArguments:
                calls.append({"index": item.index, "function": {"arguments": item.fragment}})
        if content or not (reasoning or calls):
            delta["content"] = "".join(content)
        if reasoning:
            delta["reasoning_content"] = "".join(reasoning)
        if calls:
            delta["tool_calls"] = calls
        if logprobs is None:
            if list(delta) == ["content"]:
                return self.content_chunk(delta["content"]) if delta["content"] else b""
            return self._chunk({"index": 0, "delta": delta, "logprobs": None, "finish_reason": None})
        return self._chunk({"index": 0, "delta": delta, "logprobs": {"content": self._logprobs(logprobs)},
                            "finish_reason": None})

    def finish_chunk(self, finish: FinishEvent) -> bytes:
        return self._chunk({"index": 0, "delta": {}, "logprobs": None,
                            "finish_reason": self._finish_reason(finish, self._has_tool_calls)})

    def whole(self, output: ParsedOutput, logprobs: list[TokenLogprob] | None, finish: FinishEvent) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": output.content}
        if output.reasoning:
            message["reasoning_content"] = output.reasoning
        if output.tool_calls:
            message["content"] = output.content or None
            message["tool_calls"] = [{"id": call.id, "type": "function",
                                      "function": {"name": call.name, "arguments": call.arguments}}
                                     for call in output.tool_calls]
        choice = {"index": 0, "message": message,
                  "logprobs": {"content": self._logprobs(logprobs)} if logprobs is not None else None,
                  "finish_reason": self._finish_reason(finish, bool(output.tool_calls))}
        return self._envelope(choice, finish.usage)

    @staticmethod
    def _finish_reason(finish: FinishEvent, has_tool_calls: bool) -> str:
        return "tool_calls" if has_tool_calls and finish.reason == "stop" else finish.reason

    def _logprobs(self, logprobs) -> list[dict[str, Any]]:
        out = []
        for entry in logprobs:
            text, raw = self._token_text(entry.token_id)
            top = []
            for token_id, value in entry.top:
                alt_text, alt_raw = self._token_text(token_id)
                top.append({"token": alt_text, "logprob": value, "bytes": list(alt_raw)})
            out.append({"token": text, "logprob": entry.logprob, "bytes": list(raw), "top_logprobs": top})
        return out


class CompletionFormat(_Format):
    """text_completion bodies and events: raw text, so only content deltas count."""

    object_name = "text_completion"
    chunk_object = "text_completion"
    id_prefix = "cmpl-"

    def __init__(self, state: "ServerState", gen: GenerationRequest):
        super().__init__(state, gen)
        self._text_head = self._chunk_head + b',"choices":[{"index":0,"text":'
        self._text_tail = b',"logprobs":null,"finish_reason":null}]' + self._usage_null + b"}\n\n"
        self._offset = 0  # characters of output so far, for text_offset
        # The output's bytes as characters, token by token: a token that ends inside a
        # multi-byte character adds nothing until the token that completes it.
        self._chars = codecs.getincrementaldecoder("utf-8")("replace")

    def opening(self) -> bytes:
        return b""

    def content_chunk(self, text: str) -> bytes:
        return self._text_head + _encode_text(text).encode("utf-8") + self._text_tail

    def delta_chunk(self, deltas: Sequence[Delta], logprobs: Sequence[TokenLogprob] | None) -> bytes:
        text = _content(deltas)
        if logprobs is None:
            return self.content_chunk(text) if text else b""
        return self._chunk({"index": 0, "text": text, "logprobs": self._logprobs(logprobs), "finish_reason": None})

    def finish_chunk(self, finish: FinishEvent) -> bytes:
        return self._chunk({"index": 0, "text": "", "logprobs": None, "finish_reason": finish.reason})

    def whole(self, output: ParsedOutput, logprobs: list[TokenLogprob] | None, finish: FinishEvent) -> dict[str, Any]:
        choice = {"index": 0, "text": output.content,
                  "logprobs": self._logprobs(logprobs) if logprobs is not None else None,
                  "finish_reason": finish.reason}
        return self._envelope(choice, finish.usage)

    def _logprobs(self, logprobs) -> dict[str, Any]:
        tokens, values, tops, offsets = [], [], [], []
        for entry in logprobs:
            raw = self.state.engine.token_bytes(entry.token_id)
            tokens.append(_token_key(raw))
            values.append(entry.logprob)
            top: dict[str, float] = {}
            for token_id, value in entry.top:
                top.setdefault(_token_key(self.state.engine.token_bytes(token_id)), value)
            tops.append(top)
            # where the token's first character starts in the text (the one it completes, for a
            # token that begins inside a character)
            offsets.append(self._offset)
            self._offset += len(self._chars.decode(raw))
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


def _token_key(raw: bytes) -> str:
    """A completion logprob's token: its text, or for bytes that are not whole UTF-8 characters
    OpenAI's ``bytes:\\xNN`` form, so that the byte pieces of one character stay distinct
    (decoded, every one would be U+FFFD and they would overwrite each other in top_logprobs)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{byte:02x}" for byte in raw)

"""OpenAI-compatible routes: /v1/models, /v1/chat/completions, /v1/completions.

A generation request runs: parse and validate the body (openai_schema), wait
for a frontend worker to render and tokenize, resolve max_tokens against the
context, ``engine.submit`` with an :class:`EventStream` as the sink, then
answer with one JSON body or an SSE stream. The HTTP admission permit taken
before the body was read is released by the protocol when the response ends.
A client disconnect cancels the ticket (the runtime frees the slot and counts
the cancellation); so does shutdown when the grace period runs out.

SSE token chunks are the hot path: each request precomputes the bytes around
its content, so a token costs one ``json.dumps`` of its text, and a batch of
events that arrived together is written with one ``transport.write``.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any
from urllib.parse import unquote

from ..errors import AdmissionError, Error, ExecutionError
from ..request import ErrorEvent, FinishEvent, PreparedPrompt, SamplingParams, TokenEvent, Usage
from .app import Router, ServerState, error_response
from .openai_schema import GenerationRequest, parse_chat, parse_completion
from .generation import ActiveGeneration
from .protocol import HttpConnection, HttpRequest
from .request_body import decode_json, shorten
from .response import Response
from .stream import EventStream

DONE = b"data: [DONE]\n\n"


def install(router: Router, state: ServerState) -> None:
    """Add the OpenAI routes to ``router``."""
    models = list_models(state)  # the card never changes while serving
    router.add("GET", "/v1/models", lambda request, conn: models)
    router.add_prefix("GET", "/v1/models/", lambda request, conn: get_model(state, request.params["tail"]))
    router.add("POST", "/v1/chat/completions", lambda request, conn: chat_completions(state, request, conn),
               generation=True)
    router.add("POST", "/v1/completions", lambda request, conn: completions(state, request, conn), generation=True)


# -- discovery -----------------------------------------------------------------

def model_card(state: ServerState) -> dict[str, Any]:
    card = state.card
    return {"id": card.id, "object": "model", "created": card.created, "owned_by": "flare", "root": card.identifier,
            "parent": None, "max_model_len": card.max_model_len, "capabilities": list(card.capabilities),
            "aliases": [name for name in (card.identifier, *card.served_names) if name and name != card.id],
            **card.extra}


def list_models(state: ServerState) -> Response:
    return Response.json(200, {"object": "list", "data": [model_card(state)]})


def get_model(state: ServerState, name: str) -> Response:
    name = unquote(name)
    if state.card.matches(name) or name == state.card.id:
        return Response.json(200, model_card(state))
    return error_response(404, f"the model '{shorten(name)}' does not exist", code="model_not_found",
                          param="model")


# -- generation ----------------------------------------------------------------

def _json_body(state: ServerState, request: HttpRequest) -> Any:
    return decode_json(request.body, max_depth=state.config.max_json_depth)


def _check_model(state: ServerState, gen: GenerationRequest) -> None:
    if gen.model is not None and gen.model != state.card.id and not state.card.matches(gen.model):
        raise AdmissionError(f"the model '{shorten(gen.model)}' does not exist", status=404, code="model_not_found",
                             param="model")


def _refuse_when_draining(state: ServerState) -> None:
    if state.is_draining:
        raise AdmissionError("the server is shutting down; not accepting generation requests", status=503,
                             code="shutting_down")


async def chat_completions(state: ServerState, request: HttpRequest, conn: HttpConnection) -> Response | None:
    gen = parse_chat(_json_body(state, request))
    _check_model(state, gen)
    engine = state.engine
    prompt = await state.frontend.run(lambda: engine.prepare_chat(gen.messages, tools=gen.tools,
                                                                  options=gen.chat_options))
    return await _generate(state, request, conn, gen, prompt, ChatFormat(state, gen))


async def completions(state: ServerState, request: HttpRequest, conn: HttpConnection) -> Response | None:
    gen = parse_completion(_json_body(state, request))
    _check_model(state, gen)
    prompt = await state.frontend.run(state.engine.prepare_text, gen.prompt)
    return await _generate(state, request, conn, gen, prompt, CompletionFormat(state, gen))


async def _generate(state: ServerState, request: HttpRequest, conn: HttpConnection, gen: GenerationRequest,
                    prompt: PreparedPrompt, fmt: "ChatFormat | CompletionFormat") -> Response | None:
    if conn.is_lost:
        return None  # the client left while its prompt was prepared
    params = gen.sampling_params(len(prompt), state.engine.context_len, state.config.context_hint)
    _refuse_when_draining(state)  # it waited for a frontend worker while shutdown began
    stream = EventStream(state.dispatcher)
    ticket = state.engine.submit(prompt, params, stream.sink)  # raises AdmissionError (400/503)
    active = ActiveGeneration(ticket, stream)
    state.generations.add(active)

    def on_disconnect() -> None:
        if not stream.is_terminal_received:
            ticket.cancel()
            state.metrics.num_disconnects += 1
        stream.abandon()

    conn.add_disconnect_callback(on_disconnect)
    try:
        if gen.stream:
            return await _stream(state, request, conn, stream, fmt, gen, params)
        return await _collect(state, request, conn, stream, fmt, params)
    finally:
        state.generations.discard(active)
        if not stream.is_terminal_received:
            ticket.cancel()  # shutdown, disconnect or a failure here: free the model slot


class _Timing:
    """TTFT, inter-token and end-to-end latency for one request."""

    __slots__ = ("metrics", "start", "last")

    def __init__(self, state: ServerState, request: HttpRequest):
        self.metrics = state.metrics
        # received_at is the protocol's clock (monotonic by default).
        self.start = request.received_at
        self.last = 0.0

    def on_tokens(self, now: float, num_events: int = 1) -> None:
        """``num_events`` token events delivered together at ``now``."""
        if self.last:
            self.metrics.inter_token.observe(now - self.last)
        else:
            self.metrics.ttft.observe(now - self.start)
        if num_events > 1:
            # Delivered in one write: the client sees no gap between them.
            self.metrics.inter_token.observe_zero(num_events - 1)
        self.last = now

    def on_end(self, now: float) -> None:
        self.metrics.e2e.observe(now - self.start)


async def _collect(state: ServerState, request: HttpRequest, conn: HttpConnection, stream: EventStream,
                   fmt: "ChatFormat | CompletionFormat", params: SamplingParams) -> Response | None:
    timing = _Timing(state, request)
    texts: list[str] = []
    logprobs: list = []
    while True:
        batch = await stream.next_batch()
        if not batch:  # abandoned: the client is gone, or shutdown ended the grace period
            if conn.is_lost:
                return None
            return error_response(503, "the server shut down before the response was complete",
                                  code="shutting_down")
        now = time.monotonic()
        for event in batch:
            if isinstance(event, TokenEvent):
                if event.token_ids:
                    timing.on_tokens(now)
                texts.append(event.text)
                if event.logprobs:
                    logprobs.extend(event.logprobs)
            elif isinstance(event, FinishEvent):
                timing.on_end(now)
                return Response.json(200, fmt.whole("".join(texts), logprobs if params.logprobs else None, event))
            elif isinstance(event, ErrorEvent):
                timing.on_end(now)
                return state.error_for(_as_error(event.error))


async def _stream(state: ServerState, request: HttpRequest, conn: HttpConnection, stream: EventStream,
                  fmt: "ChatFormat | CompletionFormat", gen: GenerationRequest, params: SamplingParams) -> Response | None:
    timing = _Timing(state, request)
    first = await stream.next_batch()
    if not first:
        return None
    if isinstance(first[0], ErrorEvent):
        # Nothing was sent yet: the failure can still have its own status.
        timing.on_end(time.monotonic())
        return state.error_for(_as_error(first[0].error))
    conn.start_stream()
    state.metrics.count_response(200)
    conn.write(fmt.opening())

    token_chunk = fmt.token_chunk
    write = conn.write

    def deliver(batch: list) -> None:
        """Format a batch and write it with one transport write (dispatcher callback)."""
        out: list[bytes] = []
        num_tokens = 0
        for event in batch:
            if type(event) is TokenEvent:
                if event.token_ids:
                    num_tokens += 1
                if event.text or event.logprobs:
                    out.append(token_chunk(event, params))
            elif isinstance(event, FinishEvent):
                timing.on_end(time.monotonic())
                out.append(fmt.finish_chunk(event))
                if gen.include_usage:
                    out.append(fmt.usage_chunk(event.usage))
                out.append(DONE)
            elif isinstance(event, ErrorEvent):
                timing.on_end(time.monotonic())
                error = state.error_for(_as_error(event.error))
                out.append(b"event: error\ndata: " + error.body + b"\n\n")
        if num_tokens:
            timing.on_tokens(time.monotonic(), num_tokens)
        write(b"".join(out))
        if conn.is_write_paused:
            stream.stop_consuming()  # let the client catch up; events wait in the stream

    deliver(first)
    while not stream.is_terminal_received and not stream.is_abandoned:
        if conn.is_write_paused:
            await conn.drain()
        await stream.consume(deliver)
    return None


def _as_error(error: BaseException) -> Error:
    return error if isinstance(error, Error) else ExecutionError(f"execution failed: {error}")


def _usage(usage: Usage) -> dict[str, Any]:
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens, "prompt_tokens_details": {"cached_tokens": usage.cached_tokens}}


def _dumps(payload: Any) -> bytes:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


# The C string encoder behind json.dumps, without building an encoder per call
# (json.dumps with non-default options costs ~2 us; this ~0.2 us).
_encode_text = json.encoder.encode_basestring


class _Format:
    """Shared response framing: ids, creation time, the served model name."""

    object_name = ""
    chunk_object = ""
    id_prefix = ""

    def __init__(self, state: ServerState, gen: GenerationRequest):
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
        return self._chunk_head + b',"choices":[],"usage":' + _dumps(_usage(usage)) + b"}\n\n"

    def _envelope(self, choice: dict[str, Any], usage: Usage) -> dict[str, Any]:
        return {"id": self.id, "object": self.object_name, "created": self.created, "model": self.model,
                "choices": [choice], "usage": _usage(usage)}

    def _token_text(self, token_id: int) -> tuple[str, bytes]:
        raw = self.state.engine.token_bytes(token_id)
        return raw.decode("utf-8", "replace"), raw


class ChatFormat(_Format):
    object_name = "chat.completion"
    chunk_object = "chat.completion.chunk"
    id_prefix = "chatcmpl-"

    def __init__(self, state: ServerState, gen: GenerationRequest):
        super().__init__(state, gen)
        self._content_head = self._chunk_head + b',"choices":[{"index":0,"delta":{"content":'
        self._content_tail = b'},"logprobs":null,"finish_reason":null}]' + self._usage_null + b"}\n\n"

    def opening(self) -> bytes:
        return self._chunk({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                            "finish_reason": None})

    def token_chunk(self, event: TokenEvent, params: SamplingParams) -> bytes:
        if not event.logprobs:
            return self._content_head + _encode_text(event.text).encode("utf-8") + self._content_tail
        return self._chunk({"index": 0, "delta": {"content": event.text},
                            "logprobs": {"content": self._logprobs(event.logprobs)}, "finish_reason": None})

    def finish_chunk(self, finish: FinishEvent) -> bytes:
        return self._chunk({"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish.reason})

    def whole(self, text: str, logprobs: list | None, finish: FinishEvent) -> dict[str, Any]:
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "logprobs": {"content": self._logprobs(logprobs)} if logprobs is not None else None,
                  "finish_reason": finish.reason}
        return self._envelope(choice, finish.usage)

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
    object_name = "text_completion"
    chunk_object = "text_completion"
    id_prefix = "cmpl-"

    def __init__(self, state: ServerState, gen: GenerationRequest):
        super().__init__(state, gen)
        self._text_head = self._chunk_head + b',"choices":[{"index":0,"text":'
        self._text_tail = b',"logprobs":null,"finish_reason":null}]' + self._usage_null + b"}\n\n"
        self._offset = 0  # characters of output so far, for text_offset

    def opening(self) -> bytes:
        return b""

    def token_chunk(self, event: TokenEvent, params: SamplingParams) -> bytes:
        if not event.logprobs:
            return self._text_head + _encode_text(event.text).encode("utf-8") + self._text_tail
        return self._chunk({"index": 0, "text": event.text, "logprobs": self._logprobs(event.logprobs),
                            "finish_reason": None})

    def finish_chunk(self, finish: FinishEvent) -> bytes:
        return self._chunk({"index": 0, "text": "", "logprobs": None, "finish_reason": finish.reason})

    def whole(self, text: str, logprobs: list | None, finish: FinishEvent) -> dict[str, Any]:
        choice = {"index": 0, "text": text,
                  "logprobs": self._logprobs(logprobs) if logprobs is not None else None,
                  "finish_reason": finish.reason}
        return self._envelope(choice, finish.usage)

    def _logprobs(self, logprobs) -> dict[str, Any]:
        tokens, values, tops, offsets = [], [], [], []
        for entry in logprobs:
            text, _ = self._token_text(entry.token_id)
            tokens.append(text)
            values.append(entry.logprob)
            top: dict[str, float] = {}
            for token_id, value in entry.top:
                top.setdefault(self._token_text(token_id)[0], value)
            tops.append(top)
            offsets.append(self._offset)
            self._offset += len(text)
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}

"""The generation layer every route family shares.

A family parses its request body into a prompt preparation and sampling
settings, builds a :class:`GenerationFormat` for the request, and calls
:func:`generate`, which runs the rest in the same order for every family:

1. prepare the prompt on a frontend worker (chat template, tokenizer);
2. return quietly if the client left meanwhile;
3. resolve the sampling parameters against the context (400 when prompt plus
   output do not fit); compile a structured-output constraint on a frontend worker
   (400 when it cannot be enforced);
4. refuse with 503 if shutdown began while the request waited for a worker;
5. ``engine.submit`` with an :class:`EventStream` as the sink, registered as an
   :class:`ActiveGeneration` so that shutdown can end it, with a disconnect
   callback that cancels the ticket;
6. collect one JSON body, or stream SSE with backpressure, observing TTFT,
   inter-token and end-to-end latency;
7. log one line for the request on ``flare.requests`` (when ``log_requests`` is
   on; see :func:`log_request`), however it ended.

Output text goes through the request's output parser (frontend/parsers) and
reaches the format as typed deltas. The SSE hot path keeps its per-token cost:
with the plain parser a token's text goes straight to ``content_chunk`` (the
family's precomputed bytes around one JSON string), and every batch of events
that arrived together is written with one ``transport.write``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

from ..errors import AdmissionError, Error, ExecutionError
from ..frontend import parsers
from ..frontend.parsers import ContentDelta, Delta, OutputAssembler, ParsedOutput, ToolCallStart
from ..request import ErrorEvent, FinishEvent, PreparedPrompt, SamplingParams, TokenEvent, TokenLogprob, Usage
from .protocol import HttpConnection, HttpRequest
from .request_body import shorten
from .response import Response
from .stream import EventStream
from .tool_calls import PLAIN_OUTPUT, OutputPlan

if TYPE_CHECKING:  # NOTE: app.py imports the families, which import this module
    from .app import ErrorRenderer, ServerState

request_log = logging.getLogger("flare.requests")


class ActiveGeneration:
    """A submitted request and the stream its response reads (loop thread).

    The server keeps every one in ``ServerState.generations`` so that shutdown
    can end each response with its family's terminal error event (rather than
    cutting the connection) and free its model slot.
    """

    __slots__ = ("ticket", "stream")

    def __init__(self, ticket: Any, stream: EventStream):
        self.ticket = ticket
        self.stream = stream

    def end(self, error: Error) -> None:
        """End the response with ``error`` as its terminal event and stop the model's work.

        If the runtime finishes the request at the same moment, whichever terminal
        event the stream takes first is the one the client sees (EventStream._take).
        """
        self.stream.sink(ErrorEvent(error))
        self.ticket.cancel()


class GenerationFormat(Protocol):
    """What a route family plugs in for one request: its bytes and its JSON.

    Streamed bytes are whole events in the family's framing (SSE events, NDJSON
    lines); methods that have nothing to say return ``b""``.
    """

    errors: "ErrorRenderer"  # the family's error shape
    media_type: bytes  # the stream's content type: b"text/event-stream" (SSE), b"application/x-ndjson", ...
    end_of_stream: bytes  # written after the finish and usage chunks (b"" if the family has none)

    def opening(self) -> bytes:
        """Written when the stream starts, before any token."""

    def content_chunk(self, text: str) -> bytes:
        """One non-empty content delta without logprobs: the hot path."""

    def delta_chunk(self, deltas: Sequence[Delta], logprobs: Sequence[TokenLogprob] | None) -> bytes:
        """Any other output: the deltas of one event (possibly none) and its logprobs."""

    def finish_chunk(self, finish: FinishEvent) -> bytes:
        """The finish reason."""

    def usage_chunk(self, usage: Usage) -> bytes:
        """Token usage at the end of the stream (b"" when the client did not ask)."""

    def whole(self, output: ParsedOutput, logprobs: list[TokenLogprob] | None, finish: FinishEvent) -> Any:
        """The JSON payload of a collected (non-streamed) response."""

    def error_event(self, error: Response) -> bytes:
        """The terminal event of a stream that failed, from the error response it would have had."""


SamplingResolver = Callable[[int, int, str], SamplingParams]  # (prompt_len, context_len, context_hint)


def resolve_max_tokens(max_tokens: int | None, prompt_len: int, context_len: int, *, param: str,
                       prompt_param: str, context_hint: str = "", default: int | None = None) -> int:
    """``max_tokens``; 400 when prompt + output do not fit.

    Without ``max_tokens``, the model's ``default`` (its max_new_tokens) clamped to the
    room the prompt leaves, else the rest of the context: only an explicit max_tokens
    that does not fit is refused, or a prompt that leaves no room at all. ``param``
    names the request's max_tokens field, ``prompt_param`` the prompt's (blamed when
    no max_tokens was given, or when the prompt alone fills the context).
    """
    remaining = context_len - prompt_len
    if max_tokens is not None:
        resolved = max_tokens
    else:
        resolved = remaining if default is None else min(default, remaining)
    if resolved < 1 or prompt_len + resolved > context_len:
        # A prompt that leaves no room is the prompt's fault whatever max_tokens says; the
        # message names the field as the request spelled it (max_output_tokens, num_predict).
        blame_prompt = max_tokens is None or remaining < 1
        requested = "at least one output token" if blame_prompt else f"{param.rpartition('.')[2]} of {max_tokens}"
        raise AdmissionError(
            f"prompt of {prompt_len} tokens plus {requested} exceeds the context of {context_len} tokens",
            status=400, code="context_length_exceeded", param=prompt_param if blame_prompt else param,
            hint=context_hint or None)
    return resolved


def check_model(state: "ServerState", name: str | None) -> None:
    """404 ``model_not_found`` unless ``name`` (None: not given) is the served model's id or an alias."""
    if name is not None and name != state.card.id and not state.card.matches(name):
        raise AdmissionError(f"the model '{shorten(name)}' does not exist", status=404, code="model_not_found",
                             param="model")


def refuse_when_draining(state: "ServerState") -> None:
    if state.is_draining:
        raise AdmissionError("the server is shutting down; not accepting generation requests", status=503,
                             code="shutting_down")


def as_error(error: BaseException) -> Error:
    return error if isinstance(error, Error) else ExecutionError(f"execution failed: {error}")


async def generate(state: "ServerState", request: HttpRequest, conn: HttpConnection, fmt: GenerationFormat,
                   prepare: Callable[[], PreparedPrompt], resolve: SamplingResolver, *, stream: bool,
                   output: OutputPlan = PLAIN_OUTPUT) -> Response | None:
    """Prepare, submit and answer one generation request (see the module docstring).

    ``prepare`` runs on a frontend worker; ``resolve`` turns the prompt length into
    sampling parameters; ``output`` says how the output is parsed and carries the
    grammar of a forced tool call (server/tool_calls.py). A typed error raised here
    (400 context or grammar, 503 draining or capacity) is answered here, in the
    format's shape, so that the request's log line knows its prompt length.
    """
    timing = Timing(state, request)
    try:
        response = await _generate(state, conn, fmt, prepare, resolve, stream, output, timing)
    except Error as exc:
        timing.error = exc
        response = state.error_for(exc, fmt.errors)
    except Exception:  # a bug: the protocol answers 500, or cuts a stream that had started
        if state.config.log_requests:
            timing.error = Error("internal error")
            timing.log(request, 200 if timing.is_streaming else 500)
        raise
    if state.config.log_requests:
        if timing.is_streaming and (timing.finish is not None or timing.error is not None):
            status: int | str = 200  # a stream that ran to its end (its error, if any, was its terminal event)
        elif response is not None and not timing.is_streaming:
            status = response.status
        else:
            status = "disconnected"  # the client left before the request ended
        timing.log(request, status)
    return response


async def _generate(state: "ServerState", conn: HttpConnection, fmt: GenerationFormat,
                    prepare: Callable[[], PreparedPrompt], resolve: SamplingResolver, stream: bool,
                    output: OutputPlan, timing: "Timing") -> Response | None:
    prompt = await state.frontend.run(prepare)
    if conn.is_lost:
        return None  # the client left while its prompt was prepared
    timing.prompt_len = len(prompt)
    params = resolve(len(prompt), state.engine.context_len, state.config.context_hint)
    if output.grammar is not None:  # tool_choice required or named: the call's syntax is enforced
        params = replace(params, grammar=output.grammar)
    grammar = None
    if params.grammar is not None:  # structured output: compiled on a worker too (GrammarError: 400)
        grammar = await state.frontend.run(partial(state.engine.prepare_grammar, params.grammar))
        if conn.is_lost:
            return None
    refuse_when_draining(state)  # it waited for a frontend worker while shutdown began
    output_parser = output.parser(prompt)
    events = EventStream(state.dispatcher)
    ticket = state.engine.submit(prompt, params, events.sink, grammar)  # raises AdmissionError (400/503)
    active = ActiveGeneration(ticket, events)
    state.generations.add(active)

    def on_disconnect() -> None:
        if not events.is_terminal_received:
            ticket.cancel()
            state.metrics.num_disconnects += 1
        events.abandon()

    conn.add_disconnect_callback(on_disconnect)
    try:
        if stream:
            return await _stream(state, conn, events, fmt, output_parser, timing)
        return await _collect(state, conn, events, fmt, output_parser, params, timing)
    finally:
        state.generations.discard(active)
        if not events.is_terminal_received:
            ticket.cancel()  # shutdown, disconnect or a failure here: free the model slot
        state.metrics.num_tool_parse_failures += getattr(output_parser, "malformed", 0)


class Timing:
    """TTFT, inter-token and end-to-end latency for one request, and how it ended (its log line)."""

    __slots__ = ("metrics", "start", "last", "first", "prompt_len", "finish", "error", "is_streaming")

    def __init__(self, state: "ServerState", request: HttpRequest):
        self.metrics = state.metrics
        # received_at is the protocol's clock (monotonic by default).
        self.start = request.received_at
        self.last = 0.0
        self.first = 0.0  # when its first token was delivered (0: none yet)
        self.prompt_len: int | None = None  # once prepared
        self.finish: FinishEvent | None = None  # its terminal event, when it finished
        self.error: Error | None = None  # or the error it ended with
        self.is_streaming = False  # the stream's head (status 200) was sent

    def on_tokens(self, now: float, num_events: int = 1) -> None:
        """``num_events`` token events delivered together at ``now``."""
        if self.last:
            self.metrics.inter_token.observe(now - self.last)
        else:
            self.metrics.ttft.observe(now - self.start)
            self.first = now
        if num_events > 1:
            # Delivered in one write: the client sees no gap between them.
            self.metrics.inter_token.observe_zero(num_events - 1)
        self.last = now

    def on_end(self, now: float) -> None:
        self.metrics.e2e.observe(now - self.start)

    def log(self, request: HttpRequest, status: int | str) -> None:
        """The request's log line (log_request), from what it saw."""
        finish, error = self.finish, self.error
        usage = finish.usage if finish is not None else None
        log_request(route_name(request), status, self.start, ttft=self.first - self.start if self.first else None,
                    prompt=usage.prompt_tokens if usage is not None else self.prompt_len, usage=usage,
                    finish=finish.reason if finish is not None else None,
                    error=error.code if error is not None else None)


def route_name(request: HttpRequest) -> str:
    """The route's name in request log lines (``openai.chat``...), else the request's path."""
    return getattr(request.route, "name", None) or request.path


def log_request(route: str, status: int | str, start: float | None, *, ttft: float | None = None,
                prompt: int | None = None, usage: Usage | None = None, finish: str | None = None,
                error: str | None = None) -> None:
    """One request's line on ``flare.requests`` (info), documented in docs/serving.md:

    ``request ROUTE STATUS prompt=N cached=N output=N ttft=MSms duration=Ss finish=REASON[ error=CODE]``

    ``STATUS`` is the HTTP status sent, or ``disconnected`` for a client that left before
    the request ended; ``finish`` is the engine's reason (stop, length), else ``error`` when
    ``error`` (a code) is given, else ``-``; a value not known is ``-``. No prompt or output
    text, ever. ``start`` is the request's arrival (``time.monotonic()``), None when not known.
    """
    if finish is None:
        finish = "-" if error is None else "error"

    def count(value: int | None) -> str:
        return "-" if value is None else str(value)

    line = (f"request {route} {status} prompt={count(prompt)} "
            f"cached={count(usage.cached_tokens if usage is not None else None)} "
            f"output={count(usage.completion_tokens if usage is not None else None)} "
            f"ttft={'-' if ttft is None else f'{ttft * 1000:.0f}ms'} "
            f"duration={'-' if start is None else f'{time.monotonic() - start:.3f}s'} finish={finish}")
    request_log.info(line if error is None else f"{line} error={error}")


async def _collect(state: "ServerState", conn: HttpConnection, events: EventStream, fmt: GenerationFormat,
                   parser: parsers.OutputParser, params: SamplingParams, timing: Timing) -> Response | None:
    assembler = OutputAssembler()
    logprobs: list[TokenLogprob] = []
    while True:
        batch = await events.next_batch()
        if not batch:  # abandoned: only a client that disconnected abandons its stream
            return None
        now = time.monotonic()
        for event in batch:
            if isinstance(event, TokenEvent):
                if event.token_ids:
                    timing.on_tokens(now)
                if event.text:
                    assembler.add(parser.feed(event.text))
                if event.logprobs:
                    logprobs.extend(event.logprobs)
            elif isinstance(event, FinishEvent):
                timing.on_end(now)
                timing.finish = event
                assembler.add(parser.finish())
                result = assembler.result()
                state.metrics.num_tool_calls += len(result.tool_calls)
                return Response.json(200, fmt.whole(result, logprobs if params.logprobs else None, event))
            elif isinstance(event, ErrorEvent):
                timing.on_end(now)
                timing.error = as_error(event.error)
                return state.error_for(timing.error, fmt.errors)


async def _stream(state: "ServerState", conn: HttpConnection, events: EventStream, fmt: GenerationFormat,
                  parser: parsers.OutputParser, timing: Timing) -> Response | None:
    first = await events.next_batch()
    if not first:
        return None
    if isinstance(first[0], ErrorEvent):
        # Nothing was sent yet: the failure can still have its own status.
        timing.on_end(time.monotonic())
        timing.error = as_error(first[0].error)
        return state.error_for(timing.error, fmt.errors)
    conn.start_stream(content_type=fmt.media_type)
    timing.is_streaming = True
    state.metrics.count_response(200)
    conn.write(fmt.opening())

    content_chunk = fmt.content_chunk
    delta_chunk = fmt.delta_chunk
    feed = None if parser.is_plain else parser.feed  # plain: each text is its own content delta
    write = conn.write
    metrics = state.metrics

    def count_calls(deltas: list) -> None:
        for delta in deltas:
            if type(delta) is ToolCallStart:
                metrics.num_tool_calls += 1

    def deliver(batch: list) -> None:
        """Format a batch and write it with one transport write (dispatcher callback)."""
        out: list[bytes] = []
        num_tokens = 0
        for event in batch:
            if type(event) is TokenEvent:
                if event.token_ids:
                    num_tokens += 1
                text = event.text
                if feed is None:
                    if not event.logprobs:
                        if text:
                            out.append(content_chunk(text))
                        continue
                    deltas = [ContentDelta(text)] if text else []
                else:
                    deltas = feed(text) if text else []
                    count_calls(deltas)
                    if not event.logprobs:
                        if deltas:
                            out.append(delta_chunk(deltas, None))
                        continue
                out.append(delta_chunk(deltas, event.logprobs))
            elif isinstance(event, FinishEvent):
                timing.on_end(time.monotonic())
                timing.finish = event
                if feed is not None:
                    held = parser.finish()
                    count_calls(held)
                    if held:
                        out.append(delta_chunk(held, None))
                out.append(fmt.finish_chunk(event))
                out.append(fmt.usage_chunk(event.usage))
                out.append(fmt.end_of_stream)
            elif isinstance(event, ErrorEvent):
                timing.on_end(time.monotonic())
                timing.error = as_error(event.error)
                out.append(fmt.error_event(state.error_for(timing.error, fmt.errors)))
        if num_tokens:
            timing.on_tokens(time.monotonic(), num_tokens)
        write(b"".join(out))
        if conn.is_write_paused:
            events.stop_consuming()  # let the client catch up; events wait in the stream

    deliver(first)
    while not events.is_terminal_received and not events.is_abandoned:
        if conn.is_write_paused:
            await conn.drain()
        await events.consume(deliver)
    return None

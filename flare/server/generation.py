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
   inter-token and end-to-end latency.

Output text goes through the request's output parser (frontend/parsers) and
reaches the format as typed deltas. The SSE hot path keeps its per-token cost:
with the plain parser a token's text goes straight to ``content_chunk`` (the
family's precomputed bytes around one JSON string), and every batch of events
that arrived together is written with one ``transport.write``.
"""

from __future__ import annotations

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
    no max_tokens was given).
    """
    remaining = context_len - prompt_len
    if max_tokens is not None:
        resolved = max_tokens
    else:
        resolved = remaining if default is None else min(default, remaining)
    if resolved < 1 or prompt_len + resolved > context_len:
        requested = f"max_tokens of {max_tokens}" if max_tokens is not None else "at least one output token"
        raise AdmissionError(
            f"prompt of {prompt_len} tokens plus {requested} exceeds the context of {context_len} tokens",
            status=400, code="context_length_exceeded", param=param if max_tokens is not None else prompt_param,
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
    grammar of a forced tool call (server/tool_calls.py).
    """
    prompt = await state.frontend.run(prepare)
    if conn.is_lost:
        return None  # the client left while its prompt was prepared
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
            return await _stream(state, request, conn, events, fmt, output_parser)
        return await _collect(state, request, conn, events, fmt, output_parser, params)
    finally:
        state.generations.discard(active)
        if not events.is_terminal_received:
            ticket.cancel()  # shutdown, disconnect or a failure here: free the model slot
        state.metrics.num_tool_parse_failures += getattr(output_parser, "malformed", 0)


class Timing:
    """TTFT, inter-token and end-to-end latency for one request."""

    __slots__ = ("metrics", "start", "last")

    def __init__(self, state: "ServerState", request: HttpRequest):
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


async def _collect(state: "ServerState", request: HttpRequest, conn: HttpConnection, events: EventStream,
                   fmt: GenerationFormat, parser: parsers.OutputParser, params: SamplingParams) -> Response | None:
    timing = Timing(state, request)
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
                assembler.add(parser.finish())
                result = assembler.result()
                state.metrics.num_tool_calls += len(result.tool_calls)
                return Response.json(200, fmt.whole(result, logprobs if params.logprobs else None, event))
            elif isinstance(event, ErrorEvent):
                timing.on_end(now)
                return state.error_for(as_error(event.error), fmt.errors)


async def _stream(state: "ServerState", request: HttpRequest, conn: HttpConnection, events: EventStream,
                  fmt: GenerationFormat, parser: parsers.OutputParser) -> Response | None:
    timing = Timing(state, request)
    first = await events.next_batch()
    if not first:
        return None
    if isinstance(first[0], ErrorEvent):
        # Nothing was sent yet: the failure can still have its own status.
        timing.on_end(time.monotonic())
        return state.error_for(as_error(first[0].error), fmt.errors)
    conn.start_stream(content_type=fmt.media_type)
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
                out.append(fmt.error_event(state.error_for(as_error(event.error), fmt.errors)))
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

"""FloodEngine: token events as fast as one thread can make them, for measuring the HTTP layer.

tools/bench_http.py compares Flare's HTTP server with uvicorn on the same engine;
the figure it wants is what the server can deliver, so the engine must never be the
bottleneck. FakeEngine runs the real runtime and scheduler (about 27k tokens/s on
this machine's CPU), so it would measure those instead. FloodEngine keeps
FakeEngine's prompt preparation and tokens (one byte a token, the same chat layout)
and replaces generation with one thread that gives every active request one token
event per round: filler bytes, ``max_tokens`` of them, then a FinishEvent. No
scheduler, no KV cache, no stop strings: a load source, not a model.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..engine.telemetry import EngineStats
from ..errors import AdmissionError, Error, FrontendError
from ..frontend.tokenizer import Tokenizer
from ..request import (
    ErrorEvent,
    EventSink,
    FinishEvent,
    GrammarRequest,
    ModelCard,
    PreparedPrompt,
    SamplingParams,
    TokenEvent,
    Usage,
)
from .fake_engine import FILLER, FakeEngineConfig, byte_chat_prompt, byte_text_prompt, byte_tokenizer_json

_FILLER = FILLER.encode("utf-8")
_TEXTS = tuple(chr(b) for b in range(128))  # the filler is ASCII: one character a token


@dataclass(eq=False)
class _Flow:
    prompt_len: int
    max_tokens: int
    sink: EventSink
    sent: int = 0
    is_cancelled: bool = False


@dataclass
class _Counts:
    admitted: int = 0
    completed: int = 0
    cancelled: int = 0
    generated: int = 0
    active: list = field(default_factory=list)


class _Ticket:
    def __init__(self, flow: _Flow):
        self._flow = flow

    def cancel(self) -> None:
        self._flow.is_cancelled = True


class FloodEngine:
    """Implements flare.engine.base.Engine; see the module docstring."""

    def __init__(self, config: FakeEngineConfig = FakeEngineConfig()):
        self._tokenizer = Tokenizer(byte_tokenizer_json())
        self.card = ModelCard(identifier=config.identifier, served_names=config.served_names,
                              max_model_len=config.context_len, created=int(time.time()))
        self.context_len = config.context_len
        self.max_active = config.max_active
        self.generation_defaults = config.generation
        self.special_markers: dict[str, int] = {}
        self.failure: Error | None = None
        self._capacity = config.max_active + config.max_pending
        self._lock = threading.Condition()
        self._pending: deque[_Flow] = deque()
        self._counts = _Counts()
        self._is_closed = False
        self._thread = threading.Thread(target=self._run, name="flare-flood", daemon=True)
        self._thread.start()

    def prepare_chat(self, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Mapping[str, Any]] | None,
                     options: Mapping[str, Any], chat_template: str | None = None) -> PreparedPrompt:
        if chat_template is not None:
            raise FrontendError("a request's own chat template needs a tokenizer, which the flood engine has none "
                                "of", code="unsupported", param="chat_template")
        return byte_chat_prompt(messages, tools, options)

    def prepare_text(self, prompt: str | Sequence[int]) -> PreparedPrompt:
        return byte_text_prompt(prompt)

    def token_bytes(self, token_id: int) -> bytes:
        return self._tokenizer.token_bytes(token_id)

    def prepare_grammar(self, request: GrammarRequest):
        raise FrontendError("structured output needs a model, which the flood engine has none of",
                            code="unsupported", param=request.param)

    def submit(self, prompt: PreparedPrompt, params: SamplingParams, sink: EventSink, grammar=None) -> _Ticket:
        flow = _Flow(len(prompt), params.max_tokens, sink)
        with self._lock:
            if self._is_closed:
                raise AdmissionError("the model worker is unavailable (shutting down)", status=503,
                                     code="worker_unavailable")
            if len(self._pending) + len(self._counts.active) >= self._capacity:
                raise AdmissionError(f"model admission capacity of {self._capacity} requests is exhausted",
                                     status=503, code="capacity_exhausted")
            self._pending.append(flow)
            self._counts.admitted += 1
            self._lock.notify()
        return _Ticket(flow)

    def shed_queued(self, error: Error) -> None:
        with self._lock:
            shed, self._pending = list(self._pending), deque()
        for flow in shed:
            flow.sink(ErrorEvent(error))

    def stats(self) -> EngineStats:
        with self._lock:
            c = self._counts
            return EngineStats(requests_admitted=c.admitted, requests_completed=c.completed,
                               requests_cancelled=c.cancelled, generated_tokens=c.generated,
                               slots_live=len(c.active), slots_free=self.max_active - len(c.active),
                               requests_pending=len(self._pending))

    def close(self, timeout: float | None = None) -> None:
        with self._lock:
            self._is_closed = True
            self._lock.notify()
        self._thread.join(timeout)

    def _run(self) -> None:
        counts = self._counts
        while True:
            with self._lock:
                while not self._is_closed and not counts.active and not self._pending:
                    self._lock.wait()
                if self._is_closed:
                    return
                while self._pending and len(counts.active) < self.max_active:
                    counts.active.append(self._pending.popleft())
                active = list(counts.active)
            done = []
            for flow in active:
                if flow.is_cancelled:
                    done.append(flow)
                    continue
                token = _FILLER[flow.sent % len(_FILLER)]
                flow.sent += 1
                flow.sink(TokenEvent((token,), _TEXTS[token]))
                if flow.sent >= flow.max_tokens:
                    flow.sink(FinishEvent("length", Usage(flow.prompt_len, flow.sent, 0), None))
                    done.append(flow)
            with self._lock:
                counts.generated += len(active) - sum(f.is_cancelled for f in done)
                for flow in done:
                    counts.active.remove(flow)
                    if flow.is_cancelled:
                        counts.cancelled += 1
                    else:
                        counts.completed += 1


def main(argv: Sequence[str] | None = None) -> int:
    """Serve a FloodEngine with the normal server flags (tools/bench_http.py)."""
    import argparse
    import os

    from ..server.options import add_server_arguments, load_server_config
    from ..server.session import serve

    parser = argparse.ArgumentParser(prog="python -m flare.testing.flood_engine", description=main.__doc__)
    add_server_arguments(parser)
    parser.add_argument("--model-slots", type=int, default=64)
    parser.add_argument("--model-queue", type=int, default=1024)
    args = parser.parse_args(argv)
    config = load_server_config(args, os.environ)
    flood = FakeEngineConfig(served_names=config.served_names, max_active=args.model_slots,
                             max_pending=args.model_queue)
    return serve(lambda progress: FloodEngine(flood), config)


if __name__ == "__main__":
    raise SystemExit(main())

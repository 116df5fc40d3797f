"""A deterministic fake model behind the Engine protocol, for tests and benchmarks.

:class:`FakeEngine` tokenizes by UTF-8 bytes (token ``b`` is byte ``b``,
:data:`EOS_ID` ends a reply), renders chat messages in a ChatML-like layout,
and generates from one thread of its own, like the real runtime: every step
publishes one token to each active request and then waits for the next step
(``tokens_per_s`` per request; 0 runs steps back to back). Chat replies echo
the last user message ("You said: ..."), completions continue with a fixed
filler text; after the reply comes EOS unless ``ignore_eos``, in which case
the filler repeats until max_tokens.

It honours max_tokens, stop strings (withheld, never emitted), stop_token_ids,
ignore_eos, logprobs and cancellation; it raises the admission errors of the
real runtime (400 context, 503 capacity, 503 closed), reports prefix reuse
in 64-token pages against earlier prompts, and counts the stats named in
docs/metrics.md. Two markers in the prompt inject failures:
``FLARE_FAKE_FAIL`` ends the request with an ExecutionError after two tokens,
``FLARE_FAKE_CRASH`` does the same and marks the whole runtime failed
(``failure``, which makes the server exit 1), ``FLARE_FAKE_TEMPLATE_ERROR``
makes chat preparation raise a FrontendError.

``python -m flare.testing.fake_engine`` serves it through :func:`flare.server.app.serve`
(used by the subprocess lifecycle tests and the benchmark).
"""

from __future__ import annotations

import codecs
import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ..config import PAGE_TOKENS
from ..engine.output import StopText
from ..engine.telemetry import EngineStats
from ..errors import AdmissionError, Error, ExecutionError, FrontendError
from ..request import (
    ErrorEvent,
    EventSink,
    FinishEvent,
    ModelCard,
    PreparedPrompt,
    SamplingParams,
    TokenEvent,
    TokenLogprob,
    Usage,
)

EOS_ID = 256
VOCAB_SIZE = 257
FAIL_MARKER = "FLARE_FAKE_FAIL"
CRASH_MARKER = "FLARE_FAKE_CRASH"
TEMPLATE_ERROR_MARKER = "FLARE_FAKE_TEMPLATE_ERROR"
FILLER = ("The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. "
          "How vexingly quick daft zebras jump! ")
MAX_REMEMBERED_PROMPTS = 64


@dataclass(frozen=True)
class FakeEngineConfig:
    """Knobs of the fake model."""

    identifier: str = "flare-test/fake-model"
    served_names: tuple[str, ...] = ()
    context_len: int = 4096
    max_active: int = 8  # model slots
    max_pending: int = 64  # admitted requests waiting for a slot; beyond: 503
    tokens_per_s: float = 200.0  # per request; 0 = steps back to back
    reply_prefix: str = "You said: "


@dataclass(eq=False)  # identity semantics: list.remove must never compare prompts
class _Live:
    prompt: PreparedPrompt
    params: SamplingParams
    sink: EventSink
    reply: bytes
    cached_tokens: int
    decoder: Any = field(default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace"))
    num_generated: int = 0
    stops: StopText = None  # withheld text that may start a stop string (set in submit)
    pending_ids: list[int] = field(default_factory=list)
    pending_logprobs: list[TokenLogprob] = field(default_factory=list)
    is_cancelled: bool = False
    num_failed_after: int = -1
    is_crash: bool = False


class FakeTicket:
    """Cancels its request; safe from any thread, any number of times."""

    def __init__(self, engine: "FakeEngine", live: _Live):
        self._engine = engine
        self._live = live

    def cancel(self) -> None:
        self._engine._cancel(self._live)


class FakeEngine:
    """See the module docstring. Implements flare.engine.base.Engine."""

    def __init__(self, config: FakeEngineConfig = FakeEngineConfig()):
        if config.max_active < 1 or config.context_len < 2:
            raise ExecutionError(f"the fake model needs max_active >= 1 and context_len >= 2, got "
                                 f"{config.max_active} and {config.context_len}")
        self.config = config
        self.context_len = config.context_len
        self.max_active = config.max_active
        self.card = ModelCard(identifier=config.identifier, served_names=config.served_names,
                              max_model_len=config.context_len, created=int(time.time()))
        self._lock = threading.Condition()
        self._pending: deque[_Live] = deque()
        self._active: list[_Live] = []
        self._prompts: deque[np.ndarray] = deque(maxlen=MAX_REMEMBERED_PROMPTS)
        self._stats: dict[str, float] = {}  # EngineStats counters by name
        self._decode_steps = 0
        self._is_closed = False
        self.failure: ExecutionError | None = None  # set when the runtime cannot go on
        self._thread = threading.Thread(target=self._run, name="flare-fake-model", daemon=True)
        self._thread.start()

    # -- frontend (worker threads) -------------------------------------------

    def prepare_chat(self, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Mapping[str, Any]] | None,
                     options: Mapping[str, Any]) -> PreparedPrompt:
        pieces: list[str] = []
        endpoints: list[int] = []
        num_bytes = 0

        def emit(text: str, mark: bool) -> None:
            nonlocal num_bytes
            pieces.append(text)
            num_bytes += len(text.encode("utf-8"))
            if mark:
                endpoints.append(num_bytes)

        if tools:
            emit("<|im_start|>system\nTools: " + json.dumps(list(tools), sort_keys=True) + "<|im_end|>\n", True)
        for message in messages:
            content = message.get("content") or ""
            if TEMPLATE_ERROR_MARKER in content:
                raise FrontendError("template raised an exception: fake template error")
            calls = message.get("tool_calls")
            if calls:
                content += "".join("<tool_call>" + json.dumps(c["function"], sort_keys=True) + "</tool_call>"
                                   for c in calls)
            emit(f"<|im_start|>{message['role']}\n{content}<|im_end|>\n", True)
        if options.get("add_generation_prompt", True):
            emit("<|im_start|>assistant\n", False)
        text = "".join(pieces)
        ids = np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)
        inside = tuple(e for e in endpoints if 0 < e < len(ids))
        return PreparedPrompt(token_ids=ids, message_endpoints=inside, text=text)

    def prepare_text(self, prompt: str | Sequence[int]) -> PreparedPrompt:
        if isinstance(prompt, str):
            ids = np.frombuffer(prompt.encode("utf-8"), dtype=np.uint8).astype(np.int32)
            return PreparedPrompt(token_ids=ids, text=prompt)
        bad = [t for t in prompt if not 0 <= t < VOCAB_SIZE]
        if bad:
            raise FrontendError(f"token ID {bad[0]} is outside the vocabulary of {VOCAB_SIZE}")
        return PreparedPrompt(token_ids=np.asarray(prompt, dtype=np.int32))

    def token_bytes(self, token_id: int) -> bytes:
        return bytes([token_id]) if 0 <= token_id < 256 else b""

    # -- admission (event loop) ----------------------------------------------

    def submit(self, prompt: PreparedPrompt, params: SamplingParams, sink: EventSink) -> FakeTicket:
        if len(prompt) + params.max_tokens > self.context_len:
            raise AdmissionError(f"prompt of {len(prompt)} tokens plus max_tokens of {params.max_tokens} exceeds "
                                 f"the context of {self.context_len} tokens", status=400,
                                 code="context_length_exceeded")
        text = prompt.text if prompt.text is not None else bytes(
            int(t) for t in prompt.token_ids if t < 256).decode("utf-8", "replace")
        with self._lock:
            if self._is_closed:
                raise AdmissionError("the model worker is not running", status=503, code="worker_unavailable")
            if len(self._pending) >= self.config.max_pending:
                raise AdmissionError(f"model admission capacity exhausted ({self.config.max_pending} requests "
                                     f"waiting for {self.max_active} slots)", status=503,
                                     code="model_capacity_exhausted")
            live = _Live(prompt, params, sink, self._reply(text), self._lookup_prefix(prompt.token_ids),
                         stops=StopText(params.stop))
            if FAIL_MARKER in text or CRASH_MARKER in text:
                live.num_failed_after = 2
                live.is_crash = CRASH_MARKER in text
            self._pending.append(live)
            self._count("requests_admitted")
            self._lock.notify()
        return FakeTicket(self, live)

    def _reply(self, prompt_text: str) -> bytes:
        if prompt_text.endswith("<|im_start|>assistant\n"):
            start = prompt_text.rfind("<|im_start|>user\n")
            last = prompt_text[start + 17:].split("<|im_end|>", 1)[0] if start >= 0 else ""
            return (self.config.reply_prefix + last).encode("utf-8")
        return FILLER.encode("utf-8")

    def _lookup_prefix(self, ids: np.ndarray) -> int:
        """Longest page-aligned prefix shared with a remembered prompt (caller holds the lock)."""
        best = 0
        for old in self._prompts:
            n = min(len(old), len(ids))
            diff = np.flatnonzero(old[:n] != ids[:n])
            common = int(diff[0]) if diff.size else n
            best = max(best, common // PAGE_TOKENS * PAGE_TOKENS)
        # The last token is always recomputed so that sampling has logits.
        best = min(best, (len(ids) - 1) // PAGE_TOKENS * PAGE_TOKENS)
        self._prompts.append(ids.copy())
        self._count("prefix_lookups")
        self._count("prefix_hits" if best else "prefix_misses")
        self._count("prefix_reused_tokens", best)
        return best

    def _cancel(self, live: _Live) -> None:
        with self._lock:
            if not live.is_cancelled:
                live.is_cancelled = True
                self._lock.notify()

    def stats(self) -> EngineStats:
        with self._lock:
            return EngineStats(**self._stats, slots_live=len(self._active),
                               slots_free=self.max_active - len(self._active), requests_pending=len(self._pending),
                               launches={"decode": self._decode_steps})

    def shed_queued(self, error: Error) -> None:
        """End every request still waiting for a slot with ``error`` (shutdown)."""
        with self._lock:
            shed, self._pending = list(self._pending), deque()
            for live in shed:
                if not live.is_cancelled:
                    live.is_cancelled = True
                    self._count("requests_cancelled")
                    live.sink(ErrorEvent(error))

    def close(self, timeout: float | None = None) -> None:
        with self._lock:
            self._is_closed = True
            self._lock.notify()
        self._thread.join(timeout)

    def _count(self, key: str, amount: float = 1) -> None:
        self._stats[key] = self._stats.get(key, 0) + amount

    # -- the model thread ----------------------------------------------------

    def _run(self) -> None:
        interval = 1.0 / self.config.tokens_per_s if self.config.tokens_per_s > 0 else 0.0
        next_step = time.monotonic()
        while True:
            with self._lock:
                while not self._is_closed and not self._active and not self._pending:
                    self._lock.wait()
                    next_step = time.monotonic()
                if self._is_closed:
                    doomed = self._active + list(self._pending)
                    self._active, self._pending = [], deque()
                    break
                while self._pending and len(self._active) < self.max_active:
                    self._active.append(self._pending.popleft())
                finished = [live for live in self._active if live.is_cancelled]
                for live in finished:
                    self._active.remove(live)
                    self._count("requests_cancelled")
                self._pending = deque(live for live in self._pending if not self._drop_cancelled(live))
                active = list(self._active)
            done = [live for live in active if self._step(live)]
            with self._lock:
                for live in done:
                    if live in self._active:
                        self._active.remove(live)
                self._decode_steps += 1
                self._count("generated_tokens", len(active))
            if interval:
                next_step += interval
                delay = next_step - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                else:
                    next_step = time.monotonic()
            else:
                # NOTE: a real runtime releases the GIL while the device runs a step;
                # without this a back-to-back fake would hold it for whole switch intervals.
                time.sleep(0)
        for live in doomed:
            if live.is_cancelled:
                with self._lock:
                    self._count("requests_cancelled")
            else:
                live.sink(ErrorEvent(ExecutionError("the model worker stopped before the request finished")))

    def _drop_cancelled(self, live: _Live) -> bool:
        if live.is_cancelled:
            self._count("requests_cancelled")
        return live.is_cancelled

    def _step(self, live: _Live) -> bool:
        """Generate one token for ``live``; True when it reached a terminal event."""
        params = live.params
        index = live.num_generated
        if index < len(live.reply):
            token = live.reply[index]
        elif params.ignore_eos:
            token = FILLER.encode("utf-8")[(index - len(live.reply)) % len(FILLER)]
        else:
            token = EOS_ID
        live.num_generated += 1
        live.pending_ids.append(token)
        if params.logprobs:
            live.pending_logprobs.append(self._logprob(token, params.top_logprobs))
        if live.num_failed_after >= 0 and live.num_generated > live.num_failed_after:
            error = ExecutionError("fake execution failure (%s)" % (CRASH_MARKER if live.is_crash else FAIL_MARKER))
            if live.is_crash:
                self.failure = error
            self._finish_error(live, error)
            return True
        if token == EOS_ID or token in params.stop_token_ids:
            return self._finish(live, "stop", token if token != EOS_ID else None)
        text, stop = live.stops.feed(live.decoder.decode(bytes([token])))
        if stop is not None:
            return self._finish(live, "stop", stop, text)
        if live.num_generated >= params.max_tokens:
            return self._finish(live, "length", None, text)
        if text:
            self._publish(live, text)
        return False

    def _publish(self, live: _Live, text: str) -> None:
        if live.is_cancelled:
            return
        logprobs = tuple(live.pending_logprobs) if live.params.logprobs else None
        live.sink(TokenEvent(tuple(live.pending_ids), text, logprobs))
        live.pending_ids = []
        live.pending_logprobs = []

    def _finish(self, live: _Live, reason: str, stop: str | int | None, text: str = "") -> bool:
        if reason == "stop" and not isinstance(stop, str):
            # EOS and stop tokens count as generated but are not output.
            live.pending_ids.pop()
            if live.pending_logprobs:
                live.pending_logprobs.pop()
        if not isinstance(stop, str):
            tail, matched = live.stops.flush(live.decoder.decode(b"", final=True))
            text += tail
            if matched is not None:
                reason, stop = "stop", matched
        if text or live.pending_ids:
            self._publish(live, text)
        usage = Usage(len(live.prompt), live.num_generated, live.cached_tokens)
        with self._lock:
            self._count("requests_completed")
        if not live.is_cancelled:
            live.sink(FinishEvent(reason, usage, stop))
        return True

    def _finish_error(self, live: _Live, error: ExecutionError) -> None:
        with self._lock:
            self._count("requests_failed")
        if not live.is_cancelled:
            live.sink(ErrorEvent(error))

    @staticmethod
    def _logprob(token: int, top: int) -> TokenLogprob:
        chosen = -0.125 * (token % 8)
        alternatives = [(token, chosen)] + [((token + k) % 256, chosen - 0.5 * k) for k in range(1, top)]
        return TokenLogprob(token, chosen, tuple(alternatives[:top]))


def main(argv: Sequence[str] | None = None) -> int:
    """Serve a FakeEngine with the normal server flags (tests and benchmarks)."""
    import argparse
    import os

    from ..server.options import add_server_arguments, load_server_config
    from ..server.session import serve

    parser = argparse.ArgumentParser(prog="python -m flare.testing.fake_engine", description=main.__doc__)
    add_server_arguments(parser)
    parser.add_argument("--tokens-per-s", type=float, default=FakeEngineConfig.tokens_per_s)
    parser.add_argument("--model-slots", type=int, default=FakeEngineConfig.max_active)
    parser.add_argument("--model-queue", type=int, default=FakeEngineConfig.max_pending)
    parser.add_argument("--context-len", type=int, default=FakeEngineConfig.context_len)
    args = parser.parse_args(argv)
    config = load_server_config(args, os.environ)
    fake = FakeEngineConfig(served_names=config.served_names, context_len=args.context_len,
                            max_active=args.model_slots, max_pending=args.model_queue,
                            tokens_per_s=args.tokens_per_s)
    return serve(lambda progress: FakeEngine(fake), config)


if __name__ == "__main__":
    raise SystemExit(main())

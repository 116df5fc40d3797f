"""ModelRuntime: one model thread owning the scheduler and an executor.

Each turn of the model thread::

    admit new requests -> poll completions -> RequestScheduler.complete
    -> advance grammars (structured output: consume tokens, next masks)
    -> publish tokens (incremental detokenization, stop strings, EOS, max tokens)
    -> retire terminals -> plan -> commit(next fence) -> pack inputs -> submit

Structured output: a step that samples a constrained request carries that request's
next-token bitmask, which depends on the token its previous step sampled. When that step
is still in flight, the new one is submitted grammar-constrained, i.e. held: the device
runs its forward part while the previous step completes, the grammars take that step's
tokens, and ``release`` uploads the masks so its sampling can run. Nothing else is
submitted while a step is held, so each constrained request has one step in flight and
the host's mask work overlaps the forward (a departure from the spec's empty-window
rule, docs/architecture.md). Unconstrained rows ride in the same steps. A grammar that
reaches its end finishes the request (reason stop).

The thread never blocks on the network: events go to each request's sink,
which the server forwards to its event loop. Publication is ordered per
request and ends with exactly one FinishEvent or ErrorEvent.

Failure: an exception in the model thread (or a failed completion) notifies
every active, pending and queued consumer with the error, then drains the
executor; scheduler resources are released only after the drain is
confirmed. The runtime never restarts; later submissions get a 503.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Protocol

from ..contract import GraphKind
from ..errors import AdmissionError, Error, ExecutionError
from ..execution.base import ExecutionCompletion
from ..frontend.grammar import Matcher, advance_all, fill_masks
from ..model.inputs import Inputs, pack_step
from ..request import (
    ErrorEvent,
    EventSink,
    FinishEvent,
    PreparedPrompt,
    RequestTimes,
    SamplingParams,
    TokenEvent,
    TokenLogprob,
    Usage,
)
from ..scheduler.errors import CapacityError
from ..scheduler.plan import StepResult
from ..scheduler.scheduler import RequestScheduler
from ..scheduler.speculation import SpeculationCounters
from ..scheduler.steps import LAUNCH_NAMES
from .output import StopText
from .telemetry import PUBLISH_INTERVAL_S, EngineStats
from .trace import CompletionTrace, RequestState

log = logging.getLogger("flare.runtime")

_NO_SPECULATION = SpeculationCounters()  # the counters of a scheduler without speculation: all zero
IDLE_WAIT_S = 0.05
BUSY_POLL_S = 0.002


class TextDecoder(Protocol):
    def push(self, token_ids) -> str: ...

    def flush(self) -> str: ...


@dataclass(eq=False)
class _Consumer:
    """Publication state of one request (model thread only)."""

    prompt: PreparedPrompt
    params: SamplingParams
    sink: EventSink
    decoder: TextDecoder
    arrival: float
    rid: int = 0
    num_tokens: int = 0
    stops: StopText = None  # decoded text withheld while it may start a stop string
    is_done: bool = False
    is_cancelled: bool = False
    is_released: bool = False  # its model admission capacity is given back (guarded by the runtime's lock)
    cached_tokens: int = 0
    first_token_at: float | None = None
    grammar: Matcher | None = None  # structured output: the request's place in its grammar
    grammar_fence: int = 0  # the last submitted step that samples for it (its mask waits on that one)
    bursts: int = 0  # steps whose output was published (the dashboard's Bursts)
    last_output_ns: int = 0  # when output was last published (kept only while a dashboard traces)


class RuntimeTicket:
    """Returned by submit; cancel() may be called from any thread."""

    __slots__ = ("_runtime", "_consumer")

    def __init__(self, runtime: "ModelRuntime", consumer: _Consumer):
        self._runtime = runtime
        self._consumer = consumer

    def cancel(self) -> None:
        self._runtime._request_cancel(self._consumer)


@dataclass
class RuntimeCounters:
    requests_admitted: int = 0
    requests_completed: int = 0
    requests_cancelled: int = 0
    requests_failed: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    device_busy_ns: int = 0  # summed measured durations of completed steps
    grammar_steps: int = 0  # steps that sample for a constrained request
    grammar_held_steps: int = 0  # of those, steps submitted before their masks were known
    launches: dict = field(default_factory=dict)


class ModelRuntime:
    def __init__(self, scheduler: RequestScheduler, executor, *, decoder_factory: Callable[[], TextDecoder],
                 capacity: int, capacity_hint: str = "", name: str = "flare-model"):
        self.scheduler = scheduler
        self.executor = executor
        scheduler.seed_estimates(executor.graph_estimates_ns)
        self.inputs = Inputs(scheduler.contract)
        self.decoder_factory = decoder_factory
        self.capacity = capacity
        self.capacity_hint = capacity_hint
        self.counters = RuntimeCounters()
        self.failure: ExecutionError | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._ingress: deque[_Consumer] = deque()
        self._cancels: deque[_Consumer] = deque()
        self._consumers: dict[int, _Consumer] = {}  # rid -> consumer, admitted to the scheduler
        self._constrained: dict[int, _Consumer] = {}  # rid -> consumer with a grammar (structured output)
        self._held: tuple[int, list] | None = None  # (fence, [(slot, consumer)]) of a step awaiting masks
        self._accepted = 0  # requests accepted, not yet terminal nor cancelled (model admission capacity)
        self._closing = False
        self._shed: Error | None = None  # end queued requests with this error (model thread)
        self._drained = False
        self._stats_at = 0.0
        self._stats = EngineStats()
        self._terminals: list = []  # (consumer, terminal event) waiting for a statistics publish
        self._is_publishing = False
        self.trace: CompletionTrace | None = None  # dashboard telemetry, only while one runs (engine/trace.py)
        self._publish_stats(force=True)
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    # -- any thread -------------------------------------------------------------

    def submit(self, prompt: PreparedPrompt, params: SamplingParams, sink: EventSink,
               grammar: Matcher | None = None) -> RuntimeTicket:
        """Queue a request; ``grammar`` (required when ``params.grammar`` is set) constrains its output."""
        if (grammar is None) != (params.grammar is None):
            raise ValueError("a constrained request needs its matcher, and a matcher its constraint")
        consumer = _Consumer(prompt, params, sink, self.decoder_factory(), time.monotonic(),
                             stops=StopText(params.stop), grammar=grammar)
        with self._lock:
            if self.failure is not None or self._closing:
                raise AdmissionError("the model worker is unavailable"
                                     + (f": {self.failure}" if self.failure else " (shutting down)"),
                                     status=503, code="worker_unavailable", hint=self.capacity_hint or None)
            if self._accepted >= self.capacity:
                raise AdmissionError(f"model admission capacity of {self.capacity} requests is exhausted",
                                     status=503, code="capacity_exhausted", hint=self.capacity_hint or None)
            self._accepted += 1
            self._ingress.append(consumer)
        self._wake.set()
        return RuntimeTicket(self, consumer)

    def _request_cancel(self, consumer: _Consumer) -> None:
        # The capacity is given back now, not when the model thread gets to the cancel:
        # the HTTP layer frees its permit as soon as a disconnected handler returns, and a
        # request arriving then must not find the model's admission still full. The model
        # thread handles every cancel before the arrivals of the same turn, so the
        # scheduler never holds more than the capacity.
        with self._lock:
            self._cancels.append(consumer)
            self._release(consumer)
        self._wake.set()

    def _release(self, consumer: _Consumer) -> None:
        """Give back ``consumer``'s admission capacity, once (with the lock held)."""
        if not consumer.is_released:
            consumer.is_released = True
            self._accepted -= 1

    def shed_queued(self, error: Error) -> None:
        """End every request not yet holding a slot with ``error``; later arrivals still queue."""
        with self._lock:
            self._shed = error
        self._wake.set()

    def close(self, timeout: float | None = None) -> None:
        """Stop admission, cancel what is left, drain the executor, join the thread."""
        with self._lock:
            self._closing = True
        self._wake.set()
        self._thread.join(timeout)

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def drained(self) -> bool:
        return self._drained

    def stats(self) -> EngineStats:
        """The latest statistics the model thread published (any thread)."""
        return self._stats

    def start_trace(self) -> CompletionTrace:
        """Begin dashboard telemetry (any thread); the model thread writes it from its next turn."""
        if self.trace is None:
            self.trace = CompletionTrace()
        return self.trace

    def stop_trace(self) -> None:
        self.trace = None

    def _publish_stats(self, force: bool = False) -> None:
        """Build a new EngineStats (model thread), at most every PUBLISH_INTERVAL_S unless forced."""
        now = time.monotonic()
        if not force and now - self._stats_at < PUBLISH_INTERVAL_S:
            return
        self._stats_at = now
        s = self.scheduler
        c = s.cache.counters()
        counters = self.counters
        sc = s.speculation.counters if s.speculation is not None else _NO_SPECULATION
        self._stats = EngineStats(
            speculative_verification_steps=sc.verification_steps, speculative_drafter_steps=sc.drafter_steps,
            speculative_draft_tokens=sc.draft_positions, speculative_accepted_tokens=sc.accepted_drafts,
            speculative_draft_rounds=sc.draft_rounds, speculative_generation_rounds=sc.generation_rounds,
            speculative_mean_acceptance_length=sc.mean_acceptance_length, speculative_depth=sc.depth,
            requests_admitted=counters.requests_admitted, requests_completed=counters.requests_completed,
            requests_cancelled=counters.requests_cancelled, requests_failed=counters.requests_failed,
            prefix_lookups=c.lookups, prefix_hits=c.hits, prefix_misses=c.misses,
            prefix_reused_tokens=c.reused_tokens, checkpoints_published=c.publications,
            checkpoint_evictions=c.evictions, prompt_tokens=counters.prompt_tokens,
            generated_tokens=counters.generated_tokens, device_busy_seconds=counters.device_busy_ns * 1e-9,
            slots_live=s.num_live, slots_free=s.slots.num_free, slots_retiring=s.slots.num_retiring,
            pages_reusable=s.pages.num_free, snapshots_reusable=s.rows.num_free,
            checkpoints_cached=c.cached_checkpoints, pages_cached=c.cached_pages,
            requests_pending=s.num_queued + len(self._ingress), grammar_steps=counters.grammar_steps,
            grammar_held_steps=counters.grammar_held_steps, requests_preempted=s.num_preemptions,
            preempted_restored=s.num_preempt_restored, preempted_recomputed=s.num_preempt_recomputed,
            launches={LAUNCH_NAMES[kind]: count for kind, count in s.launches.items()})

    def _request_states(self) -> tuple[RequestState, ...]:
        """Every request holding a slot, for the dashboard's request-state sample."""
        s = self.scheduler
        table, client = s.table, s.client_rid
        states = []
        for req in s.live.values():
            slot = req.slot
            if not slot:
                continue
            consumer = self._consumers.get(client(req.rid))
            arrival, last, bursts = ((int(consumer.arrival * 1e9), consumer.last_output_ns, consumer.bursts)
                                     if consumer is not None else (0, 0, 0))
            states.append(RequestState(slot, int(table.generation[slot]), req.phase.name.lower(),
                                       min(int(table.consumed[slot]), req.prompt_len), req.prompt_len,
                                       int(table.generated[slot]), arrival,
                                       int(table.last_progress[slot] * 1e9), last, bursts))
        return tuple(states)

    # -- model thread -----------------------------------------------------------

    def _main(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # noqa: BLE001 - every failure must reach consumers
            error = exc if isinstance(exc, ExecutionError) else ExecutionError(
                f"model worker failed: {type(exc).__name__}: {exc}")
            if error is not exc:
                error.__cause__ = exc
            log.error("model runtime failed: %s", error, exc_info=exc)
            with self._lock:
                self.failure = error
            self._fail_all(error)
        finally:
            self._shutdown()

    def _loop(self) -> None:
        ex, sched = self.executor, self.scheduler
        while True:
            with self._lock:
                closing = self._closing
                shed, self._shed = self._shed, None
                arrivals = list(self._ingress)
                self._ingress.clear()
                cancels = list(self._cancels)
                self._cancels.clear()
            trace = self.trace
            if trace is not None and trace.wants_sample:
                trace.publish_sample(self._request_states())
            for consumer in cancels:  # first: their capacity went to later arrivals
                self._cancel(consumer)
            for consumer in arrivals:
                self._admit(consumer)
            if shed is not None:
                # a preempted request's continuation has streamed already: active, not queued
                queued = {req.rid for req in sched.queue if req.base_outputs is None}
                for consumer in [c for c in self._consumers.values() if c.rid in queued]:
                    self._cancel(consumer, ErrorEvent(shed))
            if closing:
                for consumer in list(self._consumers.values()):
                    self._cancel(consumer, ErrorEvent(AdmissionError(
                        "the server is shutting down", status=503, code="shutting_down")))
                if not sched.inflight:
                    return
            progressed = bool(arrivals or cancels)
            while (done := ex.poll(0)) is not None:
                self._complete(done, closing)
                progressed = True
            if self._fill_window(closing):
                progressed = True
            if progressed:
                self._publish_stats()
                continue
            if ex.outstanding:
                self._publish_stats()
                done = ex.poll(BUSY_POLL_S)
                if done is not None:
                    self._complete(done, closing)
            else:
                self._publish_stats(force=True)  # idle: what readers see is exact
                self._wake.wait(IDLE_WAIT_S)
                self._wake.clear()

    def _fill_window(self, closing: bool) -> bool:
        """Plan, commit and submit while the executor has a free frame; whether any was."""
        ex, sched = self.executor, self.scheduler
        submitted = False
        while not closing and ex.can_submit():
            plan = sched.plan()
            if plan is None:
                break
            constrained = self._constrained_rows(plan) if self._constrained else ()
            waiting = []
            if constrained:
                # A mask is known once every step that sampled for its request has completed;
                # the others wait for the step in flight, so this one is submitted held.
                known = ex.completed_fence
                ready = [(slot, c) for slot, c in constrained if c.grammar_fence <= known]
                waiting = [(slot, c) for slot, c in constrained if c.grammar_fence > known]
                self.inputs.set_grammar_masks([slot for slot, _ in ready], [c.grammar.mask for _, c in ready])
            step = sched.commit(plan, ex.next_fence)
            fence = ex.submit(plan.graph_index, pack_step(self.inputs, step), grammar_constrained=bool(waiting))
            trace = self.trace
            if trace is not None:
                trace.last_submitted = (plan.graph_index, plan.estimate_ns)
            for _, consumer in constrained:
                consumer.grammar_fence = fence
            if waiting:
                self._held = (fence, waiting)
                self.counters.grammar_held_steps += 1
            self.counters.grammar_steps += bool(constrained)
            if plan.kind == GraphKind.PREFILL:
                self.counters.prompt_tokens += int(plan.cols.num_tokens.sum())
            elif plan.kind == GraphKind.MIXED:
                self.counters.prompt_tokens += int(plan.cols.num_tokens[plan.decode_rows:].sum())
            submitted = True
        return submitted

    def _release_held(self) -> None:
        """Upload the masks of the held step's constrained rows, now that the step before it
        completed and their grammars took its tokens. A row whose request ended meanwhile gets
        no new mask: its device row keeps the last one (which allowed a token), and the
        scheduler discards what that row samples."""
        fence, waiting = self._held
        if self.executor.completed_fence < fence - 1:
            return
        self._held = None
        live = [(slot, c) for slot, c in waiting
                if not c.is_done and c.grammar.failure is None and not c.grammar.is_stopped]
        self.inputs.set_grammar_masks([slot for slot, _ in live], [c.grammar.mask for _, c in live])
        self.executor.release(fence, self.inputs.take())

    def _constrained_rows(self, plan) -> list:
        """(slot, consumer) of each constrained request the plan samples for."""
        cols = plan.cols
        rows = []
        client = self.scheduler.client_rid
        for rid, slot, sample in zip(cols.rids.tolist(), cols.slots.tolist(), cols.sample.tolist()):
            consumer = self._constrained.get(client(rid))
            if consumer is not None and sample:
                rows.append((slot, consumer))
        return rows

    def _advance_grammars(self, result: StepResult) -> list[_Consumer]:
        """Feed each constrained request the tokens this step sampled and refill its mask;
        returns those whose grammar is complete (they finish once their tokens are published).
        A request that ended here anyway (EOS, length) needs no further mask."""
        by_rid: dict[int, list[int]] = {}
        for rid, token in zip(result.rids.tolist(), result.token_ids.tolist()):
            if rid in self._constrained:
                by_rid.setdefault(rid, []).append(token)
        if not by_rid:
            return []
        ended = {e.rid for e in result.ended}
        steps = [(self._constrained[rid], tokens) for rid, tokens in by_rid.items()
                 if rid not in ended and not self._constrained[rid].is_done]
        advance_all([(consumer.grammar, tokens) for consumer, tokens in steps])
        refill, complete = [], []
        for consumer, _ in steps:
            failure = consumer.grammar.failure
            if failure is not None:
                self._fail(consumer, failure)
            elif consumer.grammar.is_stopped:
                self.scheduler.finish(consumer.rid, "stop")
                complete.append(consumer)
            else:
                refill.append(consumer)
        fill_masks([c.grammar for c in refill])
        for consumer in refill:
            failure = consumer.grammar.failure
            if failure is not None:
                self._fail(consumer, failure)
        return complete

    def _fail(self, consumer: _Consumer, error: Error) -> None:
        """End one request with ``error``; the others go on."""
        if consumer.is_done:
            return
        log.warning("request %d failed: %s", consumer.rid, error)
        self.scheduler.cancel(consumer.rid)
        self._consumers.pop(consumer.rid, None)
        self.counters.requests_failed += 1
        self._end(consumer, ErrorEvent(error))

    def _admit(self, consumer: _Consumer) -> None:
        if consumer.is_done:  # cancelled before the model thread saw it arrive
            return
        params = consumer.params
        seed = params.seed if params.seed is not None else random.getrandbits(63)
        try:
            consumer.rid = self.scheduler.submit(consumer.prompt, params, seed)
        except CapacityError as exc:
            self._end(consumer, ErrorEvent(exc))
            return
        self._consumers[consumer.rid] = consumer
        if consumer.grammar is not None:
            self._constrained[consumer.rid] = consumer
        self.counters.requests_admitted += 1

    def _cancel(self, consumer: _Consumer, event=None) -> None:
        """Stop a request; a client that went away gets no event, a shutdown gets one."""
        if consumer.is_done:
            return
        consumer.is_cancelled = True
        if consumer.rid:
            self.scheduler.cancel(consumer.rid)
            self._consumers.pop(consumer.rid, None)
        self.counters.requests_cancelled += 1
        self._end(consumer, event)

    def _complete(self, done: ExecutionCompletion, closing: bool) -> None:
        if done.error is not None:
            raise done.error
        trace = self.trace
        traced = self.scheduler.inflight[0].cols if trace is not None and self.scheduler.inflight else None
        result = self.scheduler.complete(done.fence, done.graph_index, done.records, done.duration_ns)
        if traced is not None:
            trace.record(done.graph_index, done.duration_ns, traced.slots, traced.generations)
        self.counters.device_busy_ns += done.duration_ns
        # The next masks come first: the held step (and the one that refills the window) may
        # sample these requests.
        complete = self._advance_grammars(result) if self._constrained else ()
        if self._held is not None:
            self._release_held()
        # Refill the freed frame before the host work of publishing (detokenizing and
        # handing tokens to every stream), so the device never waits on it. A request
        # that publishing then finishes (a stop string) may get one more pipelined step,
        # which the scheduler validates and discards like any step after an end.
        self._fill_window(closing)
        self._publish(result, done, complete)

    def _publish(self, result: StepResult, done: ExecutionCompletion, complete=()) -> None:
        self._is_publishing = True
        try:
            self._publish_step(result, done)
            for consumer in complete:  # their grammar ended: stop after the tokens that completed it
                self._finish(consumer, "stop", None)
        finally:
            self._is_publishing = False
        self._deliver_terminals()

    def _publish_step(self, result: StepResult, done: ExecutionCompletion) -> None:
        by_rid: dict[int, list] = {}
        for rid, token, slot in zip(result.rids.tolist(), result.token_ids.tolist(), result.slots.tolist()):
            by_rid.setdefault(rid, []).append((token, slot))
        ended = {e.rid: e for e in result.ended}
        live = self.scheduler.live
        for rid, outputs in by_rid.items():
            consumer = self._consumers.get(rid)
            if consumer is None or consumer.is_done:
                continue
            self.counters.generated_tokens += len(outputs)
            if consumer.first_token_at is None:
                consumer.first_token_at = time.monotonic()
                consumer.cached_tokens = live[rid].reused if rid in live else 0
            self._emit(consumer, outputs, done, ended.get(rid))
        for rid, end in ended.items():
            consumer = self._consumers.get(rid)
            if consumer is not None and not consumer.is_done:
                self._finish(consumer, end.reason, end.stop)

    def _emit(self, consumer: _Consumer, outputs, done: ExecutionCompletion, end) -> None:
        """Publish one step's tokens of a request (several from a speculative step). They are
        fed to the stop strings one by one: a match ends the request at the token that completed
        it, and the tokens after it are neither shown nor counted (as in one-token steps)."""
        params = consumer.params
        visible = []
        logprobs = [] if params.logprobs else None
        last = len(outputs) - 1
        texts, stop = [], None
        for i, (token, slot) in enumerate(outputs):
            consumer.num_tokens += 1
            if end is not None and end.stop == token and i == last:
                break  # the stop token itself is not shown
            visible.append(token)
            if logprobs is not None:
                row = done.logprobs[slot]
                ids = done.top_ids[slot]
                # a constrained row's forbidden tokens have probability 0 (logprob -inf): not shown
                top = tuple((int(ids[k]), float(row[1 + k])) for k in range(params.top_logprobs)
                            if row[1 + k] > -math.inf)
                logprobs.append(TokenLogprob(token, float(row[0]), top))
            piece = consumer.decoder.push((token,))
            text, stop = consumer.stops.feed(piece)
            texts.append(text)
            if stop is not None:
                break
        text = "".join(texts)
        if text or visible:
            consumer.sink(TokenEvent(tuple(visible), text, tuple(logprobs) if logprobs is not None else None))
            consumer.bursts += 1
            if self.trace is not None:
                consumer.last_output_ns = time.monotonic_ns()
        if stop is not None:
            self.scheduler.finish(consumer.rid, "stop")
            self._finish(consumer, "stop", stop)

    def _finish(self, consumer: _Consumer, reason: str, stop) -> None:
        if consumer.is_done:
            return
        if reason == "cancelled":
            self._cancel(consumer)
            return
        tail, matched = consumer.stops.flush(consumer.decoder.flush())
        if matched is not None and not isinstance(stop, str):
            reason, stop = "stop", matched
        if tail:
            consumer.sink(TokenEvent((), tail, () if consumer.params.logprobs else None))
        self._consumers.pop(consumer.rid, None)
        self.counters.requests_completed += 1
        usage = Usage(len(consumer.prompt), consumer.num_tokens, consumer.cached_tokens)
        times = RequestTimes(consumer.arrival, consumer.first_token_at, time.monotonic())
        self._end(consumer, FinishEvent(reason, usage, stop, times))

    def _end(self, consumer: _Consumer, event) -> None:
        """The consumer is done; its terminal event (if any) goes out after the statistics
        that count it are published, so a client that reads them on its last event sees
        itself counted. Within one step's publication the events wait for one publish."""
        consumer.is_done = True
        self._constrained.pop(consumer.rid, None)
        with self._lock:
            self._release(consumer)
        if event is not None:
            self._terminals.append((consumer, event))
            if not self._is_publishing:
                self._deliver_terminals()

    def _deliver_terminals(self) -> None:
        if not self._terminals:
            return
        self._publish_stats(force=True)
        terminals, self._terminals = self._terminals, []
        for consumer, event in terminals:
            try:
                consumer.sink(event)
            except Exception:  # noqa: BLE001 - a broken sink must not stop the model thread
                log.exception("event sink failed")

    def _fail_all(self, error: Error) -> None:
        with self._lock:
            queued = list(self._ingress)
            self._ingress.clear()
        for consumer in list(self._consumers.values()) + queued:
            if not consumer.is_done:
                self.counters.requests_failed += 1
                self._end(consumer, ErrorEvent(error))
        self._consumers.clear()

    def _shutdown(self) -> None:
        """Drain the executor, then release scheduler resources (only after a confirmed drain)."""
        try:
            self.executor.close()
            self._drained = True
        except BaseException:  # noqa: BLE001
            log.exception("executor drain failed; retaining prepared resources")
            self._publish_stats(force=True)
            return
        self.scheduler.release_after_shutdown()
        with self._lock:
            leftovers = list(self._ingress)
            self._ingress.clear()
        error = self.failure or ExecutionError("the model runtime shut down")
        for consumer in leftovers:
            if not consumer.is_done:
                self._end(consumer, ErrorEvent(error))
        self._publish_stats(force=True)

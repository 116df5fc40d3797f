"""The completion ring the model thread writes for the dashboard, on its own and in the real
runtime: nothing exists until a dashboard starts it, completions and request samples match
what the scheduler ran, a full ring or a held lock drops (and counts), and a write costs the
model thread less than 2 us."""

from __future__ import annotations

import time

import numpy as np
import pytest

from flare.config import EngineConfig
from flare.core.embedded import demo_core
from flare.engine.model import NativeModel
from flare.engine.trace import TRACE_CAPACITY, CompletionTrace
from flare.request import FinishEvent, SamplingParams, TokenEvent

ROWS = np.arange(1, 65, dtype=np.int64)


def test_ring_keeps_order_and_drops_when_full_or_locked():
    trace = CompletionTrace(capacity=4)
    for graph in range(6):
        trace.record(graph, 10 + graph, ROWS[:2], ROWS[:2])
    assert trace.dropped == 2
    drained = trace.drain()
    assert [c.graph_index for c in drained] == [0, 1, 2, 3] and [c.duration_ns for c in drained] == [10, 11, 12, 13]
    assert all(a.at_ns <= b.at_ns for a, b in zip(drained, drained[1:]))
    trace.record(7, 1, ROWS[:1], ROWS[:1])  # room again after the drain
    with trace._lock:  # the dashboard is draining: the model thread does not wait
        trace.record(8, 1, ROWS[:1], ROWS[:1])
    assert trace.dropped == 3 and [c.graph_index for c in trace.drain()] == [7]
    assert trace.drain() == []
    with pytest.raises(ValueError):
        CompletionTrace(capacity=1000)
    assert CompletionTrace().capacity == TRACE_CAPACITY == 1024


def test_a_write_costs_the_model_thread_under_two_microseconds():
    trace = CompletionTrace()
    per_batch = 1000
    best = float("inf")
    for _ in range(7):
        started = time.perf_counter_ns()
        for _ in range(per_batch):
            trace.record(3, 1_000_000, ROWS, ROWS)
        best = min(best, (time.perf_counter_ns() - started) / per_batch)
        trace.drain()
    assert best < 2_000, f"{best:.0f} ns per completion"


@pytest.fixture(scope="module")
def model():
    m = NativeModel.load(demo_core(), EngineConfig(device="cpu", kv_memory_bytes=512 << 20, max_active=4))
    yield m
    m.close()


def test_runtime_traces_only_while_asked_and_matches_the_scheduler(model):
    runtime = model.runtime
    tok = model.tokenizer
    prompt = tok.encode("Name the capital of France.").ids
    assert runtime.trace is None  # no dashboard: no ring, nothing written
    list(model.generate(prompt, SamplingParams(max_tokens=2, temperature=0), timeout=60))
    assert runtime.trace is None
    trace = runtime.start_trace()
    assert runtime.start_trace() is trace
    sampled = []
    events = []
    asked = 0
    for event in model.generate(prompt, SamplingParams(max_tokens=12, temperature=0), timeout=60):
        events.append(event)
        sample = trace.sample
        if asked and not sampled and sample is not None and sample.at_ns > asked:
            sampled.append(sample)
        if not asked and isinstance(event, TokenEvent):  # it decodes: ask for its state
            asked = time.monotonic_ns()
            trace.request_sample()
    assert isinstance(events[-1], FinishEvent)
    completions = trace.drain()
    graphs = model.loaded.contract.graphs
    kinds = [graphs[c.graph_index].kind.name.lower() for c in completions]
    assert "decode" in kinds and any(k in kinds for k in ("prefill", "resume")), kinds
    (state,) = [r for r in sampled[0].requests if r.phase == "decoding"]
    decoded = {(int(s), int(g)) for c, k in zip(completions, kinds) if k == "decode"
               for s, g in zip(c.slots, c.generations)}
    assert decoded == {(state.slot, state.generation)}  # one request: one slot.generation
    assert state.prompt_tokens == len(prompt) and state.arrival_ns <= sampled[0].at_ns
    assert trace.last_submitted is not None and 0 <= trace.last_submitted[0] < len(graphs)
    assert trace.dropped == 0
    token_events = [e for e in events if isinstance(e, TokenEvent) and (e.token_ids or e.text)]
    trace.request_sample()
    deadline = time.monotonic() + 5
    while trace.wants_sample and time.monotonic() < deadline:  # an idle runtime answers within its wait
        time.sleep(0.01)
    assert not trace.wants_sample
    assert all(r.phase in ("finishing", "retiring") for r in trace.sample.requests)  # it has ended
    runtime.stop_trace()
    assert runtime.trace is None
    assert len(token_events) >= 1

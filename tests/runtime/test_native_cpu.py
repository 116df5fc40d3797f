"""The model runtime end to end on the CPU with the SmolLM2 demo core."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from flare.config import EngineConfig
from flare.core.embedded import demo_core
from flare.engine.model import NativeModel
from flare.errors import ExecutionError
from flare.request import ErrorEvent, FinishEvent, PreparedPrompt, SamplingParams, TokenEvent

GREEDY = dict(temperature=0.0)


@pytest.fixture(scope="module")
def model():
    m = NativeModel.load(demo_core(), EngineConfig(device="cpu", kv_memory_bytes=768 << 20))
    yield m
    m.close()


def chat_ids(tok, system: str, question: str) -> tuple[list[int], tuple[int, ...]]:
    sys_part = tok.encode(f"<|im_start|>system\n{system}<|im_end|>\n", add_special_tokens=False).ids
    user = tok.encode(f"<|im_start|>user\n{question}<|im_end|>\n", add_special_tokens=False).ids
    head = tok.encode("<|im_start|>assistant\n", add_special_tokens=False).ids
    ids = sys_part + user + head
    return ids, (len(sys_part), len(sys_part) + len(user))


def run(model, ids, max_tokens, endpoints=(), **kw):
    prompt = PreparedPrompt(np.asarray(ids, dtype=np.int32), tuple(endpoints))
    events = list(model.generate(prompt, SamplingParams(max_tokens=max_tokens, **{**GREEDY, **kw}), timeout=300))
    tokens = [t for e in events if isinstance(e, TokenEvent) for t in e.token_ids]
    return tokens, events[-1]


def collect(model, prompt, params, times=None):
    """Submit without blocking; returns (events, done, ticket). ``times`` gets arrival times."""
    events, done = [], threading.Event()

    def sink(event):
        if times is not None:
            times.append(time.monotonic())
        events.append(event)
        if isinstance(event, (FinishEvent, ErrorEvent)):
            done.set()

    ticket = model.submit(prompt, params, sink)
    return events, done, ticket


def test_concurrent_requests_match_solo_runs(model):
    tok = model.tokenizer
    rng = np.random.default_rng(0)
    words = "the of and a to in is you that it he was for on are as with his they at be this have".split()
    specs = []
    for i in range(16):
        n = int(rng.integers(2, 120))
        question = " ".join(rng.choice(words, n)) + f" question {i}?"
        ids, _ = chat_ids(tok, "You are a helpful assistant.", question)
        specs.append((ids, int(rng.integers(2, 12))))
    solo = [run(model, ids, m, ignore_eos=True)[0] for ids, m in specs]
    runs = [collect(model, PreparedPrompt(np.asarray(ids, dtype=np.int32)),
                    SamplingParams(max_tokens=m, ignore_eos=True, **GREEDY)) for ids, m in specs]
    for events, done, _ in runs:
        assert done.wait(600)
    for (events, _, _), expected, (ids, m) in zip(runs, solo, specs):
        got = [t for e in events if isinstance(e, TokenEvent) for t in e.token_ids]
        assert got == expected and len(got) == m
        assert isinstance(events[-1], FinishEvent) and events[-1].reason == "length"
    stats = model.runtime.stats()
    assert stats.launches["decode"] > 0


def system_of_tokens(tok, n: int) -> str:
    """A system prompt whose ChatML system message is exactly n tokens.

    Ending the message on a prefill-chunk boundary makes its checkpoint cost only a
    snapshot copy, so the scheduler's extra-work allowance always affords it.
    """
    words = ("You are Flare's documentation assistant; answer from the manual. " * 400).split(" ")
    lo, hi = 1, len(words)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        text = " ".join(words[:mid])
        if len(tok.encode(f"<|im_start|>system\n{text}<|im_end|>\n", add_special_tokens=False).ids) <= n:
            lo = mid
        else:
            hi = mid - 1
    text = " ".join(words[:lo])
    pad = n - len(tok.encode(f"<|im_start|>system\n{text}<|im_end|>\n", add_special_tokens=False).ids)
    return text + "." * pad if pad else text


def test_shared_system_prompt_reuses_pages(model):
    tok = model.tokenizer
    system = system_of_tokens(tok, 1024)
    warm_ids, warm_ends = chat_ids(tok, "Warm-up text. " * 300, "Hello?")
    run(model, warm_ids, 2, warm_ends)  # measure prefill and snapshot graphs
    a_ids, a_ends = chat_ids(tok, system, "What is a prefix cache?")
    assert a_ends[0] == 1024
    t0, times_a = time.monotonic(), []
    events_a, done_a, _ = collect(model, PreparedPrompt(np.asarray(a_ids, np.int32), a_ends),
                                  SamplingParams(max_tokens=4, **GREEDY), times_a)
    assert done_a.wait(300)
    ttft_a = times_a[0] - t0
    b_ids, b_ends = chat_ids(tok, system, "Why are pages 64 tokens?")
    t0, times_b = time.monotonic(), []
    events_b, done_b, _ = collect(model, PreparedPrompt(np.asarray(b_ids, np.int32), b_ends),
                                  SamplingParams(max_tokens=4, **GREEDY), times_b)
    assert done_b.wait(300)
    ttft_b = times_b[0] - t0
    usage = events_b[-1].usage
    assert usage.cached_tokens == 1024
    assert ttft_b < ttft_a
    # reused state gives the same tokens as a cold run of the same prompt would
    solo = NativeModel.load(demo_core(), EngineConfig(device="cpu", max_active=2, kv_memory_bytes=512 << 20))
    try:
        cold, _ = run(solo, b_ids, 4)
    finally:
        solo.close()
    assert [t for e in events_b if isinstance(e, TokenEvent) for t in e.token_ids] == cold


def test_cancel_mid_stream_frees_the_slot(model):
    tok = model.tokenizer
    ids, _ = chat_ids(tok, "You are verbose.", "Tell me a very long story.")
    before = model.runtime.stats()
    events, done, ticket = collect(model, PreparedPrompt(np.asarray(ids, np.int32)),
                                   SamplingParams(max_tokens=2000, ignore_eos=True, **GREEDY))
    deadline = time.monotonic() + 120
    while sum(isinstance(e, TokenEvent) for e in events) < 3:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    ticket.cancel()
    deadline = time.monotonic() + 60
    while model.runtime.stats().slots_live != 0 or model.runtime.stats().slots_retiring != 0:
        assert time.monotonic() < deadline, model.runtime.stats()
        time.sleep(0.01)
    after = model.runtime.stats()
    assert after.requests_cancelled == before.requests_cancelled + 1
    assert after.slots_free == model.loaded.contract.max_active
    n = len(events)
    time.sleep(0.2)
    assert len(events) == n  # nothing published after the cancellation


def test_a_cancel_gives_its_admission_capacity_back_at_once():
    """A request submitted right after another was cancelled is accepted even before the
    model thread has handled the cancel (the HTTP layer frees its permit as soon as a
    disconnected handler returns), and the model never holds more than its capacity."""
    from flare.errors import AdmissionError

    m = NativeModel.load(demo_core(), EngineConfig(device="cpu", max_active=1, kv_memory_bytes=512 << 20),
                         capacity=2)
    try:
        ids, _ = chat_ids(m.tokenizer, "You are verbose.", "Tell me a very long story.")
        prompt = PreparedPrompt(np.asarray(ids, np.int32))
        long = SamplingParams(max_tokens=2000, ignore_eos=True, **GREEDY)
        first, second = collect(m, prompt, long), collect(m, prompt, long)
        deadline = time.monotonic() + 120
        while not any(isinstance(e, TokenEvent) for e in first[0]):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with pytest.raises(AdmissionError) as full:
            m.submit(prompt, long, lambda e: None)
        assert full.value.status == 503
        for _ in range(20):  # cancel the waiting request and take its place straight away, many times
            second[2].cancel()
            second = collect(m, prompt, long)
        first[2].cancel()
        third = collect(m, prompt, SamplingParams(max_tokens=3, **GREEDY))
        second[2].cancel()
        assert third[1].wait(120) and isinstance(third[0][-1], FinishEvent), third[0][-1:]
        stats = m.runtime.stats()
        assert stats.requests_cancelled == 22 and stats.requests_completed == 1, stats
        with m.runtime._lock:
            assert m.runtime._accepted == 0
        assert not first[1].is_set(), "a cancelled request gets no terminal event"
    finally:
        m.close()


def test_worker_failure_fails_every_request_and_stops_threads():
    m = NativeModel.load(demo_core(), EngineConfig(device="cpu", max_active=4, kv_memory_bytes=512 << 20))
    tok = m.tokenizer
    runs = []
    for q in ("One?", "Two?", "Three?"):
        ids, _ = chat_ids(tok, "Be brief.", q)
        runs.append(collect(m, PreparedPrompt(np.asarray(ids, np.int32)),
                            SamplingParams(max_tokens=500, ignore_eos=True, **GREEDY)))
    deadline = time.monotonic() + 120
    while not all(any(isinstance(e, TokenEvent) for e in ev) for ev, _, _ in runs):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    real_run = m.loaded.programs.run

    def broken(graph):
        raise RuntimeError("injected device fault")

    m.loaded.programs.run = broken
    for events, done, _ in runs:
        assert done.wait(60)
        assert isinstance(events[-1], ErrorEvent)
        assert "injected device fault" in str(events[-1].error)
    m.runtime._thread.join(30)
    assert not m.runtime.is_alive and not m.executor._thread.is_alive()
    assert isinstance(m.runtime.failure, ExecutionError)
    with pytest.raises(Exception) as info:
        m.submit(PreparedPrompt(np.asarray([1, 2, 3], np.int32)), SamplingParams(max_tokens=2), lambda e: None)
    assert getattr(info.value, "status", None) == 503
    m.loaded.programs.run = real_run
    m.close()


def test_mixed_steps_on_the_demo_core_match_solo_runs(model):
    """A demo model loaded with MIXED graphs: prompts arriving while others decode are
    prefilled packed with the decoders riding in the same steps, and every request's greedy
    tokens equal its solo run on the model without mixed graphs."""
    tok = model.tokenizer
    rng = np.random.default_rng(3)
    words = "the of and a to in is you that it he was for on are as with his they at be this have".split()
    specs = []
    for i in range(8):
        question = " ".join(rng.choice(words, int(rng.integers(5, 300)))) + f" question {i}?"
        specs.append((chat_ids(tok, "You are a helpful assistant.", question)[0], int(rng.integers(8, 24))))
    solo = [run(model, ids, m, ignore_eos=True)[0] for ids, m in specs]
    mixed = NativeModel.load(demo_core(), EngineConfig(device="cpu", kv_memory_bytes=512 << 20, mixed_prefill=True))
    try:
        assert mixed.loaded.contract.mixed_prefill
        runs = []
        for (ids, m) in specs:  # staggered: each arrives while the earlier ones decode
            runs.append(collect(mixed, PreparedPrompt(np.asarray(ids, dtype=np.int32)),
                                SamplingParams(max_tokens=m, ignore_eos=True, **GREEDY)))
            time.sleep(0.15)
        for events, done, _ in runs:
            assert done.wait(600)
        for (events, _, _), expected in zip(runs, solo):
            assert [t for e in events if isinstance(e, TokenEvent) for t in e.token_ids] == expected
        stats = mixed.runtime.stats()
        assert stats.launches["mixed"] > 0
    finally:
        mixed.close()

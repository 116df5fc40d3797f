"""RequestScheduler with a fake executor and a fake clock (no torch)."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

from flare.contract import REC_GENERATION, GraphKind
from flare.model.inputs import pack_step
from flare.request import SamplingParams
from flare.scheduler.errors import CapacityError, CompletionError, StalePlanError
from flare.scheduler.scheduler import RequestScheduler
from flare.testing.fake_executor import FakeExecutor

from .driver import IDENTITY, Driver, contract, params, prompt


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(**kw):
    clock = Clock()
    c = contract(**{k: v for k, v in kw.items() if k in ("max_active", "context", "chunk", "pages", "rows", "mixed")})
    sched = RequestScheduler(c, IDENTITY, clock=clock, eos_token_ids=kw.get("eos", ()))
    ex = FakeExecutor(c, manual=kw.get("manual", False), eos_token=kw.get("eos_token"),
                      eos_every=kw.get("eos_every", 0))
    return sched, ex, Driver(sched, ex), clock


def warm_up(sched, ex, d) -> None:
    """Run one short request to the end, so prefill, decode and snapshot steps have measured costs."""
    sched.submit(prompt(tokens(2, 10)), params(4), 0)
    for _ in range(100):
        d.pump()
        ex.step(2)


def tokens(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 1000, n)


def alone(p, max_tokens, seed=0, endpoints=()):
    sched, ex, d, _ = make(context=4096, pages=300)
    rid = sched.submit(prompt(p, endpoints), params(max_tokens), seed)
    d.run()
    return d.tokens[rid]


def test_scheduler_imports_no_torch():
    code = "import sys, flare.scheduler.scheduler, flare.testing.fake_executor; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_concurrent_requests_match_solo_runs():
    sched, ex, d, _ = make(max_active=4, pages=200)
    specs = [(tokens(i, n), m) for i, (n, m) in enumerate([(10, 5), (300, 12), (64, 3), (130, 20), (777, 7), (1, 9)])]
    rids = [sched.submit(prompt(p), params(m), 7) for p, m in specs]
    d.run()
    for rid, (p, m) in zip(rids, specs):
        assert d.tokens[rid] == alone(p, m, 7)
        assert d.ended[rid].reason == "length"
    assert sched.num_live == 0 and sched.slots.num_free == 4 and sched.reserved_pages == 0


def test_slot_and_generation_reuse():
    sched, ex, d, _ = make(max_active=1)
    handles = []
    for i in range(3):
        sched.submit(prompt(tokens(i, 20)), params(2), 0)
        sched.plan  # noqa: B018 - admission happens in plan()
        d.run()
        handles.append(d.steps[-1].rows[0].handle)
    assert [h.slot for h in handles] == [1, 1, 1]
    assert len({h.generation for h in handles}) == 3 and all(h.generation > 0 for h in handles)


def test_plan_invalidated_by_mutation_not_by_unrelated_admission():
    sched, ex, d, _ = make(max_active=2, manual=True)
    a = sched.submit(prompt(tokens(1, 10)), params(4), 0)
    plan = sched.plan()
    assert plan.kind == GraphKind.INITIALIZE and plan.rows[0].rid == a
    sched.submit(prompt(tokens(2, 10)), params(4), 0)  # unrelated admission
    sched.plan()  # admits the second request; plan is not committed
    step = sched.commit(plan, ex.next_fence)  # still valid
    ex.submit(plan.graph_index, pack_step(d.inputs, step))
    ex.step()
    done = ex.poll()
    sched.complete(done.fence, done.graph_index, done.records, done.duration_ns)
    # a mutation of the selected request invalidates a plan made before it
    stale = sched.plan()
    sched.cancel(stale.rows[0].rid)
    with pytest.raises(StalePlanError):
        sched.commit(stale, ex.next_fence)


def test_commit_rejects_foreign_plans_and_old_fences():
    sched, ex, d, _ = make()
    other = RequestScheduler(sched.contract, IDENTITY)
    other.submit(prompt(tokens(1, 10)), params(2), 0)
    with pytest.raises(StalePlanError, match="another scheduler"):
        sched.commit(other.plan(), 1)
    sched.submit(prompt(tokens(1, 10)), params(2), 0)
    plan = sched.plan()
    sched.commit(plan, 5)
    assert sched.plan() is None  # its INITIALIZE is in flight (and unmeasured, so it runs alone)
    again = RequestScheduler(sched.contract, IDENTITY)
    again.submit(prompt(tokens(1, 10)), params(2), 0)
    p2 = again.plan()
    again.commit(p2, 3)
    with pytest.raises(StalePlanError, match="fence"):
        again.commit(p2, 3)


def test_complete_validates_before_mutating():
    sched, ex, d, _ = make(manual=True)
    sched.submit(prompt(tokens(1, 10)), params(2), 0)
    plan = sched.plan()
    step = sched.commit(plan, ex.next_fence)
    ex.submit(plan.graph_index, pack_step(d.inputs, step))
    ex.step()
    done = ex.poll()
    bad = done.records.copy()
    bad[step.rows[0].handle.slot, REC_GENERATION] += 1
    with pytest.raises(CompletionError, match="generation"):
        sched.complete(done.fence, done.graph_index, bad, done.duration_ns)
    with pytest.raises(CompletionError, match="fence"):
        sched.complete(done.fence + 1, done.graph_index, done.records, done.duration_ns)
    assert len(sched.inflight) == 1  # nothing changed
    sched.complete(done.fence, done.graph_index, done.records, done.duration_ns)
    assert not sched.inflight
    with pytest.raises(CompletionError):  # a repeated completion
        sched.complete(done.fence, done.graph_index, done.records, done.duration_ns)


def test_repeated_terminal_completion_never_emits_twice():
    """A pipelined decode references a request that ended in the step before it:
    the second completion is validated but emits nothing."""
    sched, ex, d, _ = make(manual=True, eos=(999,), eos_token=999, eos_every=3)
    warm_up(sched, ex, d)
    rid = sched.submit(prompt(tokens(3, 10)), params(50), 0)
    for _ in range(200):
        d.pump()
        ex.step(2)
        if rid in d.ended and not sched.inflight:
            break
    assert len(d.tokens[rid]) == 3 and d.tokens[rid][2] == 999
    assert d.ended[rid].reason == "stop"
    end_fence = next(r.fence for r in d.results if any(e.rid == rid for e in r.ended))
    later = [s for s in d.steps if s.fence > end_fence and any(r.rid == rid for r in s.rows)]
    assert later and later[0].plan.kind == GraphKind.DECODE, "expected a pipelined decode after the EOS"


def test_host_finish_with_decodes_in_flight_publishes_the_consumed_tokens():
    """finish() (a stop string) while pipelined decodes are in flight: their sampled
    tokens are recorded, not emitted, and the terminal checkpoint covers exactly the
    consumed tokens, so the next turn over them is a full hit."""
    sched, ex, d, _ = make(manual=True, context=2048, pages=100)
    warm_up(sched, ex, d)
    p = tokens(4, 70)
    rid = sched.submit(prompt(p), params(40), 0)
    for _ in range(400):
        d.pump(max_completions=1)
        ex.step(1)
        req = sched.live.get(rid)
        if req is not None and len(d.tokens[rid]) >= 5 and req.inflight == 2:
            break
    req = sched.live[rid]
    assert req.inflight == 2, "expected two pipelined decodes in flight"
    emitted = list(d.tokens[rid])
    sched.finish(rid, "stop")
    consumed = req.planned - req.prompt_len
    assert consumed > len(emitted)  # the host has not seen every consumed token yet
    for _ in range(400):
        d.pump()
        ex.step(2)
        if rid not in sched.live and not sched.inflight:
            break
    assert rid not in sched.live
    assert d.tokens[rid] == emitted  # nothing after the finish was emitted
    sampled = req.sampled
    assert sampled[:len(emitted)] == emitted and len(sampled) >= consumed
    follow = np.concatenate([p, np.asarray(sampled[:consumed])])
    rid2 = sched.submit(prompt(follow), params(2), 0)
    for _ in range(400):
        d.pump()
        ex.step(2)
        if rid2 in d.ended and not sched.inflight:
            break
    assert d.ended[rid2].reason == "length"
    assert sched.cache.counters().reused_tokens >= len(follow) - 1


def test_cancel_holds_resources_until_fence():
    sched, ex, d, _ = make(manual=True, max_active=1)
    rid = sched.submit(prompt(tokens(4, 100)), params(50), 0)
    for _ in range(6):
        d.pump()
        ex.step()
    d.pump()
    assert sched.inflight, "a step must be in flight"
    req = sched.live[rid]
    private = list(req.pages[req.private_from:])
    sched.cancel(rid)
    assert rid in sched.live and sched.slots.num_free == 0  # still owned
    assert not any(p in sched.pages._free_set for p in private)
    assert sched.plan() is None or all(r.rid != rid for r in sched.plan().rows)
    while sched.inflight:
        ex.step()
        d.pump()
    assert rid not in sched.live and sched.slots.num_free == 1
    assert all(p in sched.pages._free_set for p in private)


def _warm(sched, d, n=600):
    """Measure prefill/snapshot graphs so extra checkpoints can be afforded."""
    sched.submit(prompt(tokens(99, n), [n // 2]), params(2), 0)
    d.run()


def test_prefix_reuse_across_requests_sharing_a_system_prompt():
    sched, ex, d, clock = make(pages=200, chunk=256, context=2048)
    _warm(sched, d)
    system = tokens(5, 1000)
    first = np.concatenate([system, tokens(6, 30)])
    second = np.concatenate([system, tokens(7, 40)])
    sched.submit(prompt(first, [1000]), params(4), 0)
    d.run()
    before = sched.cache.counters().reused_tokens
    r2 = sched.submit(prompt(second, [1000]), params(4), 0)
    d.run()
    counters = sched.cache.counters()
    assert counters.reused_tokens - before == 1000
    assert d.tokens[r2] == alone(second, 4, 0)
    prefill2 = [s for s in d.steps if any(r.rid == r2 for r in s.rows) and s.plan.kind == GraphKind.PREFILL]
    assert sum(s.rows[0].num_tokens for s in prefill2) == 40


def test_message_boundary_checkpoints_stop_prefill():
    sched, ex, d, _ = make(pages=100, chunk=256, context=2048)
    _warm(sched, d)
    p = tokens(8, 700)
    rid = sched.submit(prompt(p, [150, 400, 650]), params(2), 0)
    d.run()
    mine = [s for s in d.steps if any(r.rid == rid for r in s.rows)]
    ends = [s.rows[0].start + s.rows[0].num_tokens for s in mine if s.plan.kind == GraphKind.PREFILL]
    assert 650 in ends  # the anchor: the last message boundary
    snapshots = [s for s in mine if s.plan.kind == GraphKind.SNAPSHOT]
    assert snapshots and sched.cache.counters().publications >= 2
    # a later request with the same first three messages reuses up to the anchor
    r2 = sched.submit(prompt(np.concatenate([p[:650], tokens(9, 20)]), [150, 400, 650]), params(2), 0)
    d.run()
    assert sched.cache.counters().reused_tokens >= 650
    assert d.ended[r2].reason == "length"


def test_full_prompt_hit_restores_and_resumes():
    sched, ex, d, _ = make()
    p = tokens(10, 170)
    r1 = sched.submit(prompt(p), params(5), 3)
    d.run()
    r2 = sched.submit(prompt(p), params(5), 3)
    d.run()
    kinds = [s.plan.kind for s in d.steps if any(r.rid == r2 for r in s.rows)]
    assert GraphKind.PREFILL not in kinds and GraphKind.RESUME in kinds
    assert d.tokens[r2] == d.tokens[r1]


def test_eviction_under_page_pressure():
    sched, ex, d, _ = make(pages=24, rows=6, max_active=1)
    results = {}
    for i in range(8):  # each leaves ~5 pages cached; the pool holds 24
        p = tokens(20 + i, 300)
        rid = sched.submit(prompt(p), params(3), 0)
        d.run()
        results[rid] = (p, d.tokens[rid])
        assert d.ended[rid].reason == "length"
    counters = sched.cache.counters()
    assert counters.evictions > 0
    assert counters.cached_pages + sched.pages.num_free + sched.pages.num_retiring == 24
    for rid, (p, toks) in list(results.items())[-2:]:
        assert toks == alone(p, 3)


def test_request_larger_than_the_cache_is_rejected():
    sched, _, _, _ = make(pages=4, context=1024)
    with pytest.raises(CapacityError):
        sched.submit(prompt(tokens(1, 300)), params(10), 0)
    with pytest.raises(CapacityError, match="context"):
        sched.submit(prompt(tokens(1, 1000)), params(100), 0)


def test_fairness_no_starvation():
    """A long prompt still progresses while many requests decode, and decoders keep decoding."""
    sched, ex, d, clock = make(max_active=8, pages=400, context=4096, chunk=256)
    _warm(sched, d)
    decoders = [sched.submit(prompt(tokens(30 + i, 20)), params(400), i) for i in range(6)]
    for _ in range(40):
        d.pump()
    long_rid = sched.submit(prompt(tokens(50, 3000)), params(2), 0)
    gaps = []
    last_long = None
    seen = len(d.steps)
    for i in range(3000):
        d.pump()
        clock.now += 0.001
        for index in range(seen, len(d.steps)):  # a pump may submit two steps
            if any(r.rid == long_rid for r in d.steps[index].rows):
                if last_long is not None:
                    gaps.append(index - last_long)
                last_long = index
        seen = len(d.steps)
        if long_rid in d.ended:
            break
    assert long_rid in d.ended, "the long prompt starved"
    assert gaps and max(gaps) < 60, gaps
    assert all(len(d.tokens[r]) > 40 for r in decoders), "decoders starved during the long prefill"


def test_waiting_prompt_prefills_in_full_chunks_when_every_step_costs_a_weight_pass():
    """On a GPU a 64-token chunk costs nearly what a 256-token chunk does (both read every
    weight). The fairness price must not make the smallest chunk the best value per ms."""
    sched, ex, d, clock = make(max_active=8, pages=400, context=4096, chunk=256)
    submit = ex.submit

    def timed_submit(graph_index, uploads):
        graph = sched.contract.graphs[graph_index]
        tokens = graph.batch * graph.tokens if graph.kind == GraphKind.PREFILL else 0
        ex.duration_ns = 5_000_000 + 10_000 * tokens  # weight pass + compute per prompt token
        return submit(graph_index, uploads)

    ex.submit = timed_submit
    _warm(sched, d)
    decoders = [sched.submit(prompt(tokens(30 + i, 20)), params(400), i) for i in range(6)]
    for _ in range(40):
        d.pump()
        clock.now += 0.005
    long_rid = sched.submit(prompt(tokens(50, 3000)), params(2), 0)
    for _ in range(3000):
        d.pump()
        clock.now += 0.005
        if long_rid in d.ended:
            break
    assert long_rid in d.ended
    chunks = [s.rows[0].num_tokens for s in d.steps if s.plan.kind == GraphKind.PREFILL and s.rows[0].rid == long_rid]
    assert chunks[:-1] == [256] * (len(chunks) - 1), chunks
    assert all(len(d.tokens[r]) > 20 for r in decoders), "decoders starved during the long prefill"


def test_timing_staleness_and_refresh_budget():
    sched, ex, d, clock = make(pages=200)
    _warm(sched, d)
    t = sched.timing
    g = sched.contract.graph(GraphKind.DECODE, 1, greedy=True).index  # the warm-up is greedy
    assert t.is_measured(g) and not t.is_stale(g, clock.now)
    clock.now += 31
    assert t.is_stale(g, clock.now) and t.estimate_ns(g) > 0  # stale but still available
    old = t.estimate_ns(g)
    t.observe(g, old * 3, clock.now)
    assert t.estimate_ns(g) == old * 3 and not t.is_stale(g, clock.now)  # replaced outright
    # credit: 0.002/0.998 of measured time, capped at 5 ms; a refresh pays its estimate
    t.credit_ns = 0
    for _ in range(10):
        t.observe(g, 1_000_000_000, clock.now)
    assert t.credit_ns == pytest.approx(t.credit_cap_ns)
    assert t.has_full_credit
    t.pay_refresh(g)
    assert not t.has_full_credit
    t.idle()
    assert t.credit_ns <= 0


def test_a_seeded_estimate_is_used_as_measured_until_the_first_observation_replaces_it():
    sched, ex, d, clock = make(pages=200)
    t = sched.timing
    decode = sched.contract.graph(GraphKind.DECODE, 1, greedy=True).index
    prefill = sched.graphs_of(GraphKind.PREFILL)[0].index
    seeds = [0] * len(sched.contract.graphs)
    seeds[decode] = 4_000_000
    sched.seed_estimates(seeds)
    assert t.is_measured(decode) and t.estimate_ns(decode) == 4_000_000 and not t.is_stale(decode, clock.now)
    assert t.is_seeded(decode)
    assert not any(t.is_measured(i) for i in range(len(seeds)) if i != decode), "a zero seed is no estimate"
    assert not t.is_measured(prefill)
    t.observe(decode, 9_000_000, clock.now)
    t.observe(decode, 1_000_000, clock.now)
    assert t.estimate_ns(decode) == 9_000_000  # the median of the two observations: the seed is gone
    assert not t.is_seeded(decode)
    sched.seed_estimates([5_000_000] * len(seeds))
    assert t.estimate_ns(decode) == 9_000_000, "a seed never overrides what serving measured"
    clock.now += 31
    assert t.is_stale(decode, clock.now)
    other = next(i for i in range(len(seeds)) if i != decode)
    assert t.is_measured(other) and not t.is_stale(other, clock.now), "a seed waits for its graph's first step"
    t.observe(other, 7_000_000, clock.now)
    assert t.estimate_ns(other) == 7_000_000
    clock.now += 31
    assert t.is_stale(other, clock.now)


def test_seeded_estimates_let_the_first_steps_pipeline():
    """Unmeasured graphs run alone (the window drains for each); with the executor's timings
    seeded, no step of the first request waits for that, and its steps queue from the start."""
    runs = {}
    for seeded in (True, False):
        sched, ex, d, clock = make(pages=200, manual=True)
        if seeded:
            sched.seed_estimates([1_000_000] * len(sched.contract.graphs))
        rid = sched.submit(prompt(tokens(62, 10)), params(40), 1)
        depths = []
        for _ in range(200):
            d.pump()
            depths.append(len(sched.inflight))
            ex.step()
            if rid in d.ended:
                break
        assert d.ended[rid].reason == "length" and d.tokens[rid] == alone(tokens(62, 10), 40, 1)
        runs[seeded] = (depths, [s.plan.estimate_ns for s in d.steps])
    depths, estimates = runs[True]
    assert all(estimates) and depths[:3] == [1, 1, 3], depths[:3]  # the first decode queues behind the prefill
    depths, estimates = runs[False]
    assert estimates.count(0) >= 3 and depths[:3] == [1, 1, 1], depths[:3]


def test_stale_dispatch_drains_the_window_and_refreshes():
    sched, ex, d, clock = make(pages=200, manual=True)
    sched.submit(prompt(tokens(61, 10)), params(200), 1)
    for _ in range(30):
        d.pump()
        ex.step()
    assert len(sched.inflight) == 2  # measured decodes pipeline two frames
    ex.step(2)
    while (done := ex.poll()) is not None:  # drain without submitting more
        sched.complete(done.fence, done.graph_index, done.records, done.duration_ns)
    clock.now += 31  # the decode estimate is stale now
    d.pump()
    assert len(sched.inflight) == 1 and sched.inflight[0].plan.is_refresh
    assert sched.plan() is None  # a stale dispatch runs alone
    ex.step()
    d.pump()
    g = sched.inflight[0].plan.graph_index
    assert not sched.timing.is_stale(g, clock.now)


def test_funded_refresh_displaces_the_winner():
    sched, _, d, clock = make(pages=200)
    t = sched.timing
    dec = sched.contract.graph(GraphKind.DECODE, 1)
    pre = sched.contract.graph(GraphKind.PREFILL, 1, 64)
    t.observe(dec.index, 1_000_000, clock.now - 40)
    t.observe(pre.index, 1_000_000, clock.now - 40)  # both observed 40 s ago
    t.observe(dec.index, 1_000_000, clock.now)  # the decode is fresh again
    candidates = [(GraphKind.PREFILL, pre, [], 10.0)]
    decode = (dec, np.zeros(0, np.int64), 1000.0)
    t.credit_ns = 0
    plan = sched.selection.select(candidates, decode, clock.now)
    assert plan.kind == GraphKind.DECODE and not plan.is_refresh
    t.credit_ns = t.credit_cap_ns
    plan = sched.selection.select(candidates, decode, clock.now)
    assert plan.kind == GraphKind.PREFILL and plan.is_refresh and plan.is_funded_refresh
    t.pay_refresh(plan.graph_index)  # what commit does for a funded refresh
    assert not t.has_full_credit  # another refresh waits for full credit
    plan = sched.selection.select(candidates, decode, clock.now)
    assert plan.kind == GraphKind.DECODE


def test_new_request_progresses_while_decodes_stay_pipelined():
    """Polling one completion at a time keeps a decode in flight; a waiting request's
    INITIALIZE/PREFILL must still win and drain the window instead of starving."""
    sched, ex, d, clock = make(max_active=4, pages=200, manual=True)
    first = sched.submit(prompt(tokens(70, 30)), params(300), 0)
    for _ in range(40):
        d.pump(max_completions=1)
        ex.step()
        clock.now += 0.01
    assert len(d.tokens[first]) > 20
    second = sched.submit(prompt(tokens(71, 30)), params(5), 0)
    for _ in range(40):
        d.pump(max_completions=1)
        ex.step()
        clock.now += 0.01
        if second in d.ended:
            break
    assert second in d.ended, "the new request starved behind pipelined decodes"


def test_greedy_cohorts_use_the_greedy_decode_variant():
    sched, ex, d, _ = make(pages=200, max_active=4)
    greedy = sched.submit(prompt(tokens(80, 20)), params(6), 0)
    d.run()
    decodes = [s for s in d.steps if s.plan.kind == GraphKind.DECODE]
    assert decodes and all(sched.contract.graphs[s.plan.graph_index].greedy for s in decodes)
    sampled = sched.submit(prompt(tokens(81, 20)), SamplingParams(max_tokens=6, temperature=0.7), 0)
    other = sched.submit(prompt(tokens(82, 20)), params(6, logprobs=True), 0)
    d.run()
    mixed = [s for s in d.steps if s.plan.kind == GraphKind.DECODE and any(r.rid in (sampled, other) for r in s.rows)]
    assert mixed and not any(sched.contract.graphs[s.plan.graph_index].greedy for s in mixed)
    assert d.ended[greedy].reason == "length" and len(d.tokens[sampled]) == 6


def test_simulated_device_runs_graphs_back_to_back_and_idles_while_the_host_is_late():
    """FakeExecutor(device_time=...) (tools/bench_host.py): a completion arrives only once the
    simulated device has run every earlier graph and this one; a late submission starts late."""
    c = contract(pages=200)
    sched = RequestScheduler(c, IDENTITY)
    ex = FakeExecutor(c, device_time=lambda graph: 0.02)
    d = Driver(sched, ex)
    rid = sched.submit(prompt(tokens(5, 20)), params(3), 0)
    d.pump()  # the first (unmeasured) step runs alone
    assert ex.outstanding == 1 and ex.poll(0) is None  # not finished yet
    started = time.perf_counter()
    done = ex.poll(1.0)
    assert done is not None and done.duration_ns == 20_000_000
    assert time.perf_counter() - started > 0.01
    sched.complete(done.fence, done.graph_index, done.records, done.duration_ns)
    time.sleep(0.05)  # the host is late: the device idles, and the next graph starts now
    d.pump()
    submitted = time.perf_counter()
    done = ex.poll(1.0)
    assert time.perf_counter() - submitted > 0.015, "a late submission must not inherit the idle time"
    sched.complete(done.fence, done.graph_index, done.records, done.duration_ns)
    t0, steps_before = time.perf_counter(), len(d.steps)
    d.run()
    assert d.ended[rid].reason == "length"
    assert time.perf_counter() - t0 >= 0.019 * (len(d.steps) - steps_before)  # each occupied the device


def test_short_prompts_prefill_together_and_match_solo_runs():
    """Waiting prompts share cohort PREFILL graphs (several rows, ragged lengths, padding
    rows), and each request still generates exactly its solo tokens."""
    sched, ex, d, clock = make(max_active=8, pages=300, chunk=256)
    _warm(sched, d)
    specs = [(tokens(100 + i, n), 6) for i, n in enumerate([20, 45, 70, 3, 64, 130, 33])]
    rids = [sched.submit(prompt(p), params(m), 3) for p, m in specs]
    d.run()
    cohorts = [s for s in d.steps if s.plan.kind == GraphKind.PREFILL and len(s.rows) > 1]
    assert cohorts, "no cohort prefill was chosen"
    assert any(len(s.rows) < s.plan.batch for s in cohorts) or any(len({r.num_tokens for r in s.rows}) > 1
                                                                   for s in cohorts)
    for rid, (p, m) in zip(rids, specs):
        assert d.tokens[rid] == alone(p, m, 3)
        assert d.ended[rid].reason == "length"
    assert sched.num_live == 0 and sched.reserved_pages == 0


def test_next_turn_sent_at_eos_waits_for_the_terminal_checkpoint():
    """A client sends the next turn the moment the EOS arrives, before the finished
    request's terminal snapshot is taken: admission waits for that capture, so the
    next turn reuses the whole previous turn (prompt, reply and the EOS, which the
    pipelined decode after it consumed)."""
    sched, ex, d, _ = make(manual=True, context=2048, pages=100, eos=(999,), eos_token=999, eos_every=6)
    warm_up(sched, ex, d)
    p = tokens(5, 90)
    rid = sched.submit(prompt(p), params(40), 0)
    for _ in range(400):
        d.pump(max_completions=1)
        ex.step(1)
        if rid in d.ended:
            break
    assert d.ended[rid].reason == "stop"
    req = sched.live[rid]
    assert req.terminal_row >= 0 or req.terminal_fence > sched.completed_fence, "terminal capture not pending"
    reply = d.tokens[rid]  # ends with the EOS
    follow = np.concatenate([p, np.asarray(reply), tokens(6, 5)])
    before = sched.cache.counters().reused_tokens
    rid2 = sched.submit(prompt(follow), params(2), 0)
    for _ in range(400):
        d.pump()
        ex.step(2)
        if rid2 in d.ended and not sched.inflight:
            break
    assert d.ended[rid2].reason == "length"
    consumed = req.planned  # prompt, reply and EOS (a pipelined decode ran on the EOS)
    assert sched.cache.counters().reused_tokens - before >= min(consumed, len(p) + len(reply))


def _h200_like(graph) -> float:
    """A simulated device's seconds per graph, in H200 proportions at a tenth of the scale:
    the small copies (initialize, snapshot) cost little beside a token's compute."""
    if graph.kind == GraphKind.PREFILL:
        return (1.5 + 0.02 * graph.batch * graph.tokens) * 1e-4
    if graph.kind == GraphKind.MIXED:
        return (1.5 + 0.02 * graph.tokens + 0.05 * graph.width) * 1e-4
    if graph.kind == GraphKind.DECODE:
        return (3.7 + 0.03 * graph.batch) * 1e-4
    return 5e-6


def test_mixed_steps_carry_the_decoders_through_prefill_and_match_solo_runs():
    """With MIXED graphs, prompts that arrive while others decode are prefilled packed (several
    requests' chunks in one stream, cut at the prompt capacity) with the decode cohort riding in
    the same step, and every request still generates exactly its solo tokens."""
    c = contract(max_active=8, pages=400, chunk=512, context=4096, mixed=True)
    sched = RequestScheduler(c, IDENTITY)
    d = Driver(sched, FakeExecutor(c, device_time=_h200_like))
    _warm(sched, d)
    first = [sched.submit(prompt(tokens(300 + i, 40)), params(60), 5) for i in range(3)]
    for _ in range(30):
        d.pump()
    specs = [(tokens(310 + i, n), 8) for i, n in enumerate([700, 45, 130, 9, 300])]
    rids = [sched.submit(prompt(p), params(m), 5) for p, m in specs]
    d.run()
    mixed = [s for s in d.steps if s.plan.kind == GraphKind.MIXED]
    assert any(s.plan.decode_rows and len(s.rows) - s.plan.decode_rows > 1 for s in mixed), \
        "no mixed step carried decoders and several prompts"
    for rid in first:
        assert d.tokens[rid] == alone(tokens(300 + first.index(rid), 40), 60, 5)
    for rid, (p, m) in zip(rids, specs):
        assert d.tokens[rid] == alone(p, m, 5)
        assert d.ended[rid].reason == "length"
    assert sched.num_live == 0 and sched.reserved_pages == 0


def test_a_page_aligned_full_hit_with_one_output_token_reserves_its_restored_tail():
    """The same 128-token prompt (two whole pages) twice with max_tokens 1: the second is a
    full prompt hit whose RESTORE maps the page after the prompt, which the reservation must
    hold even though no output token is ever written there (it used to fail the worker)."""
    sched, ex, d, _ = make(pages=200, chunk=256)
    _warm(sched, d)
    p = tokens(400, 128)
    first = sched.submit(prompt(p), params(1), 0)
    d.run()
    second = sched.submit(prompt(p), params(1), 0)
    d.run()
    assert sched.cache.counters().reused_tokens >= 128
    assert d.tokens[second] == d.tokens[first] and d.ended[second].reason == "length"
    assert sched.num_live == 0 and sched.reserved_pages == 0


def _page_owners(sched) -> dict[int, str]:
    """Every logical page's one owner: the free or retiring pool, a live request (its private
    pages), or the prefix cache; raises on a page owned twice."""
    owners: dict[int, str] = {}

    def own(page: int, who: str) -> None:
        assert page not in owners, f"page {page} owned by {owners[page]} and {who}"
        owners[page] = who

    for page in sched.pages._free:
        own(page, "free")
    for _, page in sched.pages._retiring:
        own(page, "retiring")
    for req in sched.live.values():
        for page in req.pages[req.private_from:] + req.kept_pages:
            own(page, f"request {req.rid}")
    for page in np.flatnonzero(sched.cache._page_owner).tolist():
        own(page, "cache")
    return owners


def test_decoders_grow_past_their_reservation_and_preempted_requests_finish_token_exact():
    """Admission reserves the prompt and 64 output tokens; four requests that each grow to
    seven pages share 24, so decoders run out of unreserved pages and the latest arrival is
    preempted, checkpointed and continued. Every request still generates exactly its solo
    tokens, none fails for lack of pages, and no page is leaked or owned twice."""
    from flare.config import PolicyConfig

    c = contract(max_active=4, pages=24, context=2048, rows=16)
    sched = RequestScheduler(c, IDENTITY, PolicyConfig(output_page_lookahead=64))
    ex = FakeExecutor(c)
    d = Driver(sched, ex)
    specs = [(tokens(500 + i, 100), 300) for i in range(4)]
    rids = [sched.submit(prompt(p), params(m), 0) for p, m in specs]
    d.run()
    assert sched.num_preemptions > 0
    assert sched.num_preempt_restored + sched.num_preempt_recomputed == sched.num_preemptions
    for rid, (p, m) in zip(rids, specs):
        assert d.ended[rid].reason == "length"
        assert d.tokens[rid] == alone(p, m, 0)
    assert sched.num_live == 0 and sched.reserved_pages == 0 and not sched._origin and not sched._current
    assert len(_page_owners(sched)) == c.num_pages


def test_page_ownership_state_machine():
    """Hypothesis drives admission, growth past reservations, preemption, host finishes and
    cancels over a pool too small for the requests' outputs: after every step each page has
    exactly one owner, and once everything ends every page is free or cached."""
    from hypothesis import HealthCheck, settings
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

    from flare.config import PolicyConfig

    preemptions: list[int] = []

    class Pages(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            self.c = contract(max_active=4, pages=20, context=1024, rows=8)
            self.sched = RequestScheduler(self.c, IDENTITY, PolicyConfig(output_page_lookahead=64))
            self.ex = FakeExecutor(self.c, manual=True)
            self.d = Driver(self.sched, self.ex)
            self.rids: list[int] = []

        @rule(n=st.integers(1, 200), m=st.integers(1, 400), seed=st.integers(0, 3))
        def submit(self, n, m, seed):
            if n + m <= self.c.context:
                self.rids.append(self.sched.submit(prompt(tokens(600 + seed, n)), params(m), seed))

        @rule(steps=st.integers(1, 12))
        def run_steps(self, steps):
            for _ in range(steps):
                self.d.pump(max_completions=1)
                self.ex.step()

        @rule(i=st.integers(0, 50))
        def cancel(self, i):
            if self.rids:
                self.sched.cancel(self.rids[i % len(self.rids)])

        @rule(i=st.integers(0, 50))
        def finish(self, i):
            if self.rids:
                self.sched.finish(self.rids[i % len(self.rids)])

        @invariant()
        def one_owner_per_page(self):
            assert len(_page_owners(self.sched)) == self.c.num_pages
            assert 0 <= self.sched.reserved_pages <= self.c.num_pages

        def teardown(self):  # drain: every request ends (RuleBasedStateMachine calls it last)
            for _ in range(20000):
                if not self.d.pump() and self.ex.outstanding == 0 and not self.sched.num_live \
                        and not self.sched.num_queued:
                    break
                self.ex.step()
            assert self.sched.num_live == 0 and self.sched.num_queued == 0
            owners = _page_owners(self.sched)
            assert len(owners) == self.c.num_pages and set(owners.values()) <= {"free", "retiring", "cache"}
            assert self.sched.reserved_pages == 0 and not self.sched._current
            preemptions.append(self.sched.num_preemptions)

    Pages.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None,
                                       suppress_health_check=[HealthCheck.too_slow])
    Pages.TestCase().runTest()
    assert sum(preemptions) > 0, "no example preempted: the machine does not reach page pressure"


def test_with_packed_prefill_a_system_prompt_boundary_is_checkpointed():
    """A chat's system message ends 14 tokens before its prompt does (its user message is the
    anchor). Cut there, the last tokens would take a chunk of their own, which the 5%
    allowance for extra checkpoints never affords; packed prefill carries them beside other
    rows, so the boundary costs only its snapshot, is checkpointed, and a second
    conversation reuses the system prompt."""
    c = contract(max_active=4, pages=200, chunk=512, context=2048, mixed=True)
    sched = RequestScheduler(c, IDENTITY)
    d = Driver(sched, FakeExecutor(c, device_time=_h200_like))
    _warm(sched, d)
    for i in range(3):  # measure the packed graphs
        sched.submit(prompt(tokens(700 + i, 300 + 100 * i)), params(2), 0)
    d.run()
    system = tokens(710, 1000)
    # boundaries: the system message (an extra), the user message (the anchor); then the generation prompt
    first = np.concatenate([system, tokens(711, 14)])
    sched.submit(prompt(first, [1000, 1010]), params(2), 0)
    d.run()
    before = sched.cache.counters().reused_tokens
    second = np.concatenate([system, tokens(712, 16)])
    rid = sched.submit(prompt(second, [1000, 1012]), params(2), 0)
    d.run()
    assert sched.cache.counters().reused_tokens - before == 1000
    assert d.tokens[rid] == alone(second, 2, 0)


def test_a_duplicate_prompt_admitted_beside_its_twin_returns_every_page():
    """The state machine's first find: the same one-page prompt twice, admitted together. The
    second's prompt-end snapshot finds the first's checkpoint (its page stays private), then
    its terminal capture publishes past it; that page used to fall out of every owner."""
    sched, ex, d, _ = make(max_active=4, pages=20, context=1024, rows=8)
    p = tokens(600, 64)
    sched.submit(prompt(p), params(1), 0)
    sched.submit(prompt(p), params(2), 0)
    d.run()
    owners = _page_owners(sched)
    assert len(owners) == 20 and set(owners.values()) <= {"free", "retiring", "cache"}


def test_prompts_progress_beside_a_constrained_decoder_with_packed_prefill():
    """While a structured-output decoder has a step in flight it rides in no mixed step;
    waiting prompts still prefill (packed alone or in PREFILL steps) and everyone finishes as
    solo."""
    from flare.request import GrammarRequest

    sched, ex, d, clock = make(max_active=4, pages=300, chunk=512, context=2048, mixed=True)
    _warm(sched, d)
    for i in range(3):  # measure the packed prefill graphs (an unmeasured graph runs alone)
        sched.submit(prompt(tokens(790 + i, 100 + 150 * i)), params(2), 0)
    d.run()
    constrained = SamplingParams(max_tokens=400, temperature=0.0, grammar=GrammarRequest("json_object"))
    c_rid = sched.submit(prompt(tokens(800, 30)), constrained, 0)
    for _ in range(20):
        d.pump(max_completions=1)
    rids = [sched.submit(prompt(tokens(801 + i, 200 + 50 * i)), params(10), 0) for i in range(3)]
    d.run()
    assert len(d.tokens[c_rid]) == 400
    for i, rid in enumerate(rids):
        assert d.tokens[rid] == alone(tokens(801 + i, 200 + 50 * i), 10, 0)
    assert any(s.plan.kind in (GraphKind.MIXED, GraphKind.PREFILL) and not s.plan.decode_rows for s in d.steps)


def _every_prefill_chunk(sel, budget):
    """Every single-request PREFILL candidate, as Prefill.candidates enumerates them before it
    keeps only the ones that can win (the reference for the test below)."""
    from flare.scheduler.plan import Phase, PlanRow

    s, unit, out = sel.s, sel.pol.output_token_value, []
    for r in budget.by_phase.get(Phase.PREFILLING, []):
        per_token = sel.price(r) / max(1, min(r.next_stop - r.planned, s.contract.prefill_chunk_size))
        last = -1
        for g in s.graphs_of(GraphKind.PREFILL):
            k = min(g.tokens, r.next_stop - r.planned)
            if k == last or s.new_pages_needed(r, r.planned + k) > budget.free_pages:
                break
            last = k
            sample = r.planned + k == r.prompt_len
            out.append((GraphKind.PREFILL, g, [PlanRow(r.rid, r.handle, r.epoch, r.planned, k, sample, -1)],
                        k * (1.0 + per_token) + (unit if sample else 0.0)))
    return out


@pytest.mark.parametrize("mixed", [False, True], ids=["prefill", "mixed"])
def test_kept_prefill_candidates_select_what_every_candidate_would(monkeypatch, mixed):
    """Prefill.candidates keeps, of each graph's single-request chunks, the first two and the
    first of the highest value, computed over columns. Each kept chunk equals the reference's
    (rows and value), and every plan of a run with many prompts waiting selects the same step
    from the kept chunks as from every chunk. The columns the cohorts and MIXED candidates read
    hold what the requests' own counters and Selection.price give, in the same order."""
    from flare.scheduler import policy
    from flare.scheduler.plan import Phase
    from flare.scheduler.steps import CandidateBudget, prefill

    c = contract(max_active=16, pages=900, chunk=256, context=2048, mixed=mixed)
    sched = RequestScheduler(c, IDENTITY)
    d = Driver(sched, FakeExecutor(c, device_time=_h200_like))
    _warm(sched, d)
    select, compared, pruned_away = policy.Selection.select, [0], [0]

    def checked(self, candidates, decode, now):
        chosen = select(self, candidates, decode, now)
        by_phase = {}
        for r in self.s.live.values():
            if r.inflight == 0:
                by_phase.setdefault(r.phase, []).append(r)
        every = _every_prefill_chunk(self, CandidateBudget(by_phase, self.s.num_free_pages))
        waiting = by_phase.get(Phase.PREFILLING, [])
        cols = prefill.PrefillColumns(self, waiting)  # what the cohorts and MIXED read, per request
        chunk = self.s.contract.prefill_chunk_size
        assert [cols.requests[i] for i in cols.by_debt] == sorted(waiting, key=lambda r: r.token_debt, reverse=True)
        assert cols.rows == [(r, r.planned, r.next_stop - r.planned, r.prompt_len, len(r.pages),
                              self.price(r) / max(1, min(r.next_stop - r.planned, chunk))) for r in waiting]
        single = [cand[0] == GraphKind.PREFILL and len(cand[2]) == 1 for cand in candidates]
        if every and any(single):  # (a small step behind two pipelined ones is chosen among small steps only)
            reference = {(cand[1].index, cand[2][0].rid): (cand[2][0], cand[3]) for cand in every}
            for cand, one in zip(candidates, single):  # each kept chunk is one of them, value for value
                assert not one or reference[(cand[1].index, cand[2][0].rid)] == (cand[2][0], cand[3])
            at = single.index(True)  # the kept chunks stand where all of them stood
            full = select(self, candidates[:at] + every + [cand for cand, one in zip(candidates[at:], single[at:])
                                                           if not one], decode, now)
            assert (full.kind, full.graph_index, full.rows, full.is_funded_refresh) == \
                (chosen.kind, chosen.graph_index, chosen.rows, chosen.is_funded_refresh)
            compared[0] += 1
            pruned_away[0] += len(every) - sum(single)
        return chosen

    monkeypatch.setattr(policy.Selection, "select", checked)
    assert prefill.STEP.candidates  # the kind under test
    rids = [sched.submit(prompt(tokens(700 + i, 150 + 37 * i)), params(6), i) for i in range(40)]
    d.run()
    assert all(d.ended[rid].reason == "length" for rid in rids)
    assert compared[0] > 10 and pruned_away[0] > 0, (compared, pruned_away)


def test_a_burst_of_admissions_initializes_in_one_step_until_a_request_with_marks():
    """INITIALIZE takes the newly admitted requests together, up to the largest batch; its program
    marks the penalty tokens of its first row only, so a request with marks opens the next step."""
    sched, ex, d, _ = make(max_active=8, pages=300)
    penalised = SamplingParams(max_tokens=4, temperature=0.0, repetition_penalty=1.2)
    rids = [sched.submit(prompt(tokens(i, 20)), penalised if i in (3, 5) else params(4), i) for i in range(8)]
    d.run()
    inits = [s for s in d.steps if s.plan.kind == GraphKind.INITIALIZE]
    assert [[r.rid for r in s.plan.rows] for s in inits] == [rids[:3], rids[3:5], rids[5:]]
    assert [s.plan.batch for s in inits] == [sched.graph_for(GraphKind.INITIALIZE, n).batch for n in (3, 2, 3)]
    # the marks travel with the first row of a step, and no other row has any
    for s in inits:
        admissions = [a for _, a in s.extras]
        assert all(a.penalty_prompt is None for a in admissions[1:])
    assert inits[1].extras[0][1].penalty_prompt is not None and inits[2].extras[0][1].penalty_prompt is not None
    assert all(len(d.tokens[r]) == 4 for r in rids)
    assert d.tokens[rids[0]] == alone(tokens(0, 20), 4)


def test_small_steps_queue_beside_pipelined_steps_never_in_their_frames():
    """Two steps that decode or prefill pipeline in the window; small steps (a new request's
    INITIALIZE, terminal captures) queue in the frames beyond them instead of taking the
    frame the next decode would queue in, and are planned only while the frames those steps
    may still want stay free. While a request waits to start or holds a finished slot, one
    step that decodes or prefills is in flight, not two. Outputs match solo runs."""
    from flare.contract import FRAMES, PIPELINED_STEPS
    from flare.scheduler.steps import SMALL_KINDS

    sched, ex, d, clock = make(max_active=4, pages=300, manual=True)
    warm_up(sched, ex, d)
    specs = [(tokens(300 + i, 30), 60) for i in range(3)]  # long decoders
    specs += [(tokens(400 + i, 12 + 7 * i), 3 + i % 3) for i in range(8)]  # arriving one after another
    rids = [sched.submit(prompt(p), params(m), 9) for p, m in specs[:3]]
    beside_two = 0

    def fill():
        nonlocal beside_two
        while ex.can_submit():
            before = [s.plan.kind for s in sched.inflight]
            plan = sched.plan()
            if plan is None:
                return
            ex.submit(plan.graph_index, pack_step(d.inputs, sched.commit(plan, ex.next_fence)))
            pipelined = sum(1 for k in before if k not in SMALL_KINDS)
            if plan.kind in SMALL_KINDS:
                assert len(before) + 1 + max(0, PIPELINED_STEPS - pipelined) <= FRAMES, (before, plan.kind)
                beside_two += pipelined == PIPELINED_STEPS
            else:
                assert pipelined < sched._pipeline_depth(), (before, plan.kind)
            assert len(sched.inflight) <= FRAMES

    for it in range(5000):
        while (done := ex.poll()) is not None:
            result = sched.complete(done.fence, done.graph_index, done.records, done.duration_ns)
            for out in result.tokens:
                d.tokens[out.rid].append(out.token)
            for end in result.ended:
                d.ended[end.rid] = end
        fill()
        if len(rids) < len(specs) and it % 9 == 0 and all(r in d.ended for r in rids[3:]):
            # a request arrives while the decoders' steps are in flight
            rids.append(sched.submit(prompt(specs[len(rids)][0]), params(specs[len(rids)][1]), 9))
            fill()
        if ex.outstanding == 0 and len(rids) == len(specs) and not sched.queue and not sched.num_live:
            break
        ex.step(1)
        clock.now += 0.01
    assert beside_two > 0  # an INITIALIZE queued behind two pipelined decodes, in a frame of its own
    for rid, (p, m) in zip(rids, specs):
        assert d.tokens[rid] == alone(p, m, 9), rid
        assert d.ended[rid].reason == "length"
    assert sched.num_live == 0 and sched.reserved_pages == 0

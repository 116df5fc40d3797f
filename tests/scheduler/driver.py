"""Drive a RequestScheduler against an executor the way the runtime does (tests only)."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from flare.contract import PreparedContract
from flare.model.inputs import Inputs, pack_step
from flare.request import PreparedPrompt, SamplingParams
from flare.scheduler.scheduler import RequestScheduler

IDENTITY = bytes(range(32))


def contract(max_active=4, context=1024, chunk=256, pages=64, rows=16, vocab=1000, mixed=False) -> PreparedContract:
    return PreparedContract.build(max_active=max_active, context=context, prefill_chunk_size=chunk,
                                  num_pages=pages, num_snapshot_rows=rows, vocab_size=vocab, hidden_size=8,
                                  mixed_prefill=mixed)


def prompt(tokens, endpoints=()) -> PreparedPrompt:
    return PreparedPrompt(np.asarray(tokens, dtype=np.int32), tuple(endpoints))


def params(max_tokens=8, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, **kw)


class Driver:
    def __init__(self, sched: RequestScheduler, executor):
        self.sched = sched
        self.ex = executor
        self.inputs = Inputs(sched.contract)
        self.tokens: dict[int, list[int]] = defaultdict(list)
        self.ended: dict[int, object] = {}
        self.steps = []  # committed steps, in order
        self.results = []

    def pump(self, max_completions: int | None = None) -> bool:
        """Process completions, then submit while possible. Returns whether anything happened.

        ``max_completions=1`` mimics the runtime polling one completion at a time, so a
        pipelined decode is usually still in flight when the next plan is made.
        """
        happened = False
        taken = 0
        while (max_completions is None or taken < max_completions) and (done := self.ex.poll()) is not None:
            taken += 1
            happened = True
            assert done.error is None, done.error
            result = self.sched.complete(done.fence, done.graph_index, done.records, done.duration_ns)
            self.results.append(result)
            for out in result.tokens:
                self.tokens[out.rid].append(out.token)
            for end in result.ended:
                self.ended[end.rid] = end
        while self.ex.can_submit():
            plan = self.sched.plan()
            if plan is None:
                break
            step = self.sched.commit(plan, self.ex.next_fence)
            self.steps.append(step)
            self.ex.submit(plan.graph_index, pack_step(self.inputs, step))
            happened = True
        return happened

    def run(self, max_rounds: int = 100000) -> None:
        for _ in range(max_rounds):
            if not self.pump() and self.ex.outstanding == 0:
                return
        raise AssertionError("scheduler did not go idle")

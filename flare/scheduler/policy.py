"""Selection policy: value per duration over every step kind's candidates, fairness prices.

See docs/scheduler.md for the policy in prose. Selection reads the scheduler
through a :class:`~flare.scheduler.view.SchedulerView` and the snapshot rows of
candidates through :class:`~flare.scheduler.targets.CheckpointTargets`; it never
mutates request phases or resources. Each step kind's module (steps/) proposes
its candidates; this module prices and scores them. Its only writes are the
fairness debts in the SlotTable (after each completion).
"""

from __future__ import annotations

import math

import numpy as np

from .._fast import sched as fast
from ..contract import GraphKind, GraphSpec
from .live import LiveRequest
from .plan import CommittedStep, Phase, RowArrays, ScheduledPlan
from .steps import DECODE, ROW_STEPS, Candidate, CandidateBudget
from .targets import CheckpointTargets
from .view import SchedulerView

# Phase codes are ordered: INITIALIZING..SNAPSHOTTING (1..5) precede DECODING (6) and FINISHING (7).
assert Phase.INITIALIZING < Phase.SNAPSHOTTING < Phase.DECODING < Phase.FINISHING
_FIRST, _LAST_PREP = int(Phase.INITIALIZING), int(Phase.SNAPSHOTTING)
_DECODING, _FINISHING = int(Phase.DECODING), int(Phase.FINISHING)


class Selection:
    def __init__(self, view: SchedulerView, targets: CheckpointTargets):
        self.s = view
        self.targets = targets
        self.pol = view.policy
        self.per_prompt_s = 0.0  # solo seconds per prompt token (0: unmeasured)
        self.per_output_s = 0.0  # solo seconds per output token
        self._solo_version = -1  # the timing version the solo costs were computed at

    # -- candidates -----------------------------------------------------------

    def has_other_work(self) -> bool:
        """Any admitted request waiting for a non-decode step (with nothing in flight)."""
        t = self.s.table
        phase = t.phase
        other = ((phase >= _FIRST) & (phase <= _LAST_PREP)) | (phase == _FINISHING)
        return bool(np.any(other & (t.inflight == 0)))

    def candidates(self, small: bool = True, large: bool = True) -> list[Candidate]:
        """(kind, graph, rows, value) for every runnable cohort and shape but decode, from
        each row-wise step kind in registry order: the small kinds' (StepKind.small) with
        ``small``, the others' with ``large``."""
        by_phase: dict[Phase, list[LiveRequest]] = {}
        for r in self.s.live.values():
            if r.inflight == 0:
                by_phase.setdefault(r.phase, []).append(r)
        budget = CandidateBudget(by_phase, self.s.num_free_pages)
        out: list[Candidate] = []
        for step in ROW_STEPS:
            if (small if step.small else large):
                out.extend(step.candidates(self, budget))
        return out

    # -- selection -------------------------------------------------------------

    def select(self, candidates: list[Candidate], decode: tuple[GraphSpec, np.ndarray, float] | None,
               now: float) -> ScheduledPlan:
        """Score candidates (plus the column-wise decode cohort) and build the winner's plan."""
        s, pol = self.s, self.pol
        t = s.table
        waiting_decode = t.phase == int(Phase.DECODING)
        waiting_decode &= ~t.ended
        num_decoding = int(np.count_nonzero(waiting_decode))
        num_terminal = int(np.count_nonzero(t.phase == int(Phase.FINISHING)))
        n = len(candidates) + (decode is not None)
        est = np.empty(n, np.float64)
        value = np.empty(n, np.float64)
        wait = np.empty(n, np.float64)
        stale = np.zeros(n, np.bool_)
        graphs: list[GraphSpec] = []
        for i, (kind, graph, rows, v) in enumerate(candidates):
            if kind == GraphKind.MIXED:  # MixedRows: its decode cohort, then prefill rows
                served_decoding, served_terminal = len(rows.decode), 0
            elif kind == GraphKind.SPECULATIVE:  # SpeculativeRows: decoders only
                served_decoding, served_terminal = len(rows), 0
            else:
                served_decoding = sum(1 for r in rows if s.live[r.rid].phase == Phase.DECODING)
                served_terminal = sum(1 for r in rows if s.live[r.rid].phase == Phase.FINISHING)
            est[i] = s.timing.estimate_ns(graph.index) * 1e-6  # ms
            value[i] = v
            wait[i] = (pol.decode_age_price * (num_decoding - served_decoding)
                       + pol.terminal_age_price * (num_terminal - served_terminal))
            stale[i] = s.timing.is_stale(graph.index, now)
            graphs.append(graph)
        if decode is not None:
            graph, slots, v = decode
            i = n - 1
            est[i] = s.timing.estimate_ns(graph.index) * 1e-6
            value[i] = v
            wait[i] = pol.decode_age_price * (num_decoding - len(slots)) + pol.terminal_age_price * num_terminal
            stale[i] = s.timing.is_stale(graph.index, now)
            graphs.append(graph)
        best = fast.select_candidate(value, est, wait)
        funded = False
        if s.timing.has_full_credit and est[best] > 0:
            stale_ids = [i for i in range(n) if stale[i] and i != best]
            if stale_ids:
                best = min(stale_ids, key=lambda i: s.timing.refresh_order(graphs[i].index))
                funded = True
        graph = graphs[best]
        if decode is not None and best == n - 1:
            kind, cols = GraphKind.DECODE, DECODE.plan_rows(s, decode[1])
        else:
            kind, _, rows, _ = candidates[best]
            if kind == GraphKind.MIXED:  # its decode rows lead (steps/mixed.py)
                cols = RowArrays.concat(rows.decode, RowArrays.from_rows(rows.prefill))
            elif kind == GraphKind.SPECULATIVE:
                cols = rows.cols
            else:
                cols = RowArrays.from_rows(rows)
        decode_rows = len(rows.decode) if kind == GraphKind.MIXED else 0
        drafts = rows.drafts if kind == GraphKind.SPECULATIVE else ()
        return ScheduledPlan(s.id, kind, graph.index, graph.batch, graph.tokens, cols,
                             s.timing.estimate_ns(graph.index), funded or bool(stale[best]), funded,
                             graph.width, decode_rows, drafts)

    # -- fairness --------------------------------------------------------------

    def price(self, r: LiveRequest) -> float:
        """Token-service price in prompt-token units: the tokens the request could have been
        served alone during its unserved time (its debt), times token_fairness."""
        pol = self.pol
        if r.phase == Phase.DECODING:
            per = self.per_output_s
            return pol.token_fairness * pol.output_token_value * r.token_debt / per if per else 0.0
        per = self.per_prompt_s
        return pol.token_fairness * r.token_debt / per if per else 0.0

    def refresh_solo_costs(self) -> None:
        """Seconds per token a request gets alone: the best measured prefill capacity per prompt
        token, the smallest measured decode graph (general or greedy) per output token (0 while
        unmeasured). Recomputed only when an estimate changed."""
        s = self.s
        if self._solo_version == s.timing.version:
            return
        self._solo_version = s.timing.version
        per_prompt = 0.0
        for g in (*s.graphs_of(GraphKind.PREFILL), *s.mixed_graphs.get(0, ())):
            est = s.timing.estimate_ns(g.index)
            if est and (per_prompt == 0.0 or est * 1e-9 / g.tokens < per_prompt):
                per_prompt = est * 1e-9 / g.tokens
        per_output = 0.0
        for g in s.decode_graphs:  # smallest batch first, either variant
            est = s.timing.estimate_ns(g.index)
            if est:
                per_output = est * 1e-9
                break
        self.per_prompt_s, self.per_output_s = per_prompt, per_output

    def update_prices(self, step: CommittedStep, elapsed: float, delivered: np.ndarray) -> None:
        """Every runnable request's debt grows by the frame's duration and shrinks by the solo
        service time of the tokens the frame gave it (unmeasured graphs give none). Debt fades
        with the adaptation time (service_price_adaptation_s), so prices follow recent service.
        Only relative debt matters: the minimum is subtracted."""
        self.refresh_solo_costs()
        t = self.s.table
        cols = step.cols
        fast.update_debts(t.phase, t.ended.view(np.uint8), t.token_debt, t.delivery_debt, cols.slots,
                          cols.num_tokens + cols.sample, delivered, self.per_prompt_s, self.per_output_s,
                          elapsed, math.exp(-elapsed / self.pol.service_price_adaptation_s), _FIRST, _DECODING)

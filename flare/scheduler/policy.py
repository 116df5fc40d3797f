"""Selection policy: candidates, value per duration, fairness prices.

See docs/scheduler.md for the policy in prose. Selection reads the scheduler
through a :class:`~flare.scheduler.view.SchedulerView` and the snapshot rows of
candidates through :class:`~flare.scheduler.targets.CheckpointTargets`; it never
mutates request phases or resources. Its only writes are the fairness debts in
the SlotTable (after each completion).
"""

from __future__ import annotations

import math

import numpy as np

from .._fast import sched as fast
from ..contract import GraphKind, GraphSpec
from .live import LiveRequest
from .plan import CommittedStep, Phase, PlanRow, RowArrays, ScheduledPlan
from .targets import CheckpointTargets
from .view import SchedulerView

Candidate = tuple[GraphKind, GraphSpec, list[PlanRow], float]

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

    # -- candidates -----------------------------------------------------------

    def decodable(self) -> np.ndarray:
        """Slots whose request can take another decode step now (column-wise test)."""
        t = self.s.table
        mask = (t.phase == int(Phase.DECODING)) & ~t.ended & (t.planned_gen < t.limit)
        return np.flatnonzero(mask)

    def has_other_work(self) -> bool:
        """Any admitted request waiting for a non-decode step (with nothing in flight)."""
        t = self.s.table
        phase = t.phase
        other = ((phase >= _FIRST) & (phase <= _LAST_PREP)) | (phase == _FINISHING)
        return bool(np.any(other & (t.inflight == 0)))

    def decode_pages_needed(self, slots: np.ndarray) -> np.ndarray:
        """Mask of slots whose next decode position needs a new page."""
        t = self.s.table
        return t.planned[slots] >= t.num_pages[slots] * self.s.page_tokens

    def decode_value(self, slots: np.ndarray) -> float:
        t = self.s.table
        unit = self.pol.output_token_value
        value = unit * len(slots)
        if self.per_output_s:
            value += (self.pol.token_fairness * unit * t.token_debt[slots].sum()
                      + self.pol.delivery_fairness * unit * t.delivery_debt[slots].sum()) / self.per_output_s
        return float(value)

    def decode_plan_rows(self, slots: np.ndarray) -> RowArrays:
        t = self.s.table
        n = len(slots)
        ones = np.ones(n, np.int64)
        return RowArrays(t.rid[slots].copy(), slots.astype(np.int64), t.generation[slots].copy(),
                         t.epoch[slots].copy(), t.planned[slots].copy(), ones, ones.copy(),
                         np.full(n, -1, np.int64))

    def candidates(self) -> list[Candidate]:
        """(kind, graph, rows, value) for every runnable cohort and shape but decode."""
        s = self.s
        out: list[Candidate] = []
        unit = self.pol.output_token_value
        free_pages = s.num_free_pages
        by_phase: dict[Phase, list[LiveRequest]] = {}
        for r in s.live.values():
            if r.inflight == 0:
                by_phase.setdefault(r.phase, []).append(r)
        for r in by_phase.get(Phase.INITIALIZING, ())[:1]:
            if s.new_pages_needed(r, len(r.pages) * s.page_tokens) <= free_pages:
                rows = [PlanRow(r.rid, r.handle, r.epoch, 0, 0, False, -1)]
                out.append((GraphKind.INITIALIZE, s.graph_for(GraphKind.INITIALIZE, 1), rows, unit + self.price(r)))
        for phase, kind in ((Phase.RESTORING, GraphKind.RESTORE), (Phase.RESUMING, GraphKind.RESUME),
                            (Phase.SNAPSHOTTING, GraphKind.SNAPSHOT)):
            group = by_phase.get(phase, [])[:s.contract.max_batch]
            if phase == Phase.RESTORING:
                fits = []
                for r in group:
                    need = s.new_pages_needed(r, r.reused + 1)
                    if need <= free_pages:
                        free_pages -= need
                        fits.append(r)
                group = fits
            if not group:
                continue
            rows = []
            for r in group:
                if kind == GraphKind.RESTORE:
                    rows.append(PlanRow(r.rid, r.handle, r.epoch, r.reused, 0, False, self.targets.restore_row(r)))
                elif kind == GraphKind.SNAPSHOT:
                    rows.append(PlanRow(r.rid, r.handle, r.epoch, r.planned, 0, False, self.targets.due_row(r)))
                else:
                    rows.append(PlanRow(r.rid, r.handle, r.epoch, r.planned, 0, True, -1))
            out.append((kind, s.graph_for(kind, len(rows)), rows, sum(unit + self.price(r) for r in group)))
        finishing = [r for r in by_phase.get(Phase.FINISHING, ()) if r.terminal_row >= 0][:s.contract.max_batch]
        if finishing:
            now = s.clock()
            rows = [PlanRow(r.rid, r.handle, r.epoch, r.planned, 0, False, r.terminal_row) for r in finishing]
            value = sum(self.pol.terminal_value + self.pol.terminal_age_price * (now - r.finished_at) * 1e3
                        for r in finishing)
            out.append((GraphKind.SNAPSHOT, s.graph_for(GraphKind.SNAPSHOT, len(rows)), rows, value))
        prefilling = by_phase.get(Phase.PREFILLING, [])
        for r in prefilling:
            planned = r.planned
            remaining = r.next_stop - planned
            per_token = self.prefill_price_per_token(r)
            last_tokens = -1
            for g in s.graphs_of(GraphKind.PREFILL):
                k = min(g.tokens, remaining)
                if k == last_tokens:
                    break  # larger capacities consume the same tokens: dominated
                last_tokens = k
                if s.new_pages_needed(r, planned + k) > free_pages:
                    break
                sample = planned + k == r.prompt_len
                rows = [PlanRow(r.rid, r.handle, r.epoch, planned, k, sample, -1)]
                out.append((GraphKind.PREFILL, g, rows, k * (1.0 + per_token) + (unit if sample else 0.0)))
        if len(prefilling) > 1:
            out.extend(self.prefill_cohorts(prefilling, free_pages))
        return out

    def prefill_price_per_token(self, r: LiveRequest) -> float:
        """The token-service price is paid per token served: a chunk earns the share of it
        that its tokens are of the request's largest feasible chunk. (Paid whole to any
        chunk, it would make the smallest capacity the best value per millisecond and cut
        prompts into 64-token steps that each cost a full weight pass.)"""
        return self.price(r) / max(1, min(r.next_stop - r.planned, self.s.contract.prefill_chunk_size))

    def prefill_cohorts(self, prefilling: list[LiveRequest], free_pages: int) -> list[Candidate]:
        """Cohort prefill candidates: the most indebted requests first, each row consuming
        what the token capacity allows up to its next stop. A batch capacity that a smaller
        one could hold, or a token capacity consuming the same tokens as a smaller one, is
        dominated and skipped."""
        s, unit = self.s, self.pol.output_token_value
        order = sorted(prefilling, key=lambda r: r.token_debt, reverse=True)
        per_token = {r.rid: self.prefill_price_per_token(r) for r in order}
        out: list[Candidate] = []
        last: tuple[int, tuple[int, ...]] | None = None
        for g in s.cohort_prefill_graphs:  # by (batch, tokens)
            if len(order) <= g.batch // 2:
                break  # every larger batch is dominated too
            rows, value, pages = [], 0.0, free_pages
            for r in order[:g.batch]:
                k = min(g.tokens, r.next_stop - r.planned)
                need = s.new_pages_needed(r, r.planned + k)
                if need > pages:
                    continue
                pages -= need
                sample = r.planned + k == r.prompt_len
                rows.append(PlanRow(r.rid, r.handle, r.epoch, r.planned, k, sample, -1))
                value += k * (1.0 + per_token[r.rid]) + (unit if sample else 0.0)
            if len(rows) < 2:
                continue
            work = (g.batch, tuple(row.num_tokens for row in rows))
            if last is not None and work == last:
                continue  # a smaller token capacity consumes the same tokens
            last = work
            out.append((GraphKind.PREFILL, g, rows, value))
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
            kind, cols = GraphKind.DECODE, self.decode_plan_rows(decode[1])
        else:
            kind, _, rows, _ = candidates[best]
            cols = RowArrays.from_rows(rows)
        return ScheduledPlan(s.id, kind, graph.index, graph.batch, graph.tokens, cols,
                             s.timing.estimate_ns(graph.index), funded or bool(stale[best]), funded)

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
        unmeasured)."""
        s = self.s
        per_prompt = 0.0
        for g in s.graphs_of(GraphKind.PREFILL):
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

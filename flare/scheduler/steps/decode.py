"""DECODE: every decoding request with room to grow, as one column-wise cohort.

Decode never builds per-row Python objects: the cohort, its value, its plan rows
and its commit are vectorized over the SlotTable, so a 64-request step costs a
handful of NumPy operations. The cohort runs on the greedy graph variant when
every row is plain (greedy without logprobs).
"""

from __future__ import annotations

import numpy as np

from ...contract import GraphKind, GraphSpec
from ..errors import StalePlanError
from ..plan import CommittedStep, PageUpload, Phase, RowArrays, ScheduledPlan
from .base import StepKind


class Decode(StepKind):
    kind = GraphKind.DECODE
    name = "decode"
    phases = (Phase.DECODING,)

    @staticmethod
    def decodable(view) -> np.ndarray:
        """Slots whose request can take another decode step now (column-wise test)."""
        t = view.table
        mask = (t.phase == int(Phase.DECODING)) & ~t.ended & (t.planned_gen < t.limit) & ~t.spec_inflight
        return np.flatnonzero(mask)

    @staticmethod
    def pages_needed(view, slots: np.ndarray) -> np.ndarray:
        """Mask of slots whose next decode position needs a new page."""
        t = view.table
        return t.planned[slots] >= t.num_pages[slots] * view.page_tokens

    @classmethod
    def over_reservation(cls, view, slots: np.ndarray) -> list[int]:
        """The slots whose next position needs a page past their reservation."""
        needing = slots[cls.pages_needed(view, slots)]
        return [int(s) for s in needing if view.by_slot[int(s)].page_budget == 0]

    @classmethod
    def cohort_slots(cls, view) -> np.ndarray:
        """The slots that can decode now: every decodable slot, less those whose next position
        needs a page past their reservation when no unreserved page is left (they wait for one;
        the scheduler preempts to free them: RequestScheduler.starved_decoders). Empty when the
        pages the rest need are not free yet (retiring)."""
        slots = cls.decodable(view)
        over = cls.over_reservation(view, slots)
        if over and len(over) > view.unreserved_pages:
            slots = np.setdiff1d(slots, over[view.unreserved_pages:], assume_unique=True)
        return slots if int(np.count_nonzero(cls.pages_needed(view, slots))) <= view.num_free_pages else slots[:0]

    def cohort(self, view) -> tuple[GraphSpec, np.ndarray] | None:
        """The decode candidate: (graph, slots), or None when no slot can decode or the new
        pages it needs are not free."""
        slots = self.cohort_slots(view)
        if not len(slots):
            return None
        general, greedy = view.decode_graph_for[len(slots)]
        return (greedy if greedy is not None and view.table.plain[slots].all() else general), slots

    @staticmethod
    def value(sel, slots: np.ndarray) -> float:
        t = sel.s.table
        pol = sel.pol
        unit = pol.output_token_value
        value = unit * len(slots)
        if sel.per_output_s:
            value += (pol.token_fairness * unit * t.token_debt[slots].sum()
                      + pol.delivery_fairness * unit * t.delivery_debt[slots].sum()) / sel.per_output_s
        return float(value)

    @staticmethod
    def plan_rows(view, slots: np.ndarray) -> RowArrays:
        """The rows of a cohort, each consuming one position and sampling."""
        t = view.table
        n = len(slots)
        ones = np.ones(n, np.int64)
        return RowArrays(t.rid[slots].copy(), slots.astype(np.int64), t.generation[slots].copy(),
                         t.epoch[slots].copy(), t.planned[slots].copy(), ones, ones.copy(),
                         np.full(n, -1, np.int64))

    def commit(self, view, plan: ScheduledPlan, fence: int, now: float) -> CommittedStep:
        """Column-wise commit: assign the pages new positions need, advance every row."""
        t = view.table
        slots = plan.cols.slots
        if int(np.count_nonzero(self.pages_needed(view, slots))) > view.num_free_pages:
            raise StalePlanError("the plan needs more free pages than are available")
        uploads = self.advance(view, slots, fence, now)
        return CommittedStep(fence, plan, t.planned[slots].copy(), t.reported_generated(slots), uploads,
                             committed_at=now)

    @classmethod
    def advance(cls, view, slots: np.ndarray, fence: int, now: float) -> tuple[PageUpload, ...]:
        """Commit decode rows column-wise (their pages already checked free): assign the pages
        their new positions need and advance every row's planned state; -> the page uploads."""
        t = view.table
        grow = slots[cls.pages_needed(view, slots)]
        uploads = tuple(view.assign_pages(view.by_slot[int(s)], int(t.planned[s]) + 1) for s in grow)
        t.planned[slots] += 1
        t.planned_gen[slots] += 1
        t.inflight[slots] += 1
        t.last_fence[slots] = fence
        t.epoch[slots] += 1
        t.last_progress[slots] = now
        return tuple(u for u in uploads if u.pages)


STEP = Decode()

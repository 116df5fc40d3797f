"""RESUME: sample a full prompt hit's first token from its restored hidden state (no replay)."""

from __future__ import annotations

from ...contract import GraphKind
from ..plan import Phase, PlanRow
from .base import StepKind


class Resume(StepKind):
    kind = GraphKind.RESUME
    name = "resume_sampling"
    phases = (Phase.RESUMING,)
    small = True

    def candidates(self, sel, budget):
        s = sel.s
        group = budget.by_phase.get(Phase.RESUMING, [])[:s.contract.max_batch]
        if not group:
            return []
        unit = sel.pol.output_token_value
        rows = [PlanRow(r.rid, r.handle, r.epoch, r.planned, 0, True, -1) for r in group]
        return [(GraphKind.RESUME, s.graph_for(GraphKind.RESUME, len(rows)), rows,
                 sum(unit + sel.price(r) for r in group))]

    def commit_row(self, view, row, req, fence, now):
        req.planned_generated += 1
        req.phase = Phase.DECODING
        req.last_progress = now
        return None, None


STEP = Resume()

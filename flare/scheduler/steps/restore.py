"""RESTORE: copy a cached checkpoint's snapshot row into the request's private tail page."""

from __future__ import annotations

from ...contract import GraphKind
from ..plan import Phase, PlanRow
from .base import StepKind


class Restore(StepKind):
    kind = GraphKind.RESTORE
    name = "restore"
    phases = (Phase.RESTORING,)
    small = True

    def candidates(self, sel, budget):
        s = sel.s
        fits = []
        for r in budget.by_phase.get(Phase.RESTORING, [])[:s.contract.max_batch]:
            need = s.new_pages_needed(r, r.reused + 1)
            if need <= budget.free_pages:
                budget.free_pages -= need  # NOTE: later kinds (prefill) see the pages these rows claim
                fits.append(r)
        if not fits:
            return []
        unit = sel.pol.output_token_value
        rows = [PlanRow(r.rid, r.handle, r.epoch, r.reused, 0, False, sel.targets.restore_row(r)) for r in fits]
        return [(GraphKind.RESTORE, s.graph_for(GraphKind.RESTORE, len(rows)), rows,
                 sum(unit + sel.price(r) for r in fits))]

    def mapped_positions(self, view, row, req):
        return req.reused + 1

    def commit_row(self, view, row, req, fence, now):
        req.planned = req.reused
        req.phase = Phase.RESUMING if req.reused == req.prompt_len else Phase.PREFILLING
        return None, None


STEP = Restore()

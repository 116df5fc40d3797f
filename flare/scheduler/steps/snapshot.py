"""SNAPSHOT: capture a checkpoint (tail page + hidden state) into a reserved snapshot row.

Two candidates: requests at a selected checkpoint endpoint (SNAPSHOTTING), and
finished requests whose terminal capture makes their whole history the next
turn's prefix (FINISHING), valued by terminal_value plus their age.
"""

from __future__ import annotations

from ...contract import GraphKind
from ..plan import Phase, PlanRow
from .base import StepKind


class Snapshot(StepKind):
    kind = GraphKind.SNAPSHOT
    name = "snapshot"
    phases = (Phase.SNAPSHOTTING, Phase.FINISHING)
    small = True

    def candidates(self, sel, budget):
        s, pol = sel.s, sel.pol
        out = []
        group = budget.by_phase.get(Phase.SNAPSHOTTING, [])[:s.contract.max_batch]
        if group:
            unit = pol.output_token_value
            rows = [PlanRow(r.rid, r.handle, r.epoch, r.planned, 0, False, sel.targets.due_row(r)) for r in group]
            out.append((GraphKind.SNAPSHOT, s.graph_for(GraphKind.SNAPSHOT, len(rows)), rows,
                        sum(unit + sel.price(r) for r in group)))
        finishing = [r for r in budget.by_phase.get(Phase.FINISHING, ())
                     if r.terminal_row >= 0][:s.contract.max_batch]
        if finishing:
            now = s.clock()
            rows = [PlanRow(r.rid, r.handle, r.epoch, r.planned, 0, False, r.terminal_row) for r in finishing]
            value = sum(pol.terminal_value + pol.terminal_age_price * (now - r.finished_at) * 1e3
                        for r in finishing)
            out.append((GraphKind.SNAPSHOT, s.graph_for(GraphKind.SNAPSHOT, len(rows)), rows, value))
        return out

    def commit_row(self, view, row, req, fence, now):
        view.publish_snapshot(req, row.snapshot, fence, terminal=req.phase == Phase.FINISHING)
        return None, None


STEP = Snapshot()

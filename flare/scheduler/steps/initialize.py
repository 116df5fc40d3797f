"""INITIALIZE: a newly admitted request's first step (penalty state, prompt marks, its slot rows)."""

from __future__ import annotations

from ...contract import GraphKind
from ..plan import Admission, Phase, PlanRow
from .base import StepKind


class Initialize(StepKind):
    kind = GraphKind.INITIALIZE
    name = "initialize"
    phases = (Phase.INITIALIZING,)

    def candidates(self, sel, budget):
        s = sel.s
        out = []
        for r in budget.by_phase.get(Phase.INITIALIZING, ())[:1]:  # it marks one request's prompt
            if s.new_pages_needed(r, len(r.pages) * s.page_tokens) <= budget.free_pages:
                rows = [PlanRow(r.rid, r.handle, r.epoch, 0, 0, False, -1)]
                out.append((GraphKind.INITIALIZE, s.graph_for(GraphKind.INITIALIZE, 1), rows,
                            sel.pol.output_token_value + sel.price(r)))
        return out

    def mapped_positions(self, view, row, req):
        return len(req.pages) * view.page_tokens

    def commit_row(self, view, row, req, fence, now):
        p = req.params
        penalty = req.prompt if p.repetition_penalty != 1.0 else None
        outputs = None
        if req.base_outputs is not None and (p.repetition_penalty != 1.0 or p.presence_penalty or p.frequency_penalty):
            outputs = req.base_outputs  # a continuation: the tokens it sampled before count as outputs
        admission = Admission(req.reused, req.seed, p, penalty, req.gen_base, outputs)
        req.planned = req.reused
        if req.tip is not None:
            view.cache.mark_used(req.tip, fence)  # the first step that reads the cached prefix
        # A cached tail page (or the hidden state of a full hit) comes from the snapshot row.
        restore = req.reused and (req.reused % view.page_tokens or req.reused == req.prompt_len)
        req.phase = Phase.RESTORING if restore else Phase.PREFILLING
        return None, admission


STEP = Initialize()

"""INITIALIZE: a newly admitted request's first step (penalty state, prompt marks, its slot rows)."""

from __future__ import annotations

from ...contract import GraphKind
from ..plan import Admission, Phase, PlanRow
from .base import StepKind


def marks_prompt(req) -> bool:
    """Whether the request's INITIALIZE marks tokens for the penalties (step.prompt): its prompt
    for a repetition penalty, or a continuation's earlier outputs for any penalty."""
    p = req.params
    return p.repetition_penalty != 1.0 or (req.base_outputs is not None
                                           and bool(p.presence_penalty or p.frequency_penalty))


class Initialize(StepKind):
    kind = GraphKind.INITIALIZE
    name = "initialize"
    phases = (Phase.INITIALIZING,)
    small = True

    def candidates(self, sel, budget):
        # One step takes the newly admitted requests in arrival order, up to the largest
        # batch, as long as their pages fit. The program marks the prompt tokens of its first
        # row only, so a request with marks opens a step and the next one with marks waits
        # for the following step.
        s = sel.s
        rows, value, pages = [], 0.0, 0
        for r in budget.by_phase.get(Phase.INITIALIZING, ())[:s.contract.max_batch]:
            if rows and marks_prompt(r):
                break
            need = s.new_pages_needed(r, len(r.pages) * s.page_tokens)
            if pages + need > budget.free_pages:
                break
            pages += need
            rows.append(PlanRow(r.rid, r.handle, r.epoch, 0, 0, False, -1))
            value += sel.pol.output_token_value + sel.price(r)
        if not rows:
            return []
        return [(GraphKind.INITIALIZE, s.graph_for(GraphKind.INITIALIZE, len(rows)), rows, value)]

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

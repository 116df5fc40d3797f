"""StepKind: what one step kind contributes to planning, commit and completion.

A step kind's module (one per GraphKind, found through the registry in
``steps/__init__.py``) owns its candidates (which requests it can serve now, as
which graph, for what value), its commit rule (how a committed row moves its
request's planned state and phase, and which positions it must have mapped) and
its completion rule (the most tokens one of its records may report).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ...contract import GraphKind, GraphSpec
from ..plan import Admission, Phase, PlanRow

if TYPE_CHECKING:
    from ..live import LiveRequest
    from ..policy import Selection
    from ..view import CommitView

Candidate = tuple[GraphKind, GraphSpec, list[PlanRow], float]  # (kind, graph, rows, value)
RowExtra = tuple["np.ndarray | None", "Admission | None"]  # (prefill tokens, admission) of a committed row


class CandidateBudget:
    """What one plan()'s candidate kinds share: the requests with nothing in flight, by
    phase, the KV pages still free after earlier kinds' rows claimed theirs, and the
    prefilling requests' counters as columns (steps/prefill.py, built by the first kind
    that needs them)."""

    __slots__ = ("by_phase", "free_pages", "prefill_columns")

    def __init__(self, by_phase: "dict[Phase, list[LiveRequest]]", free_pages: int):
        self.by_phase = by_phase
        self.free_pages = free_pages
        self.prefill_columns = None


class StepKind:
    kind: GraphKind
    name: str  # launch name in stats and metrics (flare_graph_launches_total{kind=...})
    phases: tuple[Phase, ...] = ()  # request phases this kind serves
    max_new_tokens = 1  # completion rule: the most tokens one record of this kind may report
    # A step of a few copies (and at most a sample from a kept hidden state): tens of
    # microseconds on the device. Small steps take the frames beyond the ones the steps that
    # decode or prefill pipeline in, never one of those (flare.contract.FRAMES).
    small = False

    def candidates(self, sel: "Selection", budget: CandidateBudget) -> list[Candidate]:
        """Row-wise candidates of this kind (decode builds its cohort column-wise instead)."""
        return []

    def mapped_positions(self, view: "CommitView", row: PlanRow, req: "LiveRequest") -> int:
        """Positions [0, n) whose pages must be assigned before the row runs."""
        return 0

    def commit_row(self, view: "CommitView", row: PlanRow, req: "LiveRequest", fence: int,
                   now: float) -> RowExtra:
        """Advance the request's planned state for a committed row; returns what the runtime packs."""
        return None, None

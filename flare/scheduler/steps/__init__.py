"""One module per step kind, found through this registry.

``STEPS`` maps each GraphKind to its StepKind; ``ROW_STEPS`` lists the row-wise kinds
in the order their candidates are generated (ties in selection go to the earlier
candidate, so the order is part of the policy). Decode builds its cohort
column-wise (decode.py). A new kind is a new module here plus a registry entry.
"""

from __future__ import annotations

from ...contract import GraphKind
from . import decode, initialize, mixed, prefill, restore, resume, snapshot, speculative
from .base import Candidate, CandidateBudget, RowExtra, StepKind

STEPS: dict[GraphKind, StepKind] = {
    step.kind: step for step in (initialize.STEP, restore.STEP, resume.STEP, snapshot.STEP, prefill.STEP,
                                 mixed.STEP, decode.STEP, speculative.STEP)
}
ROW_STEPS: tuple[StepKind, ...] = (initialize.STEP, restore.STEP, resume.STEP, snapshot.STEP, prefill.STEP,
                                   mixed.STEP)
DECODE = decode.STEP
LAUNCH_NAMES: dict[GraphKind, str] = {kind: step.name for kind, step in STEPS.items()}
SMALL_KINDS = frozenset(kind for kind, step in STEPS.items() if step.small)

__all__ = ["Candidate", "CandidateBudget", "DECODE", "LAUNCH_NAMES", "ROW_STEPS", "RowExtra", "SMALL_KINDS", "STEPS",
           "StepKind"]

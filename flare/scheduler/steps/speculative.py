"""SPECULATIVE: verify drafted tokens of decoding requests, several tokens per row and step.

Its candidates, commit and completion need the proposer and each request's acceptance
statistics, so they live with them in scheduler/speculation.py; this module registers the
kind (its launch name and completion bound).
"""

from __future__ import annotations

from ...contract import RECORD_TOKENS, GraphKind
from .base import StepKind


class Speculative(StepKind):
    kind = GraphKind.SPECULATIVE
    name = "speculative"
    max_new_tokens = RECORD_TOKENS  # the row's accepted drafts and the token after them


STEP = Speculative()

"""Plans, commits and completion results exchanged with the runtime.

A :class:`ScheduledPlan` is immutable: it names one graph and the requests it
serves with their state epochs. ``commit`` turns it into a :class:`CommittedStep`
whose rows carry everything the runtime packs (new page-table entries,
admission state, prefill tokens, snapshot rows); ``complete`` returns a
:class:`StepResult` with the tokens to publish and the requests that ended.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import NamedTuple

import numpy as np

from ..model.contract import GraphKind
from ..request import SamplingParams


class Phase(IntEnum):
    """A live request's scheduler phase (shown by the dashboard)."""

    QUEUED = 0  # waiting for a slot and resources
    INITIALIZING = 1  # admitted; its INITIALIZE program has not run
    RESTORING = 2  # a cached tail must be restored into its private page
    RESUMING = 3  # full prompt hit: sample from the restored state
    PREFILLING = 4  # consuming prompt tokens
    SNAPSHOTTING = 5  # at a selected checkpoint endpoint, awaiting its snapshot
    DECODING = 6  # generating
    FINISHING = 7  # terminal: a terminal snapshot may still be taken
    RETIRING = 8  # resources wait for the last fence
    RETIRED = 9


class Handle(NamedTuple):
    """A live request's physical slot and generation (positive, int64-safe)."""

    slot: int
    generation: int


class PlanRow(NamedTuple):
    rid: int  # scheduler request ID
    handle: Handle
    epoch: int
    start: int  # consumed tokens before this step (device position)
    num_tokens: int  # tokens this row consumes (prefill: prompt tokens; decode: 1)
    sample: bool  # whether the row samples a token
    snapshot: int  # snapshot row (SNAPSHOT/RESTORE), -1 otherwise


@dataclass(frozen=True)
class ScheduledPlan:
    scheduler_id: int
    kind: GraphKind
    graph_index: int
    batch: int  # graph row capacity
    tokens: int  # graph token capacity
    rows: tuple[PlanRow, ...]
    estimate_ns: int  # the graph's estimate when planned (0: unmeasured)
    is_refresh: bool = False  # a stale graph: it runs alone and refreshes its estimate
    is_funded_refresh: bool = False  # chosen over the winner on refresh credit (commit pays)


class Admission(NamedTuple):
    """State the runtime uploads when a request first takes its slot."""

    position: int  # reused prefix tokens
    seed: int
    params: SamplingParams
    penalty_prompt: np.ndarray | None  # prompt tokens to mark for repetition penalty


class CommittedRow(NamedTuple):
    rid: int
    handle: Handle
    start: int
    num_tokens: int
    sample: bool
    snapshot: int
    first_page: int  # page-table index of new_pages[0]
    new_pages: tuple[int, ...]  # logical page IDs to upload before the step
    tokens: np.ndarray | None  # prefill input tokens (int32)
    admission: Admission | None  # INITIALIZE only


@dataclass(frozen=True)
class CommittedStep:
    fence: int
    plan: ScheduledPlan
    rows: tuple[CommittedRow, ...]


class TokenOutput(NamedTuple):
    rid: int
    token: int
    slot: int  # where the completion's logprob rows live
    index: int  # 0-based output index of this token


class Ended(NamedTuple):
    rid: int
    reason: str  # "stop" | "length" | "cancelled"
    stop: int | None  # the stop/EOS token, when one ended it


@dataclass(frozen=True)
class StepResult:
    fence: int
    tokens: tuple[TokenOutput, ...]  # in row order
    ended: tuple[Ended, ...]  # requests that reached a terminal condition in this step
    published: tuple[int, ...]  # checkpoints that became ready

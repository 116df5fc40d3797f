"""Plans, commits and completion results exchanged with the runtime.

A :class:`ScheduledPlan` is immutable: it names one graph and the requests it
serves (as per-row arrays) with their state epochs. ``commit`` turns it into a
:class:`CommittedStep` carrying what the runtime packs (page-table uploads,
admission state, prefill tokens, snapshot rows) and the counters the
completion records must report; ``complete`` returns a :class:`StepResult`
with the tokens to publish and the requests that ended.

Rows are kept as NumPy arrays so a 64-request decode step never builds
per-row Python objects; ``rows`` views exist for callers that want tuples.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import NamedTuple

import numpy as np

from ..contract import GraphKind
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
class RowArrays:
    """One plan's rows, column-wise (int64 arrays of equal length)."""

    rids: np.ndarray
    slots: np.ndarray
    generations: np.ndarray
    epochs: np.ndarray
    starts: np.ndarray
    num_tokens: np.ndarray
    sample: np.ndarray  # 0/1
    snapshot: np.ndarray  # -1 when unused

    @classmethod
    def from_rows(cls, rows: "list[PlanRow] | tuple[PlanRow, ...]") -> "RowArrays":
        n = len(rows)

        def col(values) -> np.ndarray:
            return np.fromiter(values, dtype=np.int64, count=n)

        return cls(col(r.rid for r in rows), col(r.handle.slot for r in rows),
                   col(r.handle.generation for r in rows), col(r.epoch for r in rows),
                   col(r.start for r in rows), col(r.num_tokens for r in rows),
                   col(int(r.sample) for r in rows), col(r.snapshot for r in rows))

    @classmethod
    def concat(cls, first: "RowArrays", second: "RowArrays") -> "RowArrays":
        return cls(*(np.concatenate([a, b]) for a, b in zip(first._columns(), second._columns())))

    def with_num_tokens(self, num_tokens: np.ndarray) -> "RowArrays":
        """The same rows consuming ``num_tokens`` positions each (the other columns shared)."""
        return RowArrays(self.rids, self.slots, self.generations, self.epochs, self.starts, num_tokens, self.sample,
                         self.snapshot)

    def _columns(self) -> tuple[np.ndarray, ...]:
        return (self.rids, self.slots, self.generations, self.epochs, self.starts, self.num_tokens, self.sample,
                self.snapshot)

    def __len__(self) -> int:
        return int(self.slots.shape[0])

    def rows(self, start: int = 0) -> tuple[PlanRow, ...]:
        """Rows ``start`` onward as PlanRow tuples."""
        return tuple(PlanRow(int(rid), Handle(int(s), int(g)), int(e), int(st), int(n), bool(sm), int(sn))
                     for rid, s, g, e, st, n, sm, sn in zip(*(c[start:] for c in self._columns())))


@dataclass(frozen=True)
class ScheduledPlan:
    scheduler_id: int
    kind: GraphKind
    graph_index: int
    batch: int  # graph row capacity
    tokens: int  # graph token capacity
    cols: RowArrays
    estimate_ns: int  # the graph's estimate when planned (0: unmeasured)
    is_refresh: bool = False  # a stale graph: it runs alone and refreshes its estimate
    is_funded_refresh: bool = False  # chosen over the winner on refresh credit (commit pays)
    width: int = 0  # MIXED: the graph's decode width w
    decode_rows: int = 0  # MIXED: the leading rows of cols that decode (the rest prefill)
    drafts: tuple[np.ndarray, ...] = ()  # SPECULATIVE: each row's drafted tokens (cols.num_tokens - 1 each)

    @property
    def rows(self) -> tuple[PlanRow, ...]:
        return self.cols.rows()


class MixedRows(NamedTuple):
    """A MIXED candidate's rows: the decode cohort column-wise (as DECODE builds it), then the
    packed prefill rows."""

    decode: RowArrays
    prefill: list[PlanRow]

    def __len__(self) -> int:
        return len(self.decode) + len(self.prefill)


class Admission(NamedTuple):
    """State the runtime uploads when a request first takes its slot."""

    position: int  # reused prefix tokens
    seed: int
    params: SamplingParams
    penalty_prompt: np.ndarray | None  # prompt tokens to mark for repetition penalty
    generated: int = 0  # the slot's starting generated count (a preempted request's continuation)
    penalty_outputs: np.ndarray | None = None  # output tokens to count for penalties (a continuation)


class PageUpload(NamedTuple):
    slot: int
    first: int  # page-table index of pages[0]
    pages: tuple[int, ...]  # logical page IDs


class CommittedRow(NamedTuple):
    rid: int
    handle: Handle
    start: int
    num_tokens: int
    sample: bool
    snapshot: int
    tokens: np.ndarray | None  # prefill input tokens (int32)
    admission: Admission | None  # INITIALIZE only


@dataclass(frozen=True)
class CommittedStep:
    fence: int
    plan: ScheduledPlan
    consumed: np.ndarray  # cumulative consumed tokens each row's record must report
    generated: np.ndarray  # cumulative generated tokens each row's record must report
    page_uploads: tuple[PageUpload, ...] = ()
    extras: tuple[tuple[np.ndarray | None, Admission | None], ...] = ()  # (tokens, admission) per row; non-decode
    committed_at: float = 0.0

    @property
    def cols(self) -> RowArrays:
        return self.plan.cols

    @property
    def rows(self) -> tuple[CommittedRow, ...]:
        extras = self.extras or ((None, None),) * len(self.cols)
        return tuple(CommittedRow(r.rid, r.handle, r.start, r.num_tokens, r.sample, r.snapshot, tok, adm)
                     for r, (tok, adm) in zip(self.plan.rows, extras))


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
    rids: np.ndarray  # emitted tokens, column-wise, in row order
    slots: np.ndarray
    token_ids: np.ndarray
    indices: np.ndarray  # 0-based output index of each token
    ended: tuple[Ended, ...]  # requests that reached a terminal condition in this step
    published: tuple[int, ...]  # checkpoints that became ready
    _tokens: list = field(default_factory=list, repr=False)

    @property
    def tokens(self) -> tuple[TokenOutput, ...]:
        return tuple(TokenOutput(int(r), int(t), int(s), int(i))
                     for r, t, s, i in zip(self.rids, self.token_ids, self.slots, self.indices))

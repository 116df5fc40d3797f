"""Immutable results of PrefixCheckpointCache operations.

Every operation validates first and then commits; what it changed comes back as
one of these records, so the scheduler never sees a half-applied step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Union


class PrefixHit(NamedTuple):
    """The longest ready exact checkpoint that prefixes a history."""

    checkpoint: int  # checkpoint ID; pin it before relying on its resources
    endpoint: int  # tokens covered: prefill resumes at this position
    snapshot: int  # snapshot row holding the partial tail and resumable state


class Created(NamedTuple):
    """The proposal became a new checkpoint; its pages and snapshot now belong to the cache."""

    checkpoint: int
    is_ready: bool  # False until advance_completed passes the readiness fence


class Existing(NamedTuple):
    """An equal checkpoint already exists; the proposal's resources stay with the caller."""

    checkpoint: int
    is_ready: bool


Publication = Union[Created, Existing]


class RetiredResources(NamedTuple):
    """IDs an eviction or cancellation released logically. The cache keeps
    reserving them until advance_completed reaches ``fence``."""

    checkpoint: int  # the checkpoint that owned them (no longer held)
    pages: tuple[int, ...]  # the checkpoint's own tail pages
    snapshot: int
    fence: int  # final-use fence: the last GPU work that may touch these IDs


class Eviction(NamedTuple):
    """The outcome of one evict call, least recently used first."""

    retired: tuple[RetiredResources, ...]
    num_pages: int  # pages retired by this call
    num_snapshots: int  # snapshot rows retired by this call
    is_satisfied: bool  # both pressure targets were met


class Reusable(NamedTuple):
    """IDs whose final-use fences have completed: the only permission to reuse storage."""

    pages: tuple[int, ...]
    snapshots: tuple[int, ...]


class Completion(NamedTuple):
    """The outcome of advance_completed(fence)."""

    fence: int  # the completed fence now recorded
    ready: tuple[int, ...]  # pending checkpoints that became visible to lookup
    reusable: Reusable


@dataclass(frozen=True)
class CheckpointInfo:
    """A snapshot of one checkpoint's metadata."""

    checkpoint: int
    key: bytes  # exact endpoint key (16 bytes)
    endpoint: int
    parent: int | None  # None: the checkpoint owns every page from position 0
    pages: tuple[int, ...]  # its own tail pages, covering blocks parent.endpoint//64 .. endpoint//64-1
    snapshot: int
    ready_fence: int  # visible once this fence (and the parent's) has completed
    is_ready: bool
    pins: int  # pins on this checkpoint and on its descendants
    direct_pins: int  # pins taken on this checkpoint itself
    num_children: int
    last_use_fence: int  # latest fence recorded through mark_used (0: never used)


@dataclass(frozen=True)
class CacheCounters:
    """Values the server exports to Prometheus.

    Counters only grow; gauges describe the present. Free-resource figures are
    the scheduler's (it owns the free lists); the cache reports what it holds,
    what is still retiring, and how many IDs it has granted back.
    """

    lookups: int  # counter: lookup calls, including admissions later rejected
    hits: int  # counter
    misses: int  # counter
    reused_tokens: int  # counter: endpoint tokens of every hit
    publications: int  # counter: unique checkpoints that became ready (not duplicates)
    evictions: int  # counter: checkpoints evicted (logical; precedes GPU retirement)
    cancellations: int  # counter: pending publications cancelled
    cached_checkpoints: int  # gauge: held checkpoints, ready or pending
    pending_checkpoints: int  # gauge: held but not yet visible to lookup
    cached_pages: int  # gauge: pages owned by held checkpoints
    cached_snapshots: int  # gauge: snapshot rows owned by held checkpoints
    retiring_pages: int  # gauge: evicted or cancelled pages awaiting their fence
    retiring_snapshots: int  # gauge
    reusable_pages: int  # counter: page IDs granted back through Completion.reusable
    reusable_snapshots: int  # counter: snapshot IDs granted back through Completion.reusable
    # Gauges for check-then-commit admission: what evict() with unbounded
    # targets would retire now (ready checkpoints with no pin and no pending
    # checkpoint at or below them).
    reclaimable_pages: int
    reclaimable_snapshots: int

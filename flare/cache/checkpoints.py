"""PrefixCheckpointCache: metadata of immutable exact prefix checkpoints.

A checkpoint is the exact state after the first T tokens (and the conditioning
they consume) of some history. It privately owns the complete KV pages between
its parent's endpoint S and T, floor(T/P) - floor(S/P) of them with P = 64, and
one snapshot row holding the partial tail page and the state needed to resume
without replaying; everything below S is shared through the parent chain.

The cache is pure metadata on one completion timeline: the caller reports
fences (monotonic integers) as GPU work completes, and resource IDs only come
back for reuse through ``advance_completed(fence).reusable``, after every use
of them has completed. Every method validates first and then commits, raising
a :mod:`flare.cache.errors` error with nothing changed.
"""

from __future__ import annotations

import heapq
import operator
from typing import Iterator, Sequence

import numpy as np

from ..config import PAGE_TOKENS
from .errors import (
    CapacityError,
    CheckpointStateError,
    FenceError,
    HistoryError,
    OwnershipError,
    ParentMismatchError,
    PinError,
    SnapshotError,
    UnknownCheckpointError,
)
from .history import BLOCK_TOKENS, IDENTITY_BYTES, PrefixHistory
from .records import (
    CacheCounters,
    CheckpointInfo,
    Completion,
    Created,
    Eviction,
    Existing,
    PrefixHit,
    Publication,
    RetiredResources,
    Reusable,
)

if PAGE_TOKENS != BLOCK_TOKENS:  # pragma: no cover - a build-time mismatch
    raise ImportError(f"PAGE_TOKENS ({PAGE_TOKENS}) must equal the hashed block size ({BLOCK_TOKENS})")


class _Checkpoint:
    """Mutable bookkeeping behind one checkpoint ID (never leaves this module)."""

    __slots__ = ("id", "key", "bucket", "endpoint", "parent", "pages", "snapshot", "ready_fence",
                 "visible_fence", "is_ready", "pins", "direct_pins", "num_children",
                 "pending_below", "is_reclaimable", "last_use_fence", "stamp")

    def __init__(self, checkpoint_id: int, key: bytes, bucket: bytes, endpoint: int,
                 parent: _Checkpoint | None, pages: tuple[int, ...], snapshot: int,
                 ready_fence: int, visible_fence: int, stamp: int):
        self.id = checkpoint_id
        self.key = key
        self.bucket = bucket  # key of the aligned prefix at or below endpoint: the lookup index
        self.endpoint = endpoint
        self.parent = parent
        self.pages = pages
        self.snapshot = snapshot
        self.ready_fence = ready_fence  # the snapshot copy's own completion fence
        self.visible_fence = visible_fence  # max(ready_fence, parent's visible_fence)
        self.is_ready = False
        self.pins = 0  # direct pins here plus every pin taken on a descendant
        self.direct_pins = 0
        self.num_children = 0
        self.pending_below = 0  # pending checkpoints among the descendants
        self.is_reclaimable = False  # counted in the cache's reclaimable gauges
        self.last_use_fence = 0
        self.stamp = stamp  # LRU clock value of the latest use

    def path(self) -> Iterator[_Checkpoint]:
        """This checkpoint, then each ancestor up to the root."""
        node: _Checkpoint | None = self
        while node is not None:
            yield node
            node = node.parent

    @property
    def is_evictable(self) -> bool:
        return self.is_ready and self.pins == 0 and self.num_children == 0

    @property
    def can_reclaim(self) -> bool:
        """Repeated leaf eviction would reach this checkpoint: nothing below it
        is pinned or pending."""
        return self.is_ready and self.pins == 0 and self.pending_below == 0


def _nonnegative(value: object, what: str, error: type[Exception] = CapacityError) -> int:
    """``value`` as a nonnegative int, or ``error`` naming ``what``."""
    if isinstance(value, bool):
        raise error(f"{what} must be an integer, got bool")
    try:
        number = operator.index(value)
    except TypeError:
        raise error(f"{what} must be an integer, got {type(value).__name__}") from None
    if number < 0:
        raise error(f"{what} must be nonnegative, got {number}")
    return number


class PrefixCheckpointCache:
    """Exact prefix checkpoints with shared ancestors, pins, fences and leaf LRU eviction.

    ``num_pages`` and ``num_snapshots`` are the prepared capacities: resource
    IDs are zero-based ordinals below them. The cache tracks only the IDs it
    owns or is retiring; the caller allocates everything else. It takes no
    locks: the model thread, through the scheduler, is its only client.
    """

    def __init__(self, identity: bytes, num_pages: int, num_snapshots: int):
        if not isinstance(identity, (bytes, bytearray)) or len(identity) != IDENTITY_BYTES:
            raise HistoryError(f"model/recipe identity must be {IDENTITY_BYTES} bytes")
        self._identity = bytes(identity)
        self._num_pages = _nonnegative(num_pages, "num_pages")
        self._num_snapshots = _nonnegative(num_snapshots, "num_snapshots")
        # Owner per ID: 0 unowned, c > 0 owned by checkpoint c, -c retiring from checkpoint c.
        self._page_owner = np.zeros(self._num_pages, dtype=np.int64)
        self._snapshot_owner = np.zeros(self._num_snapshots, dtype=np.int64)
        self._checkpoints: dict[int, _Checkpoint] = {}
        self._by_key: dict[bytes, _Checkpoint] = {}
        # Ready checkpoints by the key of their aligned prefix, longest endpoint first.
        self._buckets: dict[bytes, list[_Checkpoint]] = {}
        self._pending: list[tuple[int, int]] = []  # heap of (visible_fence, checkpoint id)
        self._retiring: list[tuple[int, int, RetiredResources]] = []  # heap of (fence, seq, record)
        self._lru: list[tuple[int, int]] = []  # heap of (stamp, checkpoint id); stale entries skipped
        self._clock = 0
        self._next_id = 1
        self._retire_seq = 0
        self._completed = 0
        # Counters and gauges (see CacheCounters).
        self._lookups = self._hits = self._misses = self._reused_tokens = 0
        self._publications = self._evictions = self._cancellations = 0
        self._num_pending = self._cached_pages = 0
        self._retiring_pages = self._retiring_snapshots = 0
        self._reusable_pages = self._reusable_snapshots = 0
        self._reclaimable_pages = self._reclaimable_snapshots = 0

    # -- lookup -------------------------------------------------------------

    def lookup(self, history: PrefixHistory, limit: int | None = None) -> PrefixHit | None:
        """The longest ready checkpoint that is an exact prefix of ``history``
        and ends at or before ``limit`` (default: the whole history).

        Counts a lookup and a hit or miss; pending checkpoints are invisible.
        """
        self._check_history(history)
        end = history.num_tokens
        if limit is not None:
            end = min(_nonnegative(limit, "lookup limit"), end)
        self._lookups += 1
        keys = history.prefix_keys()
        buckets = self._buckets
        for block in range(end // BLOCK_TOKENS, -1, -1):
            offset = block * 16
            bucket = buckets.get(keys[offset:offset + 16])
            if bucket is None:
                continue
            for node in bucket:  # longest endpoint first
                if node.endpoint > end:
                    continue
                # An aligned checkpoint's key is its bucket key, already matched.
                if node.endpoint % BLOCK_TOKENS == 0 or history.key_at(node.endpoint) == node.key:
                    self._hits += 1
                    self._reused_tokens += node.endpoint
                    return PrefixHit(node.id, node.endpoint, node.snapshot)
        self._misses += 1
        return None

    # -- publication --------------------------------------------------------

    def publish(self, history: PrefixHistory, endpoint: int, *, parent: int | None,
                pages: Sequence[int], snapshot: int, consumed: int, ready_fence: int) -> Publication:
        """Propose the checkpoint of ``history`` at ``endpoint``.

        ``parent`` is a held checkpoint that prefixes the history (None: start
        at position 0); ``pages`` are the proposal's own complete pages, in
        order, exactly ``endpoint // 64 - parent_endpoint // 64`` of them;
        ``snapshot`` is its snapshot row, whose state has ``consumed`` tokens;
        ``ready_fence`` completes the snapshot copy.

        Returns :class:`Created` when the resources now belong to the cache
        (pending until ``ready_fence`` and the parent are complete), or
        :class:`Existing` when an equal checkpoint is held, in which case the
        resources stay with the caller.
        """
        self._check_history(history)
        endpoint = history._check_endpoint(endpoint)
        if endpoint == 0:
            raise HistoryError("a checkpoint must cover at least one token")
        if isinstance(consumed, bool) or not isinstance(consumed, (int, np.integer)) \
                or consumed != endpoint:
            raise SnapshotError(f"snapshot row {snapshot!r} consumed {consumed!r} tokens, "
                                f"but the checkpoint ends at {endpoint}")
        parent_node = None
        start = 0
        if parent is not None:
            parent_node = self._get(parent)
            if parent_node.endpoint >= endpoint:
                raise ParentMismatchError(f"parent checkpoint {parent} ends at {parent_node.endpoint}, "
                                          f"not before the endpoint {endpoint}")
            if history.key_at(parent_node.endpoint) != parent_node.key:
                raise ParentMismatchError(f"parent checkpoint {parent} is not a prefix of the "
                                          f"supplied history at {parent_node.endpoint} tokens")
            start = parent_node.endpoint
        page_ids = self._check_pages(pages, endpoint // BLOCK_TOKENS - start // BLOCK_TOKENS,
                                     start, endpoint)
        snapshot = self._check_snapshot(snapshot)
        ready_fence = _nonnegative(ready_fence, "ready_fence", FenceError)
        key = history.key_at(endpoint)
        existing = self._by_key.get(key)
        if existing is not None:
            return Existing(existing.id, existing.is_ready)

        # Commit.
        checkpoint_id = self._next_id
        self._next_id += 1
        stamp = self._tick()
        visible = max(ready_fence, parent_node.visible_fence if parent_node else 0)
        node = _Checkpoint(checkpoint_id, key, history.aligned_key(endpoint), endpoint, parent_node,
                           page_ids, snapshot, ready_fence, visible, stamp)
        self._checkpoints[checkpoint_id] = node
        self._by_key[key] = node
        if page_ids:
            self._page_owner[list(page_ids)] = checkpoint_id
        self._snapshot_owner[snapshot] = checkpoint_id
        self._cached_pages += len(page_ids)
        is_pending = visible > self._completed
        if parent_node is not None:
            parent_node.num_children += 1
            for ancestor in parent_node.path():  # a new child is a use of its prefix
                ancestor.stamp = stamp
                if is_pending:
                    ancestor.pending_below += 1
                    self._refresh_reclaimable(ancestor)
        if is_pending:
            self._num_pending += 1
            heapq.heappush(self._pending, (visible, checkpoint_id))
        else:
            self._make_ready(node)
        return Created(checkpoint_id, node.is_ready)

    def cancel(self, checkpoint: int) -> RetiredResources:
        """Withdraw a pending publication. Its IDs retire behind its readiness
        fence (and any recorded use) and come back through advance_completed."""
        node = self._get(checkpoint)
        if node.is_ready:
            raise CheckpointStateError(f"checkpoint {checkpoint} is ready; only pending "
                                       f"publications can be cancelled (ready ones are evicted)")
        if node.pins:
            raise PinError(f"checkpoint {checkpoint} is pinned ({node.pins} pins)")
        if node.num_children:
            raise CheckpointStateError(f"checkpoint {checkpoint} has {node.num_children} "
                                       f"descendant publications; cancel them first")
        self._num_pending -= 1
        self._cancellations += 1
        if node.parent is not None:
            for ancestor in node.parent.path():
                ancestor.pending_below -= 1
        return self._retire(node)  # also refreshes the parent chain's reclaimable state

    # -- pins and use -------------------------------------------------------

    def pin(self, checkpoint: int) -> None:
        """Pin a checkpoint and every ancestor against eviction (one direct pin)."""
        node = self._get(checkpoint)
        stamp = self._tick()
        node.direct_pins += 1
        for ancestor in node.path():
            ancestor.pins += 1
            ancestor.stamp = stamp
            self._refresh_reclaimable(ancestor)

    def unpin(self, checkpoint: int) -> None:
        """Release one direct pin taken on ``checkpoint`` (not one on a descendant)."""
        node = self._get(checkpoint)
        if node.direct_pins == 0:
            raise PinError(f"checkpoint {checkpoint} holds no direct pin "
                           f"({node.pins} pins through descendants)")
        node.direct_pins -= 1
        for ancestor in node.path():
            ancestor.pins -= 1
            self._refresh_reclaimable(ancestor)
        if node.is_evictable:  # ancestors have a child, so only node can become a leaf
            self._push_lru(node)

    def mark_used(self, checkpoint: int, fence: int) -> None:
        """Record that the submission completing at ``fence`` reads ``checkpoint``
        and its ancestors. Call before submitting; eviction then retires their
        IDs behind this fence even if the pin is released first."""
        node = self._get(checkpoint)
        fence = _nonnegative(fence, "use fence", FenceError)
        if fence <= self._completed:
            raise FenceError(f"use fence {fence} has already completed "
                             f"(completed fence is {self._completed})")
        stamp = self._tick()
        for ancestor in node.path():
            if fence > ancestor.last_use_fence:
                ancestor.last_use_fence = fence
            ancestor.stamp = stamp
        if node.is_evictable:
            self._push_lru(node)

    # -- eviction and completion --------------------------------------------

    def evict(self, page_target: int = 0, snapshot_target: int = 0) -> Eviction:
        """Evict unpinned ready leaves, least recently used first, until at least
        ``page_target`` pages and ``snapshot_target`` snapshot rows have been
        retired by this call or nothing more is evictable.

        Evicting a leaf can make its parent a leaf, which then competes by its
        own recency. The IDs stay reserved until their final-use fence completes.
        """
        page_target = _nonnegative(page_target, "page_target")
        snapshot_target = _nonnegative(snapshot_target, "snapshot_target")
        retired: list[RetiredResources] = []
        num_pages = num_snapshots = 0
        lru = self._lru
        while (num_pages < page_target or num_snapshots < snapshot_target) and lru:
            stamp, checkpoint_id = heapq.heappop(lru)
            node = self._checkpoints.get(checkpoint_id)
            if node is None or node.stamp != stamp or not node.is_evictable:
                continue  # stale entry: a newer one exists or the node is no longer a leaf
            record = self._retire(node)
            self._evictions += 1
            retired.append(record)
            num_pages += len(record.pages)
            num_snapshots += 1
        return Eviction(tuple(retired), num_pages, num_snapshots,
                        num_pages >= page_target and num_snapshots >= snapshot_target)

    def advance_completed(self, fence: int) -> Completion:
        """Report that every submission up to ``fence`` has completed.

        Pending checkpoints whose readiness (and whose parent's) is now
        complete become visible, and retired IDs whose final-use fence is
        complete are granted back in ``.reusable``: the only permission to
        reuse their storage.
        """
        fence = _nonnegative(fence, "completed fence", FenceError)
        if fence < self._completed:
            raise FenceError(f"completed fence moved backwards: {fence} < {self._completed}")
        self._completed = fence
        ready: list[int] = []
        pending = self._pending
        while pending and pending[0][0] <= fence:
            _, checkpoint_id = heapq.heappop(pending)
            node = self._checkpoints.get(checkpoint_id)
            if node is None:
                continue  # cancelled
            # NOTE: parents pop first: their visible fence is no larger and their ID smaller.
            self._num_pending -= 1
            if node.parent is not None:
                for ancestor in node.parent.path():
                    ancestor.pending_below -= 1
                    self._refresh_reclaimable(ancestor)
            self._make_ready(node)
            ready.append(checkpoint_id)
        pages: list[int] = []
        snapshots: list[int] = []
        retiring = self._retiring
        while retiring and retiring[0][0] <= fence:
            record = heapq.heappop(retiring)[2]
            if record.pages:
                self._page_owner[list(record.pages)] = 0
            self._snapshot_owner[record.snapshot] = 0
            pages.extend(record.pages)
            snapshots.append(record.snapshot)
        self._retiring_pages -= len(pages)
        self._retiring_snapshots -= len(snapshots)
        self._reusable_pages += len(pages)
        self._reusable_snapshots += len(snapshots)
        return Completion(fence, tuple(ready), Reusable(tuple(pages), tuple(snapshots)))

    # -- views --------------------------------------------------------------

    def page_table(self, checkpoint: int) -> tuple[int, ...]:
        """Every complete page of the checkpoint's prefix in position order:
        endpoint // 64 IDs, ancestors' pages first."""
        node = self._get(checkpoint)
        chain = [n.pages for n in node.path()]
        return tuple(page for pages in reversed(chain) for page in pages)

    def checkpoint(self, checkpoint: int) -> CheckpointInfo:
        node = self._get(checkpoint)
        return CheckpointInfo(node.id, node.key, node.endpoint,
                              node.parent.id if node.parent else None, node.pages, node.snapshot,
                              node.ready_fence, node.is_ready, node.pins, node.direct_pins,
                              node.num_children, node.last_use_fence)

    def counters(self) -> CacheCounters:
        return CacheCounters(
            lookups=self._lookups, hits=self._hits, misses=self._misses,
            reused_tokens=self._reused_tokens, publications=self._publications,
            evictions=self._evictions, cancellations=self._cancellations,
            cached_checkpoints=len(self._checkpoints), pending_checkpoints=self._num_pending,
            cached_pages=self._cached_pages, cached_snapshots=len(self._checkpoints),
            retiring_pages=self._retiring_pages, retiring_snapshots=self._retiring_snapshots,
            reusable_pages=self._reusable_pages, reusable_snapshots=self._reusable_snapshots,
            reclaimable_pages=self._reclaimable_pages,
            reclaimable_snapshots=self._reclaimable_snapshots)

    @property
    def identity(self) -> bytes:
        return self._identity

    @property
    def num_pages(self) -> int:
        """Prepared page capacity."""
        return self._num_pages

    @property
    def num_snapshots(self) -> int:
        """Prepared snapshot-row capacity."""
        return self._num_snapshots

    @property
    def completed_fence(self) -> int:
        return self._completed

    def __len__(self) -> int:
        return len(self._checkpoints)

    def __contains__(self, checkpoint: object) -> bool:
        return checkpoint in self._checkpoints

    def __iter__(self) -> Iterator[int]:
        """Held checkpoint IDs, oldest first."""
        return iter(list(self._checkpoints))

    # -- internals ----------------------------------------------------------

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _get(self, checkpoint: object) -> _Checkpoint:
        node = None
        if not isinstance(checkpoint, bool):
            try:
                node = self._checkpoints.get(operator.index(checkpoint))
            except TypeError:
                pass
        if node is None:
            raise UnknownCheckpointError(f"checkpoint {checkpoint!r} is not held by the cache")
        return node

    def _check_history(self, history: object) -> None:
        if not isinstance(history, PrefixHistory):
            raise HistoryError(f"expected a PrefixHistory, got {type(history).__name__}")
        if history.identity != self._identity:
            raise HistoryError("the history was built for another model/recipe identity")

    def _check_pages(self, pages: Sequence[int], expected: int, start: int,
                     endpoint: int) -> tuple[int, ...]:
        page_ids = tuple(_nonnegative(page, "page ID") for page in pages)
        if len(page_ids) != expected:
            raise CapacityError(f"a checkpoint at {endpoint} after a parent at {start} owns "
                                f"{expected} pages, got {len(page_ids)}")
        for page in page_ids:
            if page >= self._num_pages:
                raise CapacityError(f"page {page} is outside the capacity of {self._num_pages} pages")
        if len(set(page_ids)) != len(page_ids):
            raise OwnershipError(f"the proposal lists a page twice: {sorted(page_ids)}")
        if page_ids:
            owners = self._page_owner[list(page_ids)]
            taken = np.flatnonzero(owners)
            if taken.size:
                i = int(taken[0])
                raise OwnershipError(f"page {page_ids[i]} is {_describe_owner(int(owners[i]))}")
        return page_ids

    def _check_snapshot(self, snapshot: object) -> int:
        snapshot = _nonnegative(snapshot, "snapshot ID")
        if snapshot >= self._num_snapshots:
            raise CapacityError(f"snapshot row {snapshot} is outside the capacity of "
                                f"{self._num_snapshots} rows")
        owner = int(self._snapshot_owner[snapshot])
        if owner:
            raise OwnershipError(f"snapshot row {snapshot} is {_describe_owner(owner)}")
        return snapshot

    def _make_ready(self, node: _Checkpoint) -> None:
        node.is_ready = True
        self._refresh_reclaimable(node)
        self._publications += 1
        bucket = self._buckets.setdefault(node.bucket, [])
        bucket.append(node)
        bucket.sort(key=_by_endpoint_desc)
        if node.is_evictable:
            self._push_lru(node)

    def _retire(self, node: _Checkpoint) -> RetiredResources:
        """Remove a childless, unpinned checkpoint; its IDs start retiring."""
        del self._checkpoints[node.id]
        del self._by_key[node.key]
        if node.is_ready:
            bucket = self._buckets[node.bucket]
            bucket.remove(node)
            if not bucket:
                del self._buckets[node.bucket]
        if node.is_reclaimable:
            node.is_reclaimable = False
            self._reclaimable_pages -= len(node.pages)
            self._reclaimable_snapshots -= 1
        parent = node.parent
        if parent is not None:
            parent.num_children -= 1
            for ancestor in parent.path():  # a cancelled pending child may have held them
                self._refresh_reclaimable(ancestor)
            if parent.is_evictable:
                self._push_lru(parent)
        node.parent = None
        fence = max(node.ready_fence, node.last_use_fence)
        record = RetiredResources(node.id, node.pages, node.snapshot, fence)
        if node.pages:
            self._page_owner[list(node.pages)] = -node.id
        self._snapshot_owner[node.snapshot] = -node.id
        self._cached_pages -= len(node.pages)
        self._retiring_pages += len(node.pages)
        self._retiring_snapshots += 1
        self._retire_seq += 1
        heapq.heappush(self._retiring, (fence, self._retire_seq, record))
        return record

    def _refresh_reclaimable(self, node: _Checkpoint) -> None:
        if node.can_reclaim != node.is_reclaimable:
            node.is_reclaimable = not node.is_reclaimable
            sign = 1 if node.is_reclaimable else -1
            self._reclaimable_pages += sign * len(node.pages)
            self._reclaimable_snapshots += sign

    def _push_lru(self, node: _Checkpoint) -> None:
        lru = self._lru
        heapq.heappush(lru, (node.stamp, node.id))
        if len(lru) > 4 * len(self._checkpoints) + 1024:
            # Drop stale entries: keep one current entry per evictable checkpoint.
            self._lru = [(n.stamp, n.id) for n in self._checkpoints.values() if n.is_evictable]
            heapq.heapify(self._lru)


def _describe_owner(owner: int) -> str:
    if owner > 0:
        return f"owned by checkpoint {owner}"
    return f"still retiring from checkpoint {-owner}"


def _by_endpoint_desc(node: _Checkpoint) -> int:
    return -node.endpoint

"""PrefixCheckpointCache: one test per rule of the prefix checkpoint policy."""

from __future__ import annotations

import numpy as np
import pytest

from flare.cache import (
    CacheError,
    CapacityError,
    CheckpointStateError,
    Completion,
    Created,
    Existing,
    FenceError,
    HistoryError,
    OwnershipError,
    ParentMismatchError,
    PinError,
    PrefixCheckpointCache,
    PrefixHistory,
    PrefixHit,
    Reusable,
    SnapshotError,
    UnknownCheckpointError,
)

IDENTITY = bytes(range(32))
P = 64


def tokens(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 50000, size=n).astype(np.int32)


BASE = tokens(600, seed=1)


def history(n: int = 600, *, diverge_at: int | None = None, events=()) -> PrefixHistory:
    """A prefix of BASE, optionally changed from ``diverge_at`` on."""
    toks = BASE[:n].copy()
    if diverge_at is not None:
        toks[diverge_at:] = (toks[diverge_at:] + 1) % 50000
    return PrefixHistory(IDENTITY, toks, events)


class Pool:
    """The caller's side: hands out IDs the cache does not hold."""

    def __init__(self, num_pages=1000, num_snapshots=100):
        self.pages = list(range(num_pages))
        self.snapshots = list(range(num_snapshots))

    def take(self, num_pages):
        pages, self.pages = self.pages[:num_pages], self.pages[num_pages:]
        return pages, self.snapshots.pop(0)


@pytest.fixture
def cache():
    return PrefixCheckpointCache(IDENTITY, num_pages=1000, num_snapshots=100)


def publish(cache, hist, endpoint, parent=None, *, fence=0, pool=None, pages=None, snapshot=None):
    start = cache.checkpoint(parent).endpoint if parent is not None else 0
    if pages is None:
        pool = pool or publish.pool
        pages, snapshot = pool.take(endpoint // P - start // P)
    return cache.publish(hist, endpoint, parent=parent, pages=pages, snapshot=snapshot,
                         consumed=endpoint, ready_fence=fence)


@pytest.fixture(autouse=True)
def _fresh_pool():
    publish.pool = Pool()


def fingerprint(cache: PrefixCheckpointCache):
    """Everything observable about the cache, to prove a failed call changed nothing."""
    return (cache.counters(), [cache.checkpoint(c) for c in cache], cache.completed_fence,
            cache._page_owner.tobytes(), cache._snapshot_owner.tobytes(), sorted(cache._pending),
            sorted((f, s) for f, s, _ in cache._retiring), cache._next_id, cache._clock)


def assert_rejected(cache, error, call, match=None):
    before = fingerprint(cache)
    with pytest.raises(error, match=match):
        call()
    assert fingerprint(cache) == before


# -- publication ----------------------------------------------------------


def test_created_transfers_resources_and_existing_leaves_them(cache):
    h = history()
    created = cache.publish(h, 130, parent=None, pages=[5, 6], snapshot=3, consumed=130, ready_fence=0)
    assert created == Created(1, True)
    info = cache.checkpoint(1)
    assert (info.endpoint, info.pages, info.snapshot, info.parent) == (130, (5, 6), 3, None)
    # The same prefix again, even through another history object and with
    # other resources: Existing, and the proposal's IDs stay free for reuse.
    again = cache.publish(history(300), 130, parent=None, pages=[7, 8], snapshot=4, consumed=130,
                          ready_fence=0)
    assert again == Existing(1, True)
    assert cache.counters().cached_pages == 2 and len(cache) == 1
    other = cache.publish(history(diverge_at=100), 130, parent=None, pages=[7, 8], snapshot=4,
                          consumed=130, ready_fence=0)
    assert other == Created(2, True)
    assert cache.counters().publications == 2  # duplicates are not publications


def test_a_child_owns_the_pages_between_its_parent_and_endpoint(cache):
    h = history()
    # floor(T/P) - floor(S/P) complete pages; the parent's partial tail page is
    # recomputed into the child's first page.
    cases = [(None, 0, 63, 0), (None, 0, 64, 1), (None, 0, 130, 2)]
    for parent, _, endpoint, expected in cases:
        pages, snap = publish.pool.take(expected)
        created = cache.publish(h, endpoint, parent=parent, pages=pages, snapshot=snap,
                                consumed=endpoint, ready_fence=0)
        assert len(cache.checkpoint(created.checkpoint).pages) == expected
    parent = cache.lookup(h, 130).checkpoint
    for endpoint, expected in [(140, 0), (192, 1), (256, 2), (300, 2)]:
        pages, snap = publish.pool.take(expected + 1)
        assert_rejected(cache, CapacityError, lambda: cache.publish(
            h, endpoint, parent=parent, pages=pages, snapshot=snap, consumed=endpoint, ready_fence=0),
            match=f"owns {expected} pages, got {expected + 1}")
        created = cache.publish(h, endpoint, parent=parent, pages=pages[:expected], snapshot=snap,
                                consumed=endpoint, ready_fence=0)
        assert cache.checkpoint(created.checkpoint).pages == tuple(pages[:expected])
        assert len(cache.page_table(created.checkpoint)) == endpoint // P


def test_page_table_concatenates_ancestor_pages(cache):
    h = history()
    a = cache.publish(h, 100, parent=None, pages=[10], snapshot=0, consumed=100, ready_fence=0)
    b = cache.publish(h, 260, parent=a.checkpoint, pages=[11, 12, 13], snapshot=1, consumed=260,
                      ready_fence=0)
    c = cache.publish(h, 320, parent=b.checkpoint, pages=[14], snapshot=2, consumed=320, ready_fence=0)
    assert cache.page_table(c.checkpoint) == (10, 11, 12, 13, 14)
    assert cache.page_table(a.checkpoint) == (10,)


def test_parent_must_prefix_the_history_and_end_before_the_endpoint(cache):
    h = history()
    parent = publish(cache, h, 100).checkpoint
    foreign = history(diverge_at=50)
    assert_rejected(cache, ParentMismatchError, lambda: publish(cache, foreign, 200, parent),
                    match="not a prefix")
    assert_rejected(cache, ParentMismatchError, lambda: publish(cache, h, 100, parent, pages=[], snapshot=9),
                    match="not before")
    assert_rejected(cache, ParentMismatchError, lambda: publish(cache, h, 90, parent, pages=[], snapshot=9),
                    match="not before")
    assert_rejected(cache, UnknownCheckpointError, lambda: cache.publish(
        h, 200, parent=77, pages=[1, 2], snapshot=9, consumed=200, ready_fence=0))
    # An event the parent did not see also breaks the prefix relation.
    with_image = history(events=[(50, b"i" * 32)])
    assert_rejected(cache, ParentMismatchError, lambda: publish(cache, with_image, 200, parent),
                    match="not a prefix")
    with_later_image = history(events=[(100, b"i" * 32)])
    assert isinstance(publish(cache, with_later_image, 200, parent), Created)


def test_snapshot_must_have_consumed_exactly_the_endpoint(cache):
    assert_rejected(cache, SnapshotError, lambda: cache.publish(
        history(), 100, parent=None, pages=[1], snapshot=1, consumed=99, ready_fence=0),
        match="consumed 99 tokens, but the checkpoint ends at 100")


def test_ids_must_fit_the_prepared_capacities():
    cache = PrefixCheckpointCache(IDENTITY, num_pages=4, num_snapshots=2)
    h = history()
    for pages, snapshot, error, match in [
        ([4], 0, CapacityError, "page 4 is outside the capacity of 4 pages"),
        ([-1], 0, CapacityError, "nonnegative"),
        (["0"], 0, CapacityError, "integer"),
        ([0], 2, CapacityError, "snapshot row 2 is outside the capacity of 2 rows"),
        ([0], -1, CapacityError, "nonnegative"),
    ]:
        assert_rejected(cache, error, lambda: cache.publish(
            h, 100, parent=None, pages=pages, snapshot=snapshot, consumed=100, ready_fence=0),
            match=match)
    assert_rejected(cache, CapacityError, lambda: cache.evict(-1), match="nonnegative")
    with pytest.raises(CapacityError):
        PrefixCheckpointCache(IDENTITY, num_pages=-1, num_snapshots=0)


def test_ownership_may_not_overlap_held_or_retiring_ids(cache):
    h = history()
    a = cache.publish(h, 130, parent=None, pages=[1, 2], snapshot=1, consumed=130, ready_fence=0)
    other = history(diverge_at=10)
    for pages, snapshot, match in [([2, 3], 5, "page 2 is owned by checkpoint 1"),
                                   ([3, 3], 5, "lists a page twice"),
                                   ([3, 4], 1, "snapshot row 1 is owned by checkpoint 1")]:
        assert_rejected(cache, OwnershipError, lambda: cache.publish(
            other, 130, parent=None, pages=pages, snapshot=snapshot, consumed=130, ready_fence=0),
            match=match)
    cache.mark_used(a.checkpoint, 5)
    eviction = cache.evict(page_target=1)
    assert eviction.retired[0].fence == 5
    # Retired but not yet reusable: still reserved.
    assert_rejected(cache, OwnershipError, lambda: cache.publish(
        other, 130, parent=None, pages=[1, 9], snapshot=6, consumed=130, ready_fence=0),
        match="page 1 is still retiring from checkpoint 1")
    assert cache.advance_completed(4).reusable == Reusable((), ())
    assert cache.advance_completed(5).reusable == Reusable((1, 2), (1,))
    assert isinstance(cache.publish(other, 130, parent=None, pages=[1, 2], snapshot=1, consumed=130,
                                    ready_fence=5), Created)


def test_existing_still_validates_the_proposal(cache):
    h = history()
    cache.publish(h, 130, parent=None, pages=[1, 2], snapshot=1, consumed=130, ready_fence=0)
    assert_rejected(cache, OwnershipError, lambda: cache.publish(
        h, 130, parent=None, pages=[1, 2], snapshot=1, consumed=130, ready_fence=0))


def test_history_must_belong_to_the_cache_identity(cache):
    stranger = PrefixHistory(bytes(32), BASE)
    assert_rejected(cache, HistoryError, lambda: cache.lookup(stranger), match="another")
    assert_rejected(cache, HistoryError, lambda: publish(cache, stranger, 100), match="another")
    assert_rejected(cache, HistoryError, lambda: cache.lookup("tokens"), match="PrefixHistory")
    assert_rejected(cache, HistoryError, lambda: publish(cache, history(), 0, pages=[], snapshot=0),
                    match="at least one token")
    assert_rejected(cache, HistoryError, lambda: publish(cache, history(100), 101, pages=[1], snapshot=0),
                    match="outside the history")


def test_checkpoint_ids_are_monotonic_and_never_reused(cache):
    h = history()
    ids = [publish(cache, h, 10 * (i + 1)).checkpoint for i in range(3)]
    assert ids == [1, 2, 3]
    cache.evict(snapshot_target=3)
    assert len(cache) == 0
    assert publish(cache, h, 10).checkpoint == 4


# -- pending publications -------------------------------------------------


def test_pending_checkpoints_reserve_resources_but_are_invisible(cache):
    h = history()
    created = publish(cache, h, 130, fence=7)
    assert created == Created(1, False)
    assert cache.lookup(h) is None
    counters = cache.counters()
    assert (counters.pending_checkpoints, counters.cached_pages, counters.publications) == (1, 2, 0)
    assert cache.evict(page_target=10).retired == ()  # not evictable while pending
    assert publish(cache, h, 130, pages=[500, 501], snapshot=50) == Existing(1, False)
    assert cache.advance_completed(6) == Completion(6, (), Reusable((), ()))
    assert cache.lookup(h) is None
    assert cache.advance_completed(7).ready == (1,)
    assert cache.lookup(h) == PrefixHit(1, 130, cache.checkpoint(1).snapshot)
    assert cache.counters().publications == 1 and cache.counters().pending_checkpoints == 0


def test_a_child_is_visible_only_once_its_pending_parent_is(cache):
    h = history()
    parent = publish(cache, h, 100, fence=10).checkpoint
    child = publish(cache, h, 200, parent, fence=3).checkpoint
    assert cache.advance_completed(5).ready == ()
    assert cache.lookup(h) is None
    assert cache.advance_completed(10).ready == (parent, child)
    assert cache.lookup(h).checkpoint == child


def test_cancel_retires_a_pending_publication_behind_its_fence(cache):
    h = history()
    created = cache.publish(h, 130, parent=None, pages=[1, 2], snapshot=3, consumed=130, ready_fence=9)
    retired = cache.cancel(created.checkpoint)
    assert (retired.pages, retired.snapshot, retired.fence) == ((1, 2), 3, 9)
    assert created.checkpoint not in cache and cache.lookup(h) is None
    assert cache.counters().cancellations == 1 and cache.counters().pending_checkpoints == 0
    completion = cache.advance_completed(8)
    assert completion.reusable == Reusable((), ())
    completion = cache.advance_completed(9)
    assert completion.ready == () and completion.reusable == Reusable((1, 2), (3,))
    assert cache.counters().publications == 0


def test_cancel_rules(cache):
    h = history()
    ready = publish(cache, h, 50).checkpoint
    assert_rejected(cache, CheckpointStateError, lambda: cache.cancel(ready), match="is ready")
    parent = publish(cache, h, 150, ready, fence=4).checkpoint
    child = publish(cache, h, 250, parent, fence=4).checkpoint
    assert_rejected(cache, CheckpointStateError, lambda: cache.cancel(parent), match="descendant")
    cache.pin(child)
    assert_rejected(cache, PinError, lambda: cache.cancel(child), match="pinned")
    cache.unpin(child)
    cache.cancel(child)
    cache.cancel(parent)
    assert_rejected(cache, UnknownCheckpointError, lambda: cache.cancel(parent))
    assert cache.advance_completed(4).ready == ()


# -- pins, use and eviction ------------------------------------------------


def test_pins_cover_ancestors_with_direct_accounting(cache):
    h = history()
    a = publish(cache, h, 100).checkpoint
    b = publish(cache, h, 200, a).checkpoint
    c = publish(cache, h, 300, b).checkpoint
    cache.pin(c)
    assert [cache.checkpoint(x).pins for x in (a, b, c)] == [1, 1, 1]
    assert [cache.checkpoint(x).direct_pins for x in (a, b, c)] == [0, 0, 1]
    # An ancestor unpin cannot consume the descendant's reference.
    assert_rejected(cache, PinError, lambda: cache.unpin(a), match="no direct pin")
    cache.pin(a)
    cache.unpin(a)
    assert cache.evict(page_target=100, snapshot_target=100).retired == ()
    cache.unpin(c)
    assert_rejected(cache, PinError, lambda: cache.unpin(c))
    assert_rejected(cache, UnknownCheckpointError, lambda: cache.pin(99))
    eviction = cache.evict(snapshot_target=3)
    assert [r.checkpoint for r in eviction.retired] == [c, b, a]


def test_eviction_spares_pinned_checkpoints_and_their_ancestors(cache):
    h = history()
    root = publish(cache, h, 64).checkpoint
    pinned_leaf = publish(cache, h, 200, root).checkpoint
    free_leaf = publish(cache, history(diverge_at=100), 190, root).checkpoint
    cache.pin(pinned_leaf)
    eviction = cache.evict(page_target=1000, snapshot_target=1000)
    assert [r.checkpoint for r in eviction.retired] == [free_leaf]
    assert not eviction.is_satisfied
    assert root in cache and pinned_leaf in cache


def test_eviction_is_leaf_lru_with_separate_page_and_snapshot_targets(cache):
    leaves = []
    for i in range(4):
        h = history(diverge_at=i)  # four unrelated prefixes
        leaves.append(publish(cache, h, 64 * (i + 1) + 1).checkpoint)  # 1, 2, 3, 4 pages
    for leaf in (leaves[2], leaves[0], leaves[3], leaves[1]):
        cache.mark_used(leaf, 1)
    # LRU order is now 2, 0, 3, 1.
    first = cache.evict(snapshot_target=1)
    assert [r.checkpoint for r in first.retired] == [leaves[2]] and first.num_pages == 3
    second = cache.evict(page_target=2)  # leaf 0 (1 page) is not enough; leaf 3 follows
    assert [r.checkpoint for r in second.retired] == [leaves[0], leaves[3]]
    assert (second.num_pages, second.num_snapshots, second.is_satisfied) == (5, 2, True)
    assert cache.evict().retired == ()  # no pressure, no eviction
    assert cache.counters().evictions == 3


def test_evicting_a_leaf_exposes_its_parent_by_its_own_recency(cache):
    h = history()
    parent = publish(cache, h, 100).checkpoint
    child = publish(cache, h, 200, parent).checkpoint
    other = publish(cache, history(diverge_at=0), 50).checkpoint
    cache.mark_used(other, 1)  # other is now more recent than the parent chain
    eviction = cache.evict(snapshot_target=2)
    assert [r.checkpoint for r in eviction.retired] == [child, parent]


def test_reclaimable_gauges_predict_what_eviction_can_retire(cache):
    h = history()
    a = publish(cache, h, 100).checkpoint  # 1 page
    b = publish(cache, h, 200, a).checkpoint  # 2 pages
    other = publish(cache, history(diverge_at=0), 130).checkpoint  # 2 pages
    def reclaimable():
        return cache.counters().reclaimable_pages, cache.counters().reclaimable_snapshots
    assert reclaimable() == (5, 3)
    cache.pin(b)  # pins b and a
    assert reclaimable() == (2, 1)
    pending = publish(cache, history(diverge_at=0), 300, other, fence=4).checkpoint
    assert reclaimable() == (0, 0)  # other now has a pending descendant
    cache.unpin(b)
    assert reclaimable() == (3, 2)
    eviction = cache.evict(page_target=100, snapshot_target=100)
    assert (eviction.num_pages, eviction.num_snapshots) == (3, 2)
    assert reclaimable() == (0, 0)
    cache.cancel(pending)
    assert reclaimable() == (2, 1)


def test_retired_ids_carry_their_final_use_fence(cache):
    h = history()
    a = cache.publish(h, 130, parent=None, pages=[1, 2], snapshot=0, consumed=130, ready_fence=3)
    cache.advance_completed(3)
    cache.pin(a.checkpoint)
    cache.mark_used(a.checkpoint, 8)
    cache.unpin(a.checkpoint)  # releasing the pin does not complete the use
    record = cache.evict(snapshot_target=1).retired[0]
    assert record.fence == 8
    counters = cache.counters()
    assert (counters.retiring_pages, counters.retiring_snapshots, counters.cached_pages) == (2, 1, 0)
    assert cache.advance_completed(7).reusable == Reusable((), ())
    assert cache.advance_completed(8).reusable == Reusable((1, 2), (0,))
    counters = cache.counters()
    assert (counters.retiring_pages, counters.reusable_pages, counters.reusable_snapshots) == (0, 2, 1)


def test_ids_whose_fence_already_completed_wait_for_the_next_advance(cache):
    h = history()
    publish(cache, h, 100, pages=[3], snapshot=4)
    cache.advance_completed(5)
    record = cache.evict(snapshot_target=1).retired[0]
    assert record.fence == 0
    assert cache.advance_completed(5).reusable == Reusable((3,), (4,))


def test_mark_used_covers_ancestors_and_rejects_completed_fences(cache):
    h = history()
    a = publish(cache, h, 100).checkpoint
    b = publish(cache, h, 200, a).checkpoint
    cache.mark_used(b, 6)
    assert cache.checkpoint(a).last_use_fence == 6
    cache.mark_used(b, 4)  # an older use never lowers the final-use fence
    assert cache.checkpoint(b).last_use_fence == 6
    cache.advance_completed(4)
    assert_rejected(cache, FenceError, lambda: cache.mark_used(b, 4), match="already completed")
    assert_rejected(cache, FenceError, lambda: cache.mark_used(b, -1), match="nonnegative")
    assert_rejected(cache, UnknownCheckpointError, lambda: cache.mark_used(42, 9))


def test_completed_fence_is_monotonic(cache):
    cache.advance_completed(5)
    assert_rejected(cache, FenceError, lambda: cache.advance_completed(4), match="backwards")
    assert cache.advance_completed(5).fence == 5
    assert_rejected(cache, FenceError, lambda: cache.advance_completed("6"), match="integer")


# -- lookup -----------------------------------------------------------------


def test_lookup_returns_the_longest_ready_exact_prefix(cache):
    h = history()
    a = publish(cache, h, 64).checkpoint
    b = publish(cache, h, 100, a).checkpoint
    c = publish(cache, h, 256, b).checkpoint
    d = publish(cache, h, 300, c, fence=9).checkpoint  # pending
    assert cache.lookup(h).checkpoint == c
    assert cache.lookup(h, limit=255).checkpoint == b
    assert cache.lookup(h, limit=100).checkpoint == b
    assert cache.lookup(h, limit=99).checkpoint == a
    assert cache.lookup(h, limit=63) is None
    assert cache.lookup(history(150)).checkpoint == b
    # Same aligned prefix, different partial tail: falls back to the aligned checkpoint.
    assert cache.lookup(history(diverge_at=80)).checkpoint == a
    assert cache.lookup(history(diverge_at=10)) is None
    # An event consumed before the endpoint changes the match.
    assert cache.lookup(history(events=[(90, b"v" * 32)])).checkpoint == a
    assert cache.lookup(history(events=[(100, b"v" * 32)])).checkpoint == b
    assert cache.lookup(history(events=[(256, b"v" * 32)])).checkpoint == c
    cache.advance_completed(9)
    assert cache.lookup(h).checkpoint == d


def test_lookup_prefers_the_longest_tail_within_a_block(cache):
    h = history()
    for endpoint in (70, 90, 80):
        publish(cache, h, endpoint)
    assert cache.lookup(h).endpoint == 90
    assert cache.lookup(h, limit=85).endpoint == 80
    assert cache.lookup(history(diverge_at=85)).endpoint == 80


def test_counters_track_lookups_hits_and_reused_tokens(cache):
    h = history()
    publish(cache, h, 100)
    cache.lookup(h)
    cache.lookup(history(diverge_at=3))
    cache.lookup(h, limit=50)
    counters = cache.counters()
    assert (counters.lookups, counters.hits, counters.misses, counters.reused_tokens) == (3, 1, 2, 100)
    assert (counters.cached_checkpoints, counters.cached_snapshots, counters.cached_pages) == (1, 1, 1)


def test_errors_share_the_cache_base_class():
    for error in (CapacityError, CheckpointStateError, FenceError, HistoryError, OwnershipError,
                  ParentMismatchError, PinError, SnapshotError, UnknownCheckpointError):
        assert issubclass(error, CacheError) and error.status == 500

"""Random operation sequences against a plain reference model of the cache.

The model knows nothing about hashing: a checkpoint is identified by its exact
content (the first T tokens and the events they consume). After every step the
cache must agree with the model, and the resource invariants must hold: every
ID is in exactly one place (the caller's free pool, a held checkpoint, or
retiring), IDs return to the pool only through ``reusable`` and only once
their fence has completed, pinned checkpoints and their ancestors survive
eviction, and lookups return the longest ready exact prefix.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from flare.cache import (
    CacheError,
    CapacityError,
    Created,
    Existing,
    OwnershipError,
    ParentMismatchError,
    PinError,
    PrefixCheckpointCache,
    PrefixHistory,
    SnapshotError,
)

IDENTITY = b"\x5a" * 32
P = 64
NUM_PAGES = 24
NUM_SNAPSHOTS = 10

_base = np.random.default_rng(2).integers(0, 1000, size=320).astype(np.int32)
_other = (_base + 7) % 1000
IMAGE_A, IMAGE_B = b"\xaa" * 32, b"\xbb" * 32
# (tokens, events): shared prefixes of several lengths, and images that split them.
HISTORY_SPECS = [
    (_base, ()),
    (np.concatenate([_base[:130], _other[130:]]), ()),
    (np.concatenate([_base[:64], _other[64:]]), ()),
    (_base, ((70, IMAGE_A),)),
    (_base, ((200, IMAGE_A), (200, IMAGE_B))),
    (_base[:150], ()),
    (_other, ()),
]
HISTORIES = [PrefixHistory(IDENTITY, tokens, events) for tokens, events in HISTORY_SPECS]
ENDPOINTS = [1, 30, 63, 64, 65, 100, 128, 130, 150, 192, 200, 201, 250, 256, 300, 320]


def content(spec_index: int, endpoint: int):
    """What a checkpoint at ``endpoint`` of a history is: tokens and consumed events."""
    tokens, events = HISTORY_SPECS[spec_index]
    return tuple(tokens[:endpoint].tolist()), tuple(e for e in events if e[0] < endpoint)


@dataclass
class Model:
    id: int
    content: tuple
    endpoint: int
    parent: int | None
    pages: tuple
    snapshot: int
    ready_fence: int
    visible_fence: int
    stamp: int
    is_ready: bool = False
    direct_pins: int = 0
    last_use: int = 0
    children: set = field(default_factory=set)


class CacheMachine(RuleBasedStateMachine):

    @initialize()
    def setup(self):
        self.cache = PrefixCheckpointCache(IDENTITY, NUM_PAGES, NUM_SNAPSHOTS)
        self.free_pages = set(range(NUM_PAGES))
        self.free_snapshots = set(range(NUM_SNAPSHOTS))
        self.model: dict[int, Model] = {}
        self.retiring: list[tuple[int, tuple, int]] = []  # (fence, pages, snapshot)
        self.completed = 0
        self.clock = 0
        self.next_id = 1
        self.counts = dict(lookups=0, hits=0, misses=0, reused_tokens=0, publications=0,
                           evictions=0, cancellations=0, reusable_pages=0, reusable_snapshots=0)

    # -- model helpers ------------------------------------------------------

    def path(self, checkpoint_id):
        while checkpoint_id is not None:
            node = self.model[checkpoint_id]
            yield node
            checkpoint_id = node.parent

    def pins(self, node: Model) -> int:
        return node.direct_pins + sum(self.pins(self.model[c]) for c in node.children)

    def tick(self):
        self.clock += 1
        return self.clock

    def has_pending_below(self, node: Model) -> bool:
        return any(not self.model[c].is_ready or self.has_pending_below(self.model[c])
                   for c in node.children)

    def reclaimable(self, node: Model) -> bool:
        return node.is_ready and self.pins(node) == 0 and not self.has_pending_below(node)

    def evictable(self, node: Model) -> bool:
        return node.is_ready and not node.children and self.pins(node) == 0

    def retire(self, node: Model, fence: int):
        del self.model[node.id]
        if node.parent is not None:
            self.model[node.parent].children.discard(node.id)
        self.retiring.append((fence, node.pages, node.snapshot))

    @staticmethod
    def pick(index, candidates):
        # NOTE: no assume() here: inside a stateful rule it discards the whole run.
        return candidates[index % len(candidates)] if candidates else None

    # -- rules ----------------------------------------------------------------

    @rule(h=st.integers(0, len(HISTORIES) - 1), e=st.sampled_from(ENDPOINTS),
          parent_index=st.integers(0, 50), use_parent=st.booleans(), delay=st.integers(0, 3))
    def publish(self, h, e, parent_index, use_parent, delay):
        history = HISTORIES[h]
        endpoint = min(e, history.num_tokens)
        parents = [m for m in self.model.values()
                   if m.endpoint < endpoint and m.content == content(h, m.endpoint)]
        parent = self.pick(parent_index, parents) if use_parent and parents else None
        start = parent.endpoint if parent else 0
        num_pages = endpoint // P - start // P
        if len(self.free_pages) < num_pages or not self.free_snapshots:
            return  # the caller would evict first; the evict rule covers that
        pages = sorted(self.free_pages)[:num_pages]
        snapshot = min(self.free_snapshots)
        fence = self.completed + delay
        result = self.cache.publish(history, endpoint, parent=parent.id if parent else None,
                                    pages=pages, snapshot=snapshot, consumed=endpoint,
                                    ready_fence=fence)
        equal = [m for m in self.model.values() if m.content == content(h, endpoint)]
        if equal:
            assert result == Existing(equal[0].id, equal[0].is_ready)
            return  # the proposal's IDs stay in the caller's pool
        visible = max(fence, parent.visible_fence if parent else 0)
        assert result == Created(self.next_id, visible <= self.completed)
        stamp = self.tick()
        node = Model(self.next_id, content(h, endpoint), endpoint, parent.id if parent else None,
                     tuple(pages), snapshot, fence, visible, stamp, is_ready=visible <= self.completed)
        self.next_id += 1
        self.model[node.id] = node
        if parent:
            parent.children.add(node.id)
            for ancestor in self.path(parent.id):
                ancestor.stamp = stamp
        if node.is_ready:
            self.counts["publications"] += 1
        self.free_pages.difference_update(pages)
        self.free_snapshots.discard(snapshot)

    @rule(h=st.integers(0, len(HISTORIES) - 1), e=st.sampled_from(ENDPOINTS),
          kind=st.sampled_from(["parent", "overlap", "capacity", "count", "consumed"]),
          index=st.integers(0, 50))
    def publish_invalid(self, h, e, kind, index):
        history = HISTORIES[h]
        endpoint = min(e, history.num_tokens)
        parent = None
        num_pages = endpoint // P
        pages = sorted(self.free_pages)[:num_pages]
        if not self.free_snapshots:
            return  # every proposal would also overlap a held snapshot row
        snapshot = min(self.free_snapshots)
        consumed = endpoint
        if kind == "parent":
            wrong = [m for m in self.model.values()
                     if m.endpoint >= endpoint or m.content != content(h, m.endpoint)]
            parent = self.pick(index, wrong)
            if parent is None:
                return
            num_pages = max(0, endpoint // P - parent.endpoint // P)
            pages = sorted(self.free_pages)[:num_pages]
            error = ParentMismatchError
        elif kind == "overlap":
            held = sorted({p for m in self.model.values() for p in m.pages}
                          | {p for _, ps, _ in self.retiring for p in ps})
            held_snapshots = sorted({m.snapshot for m in self.model.values()}
                                    | {s for _, _, s in self.retiring})
            if held and num_pages:
                pages = pages[:num_pages - 1] + [self.pick(index, held)]
            elif held_snapshots:
                snapshot = self.pick(index, held_snapshots)
            else:
                return
            error = OwnershipError
        elif kind == "capacity":
            if num_pages:
                pages = pages[:num_pages - 1] + [NUM_PAGES + index]
            else:
                snapshot = NUM_SNAPSHOTS + index
            error = CapacityError
        elif kind == "count":
            pages = sorted(self.free_pages)[:num_pages + 1]
            error = CapacityError
        else:
            consumed = endpoint + 1
            error = SnapshotError
        if len(pages) != num_pages + (kind == "count"):
            return  # not enough free pages to build the intended proposal
        before = self.fingerprint()
        try:
            self.cache.publish(history, endpoint, parent=parent.id if parent else None,
                               pages=pages, snapshot=snapshot, consumed=consumed,
                               ready_fence=self.completed)
        except error:
            pass
        else:
            raise AssertionError(f"an invalid {kind} proposal was accepted")
        assert self.fingerprint() == before

    @rule(h=st.integers(0, len(HISTORIES) - 1), limit=st.one_of(st.none(), st.integers(0, 330)))
    def lookup(self, h, limit):
        history = HISTORIES[h]
        end = history.num_tokens if limit is None else min(limit, history.num_tokens)
        matches = [m for m in self.model.values()
                   if m.is_ready and m.endpoint <= end and m.content == content(h, m.endpoint)]
        hit = self.cache.lookup(history, limit)
        self.counts["lookups"] += 1
        if not matches:
            assert hit is None
            self.counts["misses"] += 1
            return
        best = max(matches, key=lambda m: m.endpoint)
        assert hit is not None and (hit.checkpoint, hit.endpoint, hit.snapshot) == \
            (best.id, best.endpoint, best.snapshot)
        self.counts["hits"] += 1
        self.counts["reused_tokens"] += best.endpoint

    @rule(index=st.integers(0, 50))
    def pin(self, index):
        node = self.pick(index, sorted(self.model.values(), key=lambda m: m.id))
        if node is None:
            return
        self.cache.pin(node.id)
        node.direct_pins += 1
        stamp = self.tick()
        for ancestor in self.path(node.id):
            ancestor.stamp = stamp

    @rule(index=st.integers(0, 50))
    def unpin(self, index):
        node = self.pick(index, sorted(self.model.values(), key=lambda m: m.id))
        if node is None:
            return
        if node.direct_pins == 0:
            before = self.fingerprint()
            try:
                self.cache.unpin(node.id)
            except PinError:
                pass
            else:
                raise AssertionError("unpinned a checkpoint without a direct pin")
            assert self.fingerprint() == before
            return
        self.cache.unpin(node.id)
        node.direct_pins -= 1

    @rule(index=st.integers(0, 50), ahead=st.integers(1, 4))
    def mark_used(self, index, ahead):
        node = self.pick(index, sorted(self.model.values(), key=lambda m: m.id))
        if node is None:
            return
        fence = self.completed + ahead
        self.cache.mark_used(node.id, fence)
        stamp = self.tick()
        for ancestor in self.path(node.id):
            ancestor.last_use = max(ancestor.last_use, fence)
            ancestor.stamp = stamp

    @rule()
    def evict_everything_reclaimable(self):
        before = self.cache.counters()
        eviction = self.cache.evict(NUM_PAGES + 1, NUM_SNAPSHOTS + 1)
        assert (eviction.num_pages, eviction.num_snapshots) == \
            (before.reclaimable_pages, before.reclaimable_snapshots)
        for record in eviction.retired:
            node = self.model[record.checkpoint]
            assert self.evictable(node)
            fence = max(node.ready_fence, node.last_use)
            assert tuple(record) == (node.id, node.pages, node.snapshot, fence)
            self.retire(node, fence)
        self.counts["evictions"] += len(eviction.retired)

    @rule(page_target=st.integers(0, 8), snapshot_target=st.integers(0, 3))
    def evict(self, page_target, snapshot_target):
        pinned_paths = {a.id for m in self.model.values() if m.direct_pins
                        for a in self.path(m.id)}
        expected = []
        num_pages = num_snapshots = 0
        while num_pages < page_target or num_snapshots < snapshot_target:
            candidates = [m for m in self.model.values() if self.evictable(m)]
            if not candidates:
                break
            victim = min(candidates, key=lambda m: m.stamp)
            fence = max(victim.ready_fence, victim.last_use)
            expected.append((victim.id, victim.pages, victim.snapshot, fence))
            self.retire(victim, fence)
            num_pages += len(victim.pages)
            num_snapshots += 1
        eviction = self.cache.evict(page_target, snapshot_target)
        assert [tuple(r) for r in eviction.retired] == expected
        assert not {r.checkpoint for r in eviction.retired} & pinned_paths
        assert (eviction.num_pages, eviction.num_snapshots) == (num_pages, num_snapshots)
        assert eviction.is_satisfied == (num_pages >= page_target and num_snapshots >= snapshot_target)
        self.counts["evictions"] += len(expected)

    @rule(ahead=st.integers(0, 3))
    def advance_completed(self, ahead):
        fence = self.completed + ahead
        completion = self.cache.advance_completed(fence)
        self.completed = fence
        newly_ready = sorted((m for m in self.model.values()
                              if not m.is_ready and m.visible_fence <= fence),
                             key=lambda m: (m.visible_fence, m.id))
        assert completion.ready == tuple(m.id for m in newly_ready)
        for node in newly_ready:
            node.is_ready = True
            self.counts["publications"] += 1
        due = [r for r in self.retiring if r[0] <= fence]
        self.retiring = [r for r in self.retiring if r[0] > fence]
        pages = [p for _, ps, _ in due for p in ps]
        snapshots = [s for _, _, s in due]
        assert sorted(completion.reusable.pages) == sorted(pages)
        assert sorted(completion.reusable.snapshots) == sorted(snapshots)
        # Reuse permission: nothing granted twice, nothing still in use.
        assert not self.free_pages & set(pages) and not self.free_snapshots & set(snapshots)
        self.free_pages.update(pages)
        self.free_snapshots.update(snapshots)
        self.counts["reusable_pages"] += len(pages)
        self.counts["reusable_snapshots"] += len(snapshots)

    @rule(index=st.integers(0, 50))
    def cancel(self, index):
        candidates = sorted((m for m in self.model.values()
                             if not m.is_ready and not m.children and self.pins(m) == 0),
                            key=lambda m: m.id)
        node = self.pick(index, candidates)
        if node is None:
            return
        record = self.cache.cancel(node.id)
        fence = max(node.ready_fence, node.last_use)
        assert tuple(record) == (node.id, node.pages, node.snapshot, fence)
        self.retire(node, fence)
        self.counts["cancellations"] += 1

    @precondition(lambda self: self.model)
    @rule(index=st.integers(0, 50))
    def cancel_invalid(self, index):
        candidates = sorted((m for m in self.model.values()
                             if m.is_ready or m.children or self.pins(m)), key=lambda m: m.id)
        node = self.pick(index, candidates)
        if node is None:
            return
        before = self.fingerprint()
        try:
            self.cache.cancel(node.id)
        except CacheError:
            pass
        else:
            raise AssertionError("cancelled a ready, pinned or parent checkpoint")
        assert self.fingerprint() == before

    # -- invariants -----------------------------------------------------------

    def fingerprint(self):
        cache = self.cache
        return (cache.counters(), [cache.checkpoint(c) for c in cache], cache.completed_fence)

    @invariant()
    def every_id_has_exactly_one_place(self):
        if not hasattr(self, "cache"):
            return
        held_pages = [p for c in self.cache for p in self.cache.checkpoint(c).pages]
        held_snapshots = [self.cache.checkpoint(c).snapshot for c in self.cache]
        retiring_pages = [p for _, ps, _ in self.retiring for p in ps]
        retiring_snapshots = [s for _, _, s in self.retiring]
        pages = held_pages + retiring_pages + sorted(self.free_pages)
        snapshots = held_snapshots + retiring_snapshots + sorted(self.free_snapshots)
        assert sorted(pages) == list(range(NUM_PAGES)), "a page is owned twice or lost"
        assert sorted(snapshots) == list(range(NUM_SNAPSHOTS)), "a snapshot row is owned twice or lost"

    @invariant()
    def cache_matches_the_model(self):
        if not hasattr(self, "cache"):
            return
        assert sorted(self.cache) == sorted(self.model)
        for node in self.model.values():
            info = self.cache.checkpoint(node.id)
            assert (info.endpoint, info.parent, info.pages, info.snapshot, info.is_ready,
                    info.pins, info.direct_pins, info.num_children, info.last_use_fence) == \
                (node.endpoint, node.parent, node.pages, node.snapshot, node.is_ready,
                 self.pins(node), node.direct_pins, len(node.children), node.last_use)
            assert len(self.cache.page_table(node.id)) == node.endpoint // P

    @invariant()
    def counters_match_the_model(self):
        if not hasattr(self, "cache"):
            return
        c = self.cache.counters()
        for name, value in self.counts.items():
            assert getattr(c, name) == value, name
        assert c.cached_checkpoints == len(self.model)
        assert c.pending_checkpoints == sum(not m.is_ready for m in self.model.values())
        assert c.cached_pages == sum(len(m.pages) for m in self.model.values())
        assert c.cached_snapshots == len(self.model)
        assert c.retiring_pages == sum(len(ps) for _, ps, _ in self.retiring)
        assert c.retiring_snapshots == len(self.retiring)
        assert self.cache.completed_fence == self.completed
        reclaimable = [m for m in self.model.values() if self.reclaimable(m)]
        assert c.reclaimable_pages == sum(len(m.pages) for m in reclaimable)
        assert c.reclaimable_snapshots == len(reclaimable)


TestCacheMachine = CacheMachine.TestCase
TestCacheMachine.settings = settings(max_examples=300, stateful_step_count=60, deadline=None,
                                     suppress_health_check=[HealthCheck.filter_too_much,
                                                            HealthCheck.too_slow])

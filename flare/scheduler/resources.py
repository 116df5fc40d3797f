"""Fence-gated ID pools for slots, KV pages and snapshot rows.

An ID handed back with :meth:`IdPool.retire` stays unusable until the fence
of the last submission that may touch it completes; :meth:`advance` is the
only way retiring IDs become free again. IDs the cache owns are outside the
pool until the cache grants them back (``Completion.reusable``), which the
scheduler passes to :meth:`give`.
"""

from __future__ import annotations

import heapq
from typing import Iterable

from .errors import ResourceError


class IdPool:
    def __init__(self, name: str, ids: Iterable[int]):
        self.name = name
        self._free: list[int] = sorted(ids, reverse=True)  # pop() yields the smallest ID
        self._free_set = set(self._free)
        self._retiring: list[tuple[int, int]] = []  # heap of (fence, id)
        self.capacity = len(self._free)

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_retiring(self) -> int:
        return len(self._retiring)

    def take(self, count: int) -> list[int]:
        if count > len(self._free):
            raise ResourceError(f"{self.name}: {count} requested, {len(self._free)} free")
        taken = [self._free.pop() for _ in range(count)]
        self._free_set.difference_update(taken)
        return taken

    def take_one(self) -> int:
        return self.take(1)[0]

    def give(self, ids: Iterable[int]) -> None:
        """Return IDs no pending work can touch."""
        for i in ids:
            if i in self._free_set:
                raise ResourceError(f"{self.name}: ID {i} returned twice")
            self._free.append(i)
            self._free_set.add(i)

    def retire(self, ids: Iterable[int], fence: int, completed: int) -> None:
        """Return IDs whose last use completes at ``fence``."""
        ids = list(ids)
        if fence <= completed:
            self.give(ids)
            return
        for i in ids:
            heapq.heappush(self._retiring, (fence, i))

    def advance(self, completed: int) -> list[int]:
        freed = []
        while self._retiring and self._retiring[0][0] <= completed:
            freed.append(heapq.heappop(self._retiring)[1])
        self.give(freed)
        return freed

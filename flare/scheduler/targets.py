"""CheckpointTargets: the checkpoint endpoints of an admission and the snapshot rows they use.

At admission a request reserves one snapshot row per selected checkpoint endpoint
(and one for a terminal capture); RESTORE reads the row of the cached checkpoint it
resumes from, SNAPSHOT writes the row reserved for the endpoint it reached. Taking a
row may evict an unpinned cache leaf, whose IDs come back through ``reclaim``
(the scheduler's cache collection at its completed fence).
"""

from __future__ import annotations

from typing import Callable, Sequence

from ..cache import PrefixCheckpointCache
from ..config import PolicyConfig
from ..contract import GraphSpec
from .live import LiveRequest
from .resources import IdPool
from .timing import TimingEstimates


class CheckpointTargets:
    def __init__(self, cache: PrefixCheckpointCache, rows: IdPool, timing: TimingEstimates, policy: PolicyConfig,
                 prefill_graphs: Sequence[GraphSpec], snapshot_graphs: Sequence[GraphSpec],
                 reclaim: Callable[[], None], packed_graphs: Sequence[GraphSpec] = ()):
        self.cache = cache
        self.rows = rows
        self.timing = timing
        self.policy = policy
        self.prefill_graphs = prefill_graphs  # one-row PREFILL graphs by token capacity
        self.snapshot_graphs = snapshot_graphs  # by batch: [0] prices one extra capture
        self.reclaim = reclaim
        self.packed_graphs = packed_graphs  # MIXED graphs without decode rows (packed prefill)

    # -- rows ----------------------------------------------------------------------

    def restore_row(self, r: LiveRequest) -> int:
        """The snapshot row RESTORE reads: the one of the cached checkpoint the request resumes."""
        return self.cache.checkpoint(r.tip).snapshot

    @staticmethod
    def due_row(r: LiveRequest) -> int:
        """The snapshot row SNAPSHOT writes: the one reserved for the endpoint now due."""
        return r.target_rows[r.targets.index(r.snapshot_due)]

    def take_row(self) -> int:
        """A free snapshot row, evicting an unpinned cache leaf if none is free; -1 if impossible."""
        if not self.rows.num_free:
            self.cache.evict(snapshot_target=1)
            self.reclaim()
        return self.rows.take_one() if self.rows.num_free else -1

    # -- endpoints -------------------------------------------------------------------

    def select(self, req: LiveRequest) -> None:
        """Reserve snapshot rows for checkpoint endpoints beyond the reused prefix.

        The anchor is the last message boundary past the reuse (or the prompt end when
        there is none). Earlier boundaries and a distinct prompt end are extras: each
        costs a snapshot copy plus whatever prefill its cut adds, and together they
        must fit in checkpoint_extra_work_fraction of the estimated uncached prefill
        work. Unknown costs admit no extras.
        """
        length, reused = req.prompt_len, req.reused
        boundaries = [e for e in req.endpoints if e > reused]
        chosen: list[int] = []
        if reused < length:
            chosen.append(boundaries[-1] if boundaries else length)
            base = self.prefill_cost_ns(reused, length, chosen)
            snapshot = self.timing.estimate_ns(self.snapshot_graphs[0].index)
            if base and snapshot:
                budget = self.policy.checkpoint_extra_work_fraction * base
                extras = boundaries[:-1] + ([length] if boundaries else [])
                for endpoint in sorted(extras, reverse=True):  # later boundaries first
                    cost = self.prefill_cost_ns(reused, length, chosen + [endpoint])
                    extra = cost - base + snapshot
                    if extra <= budget:
                        chosen.append(endpoint)
                        budget -= extra
                        base = cost
        rows: list[tuple[int, int]] = []
        for endpoint in chosen:  # anchor first; rows may come from evicting LRU cache leaves
            row = self.take_row()
            if row < 0:
                break
            rows.append((endpoint, row))
        rows.sort()
        req.targets = [e for e, _ in rows]
        req.target_rows = [r for _, r in rows]
        req.terminal_row = self.take_row()

    def prefill_cost_ns(self, start: int, end: int, cuts: list[int]) -> int:
        """Estimated prefill time from start to end with chunks stopping at cuts (0: unknown).

        With packed prefill (MIXED graphs), a cut costs no step of its own: the tokens after it
        share the next packed step with other rows, so the time is the tokens at the best
        measured packed rate whatever the cuts (the system prompt of a chat workload was
        otherwise never affordable: its cut added a whole chunk)."""
        rates = [self.timing.estimate_ns(g.index) / g.tokens for g in self.packed_graphs
                 if self.timing.estimate_ns(g.index)]
        if rates:
            return int(round((end - start) * min(rates)))
        graphs = self.prefill_graphs
        largest = graphs[-1].tokens
        total, pos = 0, start
        for stop in sorted({c for c in cuts if start < c < end} | {end}):
            while pos < stop:
                k = min(largest, stop - pos)
                est = self.timing.estimate_ns(next(g for g in graphs if g.tokens >= k).index)
                if est == 0:
                    return 0
                total += est
                pos += k
        return total

"""Graph duration estimates and the funded refresh of stale ones.

Every captured graph shape has an estimate that starts unmeasured, or seeded:
the executor timed the graph before serving (the CUDA executor replays each
captured graph once at load), and the scheduler starts from that instead of
running every graph once on live requests to learn it. A seed is used as
measured, never goes stale, and is replaced outright by the first valid
observation. Later fresh observations keep the median of the last nine. After
``freshness`` seconds without a valid observation the estimate is stale: still
used for selection, replaced outright by the next observation.

Refreshing a stale estimate means running a graph the policy would not pick
on merit. Ordinary execution funds that: each valid observation earns
``credit_fraction`` of its duration (0.002 / 0.998, so refreshes cost at most
0.2% of execution time), capped at ``credit_cap``. A refresh may displace the
ordinary winner only with full credit and pays its estimated duration; being
idle discards positive credit but keeps debt.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class _Estimate:
    observations: deque = field(default_factory=lambda: deque(maxlen=9))
    value_ns: int = 0  # 0 = unmeasured
    last_observed: float = float("-inf")
    last_attempt: float = float("-inf")
    seeded: bool = False  # value_ns came from seed(), not from serving


class TimingEstimates:
    def __init__(self, num_graphs: int, *, window: int = 9, freshness_s: float = 30.0,
                 credit_fraction: float = 0.002 / 0.998, credit_cap_s: float = 0.005):
        self._estimates = [_Estimate(observations=deque(maxlen=window)) for _ in range(num_graphs)]
        self.freshness_s = freshness_s
        self.credit_fraction = credit_fraction
        self.credit_cap_ns = int(credit_cap_s * 1e9)
        self.credit_ns = 0.0
        self.version = 0  # bumped whenever an estimate changes (derived costs cache on it)

    def estimate_ns(self, graph: int) -> int:
        """The current estimate; 0 when unmeasured."""
        return self._estimates[graph].value_ns

    def is_measured(self, graph: int) -> bool:
        return self._estimates[graph].value_ns > 0

    def is_seeded(self, graph: int) -> bool:
        """Whether the estimate is still the seed (timed at load, not by a served step)."""
        return self._estimates[graph].seeded

    def is_stale(self, graph: int, now: float) -> bool:
        e = self._estimates[graph]
        # a seed waits for its graph's first real step, which replaces it: a stale winner would
        # drain the window to run alone, as an unmeasured graph does
        return e.value_ns > 0 and not e.seeded and now - e.last_observed > self.freshness_s

    def refresh_order(self, graph: int) -> float:
        """Stale candidates refresh oldest first: the later of last observation and attempt."""
        e = self._estimates[graph]
        return max(e.last_observed, e.last_attempt)

    def attempted(self, graph: int, now: float) -> None:
        self._estimates[graph].last_attempt = now

    def seed(self, graph: int, duration_ns: int, now: float) -> None:
        """A first estimate from outside serving (the graph timed at load, with padding rows):
        used as measured and never stale; the first valid observation replaces it. An estimate
        that serving has already measured is kept."""
        e = self._estimates[graph]
        if duration_ns <= 0 or (e.value_ns and not e.seeded):
            return
        e.observations.clear()
        e.value_ns, e.seeded, e.last_observed = int(duration_ns), True, now
        self.version += 1

    def observe(self, graph: int, duration_ns: int, now: float) -> None:
        """Record a valid completion's measured duration."""
        if duration_ns <= 0:
            return
        e = self._estimates[graph]
        if e.value_ns == 0 or e.seeded or now - e.last_observed > self.freshness_s:
            e.observations.clear()
            e.seeded = False
        e.observations.append(int(duration_ns))
        ordered = sorted(e.observations)
        value = ordered[len(ordered) // 2]
        if value != e.value_ns:
            e.value_ns = value
            self.version += 1
        e.last_observed = now
        self.credit_ns = min(self.credit_cap_ns, self.credit_ns + self.credit_fraction * duration_ns)

    @property
    def has_full_credit(self) -> bool:
        return self.credit_ns >= self.credit_cap_ns

    def pay_refresh(self, graph: int) -> None:
        self.credit_ns -= self._estimates[graph].value_ns

    def idle(self) -> None:
        """Nothing to run: positive credit lapses, debt remains."""
        self.credit_ns = min(self.credit_ns, 0.0)

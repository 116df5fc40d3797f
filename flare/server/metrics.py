"""Prometheus metrics: the runtime's counters and gauges plus the HTTP side.

``Engine.stats()`` returns a flat mapping of the names in :data:`ENGINE_COUNTERS`
and :data:`ENGINE_GAUGES` (and ``launches.<graph kind>``); a missing key is
exported as 0, so a runtime may grow into the list. The server adds HTTP and
frontend capacities, the listener's age, tokens generated in the most recent
minute (sampled every five seconds) and three latency histograms. No metric
carries a request label, prompt text or token IDs. docs/metrics.md lists every
exported name.

Scrapes read independent values and may span concurrent runtime updates; they
are not a transactional sample.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from typing import TYPE_CHECKING, Iterable, Mapping

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

if TYPE_CHECKING:
    from .app import ServerState

PREFIX = "flare_"

# Engine.stats() counter keys -> help. Exported as flare_<key>_total.
ENGINE_COUNTERS: dict[str, str] = {
    "requests_admitted": "Requests admitted by the model runtime.",
    "requests_completed": "Requests that finished successfully (stop or length).",
    "requests_cancelled": "Requests cancelled before finishing (client disconnects included).",
    "requests_failed": "Requests that ended with an execution failure.",
    "prefix_lookups": "Prefix cache lookups, including admissions later rejected for resource pressure.",
    "prefix_hits": "Prefix cache lookups that reused at least one cached token.",
    "prefix_misses": "Prefix cache lookups that reused nothing.",
    "prefix_reused_tokens": "Prompt tokens served from the prefix cache.",
    "checkpoints_published": "Unique prefix checkpoints that became ready (duplicate proposals excluded).",
    "checkpoint_evictions": "Logical evictions of cached checkpoints.",
    "prompt_tokens": "Prompt tokens consumed by prefill (padding and prefix reuse excluded).",
    "generated_tokens": "Output tokens committed, including EOS and tokens withheld by stop strings.",
    "device_busy_seconds": "Measured device time of completed steps (CUDA events on a GPU).",
}

# Engine.stats() gauge keys -> help. Exported as flare_<key>.
ENGINE_GAUGES: dict[str, str] = {
    "slots_live": "Request slots holding a live request.",
    "slots_free": "Request slots free for admission (retirement fences completed).",
    "slots_retiring": "Request slots awaiting retirement of their final GPU use.",
    "pages_reusable": "KV pages whose fences have completed and can be allocated.",
    "snapshots_reusable": "Snapshot rows whose fences have completed and can be allocated.",
    "checkpoints_cached": "Prefix checkpoints held by the cache.",
    "pages_cached": "KV pages owned by cached checkpoints.",
    "requests_pending": "Requests admitted by the model runtime and waiting for a slot.",
}

# Engine.stats() key prefix for successful graph launches, e.g. "launches.decode".
LAUNCH_PREFIX = "launches."
GRAPH_KINDS = ("initialize", "restore", "snapshot", "vision", "prefill", "scored_prefill",
               "resume_sampling", "decode", "speculative", "mixed")

# Latency buckets in seconds: a CPU demo model is slow, a GPU decode step is ~10 ms.
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

TOKEN_SAMPLE_INTERVAL_S = 5.0
TOKEN_WINDOW_S = 60.0


class TokenRate:
    """Tokens generated during the most recent minute, from 5-second samples.

    ``sample`` records the runtime's cumulative generated-token count; the value
    is the newest sample minus the newest one at least a minute older (or the
    oldest kept, during the first minute).
    """

    def __init__(self):
        self._samples: deque[tuple[float, float]] = deque()

    def sample(self, now: float, total: float) -> None:
        self._samples.append((now, total))
        # Keep one sample at or beyond the window edge as the baseline.
        while len(self._samples) > 2 and self._samples[1][0] <= now - TOKEN_WINDOW_S:
            self._samples.popleft()

    @property
    def value(self) -> float:
        if len(self._samples) < 2:
            return 0.0
        return self._samples[-1][1] - self._samples[0][1]


class LoopHistogram:
    """A histogram observed and scraped on the event loop thread only.

    prometheus_client's Histogram takes a lock and walks its buckets in Python
    (about 1.8 us per observation here); inter-token latency is observed once
    per delivered event, so this keeps plain per-bucket counts instead (one C
    bisect and an increment) and renders cumulative buckets at scrape time.
    """

    __slots__ = ("name", "help", "bounds", "counts", "sum")

    def __init__(self, name: str, help_text: str, buckets: tuple[float, ...]):
        self.name = name
        self.help = help_text
        self.bounds = tuple(sorted(buckets))
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def observe_zero(self, count: int) -> None:
        """``count`` observations of 0 (events delivered together)."""
        self.counts[0] += count

    def family(self) -> HistogramMetricFamily:
        cumulative = []
        total = 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts):
            total += count
            cumulative.append(("+Inf" if bound == float("inf") else repr(float(bound)), total))
        return HistogramMetricFamily(self.name, self.help, buckets=cumulative, sum_value=self.sum)


class ServerMetrics:
    """The registry behind /metrics, owned by one server."""

    def __init__(self, state: "ServerState"):
        self.state = state
        self.registry = CollectorRegistry(auto_describe=False)
        self.ttft = LoopHistogram(f"{PREFIX}time_to_first_token_seconds",
                                  "Request receipt to first output token.", TTFT_BUCKETS)
        self.inter_token = LoopHistogram(f"{PREFIX}inter_token_latency_seconds",
                                         "Time between consecutive output deliveries of one request.", ITL_BUCKETS)
        self.e2e = LoopHistogram(f"{PREFIX}e2e_request_latency_seconds", "Request receipt to its terminal event.",
                                 E2E_BUCKETS)
        self.token_rate = TokenRate()
        self.num_requests = 0  # HTTP requests answered (any route)
        self.num_disconnects = 0  # generation responses cut short by the client
        self.num_responses_by_status: dict[int, int] = {}
        self.registry.register(_StateCollector(self))

    def count_response(self, status: int) -> None:
        self.num_requests += 1
        self.num_responses_by_status[status] = self.num_responses_by_status.get(status, 0) + 1

    def sample_tokens(self, now: float | None = None) -> None:
        """Called every TOKEN_SAMPLE_INTERVAL_S by the server."""
        stats = self.state.read_engine_stats()
        self.token_rate.sample(time.monotonic() if now is None else now, float(stats.get("generated_tokens", 0)))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _StateCollector:
    """Reads the runtime's stats and the server's gauges at scrape time."""

    def __init__(self, metrics: ServerMetrics):
        self.metrics = metrics

    def collect(self) -> Iterable[Metric]:
        metrics = self.metrics
        state = metrics.state
        stats: Mapping[str, float] = state.read_engine_stats()
        for key, help_text in ENGINE_COUNTERS.items():
            yield _counter(key, help_text, stats.get(key, 0))
        launches = CounterMetricFamily(f"{PREFIX}graph_launches", "Successful graph launches by graph kind.",
                                       labels=["kind"])
        kinds = list(GRAPH_KINDS) + sorted(k[len(LAUNCH_PREFIX):] for k in stats
                                           if k.startswith(LAUNCH_PREFIX) and k[len(LAUNCH_PREFIX):] not in GRAPH_KINDS)
        for kind in kinds:
            launches.add_metric([kind], float(stats.get(LAUNCH_PREFIX + kind, 0)))
        yield launches
        for key, help_text in ENGINE_GAUGES.items():
            yield _gauge(key, help_text, stats.get(key, 0))
        admission = state.admission
        yield _gauge("http_capacity", "HTTP admission capacity (queue_capacity + max_active).", admission.capacity)
        yield _gauge("http_admitted", "Requests holding an HTTP admission permit.", admission.num_in_use)
        yield _gauge("http_admission_paused", "1 while admission is paused.", int(admission.is_paused))
        yield _counter("http_rejected", "Generation requests refused for HTTP capacity (429).", admission.num_rejected)
        yield _counter("http_requests", "HTTP requests answered.", metrics.num_requests)
        yield _counter("http_disconnects", "Generation responses cut short by a client disconnect.",
                       metrics.num_disconnects)
        responses = CounterMetricFamily(f"{PREFIX}http_responses", "HTTP responses by status code.", labels=["code"])
        for status, count in sorted(metrics.num_responses_by_status.items()):
            responses.add_metric([str(status)], count)
        yield responses
        pool = state.frontend
        yield _gauge("frontend_workers", "Frontend worker threads (template rendering, tokenization).",
                     pool.num_workers)
        yield _gauge("frontend_busy", "Frontend workers preparing a request.", pool.num_busy)
        yield _gauge("frontend_waiting", "Admitted requests waiting for a frontend worker.", pool.num_waiting)
        yield _gauge("uptime_seconds", "Seconds since the listener started.", state.seconds_since_listen())
        yield _gauge("tokens_last_minute", "Tokens generated during the most recent minute, sampled every 5 s.",
                     metrics.token_rate.value)
        for histogram in (metrics.ttft, metrics.inter_token, metrics.e2e):
            yield histogram.family()


def _counter(key: str, help_text: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(f"{PREFIX}{key}", help_text, value=float(value))


def _gauge(key: str, help_text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}{key}", help_text, value=float(value))

"""Prometheus metrics: the runtime's counters and gauges plus the HTTP side.

``Engine.stats()`` returns an :class:`~flare.engine.telemetry.EngineStats`, whose
fields name every engine counter and gauge (and graph launches by kind). The server adds HTTP and
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
from typing import TYPE_CHECKING, Iterable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from ..engine.telemetry import COUNTER, GAUGE, GRAPH_KINDS, EngineStats, stat_fields

if TYPE_CHECKING:
    from .app import ServerState

PREFIX = "flare_"

# Engine statistics: every counter and gauge of flare.engine.telemetry.EngineStats,
# exported as flare_<name>_total (counters) or flare_<name> (gauges).
ENGINE_COUNTERS: dict[str, str] = {name: help_text for name, _, help_text in stat_fields(COUNTER)}
ENGINE_GAUGES: dict[str, str] = {name: help_text for name, _, help_text in stat_fields(GAUGE)}

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
        self.num_tool_parse_failures = 0  # model text that began like a tool call but did not parse
        self.num_tool_calls = 0  # tool calls parsed out of model output
        self.num_responses_by_status: dict[int, int] = {}
        self.registry.register(_StateCollector(self))

    def count_response(self, status: int) -> None:
        self.num_requests += 1
        self.num_responses_by_status[status] = self.num_responses_by_status.get(status, 0) + 1

    def sample_tokens(self, now: float | None = None) -> None:
        """Called every TOKEN_SAMPLE_INTERVAL_S by the server."""
        stats = self.state.read_engine_stats()
        self.token_rate.sample(time.monotonic() if now is None else now, float(stats.generated_tokens))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _StateCollector:
    """Reads the runtime's stats and the server's gauges at scrape time."""

    def __init__(self, metrics: ServerMetrics):
        self.metrics = metrics

    def collect(self) -> Iterable[Metric]:
        metrics = self.metrics
        state = metrics.state
        stats: EngineStats = state.read_engine_stats()
        for key, help_text in ENGINE_COUNTERS.items():
            yield _counter(key, help_text, getattr(stats, key))
        launches = CounterMetricFamily(f"{PREFIX}graph_launches", "Successful graph launches by graph kind.",
                                       labels=["kind"])
        for kind in list(GRAPH_KINDS) + sorted(k for k in stats.launches if k not in GRAPH_KINDS):
            launches.add_metric([kind], float(stats.launches.get(kind, 0)))
        yield launches
        for key, help_text in ENGINE_GAUGES.items():
            yield _gauge(key, help_text, getattr(stats, key))
        admission = state.admission
        yield _gauge("http_capacity", "HTTP admission capacity (queue_capacity + max_active).", admission.capacity)
        yield _gauge("http_admitted", "Requests holding an HTTP admission permit.", admission.num_in_use)
        yield _gauge("http_admission_paused", "1 while admission is paused.", int(admission.is_paused))
        yield _counter("http_rejected", "Generation requests refused for HTTP capacity (429).", admission.num_rejected)
        bodies = state.body_budget
        yield _gauge("http_body_bytes", "Bytes of request bodies held (arriving, or of requests not finished).",
                     bodies.num_bytes)
        yield _gauge("http_body_budget", "The most request body bytes held at once (HTTP capacity x body limit).",
                     bodies.capacity)
        yield _counter("http_body_refused", "Request bodies refused because the body budget was full (503).",
                       bodies.num_refused)
        yield _counter("http_requests", "HTTP requests answered.", metrics.num_requests)
        yield _counter("http_disconnects", "Generation responses cut short by a client disconnect.",
                       metrics.num_disconnects)
        yield _counter("tool_calls", "Tool calls parsed out of model output.", metrics.num_tool_calls)
        yield _counter("tool_call_parse_failures", "Model output that began like a tool call but did not parse "
                                                   "(returned as content).", metrics.num_tool_parse_failures)
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

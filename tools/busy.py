"""Device busy fraction of a serving run, sampled from the engine's own counters."""

from __future__ import annotations

import threading
import time


class BusySampler:
    """Samples the engine's measured device time and live slots every `period` seconds.

    The steady-decode busy fraction counts only the intervals during which every slot
    the benchmark can fill was live, so client start-up, ramp-up and the draining tail
    (fewer live requests than the concurrency) do not dilute it.
    """

    def __init__(self, engine, full: int, period: float = 0.05):
        self.engine, self.full, self.period = engine, full, period
        self.samples: list[tuple[float, float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="busy-sampler", daemon=True)

    def __enter__(self) -> "BusySampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            stats = self.engine.stats()
            self.samples.append((time.perf_counter(), stats["device_busy_seconds"], int(stats["slots_live"])))
            if self._stop.wait(self.period):
                return

    def steady(self) -> tuple[float, float]:
        """(busy fraction, seconds) over intervals whose both ends had all slots live."""
        busy = wall = 0.0
        for (t0, b0, n0), (t1, b1, n1) in zip(self.samples, self.samples[1:]):
            if n0 >= self.full and n1 >= self.full:
                busy += b1 - b0
                wall += t1 - t0
        return (busy / wall if wall else float("nan")), wall

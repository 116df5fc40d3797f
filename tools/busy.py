"""A serving run's device busy fraction, sampled from the engine's own counters.

:func:`serve_and_measure` serves an engine over HTTP, drives tools/bench_serving.py
against it in a subprocess and reports the client's figures with the busy fraction
(tools/bench_gpu.py on a GPU, tools/bench_host.py over a simulated device).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path


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
            self.samples.append((time.perf_counter(), stats.device_busy_seconds, int(stats.slots_live)))
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


@dataclass
class ServingRun:
    summary: str  # bench_serving.py's one-line summary
    result: dict  # its JSON figures
    busy_steady: float  # device busy fraction while all slots were live
    steady_s: float  # seconds with all slots live
    busy_whole: float  # device busy fraction over the whole run
    wall_s: float
    full: int  # the slot count that counts as "all live"


def start_server(engine, queue_capacity: int):
    """Serve ``engine`` on a free local port (close the returned session when done)."""
    from flare.config import ServerConfig
    from flare.server.session import Server

    return Server.start(engine, ServerConfig(host="127.0.0.1", port=0, queue_capacity=queue_capacity,
                                             log_level="warning"))


def measure(engine, session, *, full: int, requests: int, concurrency: int, input_len: int, output_len: int,
            vocab: int, timeout: float, load_args: tuple[str, ...] = ()) -> ServingRun:
    """Run the load client against a server already serving ``engine``."""
    busy0 = engine.stats().device_busy_seconds
    t0 = time.perf_counter()
    with BusySampler(engine, full=full) as sampler:
        run = subprocess.run([sys.executable, str(Path(__file__).parent / "bench_serving.py"),
                              "--url", session.base_url, "--model", "bench", "--requests", str(requests),
                              "--concurrency", str(concurrency), "--input-len", str(input_len),
                              "--output-len", str(output_len), "--vocab", str(vocab), *load_args],
                             capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    busy = engine.stats().device_busy_seconds - busy0
    lines = run.stdout.strip().splitlines()
    if run.returncode != 0 or not lines:
        raise RuntimeError(f"bench_serving.py failed (exit {run.returncode}):\n{run.stdout[-2000:]}\n"
                           f"{run.stderr[-3000:]}")
    steady, steady_s = sampler.steady()
    return ServingRun(lines[0], json.loads(lines[-1]), steady, steady_s, busy / wall, wall, full)


def serve_and_measure(engine, *, full: int, requests: int, concurrency: int, input_len: int, output_len: int,
                      vocab: int, queue_capacity: int, timeout: float, load_args: tuple[str, ...] = ()) -> ServingRun:
    """Serve ``engine`` on a free local port and run the load client against it once."""
    session = start_server(engine, queue_capacity)
    try:
        return measure(engine, session, full=full, requests=requests, concurrency=concurrency, input_len=input_len,
                       output_len=output_len, vocab=vocab, timeout=timeout, load_args=load_args)
    finally:
        session.close(grace_s=1.0)

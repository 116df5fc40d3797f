"""What dashboard telemetry costs the model thread, per graph completion.

    python tools/bench_telemetry.py [--rows 64] [--repeats 9]

Prints the best per-completion time of ``CompletionTrace.record`` (the ring write the model
thread makes while a dashboard runs) beside, from the same run, a Python call that does
nothing (the floor of any per-completion hook) and the check the model thread makes when no
dashboard runs (``trace is None``). The budget is 2 us per completion (issue 25).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from flare.engine.trace import CompletionTrace  # noqa: E402


class _Holder:
    trace = None

    def nothing(self, graph, duration, slots, generations):
        pass


def best_ns(fn, count: int, repeats: int, after=None) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter_ns()
        for _ in range(count):
            fn()
        best = min(best, (time.perf_counter_ns() - started) / count)
        if after is not None:
            after()
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64, help="rows per completion (the slot arrays' length)")
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    rows = np.arange(1, args.rows + 1, dtype=np.int64)
    trace = CompletionTrace()
    holder = _Holder()
    count = trace.capacity  # one ring's worth, then a drain (as the dashboard does)
    record = best_ns(lambda: trace.record(3, 1_000_000, rows, rows), count, args.repeats, trace.drain)
    empty = best_ns(lambda: holder.nothing(3, 1_000_000, rows, rows), count, args.repeats)
    off = best_ns(lambda: holder.trace is not None, count, args.repeats)
    drain = best_ns(lambda: [trace.record(3, 1, rows, rows) for _ in range(count)] and trace.drain(), 1,
                    args.repeats) / count
    print(f"record (dashboard on):   {record:7.0f} ns per completion  (budget 2,000 ns: "
          f"{'within' if record < 2000 else 'OVER'})")
    print(f"empty call, same run:    {empty:7.0f} ns  (record / empty call {record / empty:.1f}x)")
    print(f"dashboard off (check):   {off:7.0f} ns per completion")
    print(f"record + drain:          {drain:7.0f} ns per completion (the drain runs on the dashboard thread)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

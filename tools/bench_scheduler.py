#!/usr/bin/env python3
"""Host time per decode step: plan + commit + pack + complete (fake executor).

For 1, 16 and 64 live decoding requests, drive the real RequestScheduler and
Inputs packing against FakeExecutor and time only the host work of one step;
the fake's own execution is excluded. Prints medians and p99, then one JSON
line. Target (issue 5): <= 150 us per step at 64 requests; vLLM's stated
target for its scheduler overhead is 200-300 us.

    python tools/bench_scheduler.py [--steps 2000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flare.contract import GraphKind, PreparedContract  # noqa: E402
from flare.model.inputs import Inputs, pack_step  # noqa: E402
from flare.request import PreparedPrompt, SamplingParams  # noqa: E402
from flare.scheduler.scheduler import RequestScheduler  # noqa: E402
from flare.testing.fake_executor import FakeExecutor  # noqa: E402


def measure(live: int, steps: int) -> tuple[float, float, dict[str, float]]:
    contract = PreparedContract.build(max_active=64, context=8192, prefill_chunk_size=512, num_pages=64 * 130,
                                      num_snapshot_rows=256, vocab_size=128256, hidden_size=4096)
    sched = RequestScheduler(contract, bytes(32))
    ex = FakeExecutor(contract, duration_ns=5_000_000, manual=True, read_history=False)
    inputs = Inputs(contract)
    rng = np.random.default_rng(0)
    for i in range(live):
        tokens = rng.integers(0, 128000, int(rng.integers(100, 400))).astype(np.int32)
        sched.submit(PreparedPrompt(tokens), SamplingParams(max_tokens=7000, temperature=0.0), i)

    def step() -> tuple[int, float, float, float, float]:
        t0 = time.perf_counter_ns()
        plan = sched.plan()
        t1 = time.perf_counter_ns()
        if plan is None:
            return 0, 0, 0, 0, 0
        committed = sched.commit(plan, ex.next_fence)
        t2 = time.perf_counter_ns()
        uploads = pack_step(inputs, committed)
        t3 = time.perf_counter_ns()
        ex.submit(plan.graph_index, uploads)  # excluded: the fake device
        ex.step()
        done = ex.poll()
        t4 = time.perf_counter_ns()
        sched.complete(done.fence, done.graph_index, done.records, done.duration_ns)
        t5 = time.perf_counter_ns()
        return int(plan.kind), t1 - t0, t2 - t1, t3 - t2, t5 - t4

    # warm up until every request decodes
    for _ in range(100000):
        step()
        if sum(1 for r in sched.live.values() if r.is_decodable) == live and not sched.queue:
            break
    totals, parts = [], {"plan": [], "commit": [], "pack": [], "complete": []}
    while len(totals) < steps:
        kind, p, c, k, d = step()
        if kind == 0:
            raise RuntimeError("the scheduler went idle before the measurement finished")
        if kind != GraphKind.DECODE:
            continue
        totals.append((p + c + k + d) / 1000)
        for name, v in zip(parts, (p, c, k, d)):
            parts[name].append(v / 1000)
    totals.sort()
    return statistics.median(totals), totals[int(0.99 * (len(totals) - 1))], \
        {name: statistics.median(v) for name, v in parts.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    result = {}
    print(f"{'live':>5} {'median us':>10} {'p99 us':>8}   plan / commit / pack / complete (median us)")
    for live in (1, 16, 64):
        median, p99, parts = measure(live, args.steps)
        result[f"step_us_{live}"] = round(median, 1)
        result[f"step_us_p99_{live}"] = round(p99, 1)
        print(f"{live:>5} {median:>10.1f} {p99:>8.1f}   " + " / ".join(f"{v:.1f}" for v in parts.values()))
    result["target_us_64"] = 150
    result["reference"] = "vLLM scheduler overhead target 200-300 us per step"
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

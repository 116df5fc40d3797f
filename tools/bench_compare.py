#!/usr/bin/env python3
"""Set bench_gpu.json runs of two trees side by side: each figure's values, their medians and the ratio.

    python tools/bench_compare.py --base A1.json A2.json --new B1.json B2.json [--keys bs1_ms,suite_a.]

tools/gpu_ab.sh runs the baseline tree (A) and the working tree (B) alternately in one device
call and ends with this table. Nested results (the serving suite's `suite_a` and the like) are
read as `suite_a.output_tok_s`. A figure missing from one side is shown with a dash; lists
and strings are left out. --keys keeps the figures whose names start with one of its prefixes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def flatten(results: dict, prefix: str = "") -> dict[str, float]:
    """The numeric figures of one run, nested dicts joined with dots (bools are not figures)."""
    figures: dict[str, float] = {}
    for key, value in results.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            figures.update(flatten(value, name + "."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            figures[name] = float(value)
    return figures


def compare(base: list[dict], new: list[dict], prefixes: tuple[str, ...] = ()) -> list[tuple]:
    """Rows of (figure, base values, new values, new median / base median or None)."""
    base_runs, new_runs = [flatten(r) for r in base], [flatten(r) for r in new]
    names = sorted({n for run in base_runs + new_runs for n in run})
    rows = []
    for name in names:
        if prefixes and not name.startswith(prefixes):
            continue
        a = [run[name] for run in base_runs if name in run]
        b = [run[name] for run in new_runs if name in run]
        ratio = None
        if a and b and statistics.median(a) != 0:
            ratio = statistics.median(b) / statistics.median(a)
        rows.append((name, a, b, ratio))
    return rows


def render(rows: list[tuple], base_label: str, new_label: str) -> str:
    def values(v: list[float]) -> str:
        return " / ".join(f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}" for x in v) if v else "-"

    table = [("figure", base_label, new_label, "new/base")]
    table += [(name, values(a), values(b), f"{ratio:.3f}" if ratio is not None else "-") for name, a, b, ratio in rows]
    widths = [max(len(row[i]) for row in table) for i in range(4)]
    return "\n".join("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in
                               enumerate(zip(row, widths))) for row in table)


def load(paths: list[Path]) -> list[dict]:
    runs = []
    for path in paths:
        try:
            runs.append(json.loads(path.read_text()))
        except (OSError, ValueError) as exc:
            print(f"skipping {path}: {exc}", file=sys.stderr)
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, nargs="+", required=True, help="the baseline tree's bench_gpu.json runs")
    parser.add_argument("--new", type=Path, nargs="+", required=True, help="the working tree's runs")
    parser.add_argument("--base-label", default="base")
    parser.add_argument("--new-label", default="new")
    parser.add_argument("--keys", default="", help="comma-separated name prefixes to keep")
    args = parser.parse_args()
    base, new = load(args.base), load(args.new)
    if not base or not new:
        print("error: no readable run on one side", file=sys.stderr)
        return 1
    prefixes = tuple(p for p in args.keys.split(",") if p)
    print(render(compare(base, new, prefixes), args.base_label, args.new_label))
    return 0


if __name__ == "__main__":
    sys.exit(main())

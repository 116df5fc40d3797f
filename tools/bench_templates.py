"""Chat-template rendering benchmark: flare's bytecode VM vs jinja2 vs minijinja.

For the Qwen3, Llama 3.1 and DeepSeek R1 templates and five workloads (short prompt,
long history, large messages, 20 tools, images) it prints, per engine: compile time,
warm median and p95 render latency, peak Python memory during one render, and
4-thread throughput. jinja2 is configured exactly as Transformers'
apply_chat_template (its own compile helper); minijinja is the Python binding with
trim_blocks/lstrip_blocks, debug off and its built-in filters. Our output is checked
byte-identical to jinja2's before timing. The last line is one JSON object.

    python tools/bench_templates.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "frontend"))

from template_corpus import SPECIAL_TOKENS, history, many_tools  # noqa: E402

from flare import fixtures  # noqa: E402
from flare.frontend.template import compile_template  # noqa: E402

TEMPLATES = {
    "qwen3": "Qwen-Qwen3-0.6B.jinja",
    "llama3.1": "meta-llama-Llama-3.1-8B-Instruct.jinja",
    "deepseek-r1": "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
    # The three above are text-only (jinja2 itself rejects image content parts with
    # them), so the images case also runs on a vision-language template.
    "qwen3.5-vl": "Qwen3.5-4B.jinja",
}


def workloads() -> dict[str, dict]:
    base = {"tools": None, "documents": None, "add_generation_prompt": True, **SPECIAL_TOKENS}
    big = ("Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 1800)[:100_000]
    image_turns = []
    for i in range(8):
        image_turns.append({"role": "user", "content": [
            {"type": "image", "image": "<Image>"},
            {"type": "text", "text": f"What changed in picture {i}?"}]})
        image_turns.append({"role": "assistant", "content": [
            {"type": "text", "text": f"Picture {i} shows a different cat."}]})
    image_turns.append({"role": "user", "content": [{"type": "image", "image": "<Image>"},
                                                    {"type": "text", "text": "And this?"}]})
    return {
        "short": {**base, "messages": [{"role": "system", "content": "You are helpful."},
                                       {"role": "user", "content": "What is the capital of France?"}]},
        "history_40": {**base, "messages": history(40)},
        "history_120": {**base, "messages": history(120)},
        "large_100kb": {**base, "messages": [
            {"role": "system", "content": "Summarise the user's document."},
            {"role": "user", "content": big},
            {"role": "assistant", "content": big[:50_000]},
            {"role": "user", "content": "Shorter, please."}]},
        "tools_20": {**base, "tools": many_tools(20), "messages": [
            {"role": "system", "content": "Use the tools."},
            {"role": "user", "content": "Run tool 3 on 'abc'."}]},
        "images": {**base, "messages": image_turns},
    }


# ---------------------------------------------------------------- engines

def _jinja2_engine(source: str):
    from transformers.utils.chat_template_utils import _cached_compile_jinja_template
    compile_fn = lambda: _cached_compile_jinja_template(source)  # noqa: E731 - uncached
    tpl = compile_fn()
    return compile_fn, (lambda ctx: tpl.render(**ctx))


def _minijinja_engine(source: str):
    import minijinja

    def raise_exception(message):
        raise minijinja.TemplateError(message)

    def strftime_now(fmt):
        from datetime import datetime
        return datetime.now().strftime(fmt)

    def compile_fn():
        env = minijinja.Environment(trim_blocks=True, lstrip_blocks=True, debug=False)
        env.add_function("raise_exception", raise_exception)
        env.add_function("strftime_now", strftime_now)
        env.add_template("chat", source)
        return env

    env = compile_fn()
    return compile_fn, (lambda ctx: env.render_template("chat", **ctx))


def _flare_engine(source: str):
    compile_fn = lambda: compile_template(source)  # noqa: E731
    tpl = compile_fn()
    return compile_fn, tpl.render


ENGINES = {"flare": _flare_engine, "jinja2": _jinja2_engine, "minijinja": _minijinja_engine}


# ---------------------------------------------------------------- measurements

def _time_calls(fn, budget_s: float, min_n: int = 15, max_n: int = 20000) -> list[float]:
    for _ in range(3):
        fn()
    samples: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(samples) < max_n and (len(samples) < min_n or time.perf_counter() < deadline):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return samples


def _percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _peak_memory(render, ctx) -> int:
    tracemalloc.start()
    tracemalloc.reset_peak()
    render(ctx)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak


def _throughput(render, ctx, budget_s: float, threads: int = 4) -> float:
    counts = [0] * threads
    stop = time.perf_counter() + budget_s

    def worker(i):
        n = 0
        while time.perf_counter() < stop:
            render(ctx)
            n += 1
        counts[i] = n

    start = time.perf_counter()
    ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(counts) / (time.perf_counter() - start)


def measure_case(source: str, ctx: dict, budget_s: float) -> dict:
    """All engines on one case. Latency samples are interleaved round-robin so that
    load from other processes on this shared machine hits every engine alike."""
    engines = {}
    rows: dict = {}
    for name, make in ENGINES.items():
        compile_fn, render = make(source)
        try:
            render(ctx)
        except Exception as exc:  # noqa: BLE001 - a reference that cannot render this case
            rows[name] = {"error": f"{type(exc).__name__}: {exc}"[:120]}
            continue
        engines[name] = (compile_fn, render)
        rows[name] = {"compile_us": statistics.median(
            _time_calls(compile_fn, budget_s / 4, min_n=5, max_n=200)) * 1e6}
    samples: dict = {name: [] for name in engines}
    for _, render in engines.values():
        for _ in range(3):
            render(ctx)
    deadline = time.perf_counter() + budget_s * len(engines)
    rounds = 0
    while rounds < 15 or (time.perf_counter() < deadline and rounds < 20000):
        order = list(engines.items())
        order = order[rounds % len(order):] + order[:rounds % len(order)]
        for name, (_, render) in order:
            t0 = time.perf_counter()
            render(ctx)
            samples[name].append(time.perf_counter() - t0)
        rounds += 1
    for name, (_, render) in engines.items():
        lat = samples[name]
        rows[name].update({
            "median_us": statistics.median(lat) * 1e6,
            "p95_us": _percentile(lat, 0.95) * 1e6,
            "peak_kib": _peak_memory(render, ctx) / 1024,
            "threads4_per_s": _throughput(render, ctx, budget_s / 2),
        })
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter timing budgets")
    args = parser.parse_args()
    budget = 0.15 if args.quick else 0.5
    template_dir = fixtures.ensure_fixtures() / "templates"
    cases = workloads()
    results: dict = {}
    speed_j2: list[float] = []
    speed_mj: list[float] = []
    header = (f"{'template':<12} {'case':<12} {'engine':<10} {'compile us':>10} {'median us':>10} "
              f"{'p95 us':>10} {'peak KiB':>9} {'4thr/s':>9}  speedup")
    print(header)
    print("-" * len(header))
    for tname, fname in TEMPLATES.items():
        source = (template_dir / fname).read_text(encoding="utf-8")
        for cname, ctx in cases.items():
            try:
                ref = ENGINES["jinja2"](source)[1](ctx)
            except Exception as exc:  # noqa: BLE001 - the template rejects this input
                print(f"{tname:<12} {cname:<12} (template raises in jinja2 too: "
                      f"{str(exc)[:60]!r}; not timed)")
                continue
            ours_text = compile_template(source).render(ctx)
            if ours_text != ref:
                print(f"OUTPUT MISMATCH {tname}/{cname}", file=sys.stderr)
                return 1
            row = measure_case(source, ctx, budget)
            results[f"{tname}/{cname}"] = row
            ours = row["flare"]["median_us"]
            for engine, m in row.items():
                if "error" in m:
                    print(f"{tname:<12} {cname:<12} {engine:<10} n/a: {m['error']}")
                    continue
                speed = m["median_us"] / ours
                note = "" if engine == "flare" else f"  ours {speed:5.1f}x faster"
                print(f"{tname:<12} {cname:<12} {engine:<10} {m['compile_us']:10.1f} "
                      f"{m['median_us']:10.1f} {m['p95_us']:10.1f} {m['peak_kib']:9.1f} "
                      f"{m['threads4_per_s']:9.0f}{note}")
                if engine == "jinja2":
                    speed_j2.append(speed)
                elif engine == "minijinja":
                    speed_mj.append(speed)
    summary = {
        "benchmark": "chat_template_render",
        "speedup_vs_jinja2_min": round(min(speed_j2), 2),
        "speedup_vs_minijinja_min": round(min(speed_mj), 2) if speed_mj else None,
        "speedup_vs_jinja2_median": round(statistics.median(speed_j2), 2),
        "speedup_vs_minijinja_median": round(statistics.median(speed_mj), 2) if speed_mj else None,
        "minijinja_cases": len(speed_mj),
        "cases": {k: {e: round(m.get("median_us", -1), 1) for e, m in v.items()}
                  for k, v in results.items()},
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

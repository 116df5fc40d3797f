"""Cost of the output parsers on the event loop: microseconds per character of output.

Each served parser pair (tool calls behind reasoning) reads a long synthetic output in
3-character pieces (about a token's text), as the generation layer feeds it; the plain
parser in the same run is the reference (the SSE hot path skips even that). A parser's
cost must stay linear in the output: the two lengths show it.

    python tools/bench_parsers.py [--chars 100000]
"""

from __future__ import annotations

import argparse
import time

from flare.frontend import parsers

PAIRS = [(None, None), ("hermes", "think"), ("qwen3_coder", "think"), ("llama3_json", None), ("mistral", None),
         ("deepseek_v31", "think"), ("granite", None), ("glm45", "think"), ("kimi_k2", None)]


def output(chars: int) -> str:
    """Reasoning, then content, then one call with a long string argument (the families differ
    only in the call's syntax, which is short next to the text around it)."""
    return ("<think>" + "reason " * (chars // 14) + "</think>" + "word " * (chars // 10)
            + '<tool_call>\n{"name": "f", "arguments": {"a": "' + "x" * (chars // 4) + '"}}\n</tool_call>')


def per_char_us(tool: str | None, reasoning: str | None, text: str) -> float:
    parser = parsers.build(tool, reasoning)
    start = time.perf_counter()
    for i in range(0, len(text), 3):
        parser.feed(text[i:i + 3])
    parser.finish()
    return (time.perf_counter() - start) * 1e6 / len(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chars", type=int, default=100_000)
    args = ap.parse_args()
    short, long = output(args.chars // 4), output(args.chars)
    plain = per_char_us(None, None, long)
    print(f"{'parsers':<26} {'us/char':>8} {'x plain':>8} {'short us/char':>14}")
    for tool, reasoning in PAIRS:
        name = " + ".join(n for n in (reasoning, tool) if n) or "plain"
        cost = per_char_us(tool, reasoning, long)
        print(f"{name:<26} {cost:8.3f} {cost / plain:8.1f} {per_char_us(tool, reasoning, short):14.3f}")


if __name__ == "__main__":
    main()

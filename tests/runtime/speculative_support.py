"""What the speculative-decoding tests share: prompts in the demo core's chat format, a blocking
run, concurrent runs, and the scheduler's speculative counters."""

from __future__ import annotations

import threading

import numpy as np

from flare.request import PreparedPrompt, SamplingParams, TokenEvent

MEMORY = 512 << 20  # KV budget per demo-core model


def chat(tok, text: str) -> list[int]:
    return tok.encode(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False).ids


def run(model, ids, **params):
    """(tokens, terminal event) of one request, blocking."""
    events = list(model.generate(PreparedPrompt(np.asarray(ids, np.int32)), SamplingParams(**params), timeout=600))
    return [t for e in events if isinstance(e, TokenEvent) for t in e.token_ids], events[-1]


def run_together(model, prompts, **params) -> list[list[int]]:
    """Every prompt submitted at once (one thread each): their tokens, in prompt order."""
    results: dict[int, list[int]] = {}

    def go(i):
        results[i] = run(model, prompts[i], **params)[0]

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [results[i] for i in range(len(prompts))]


def counters(model) -> dict:
    c = model.runtime.scheduler.speculation.counters
    return {k: getattr(c, k) for k in c.__slots__}

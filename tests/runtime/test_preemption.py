"""KV pages on demand and preemption through the real runtime, sampler and CPU executor.

A random tiny Llama core (context 1,024) is served with a KV budget of a few dozen pages
and a 64-token output lookahead, so four requests that each grow to nine pages cannot all
keep theirs: decoders run past their reservations and the scheduler preempts. Sampled
tokens (temperature, top-p, presence/frequency/repetition penalties, per-request seeds) must
equal the same requests' tokens with memory to spare: a continuation resumes the RNG stream
and the penalty counts where the preempted request left them.
"""

from __future__ import annotations

import pytest

from flare.config import EngineConfig, PolicyConfig
from flare.engine.model import NativeModel
from flare.model.attention import KVCache
from flare.request import FinishEvent, SamplingParams, TokenEvent
from tests.model.harness import Harness, save_tiny
from tests.model.test_parity_tiny import _make, _prompt
from tests.runtime.bursts import submit_all

SAMPLED = dict(temperature=0.9, top_p=0.95, presence_penalty=0.3, frequency_penalty=0.4, repetition_penalty=1.1)


@pytest.fixture(scope="module")
def tiny_core(tmp_path_factory):
    model = _make("llama")
    ckpt = save_tiny(model, tmp_path_factory.mktemp("preempt-ckpt"))
    out = tmp_path_factory.mktemp("preempt-core") / "core"
    Harness.export(ckpt, out, context=1024, chunk=128).close()
    return out


def _run(core, kv_pages: int | None, specs) -> tuple[list[list[int]], dict]:
    page = KVCache.bytes_per_page(3, 2, 16, __import__("torch").float32)
    config = EngineConfig(device="cpu", max_active=4, num_snapshot_rows=8,
                          kv_memory_bytes=(kv_pages + 1) * page + 8 * (page + 64 * 4) if kv_pages else 64 << 20,
                          policy=PolicyConfig(output_page_lookahead=64))
    model = NativeModel.load(core, config)
    try:
        results = submit_all(model, specs)
        stats = model.runtime.stats()
        out = []
        for events in results:
            assert isinstance(events[-1], FinishEvent) and events[-1].reason == "length", events[-1]
            out.append([t for e in events if isinstance(e, TokenEvent) for t in e.token_ids])
        return out, {"preempted": stats.requests_preempted, "restored": stats.preempted_restored,
                     "recomputed": stats.preempted_recomputed, "pages": model.loaded.contract.num_pages}
    finally:
        model.close()


def test_preempted_requests_sample_what_they_sample_with_room(tiny_core):
    specs = [(_prompt(700 + i, 60 + 7 * i), SamplingParams(max_tokens=480, seed=11 + i, ignore_eos=True, **SAMPLED))
             for i in range(4)]
    roomy, roomy_stats = _run(tiny_core, None, specs)
    tight, stats = _run(tiny_core, 24, specs)
    assert roomy_stats["preempted"] == 0 and stats["pages"] <= 26
    assert stats["preempted"] > 0 and stats["restored"] + stats["recomputed"] == stats["preempted"]
    assert tight == roomy

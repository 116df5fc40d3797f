"""The learned drafter (--speculative draft --draft-core DIR) on real cores: the demo core drafting
for itself and a different tiny model drafting for a tiny target give the target's greedy tokens
exactly (stop strings, max_tokens, prefix-cache hits, concurrency, the drafter's own KV running
short), the back-off stops drafting that does not pay, and incompatible draft cores are refused."""

from __future__ import annotations

import numpy as np
import pytest

from flare.config import EngineConfig
from flare.core.embedded import demo_core
from flare.core.format import load_core
from flare.engine.drafter import check_compatible
from flare.engine.model import NativeModel
from flare.errors import FrontendError
from tests.model.harness import Harness, save_tiny
from tests.model.test_parity_tiny import _make
from tests.runtime.speculative_support import MEMORY, chat, counters, run, run_together

PASSAGE = ("The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single "
           "step. All that glitters is not gold.")


def drafting_model(core, draft, *, always: bool, **config) -> NativeModel:
    m = NativeModel.load(core, EngineConfig(device="cpu", kv_memory_bytes=config.pop("memory", MEMORY),
                                            speculative="draft", draft_core=str(draft), **config))
    m.runtime.scheduler.speculation.always = always  # every round verifies: the drafts are always used
    return m


@pytest.fixture(scope="module")
def plain():
    m = NativeModel.load(demo_core(), EngineConfig(device="cpu", kv_memory_bytes=MEMORY, max_active=4))
    yield m
    m.close()


@pytest.fixture(scope="module")
def self_drafting():
    m = drafting_model(demo_core(), demo_core(), always=True, max_active=4)
    yield m
    m.close()


@pytest.mark.parametrize("params", [
    dict(max_tokens=40, stop=("lazy",)),
    dict(max_tokens=1),
    dict(max_tokens=7),
    dict(max_tokens=32, ignore_eos=True),
], ids=["stop-lazy", "1", "7", "ignore-eos"])
def test_the_demo_core_drafting_for_itself_is_lossless(plain, self_drafting, params):
    ids = chat(plain.tokenizer, f"Copy the following text word for word:\n\n{PASSAGE}")
    before = counters(self_drafting)
    want = run(plain, ids, temperature=0.0, **params)
    got = run(self_drafting, ids, temperature=0.0, **params)
    assert got[0] == want[0]
    assert got[1].reason == want[1].reason and got[1].usage == want[1].usage
    if params["max_tokens"] >= 7:
        after = counters(self_drafting)
        assert after["verification_steps"] > before["verification_steps"]
        # a model drafting for itself is right (near-ties aside): most drafts are accepted
        offered = after["draft_positions"] - before["draft_positions"]
        assert after["accepted_drafts"] - before["accepted_drafts"] >= 0.8 * offered
        assert after["drafter_steps"] - before["drafter_steps"] == offered


def test_prefix_cache_hits_and_concurrency_stay_exact(plain, self_drafting):
    tok = plain.tokenizer
    prompts = [chat(tok, f"Repeat after me: {PASSAGE}"), chat(tok, "Write a short poem about the sea."),
               chat(tok, f"Repeat after me: {PASSAGE}"), chat(tok, "Name three colours.")]
    want = [run(plain, p, temperature=0.0, max_tokens=24)[0] for p in prompts]
    assert run_together(self_drafting, prompts, temperature=0.0, max_tokens=24) == want
    again, finish = run(self_drafting, prompts[1], temperature=0.0, max_tokens=24)
    assert again == want[1] and finish.usage.cached_tokens > 0


def test_drafting_that_does_not_pay_backs_off():
    """On the CPU the demo core drafting for itself costs a decode step per draft: after
    measuring each width, the scheduler stops running the drafter (probes aside)."""
    m = drafting_model(demo_core(), demo_core(), always=False, max_active=2)
    try:
        ids = chat(m.tokenizer, "Count from one to twenty in words, separated by commas.")
        run(m, ids, temperature=0.0, max_tokens=72, ignore_eos=True)
        c = counters(m)
        assert c["generation_rounds"] >= 30 and c["verification_steps"] <= c["generation_rounds"] // 4, c
        assert m.drafter.cost_s  # its rounds were measured
    finally:
        m.close()


@pytest.fixture(scope="module")
def tiny_cores(tmp_path_factory):
    """A tiny Llama target, a tiny Qwen2 draft model with the same (word) tokenizer, and the
    draft model exported with less context than the target."""
    out = {}
    for name, family, context in (("target", "llama", 1024), ("draft", "qwen2", 1024), ("short", "qwen2", 512)):
        ckpt = save_tiny(_make(family), tmp_path_factory.mktemp(f"{name}-ckpt"))
        out[name] = tmp_path_factory.mktemp(f"{name}-core") / "core"
        Harness.export(ckpt, out[name], context=context, chunk=128).close()
    return out


def test_a_different_draft_model_is_lossless_when_its_kv_runs_short(tiny_cores):
    target, draft = tiny_cores["target"], tiny_cores["draft"]
    prompts = [np.random.default_rng(i).integers(3, 500, 150).tolist() for i in range(3)]
    config = dict(device="cpu", kv_memory_bytes=64 << 20, max_active=4)
    plain = NativeModel.load(target, EngineConfig(**config))
    try:
        want = [run(plain, p, temperature=0.0, max_tokens=40, ignore_eos=True)[0] for p in prompts]
    finally:
        plain.close()
    m = drafting_model(target, draft, always=True, memory=64 << 20, max_active=4)
    try:
        drafter = m.drafter
        # the drafter's pool holds one request's history (4 pages): concurrent requests draft in
        # turn, each taking the pages of the last one that drafted
        drafter.free_pages = drafter.free_pages[-4:]
        assert run_together(m, prompts, temperature=0.0, max_tokens=40, ignore_eos=True) == want
        c = counters(m)
        assert c["verification_steps"] > 0 and c["drafter_steps"] == c["draft_positions"] > 0
        assert drafter.failure is None and drafter.evictions > 0
        assert sum(len(p) for p in drafter.pages) + len(drafter.free_pages) == 4
        # sampled requests verify the drafts by rejection sampling
        before = c["verification_steps"]
        tokens = run(m, prompts[0], temperature=0.8, seed=7, max_tokens=16, ignore_eos=True)[0]
        assert len(tokens) == 16 and counters(m)["verification_steps"] > before
    finally:
        m.close()


def test_incompatible_draft_cores_are_refused(tiny_cores):
    with pytest.raises(FrontendError, match="different tokenizer"):
        check_compatible(load_core(demo_core()), load_core(tiny_cores["draft"]))
    with pytest.raises(FrontendError, match="less than the target's 1024"):
        check_compatible(load_core(tiny_cores["target"]), load_core(tiny_cores["short"]))
    with pytest.raises(FrontendError, match="different tokenizer"):
        NativeModel.load(demo_core(), EngineConfig(device="cpu", kv_memory_bytes=MEMORY, speculative="draft",
                                                   draft_core=str(tiny_cores["draft"])))

"""Speculative decoding on captured CUDA graphs, end to end on a tiny bf16 core: the flat
verification rows and their outcome run as kernels (slots.verification_inputs,
slots.commit_verification), greedy and sampled.

Within one graph a verification row's choice depends on its context only, never on the drafts
after it, so once the drafts replay the width-5 graph's own greedy continuation, every
acceptance rate must give that continuation back token for token. Only width 5 is offered (as
tools/bench_speculative.py does): another width is another product and attention split shape,
which may round apart on a near-tie, as a plain decode row may; plain decode is only the source
of the first drafts here.
"""

from __future__ import annotations

import numpy as np
import pytest

from flare.config import EngineConfig
from flare.core.export import ExportOptions, export_core
from flare.engine.model import NativeModel
from flare.scheduler.speculation import ReplayProposer
from tests.model.harness import save_tiny
from tests.model.test_parity_tiny import VOCAB, _make
from tests.runtime.speculative_support import counters, run


@pytest.fixture(scope="module")
def replaying(tmp_path_factory):
    ckpt = save_tiny(_make("llama"), tmp_path_factory.mktemp("spec-ckpt"))
    core = tmp_path_factory.mktemp("spec-core") / "core"
    export_core(ckpt, core, ExportOptions(context=512, prefill_chunk_size=64, max_active=4, dtype="bfloat16"))
    truth: dict[bytes, np.ndarray] = {}
    proposer = ReplayProposer(truth, 1.0, vocab_size=VOCAB, seed=0)
    model = NativeModel.load(core, EngineConfig(device="cuda", max_active=4, kv_memory_bytes=64 << 20,
                                                speculative="copy", speculative_depth=4), proposer=proposer)
    model.runtime.scheduler.speculation.widths = [5]
    yield model, truth, proposer
    model.close()


def _key(ids) -> bytes:
    return np.asarray(ids, np.int32).tobytes()


def _replay_plain_run(model, truth, ids, max_tokens: int) -> list[int]:
    """Greedy tokens of a plain decode of ``ids``, recorded as the proposer's drafts for it."""
    spec = model.runtime.scheduler.speculation
    model.runtime.scheduler.speculation = None
    try:
        plain = run(model, ids, temperature=0.0, max_tokens=max_tokens, ignore_eos=True)[0]
    finally:
        model.runtime.scheduler.speculation = spec
    truth[_key(ids)] = np.asarray(plain, np.int64)
    return plain


def test_greedy_verification_gives_its_continuation_back_at_any_acceptance(replaying):
    model, truth, proposer = replaying
    spec = model.runtime.scheduler.speculation
    ids = list(range(3, 40))
    _replay_plain_run(model, truth, ids, 48)
    spec.always = True
    try:
        proposer.accept = 1.0
        verified = run(model, ids, temperature=0.0, max_tokens=48, ignore_eos=True)[0]
        truth[_key(ids)] = np.asarray(verified, np.int64)
        for accept in (1.0, 0.5, 0.0):
            proposer.accept = accept
            before = counters(model)
            got = run(model, ids, temperature=0.0, max_tokens=48, ignore_eos=True)[0]
            after = counters(model)
            d = {k: after[k] - before[k] for k in after}
            assert got == verified, f"acceptance {accept}"
            assert d["verification_steps"] > 0
            if accept == 1.0:
                assert d["accepted_drafts"] == d["draft_positions"] > 0
                assert d["verification_steps"] < 20, "four drafts accepted a round: about 48 / 5 rounds"
            if accept == 0.0:
                assert d["accepted_drafts"] == 0
    finally:
        spec.always = False
    assert len(verified) == 48


def test_sampled_verification_emits_every_token_it_accepts(replaying):
    model, truth, proposer = replaying
    spec = model.runtime.scheduler.speculation
    ids = list(range(50, 90))
    _replay_plain_run(model, truth, ids, 40)
    proposer.accept = 1.0
    spec.always = True
    try:
        before = counters(model)
        # a low temperature: the replayed greedy drafts are often what the sampler draws
        tokens, end = run(model, ids, temperature=0.3, top_k=4, seed=11, max_tokens=40, ignore_eos=True)
        after = counters(model)
    finally:
        spec.always = False
    d = {k: after[k] - before[k] for k in after}
    assert end.reason == "length" and len(tokens) == 40
    assert all(0 <= t < VOCAB for t in tokens)
    assert d["verification_steps"] > 0 and d["accepted_drafts"] > 0
    assert d["verification_steps"] < 40, "accepted drafts emit several tokens a round"

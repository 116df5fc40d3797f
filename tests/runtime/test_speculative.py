"""Speculative decoding end to end on the CPU demo core: lossless greedy output with copy
proposals and replayed drafts, the target distribution kept under sampling, the acceptance
statistics and counters, and back-off when drafts do not pay."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from flare.config import EngineConfig
from flare.core.embedded import demo_core
from flare.engine.model import NativeModel
from flare.request import FinishEvent, PreparedPrompt, SamplingParams, TokenEvent
from flare.scheduler.speculation import AcceptanceStats, Proposer, ReplayProposer
from tests.runtime.speculative_support import MEMORY, chat, counters, run, run_together

PASSAGE = ("The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single "
           "step. All that glitters is not gold. Actions speak louder than words.")


@pytest.fixture(scope="module")
def plain():
    m = NativeModel.load(demo_core(), EngineConfig(device="cpu", kv_memory_bytes=MEMORY))
    yield m
    m.close()


@pytest.fixture(scope="module")
def copying():
    m = NativeModel.load(demo_core(), EngineConfig(device="cpu", kv_memory_bytes=MEMORY, speculative="copy"))
    yield m
    m.close()


def copy_prompt(tok) -> list[int]:
    return chat(tok, f"Copy the following text word for word:\n\n{PASSAGE}\n\nNow write it again.")


@pytest.mark.parametrize("params", [
    dict(max_tokens=60),
    dict(max_tokens=1),
    dict(max_tokens=2),
    dict(max_tokens=9),
    dict(max_tokens=60, stop=("lazy",)),
    dict(max_tokens=60, stop=("thousand miles",)),
    dict(max_tokens=60, ignore_eos=True),
], ids=["60", "1", "2", "9", "stop-lazy", "stop-two-words", "ignore-eos"])
def test_copy_proposals_are_lossless_under_greedy(plain, copying, params):
    ids = copy_prompt(plain.tokenizer)
    before = counters(copying)
    want = run(plain, ids, temperature=0.0, **params)
    got = run(copying, ids, temperature=0.0, **params)
    assert got[0] == want[0]
    assert got[1].reason == want[1].reason and got[1].usage == want[1].usage
    if params["max_tokens"] >= 9:
        after = counters(copying)
        assert after["verification_steps"] > before["verification_steps"]
        assert after["accepted_drafts"] > before["accepted_drafts"]


def test_prefix_cache_hits_and_concurrency_stay_exact(plain, copying):
    tok = plain.tokenizer
    prompts = [copy_prompt(tok), chat(tok, f"Repeat after me: {PASSAGE}"),
               chat(tok, "Write a short poem about the sea."), copy_prompt(tok)]
    want = [run(plain, p, temperature=0.0, max_tokens=48)[0] for p in prompts]
    # the same prompts again, all at once: full and partial cache hits, a shared cohort
    assert run_together(copying, prompts, temperature=0.0, max_tokens=48) == want
    again, finish = run(copying, prompts[0], temperature=0.0, max_tokens=48)
    assert again == want[0] and finish.usage.cached_tokens > 0


def test_requests_that_cannot_speculate_decode_as_before(plain, copying):
    ids = copy_prompt(plain.tokenizer)
    for params in (dict(logprobs=True, top_logprobs=2), dict(repetition_penalty=1.3), dict(presence_penalty=0.5)):
        before = counters(copying)["verification_steps"]
        assert run(copying, ids, temperature=0.0, max_tokens=24, **params)[0] == \
            run(plain, ids, temperature=0.0, max_tokens=24, **params)[0]
        assert counters(copying)["verification_steps"] == before


def test_replayed_drafts_at_any_acceptance_are_lossless(plain):
    ids = chat(plain.tokenizer, "Write a short story about a lighthouse keeper.")
    want = run(plain, ids, temperature=0.0, max_tokens=40, ignore_eos=True)[0]
    truth = {np.asarray(ids, np.int32).tobytes(): np.asarray(want, np.int64)}
    for accept in (1.0, 0.6, 0.0):
        m = NativeModel.load(demo_core(), EngineConfig(device="cpu", kv_memory_bytes=MEMORY, speculative="copy",
                                                       max_active=4),
                             proposer=ReplayProposer(truth, accept, vocab_size=49152, seed=1))
        try:
            got = run(m, ids, temperature=0.0, max_tokens=40, ignore_eos=True)[0]
            c = counters(m)
        finally:
            m.close()
        assert got == want, f"acceptance {accept}"
        if accept == 1.0:
            # every offered draft was right: each verification kept all it offered
            assert c["accepted_drafts"] == c["draft_positions"] > 0
            assert c["verification_steps"] < 20
        if accept == 0.0:
            assert c["accepted_drafts"] == 0


class FixedDraft(Proposer):
    """Drafts one fixed token every round (for the distribution test)."""

    source = "fixed"

    def __init__(self, token: int):
        self.token = token

    def propose(self, req, out, num_out, depth):
        return np.asarray([self.token], np.int64)


def _second_tokens(ids, first: int, draft: int, n: int) -> list[int]:
    """The second sampled token of n seeded requests (temperature 1, top_k 2) whose first was
    ``first``, with ``draft`` proposed for it every round."""
    m = NativeModel.load(demo_core(), EngineConfig(device="cpu", kv_memory_bytes=MEMORY, speculative="copy",
                                                   max_active=16, speculative_depth=1),
                         proposer=FixedDraft(draft), capacity=n)
    outs: list[list[int]] = []
    done = threading.Semaphore(0)

    def sink_for():
        got: list[int] = []

        def sink(event):
            if isinstance(event, TokenEvent):
                got.extend(event.token_ids)
            if isinstance(event, FinishEvent):
                outs.append(got)
                done.release()
        return sink

    try:
        for i in range(n):
            m.submit(PreparedPrompt(np.asarray(ids, np.int32)),
                     SamplingParams(max_tokens=3, temperature=1.0, top_k=2, seed=1000 + i, ignore_eos=True),
                     sink_for())
        for _ in range(n):
            assert done.acquire(timeout=600)
        c = counters(m)
    finally:
        m.close()
    assert c["verification_steps"] > 0 and c["draft_rounds"] > 0
    return [o[1] for o in outs if o[0] == first]


def test_sampled_outputs_keep_the_target_distribution(plain):
    """Rejection sampling keeps the target distribution: the second token (top_k 2, so two
    outcomes), sampled in a verification round whose draft is either of the two, comes out
    with the target's probabilities (from the plain engine's logprobs), within 4 sigma."""
    tok = plain.tokenizer
    ids = chat(tok, "Is the sky blue? Answer in one word.")
    first = run(plain, ids, temperature=0.0, max_tokens=1)[0][0]
    probe = list(plain.generate(PreparedPrompt(np.asarray(ids + [first], np.int32)),
                                SamplingParams(max_tokens=1, temperature=0.0, logprobs=True, top_logprobs=2),
                                timeout=600))
    top = [e.logprobs for e in probe if isinstance(e, TokenEvent) and e.logprobs][0][0].top
    (a, la), (b, lb) = top[:2]
    pa = float(np.exp(la) / (np.exp(la) + np.exp(lb)))  # top_k 2 renormalizes the two
    for draft in (a, b):
        seconds = _second_tokens(ids, first, draft, 256)
        assert len(seconds) >= 64 and set(seconds) <= {a, b}
        observed = seconds.count(a) / len(seconds)
        sigma = np.sqrt(pa * (1 - pa) / len(seconds))
        assert abs(observed - pa) <= 4 * sigma + 1e-3, (draft, observed, pa, len(seconds))


def test_acceptance_statistics_learn_and_age():
    population = AcceptanceStats(aging=0.98)
    st = AcceptanceStats(population)
    assert st.expected(2) == pytest.approx(0.5 + 0.25)
    for _ in range(30):
        st.observe(4, 4, censored=False)
    assert st.expected(4) > 3.0
    for _ in range(30):
        st.observe(4, 0, censored=False)
    assert st.rates()[0] < 0.15 and st.expected(4) < 0.3
    # a round that ended inside its accepted prefix says nothing about the depths after it
    before = st.trials.copy()
    st.observe(4, 1, censored=True)
    assert st.trials[1] == pytest.approx(before[1] * 0.9)
    # a new request starts from what the population has seen
    for _ in range(40):
        population.observe(4, 0, censored=False)
    assert AcceptanceStats(population).expected(4) < 0.2


def test_free_generation_backs_off(copying):
    """Where copied drafts are wrong, the scheduler stops speculating: most steps are plain
    decode steps, and the probes stay within their budget."""
    ids = chat(copying.tokenizer, "Count from one to twenty in words, separated by commas.")
    before = counters(copying)
    run(copying, ids, temperature=0.0, max_tokens=80, ignore_eos=True)
    after = counters(copying)
    steps = after["verification_steps"] - before["verification_steps"]
    rounds = after["generation_rounds"] - before["generation_rounds"]
    assert rounds >= 40 and steps <= rounds // 4, (steps, rounds)


def test_flattened_verification_is_lossless_too(plain):
    """The form captured CUDA graphs run (b * w decode rows), exercised on the CPU."""
    m = NativeModel.load(demo_core(), EngineConfig(device="cpu", kv_memory_bytes=MEMORY, speculative="copy",
                                                   max_active=4))
    m.loaded.programs.flat_verification = True
    try:
        ids = copy_prompt(plain.tokenizer)
        for params in (dict(max_tokens=48), dict(max_tokens=48, stop=("lazy",))):
            assert run(m, ids, temperature=0.0, **params)[0] == run(plain, ids, temperature=0.0, **params)[0]
        assert counters(m)["accepted_drafts"] > 0
    finally:
        m.close()

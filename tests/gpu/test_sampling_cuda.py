"""The sampling variant's token choice (four Triton launches) and logprobs (two) on the GPU: the torch
reference's tokens at the real vocabulary, and the filtered distribution over many draws.

The interpreter tests (tests/kernels/interpreted/test_sampling.py) hold the kernel to the
reference token for token on the CPU; compiled, ``tl.exp`` and the block sums round
differently from torch, so a draw landing within rounding of a token boundary may differ.
"""

from __future__ import annotations

import pytest
import torch

from flare.contract import (
    SAMPLING_COLUMNS,
    SAMPLING_FREQUENCY,
    SAMPLING_MIN_P,
    SAMPLING_PRESENCE,
    SAMPLING_REPETITION,
    SAMPLING_TEMPERATURE,
    SAMPLING_TOP_K,
    SAMPLING_TOP_P,
)
from flare.model import sampling as reference
from flare.model.kernels.sampling import sample_tokens

DEV = "cuda"


def _rows(slots: int) -> torch.Tensor:
    """Sampling rows cycling through plain temperature, each filter, all three (Ollama's
    defaults), penalties with a filter, a greedy temperature."""
    sampling = torch.zeros(slots, SAMPLING_COLUMNS)
    sampling[:, SAMPLING_REPETITION] = 1.0
    sampling[:, SAMPLING_TOP_P] = 1.0
    sampling[:, SAMPLING_TEMPERATURE] = 1.0
    kinds = torch.arange(slots) % 7
    sampling[kinds == 1, SAMPLING_TOP_K] = 40
    sampling[kinds == 2, SAMPLING_TOP_P] = 0.9
    sampling[kinds == 3, SAMPLING_MIN_P] = 0.05
    sampling[kinds == 4, SAMPLING_TEMPERATURE] = 0.8
    sampling[kinds == 4, SAMPLING_TOP_K] = 40
    sampling[kinds == 4, SAMPLING_TOP_P] = 0.9
    sampling[kinds == 5, SAMPLING_REPETITION] = 1.2
    sampling[kinds == 5, SAMPLING_PRESENCE] = 0.5
    sampling[kinds == 5, SAMPLING_FREQUENCY] = 0.3
    sampling[kinds == 5, SAMPLING_TOP_K] = 20
    sampling[kinds == 6, SAMPLING_TEMPERATURE] = 0.0
    return sampling.to(DEV)


@pytest.mark.parametrize("scale", [1.0, 4.0])
def test_the_kernel_draws_the_references_tokens_at_the_real_vocabulary(scale):
    vocab, b = 128256, 224
    gen = torch.Generator(device=DEV).manual_seed(int(scale))
    sampling = _rows(b)
    out_counts = ((torch.rand(b, vocab, device=DEV, generator=gen) < 0.001) * 2).to(torch.int32)
    prompt_counts = (torch.rand(b, vocab, device=DEV, generator=gen) < 0.001).to(torch.int32)
    rows = torch.arange(b, device=DEV)
    seeds = torch.arange(b, dtype=torch.int64, device=DEV) * 7919
    generated = torch.zeros(b, dtype=torch.int64, device=DEV)
    do_sample = torch.ones(b, dtype=torch.bool, device=DEV)
    slot_token = torch.zeros(b, dtype=torch.int64, device=DEV)
    same = total = 0
    for draw in range(4):
        logits = torch.randn(b, vocab, device=DEV, generator=gen) * scale
        generated += 1
        args = (logits, sampling, out_counts, prompt_counts, rows, do_sample, slot_token, seeds, generated)
        want = reference.sampled_tokens(*args)
        got = sample_tokens(*args)
        same += int((got == want).sum())
        total += b
        greedy = (sampling[:, SAMPLING_TEMPERATURE] <= 0)
        assert torch.equal(got[greedy], want[greedy]), "greedy rows take the penalized argmax"
    assert same >= 0.98 * total, f"only {same} of {total} draws match the reference"


def test_the_kernels_draws_follow_the_filtered_distribution():
    """Ollama's defaults (temperature 0.8, top_k 40, top_p 0.9) on one peaked row, 32,768
    draws: no token outside the filtered set, each kept token's frequency within 5 sigma."""
    vocab, slots, rounds = 32000, 4096, 8
    gen = torch.Generator(device=DEV).manual_seed(11)
    logits = torch.randn(1, vocab, device=DEV, generator=gen)
    logits[0, torch.randperm(vocab, device=DEV, generator=gen)[:30]] += torch.linspace(3, 6, 30, device=DEV)
    params = torch.zeros(1, SAMPLING_COLUMNS, device=DEV)
    params[0, [SAMPLING_REPETITION, SAMPLING_TEMPERATURE, SAMPLING_TOP_K, SAMPLING_TOP_P]] = torch.tensor(
        [1.0, 0.8, 40.0, 0.9], device=DEV)
    kept, order, keep = reference._filtered(logits, params)
    expected = torch.zeros(vocab, device=DEV).scatter_(0, order[0], kept[0] / kept[0].sum())
    assert 3 < int(keep.sum()) <= 40  # the filters bite: top_p, then top_k
    sampling = params.repeat(slots, 1)
    zeros = torch.zeros(slots, vocab, dtype=torch.int32, device=DEV)
    seeds = torch.arange(slots, dtype=torch.int64, device=DEV) + 12345
    generated = torch.zeros(slots, dtype=torch.int64, device=DEV)
    counts = torch.zeros(vocab, device=DEV)
    rows = torch.arange(slots, device=DEV)
    for _ in range(rounds):
        generated += 1
        tokens = sample_tokens(logits.expand(slots, vocab).contiguous(), sampling, zeros, zeros, rows,
                               torch.ones(slots, dtype=torch.bool, device=DEV),
                               torch.zeros(slots, dtype=torch.int64, device=DEV), seeds, generated)
        counts += torch.bincount(tokens, minlength=vocab).float()
    n = slots * rounds
    assert float(counts[expected == 0].sum()) == 0, "a filtered-out token was drawn"
    sigma = torch.sqrt(expected * (1 - expected) / n)
    worst = float(((counts / n - expected).abs() / sigma.clamp(min=1e-9))[expected > 0].max())
    assert worst < 5, f"a kept token's frequency is {worst:.1f} sigma from its probability"


def test_the_logprobs_kernels_write_the_references_logprobs_at_the_real_vocabulary():
    """At Llama 3's vocabulary and 20 top logprobs, compiled: the rows that ask get the
    reference's ids (no ties in these logits) and its logprobs within float rounding of a
    blocked log-sum-exp; a row that does not ask keeps its frame row."""
    from flare.contract import FRAMES, SAMPLING_LOGPROBS
    from flare.model.kernels.sampling import write_logprobs

    vocab, b, k = 128256, 224, 20
    gen = torch.Generator(device=DEV).manual_seed(4)
    sampling = _rows(b)
    sampling[::3, SAMPLING_LOGPROBS] = 1.0
    logits = torch.randn(b, vocab, device=DEV, generator=gen) * 4
    token = torch.randint(0, vocab, (b,), device=DEV, generator=gen)
    rows = torch.arange(b, device=DEV)
    out_lp = torch.full((FRAMES, b, 1 + k), 7.0, device=DEV)
    out_ids = torch.full((FRAMES, b, k), -1, dtype=torch.int64, device=DEV)
    frame = torch.tensor([1], device=DEV)
    write_logprobs(logits, token, rows, sampling=sampling, frame=frame, out_logprobs=out_lp, out_top_ids=out_ids)
    values, ids = reference.token_logprobs(logits, token, k)
    asked = sampling[:, SAMPLING_LOGPROBS] > 0
    assert torch.equal(out_ids[1][asked], ids[asked])
    torch.testing.assert_close(out_lp[1][asked], values[asked], rtol=0, atol=1e-4)
    assert torch.all(out_lp[1][~asked] == 7.0) and torch.all(out_ids[1][~asked] == -1)
    assert torch.all(out_lp[0] == 7.0) and torch.all(out_ids[2] == -1)

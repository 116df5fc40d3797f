"""The sort-free sampler (flare.model.sampling.sample): the kept set its rounds define, the
distribution of its draws, its determinism, and its agreement with the sorted filter that
speculative verification uses."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flare.contract import (
    SAMPLING_COLUMNS,
    SAMPLING_MIN_P,
    SAMPLING_REPETITION,
    SAMPLING_TEMPERATURE,
    SAMPLING_TOP_K,
    SAMPLING_TOP_P,
)
from flare.model.sampling import _filtered, philox_uniform, sample

LOGITS = torch.tensor([2.0, 1.5, 1.5, 0.3, -0.2, 3.1, -1.0, 0.9, 0.0, -3.0, 2.2, 1.1])


def _params(n: int, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0) -> torch.Tensor:
    p = torch.zeros(n, SAMPLING_COLUMNS)
    p[:, SAMPLING_REPETITION] = 1.0
    p[:, SAMPLING_TEMPERATURE] = temperature
    p[:, SAMPLING_TOP_K] = top_k
    p[:, SAMPLING_TOP_P] = top_p
    p[:, SAMPLING_MIN_P] = min_p
    return p


def _expected(temperature, top_k, top_p, min_p) -> np.ndarray:
    """The filtered distribution by its definition: token i is kept when fewer than top_k
    scores are above it, the probability above it is below top_p and its probability is at
    least min_p times the largest."""
    probs = torch.softmax(LOGITS / temperature, dim=0).double().numpy()
    keep = np.zeros(len(probs), bool)
    for i, p in enumerate(probs):
        above = probs > p
        keep[i] = ((top_k <= 0 or above.sum() < top_k) and probs[above].sum() < top_p and p >= min_p * probs.max())
    keep[probs.argmax()] = True
    out = np.where(keep, probs, 0.0)
    return out / out.sum()


@pytest.mark.parametrize("filters", [
    dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0),
    dict(temperature=0.7, top_k=4, top_p=1.0, min_p=0.0),
    dict(temperature=1.3, top_k=0, top_p=0.6, min_p=0.0),
    dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.2),
    dict(temperature=0.9, top_k=6, top_p=0.8, min_p=0.05),
])
def test_draws_follow_the_filtered_distribution(filters):
    """20,000 draws (one row per counter) land on the kept tokens with the filtered
    distribution's frequencies, each within 5 sigma; no draw leaves the kept set."""
    n = 20_000
    logits = LOGITS.repeat(n, 1)
    tokens = sample(logits, _params(n, **filters), torch.full((n,), 1234, dtype=torch.int64),
                    torch.arange(n, dtype=torch.int64))
    want = _expected(**filters)
    seen = np.bincount(tokens.numpy(), minlength=len(want)) / n
    assert seen[want == 0].sum() == 0, f"draws outside the kept set: {seen}"
    sigma = np.sqrt(want * (1 - want) / n)
    assert np.all(np.abs(seen - want) <= 5 * sigma + 1e-4), (seen.round(4), want.round(4))


def test_ties_at_the_boundary_are_kept_together():
    """Tokens 1 and 2 tie below token 4: one score is above each of them, so top_k 2 keeps
    both (three tokens), where a sorted filter would keep one of the two."""
    n = 4000
    logits = torch.tensor([[0.0, 2.0, 2.0, 1.0, 3.0]]).repeat(n, 1)
    tokens = sample(logits, _params(n, top_k=2), torch.zeros(n, dtype=torch.int64), torch.arange(n))
    # scores above: token 4 none, tokens 1 and 2 one each (both kept), token 3 three
    assert set(tokens.tolist()) == {1, 2, 4}


def test_greedy_rows_and_top_k_one_take_the_argmax():
    logits = LOGITS.repeat(3, 1)
    params = torch.cat([_params(1, temperature=0.0), _params(1, top_k=1), _params(1, temperature=0.0, top_p=0.1)])
    assert sample(logits, params, torch.arange(3), torch.arange(3)).tolist() == [5, 5, 5]


def test_a_rows_draw_does_not_depend_on_its_batch():
    """The same seed and counter give the same token alone or among other rows."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 300, generator=gen) * 2
    params = torch.cat([_params(3, temperature=0.8, top_p=0.9), _params(3, top_k=20, min_p=0.01)])
    seeds = torch.tensor([9, 8, 7, 6, 5, 4])
    counters = torch.tensor([0, 1, 2, 3, 4, 5])
    together = sample(logits, params, seeds, counters)
    alone = [int(sample(logits[i:i + 1], params[i:i + 1], seeds[i:i + 1], counters[i:i + 1])) for i in range(6)]
    assert together.tolist() == alone


def test_an_unfiltered_row_inverts_its_first_uniform_in_token_order():
    """Round 0 is the uniform a row always drew (Philox counter word 2 = 0): without filters
    the token is where that uniform falls in the CDF taken in token-id order."""
    seeds, counters = torch.tensor([42]), torch.tensor([7])
    u = float(philox_uniform(seeds, counters))
    probs = torch.softmax(LOGITS, dim=0)
    want = int(torch.searchsorted(torch.cumsum(probs, 0), torch.tensor([u * float(probs.sum())]), right=True))
    assert int(sample(LOGITS.view(1, -1), _params(1), seeds, counters)) == want
    assert float(philox_uniform(seeds, counters, 1)) != u


def test_the_sorted_filter_of_verification_keeps_the_same_set_without_ties():
    """Speculative verification filters in sorted order; without ties its kept set is the one
    the rounds accept from."""
    params = _params(1, temperature=0.9, top_k=6, top_p=0.8, min_p=0.05)
    kept, order, keep = _filtered(LOGITS.view(1, -1) + torch.arange(12) * 1e-4, params)
    sorted_set = set(order[0][keep[0]].tolist())
    assert sorted_set == set(np.flatnonzero(_expected(0.9, 6, 0.8, 0.05)).tolist())

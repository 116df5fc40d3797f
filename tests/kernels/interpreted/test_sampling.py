"""The greedy variant's two-launch token choice against the torch reference, under the interpreter."""

from __future__ import annotations

import pytest
import torch

from flare.contract import SAMPLING_COLUMNS, SAMPLING_FREQUENCY, SAMPLING_PRESENCE, SAMPLING_REPETITION
from flare.model import sampling as reference
from flare.model.kernels import KernelInputError
from flare.model.kernels.sampling import greedy_tokens

VOCAB = 5000  # not a multiple of the 2048-token block


def _state(seed: int, slots: int = 6):
    gen = torch.Generator().manual_seed(seed)
    sampling = torch.zeros(slots, SAMPLING_COLUMNS)
    sampling[:, SAMPLING_REPETITION] = 1.0
    sampling[2, SAMPLING_REPETITION] = 1.3
    sampling[2, SAMPLING_PRESENCE] = 0.7
    sampling[5, SAMPLING_FREQUENCY] = 0.25
    sampling[5, SAMPLING_REPETITION] = 0.9
    out_counts = torch.randint(0, 3, (slots, VOCAB), generator=gen, dtype=torch.int32) * \
        (torch.rand(slots, VOCAB, generator=gen) < 0.05)
    prompt_counts = torch.randint(0, 2, (slots, VOCAB), generator=gen, dtype=torch.int32) * \
        (torch.rand(slots, VOCAB, generator=gen) < 0.05)
    slot_token = torch.arange(slots, dtype=torch.int64) + 100
    return gen, sampling, out_counts.to(torch.int32), prompt_counts.to(torch.int32), slot_token


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_tokens_match_the_reference(seed):
    gen, sampling, out_counts, prompt_counts, slot_token = _state(seed)
    slots = torch.tensor([2, 0, 5, 3])
    logits = torch.randn(4, VOCAB, generator=gen) * 3
    do_sample = torch.tensor([True, True, True, False])
    args = (logits, sampling, out_counts, prompt_counts, slots, do_sample, slot_token)
    want = reference.greedy_tokens(*args)
    got = greedy_tokens(*args)
    assert torch.equal(got, want), f"greedy_tokens {got.tolist()} != reference {want.tolist()}"
    assert int(got[3]) == int(slot_token[3]), "a row that does not sample keeps its slot's token"


def test_ties_resolve_to_the_lowest_token_id_across_blocks():
    _, sampling, out_counts, prompt_counts, slot_token = _state(4)
    out_counts.zero_()
    prompt_counts.zero_()
    logits = torch.zeros(2, VOCAB)
    logits[0, [4500, 2100, 3000]] = 7.0  # maxima in blocks 1 and 2: 2100 wins
    logits[1, [1999, 17]] = 2.5  # both in block 0: 17 wins
    args = (logits, sampling, out_counts, prompt_counts, torch.tensor([0, 1]), torch.tensor([True, True]), slot_token)
    assert greedy_tokens(*args).tolist() == [2100, 17] == reference.greedy_tokens(*args).tolist()


def test_counts_move_only_penalized_rows():
    """A row without penalties ignores its counts (the kernel skips reading them); a penalized
    row's counts move its choice."""
    _, sampling, out_counts, prompt_counts, slot_token = _state(6)
    out_counts.zero_()
    prompt_counts.zero_()
    logits = torch.zeros(2, VOCAB)
    logits[:, 4100] = 3.0  # the best token of both rows, seen in both slots' outputs
    logits[:, 7] = 2.9
    out_counts[[0, 5], 4100] = 4
    prompt_counts[[0, 5], 4100] = 1
    args = (logits, sampling, out_counts, prompt_counts, torch.tensor([0, 5]), torch.tensor([True, True]), slot_token)
    # slot 0 has no penalties: 4100 stays; slot 5 (repetition 0.9, frequency 0.25) drops it
    assert greedy_tokens(*args).tolist() == [4100, 7] == reference.greedy_tokens(*args).tolist()


def test_bad_inputs_raise_typed_errors():
    _, sampling, out_counts, prompt_counts, slot_token = _state(5)
    slots, do_sample = torch.tensor([0]), torch.tensor([True])
    with pytest.raises(KernelInputError, match="greedy_tokens: logits must be float32"):
        greedy_tokens(torch.zeros(1, VOCAB, dtype=torch.float64), sampling, out_counts, prompt_counts, slots,
                      do_sample, slot_token)
    with pytest.raises(KernelInputError, match="greedy_tokens: counts must be int32"):
        greedy_tokens(torch.zeros(1, VOCAB + 1), sampling, out_counts, prompt_counts, slots, do_sample, slot_token)



@pytest.mark.parametrize("seed", [0, 1])
def test_grammar_masks_match_the_reference(seed):
    from flare.contract import SAMPLING_GRAMMAR, mask_words
    from flare.model.kernels.sampling import apply_grammar_masks

    gen = torch.Generator().manual_seed(seed)
    sampling = torch.zeros(6, SAMPLING_COLUMNS)
    sampling[[2, 5], SAMPLING_GRAMMAR] = 1.0
    masks = torch.randint(-2**31, 2**31 - 1, (6, mask_words(VOCAB)), generator=gen, dtype=torch.int32)
    masks[5] = 0
    masks[5, 3] = 1 << 7  # slot 5 allows token 3 * 32 + 7 only
    slots = torch.tensor([2, 0, 5, 3])
    logits = torch.randn(4, VOCAB, generator=gen)
    want, got = logits.clone(), logits.clone()
    reference.apply_grammar_masks(want, sampling, masks, slots)
    apply_grammar_masks(got, sampling, masks, slots)
    assert torch.equal(want, got)
    assert torch.equal(got[1], logits[1]) and torch.equal(got[3], logits[3])  # slots 0 and 3: unconstrained
    allowed = [t for t in range(VOCAB) if (int(masks[2, t // 32]) >> (t % 32)) & 1]
    assert torch.isfinite(got[0]).nonzero().view(-1).tolist() == allowed  # slot 2: its random mask
    assert torch.equal(got[0][allowed], logits[0][allowed])
    assert torch.isfinite(got[2]).nonzero().view(-1).tolist() == [3 * 32 + 7]  # slot 5: one token

"""The greedy and sampling variants' token choices against the torch reference, under the interpreter."""

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
from flare.model.kernels import KernelInputError
from flare.model.kernels.sampling import greedy_tokens, sample_tokens

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


def _sampling_rows(slots: int) -> torch.Tensor:
    """The first ``slots`` of eight sampling rows covering every path: plain temperature,
    each filter, all three, penalties with filters, a greedy temperature, top_k 1."""
    sampling = torch.zeros(max(slots, 8), SAMPLING_COLUMNS)
    sampling[:, SAMPLING_REPETITION] = 1.0
    sampling[:, SAMPLING_TOP_P] = 1.0
    sampling[:, SAMPLING_TEMPERATURE] = 1.0
    sampling[1, SAMPLING_TEMPERATURE] = 0.6
    sampling[1, SAMPLING_TOP_K] = 40
    sampling[2, SAMPLING_TOP_P] = 0.9
    sampling[3, SAMPLING_MIN_P] = 0.05
    sampling[4, [SAMPLING_TEMPERATURE, SAMPLING_TOP_K, SAMPLING_TOP_P, SAMPLING_MIN_P]] = torch.tensor(
        [0.8, 3.0, 0.5, 0.01])
    sampling[5, [SAMPLING_REPETITION, SAMPLING_PRESENCE, SAMPLING_FREQUENCY, SAMPLING_TOP_K]] = torch.tensor(
        [1.3, 0.4, 0.2, 2.0])
    sampling[6, SAMPLING_TEMPERATURE] = 0.0
    sampling[7, SAMPLING_TOP_K] = 1
    return sampling[:slots].contiguous()


@pytest.mark.parametrize("seed", [0, 1])
def test_sample_tokens_match_the_reference(seed):
    """The four-launch sampler draws the reference's tokens, row for row, across filters,
    penalties, greedy rows and rows that do not sample; the rounds' uniforms are the
    reference's Philox words."""
    slots = 8
    gen = torch.Generator().manual_seed(seed)
    sampling = _sampling_rows(slots)
    out_counts = (torch.randint(0, 3, (slots, VOCAB), generator=gen) *
                  (torch.rand(slots, VOCAB, generator=gen) < 0.05)).to(torch.int32)
    prompt_counts = (torch.rand(slots, VOCAB, generator=gen) < 0.05).to(torch.int32)
    slot_token = torch.arange(slots, dtype=torch.int64) + 100
    slot_seed = torch.randint(-2**62, 2**62, (slots,), generator=gen, dtype=torch.int64)
    slot_generated = torch.randint(0, 2**40, (slots,), generator=gen, dtype=torch.int64)
    rows = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 4, 2])
    do_sample = torch.ones(len(rows), dtype=torch.bool)
    do_sample[-1] = False
    for draw in range(3):
        logits = torch.randn(len(rows), VOCAB, generator=gen) * 2.5
        slot_generated += 1
        args = (logits, sampling, out_counts, prompt_counts, rows, do_sample, slot_token, slot_seed, slot_generated)
        want = reference.sampled_tokens(*args)
        got = sample_tokens(*args)
        assert torch.equal(got, want), f"draw {draw}: sample_tokens {got.tolist()} != reference {want.tolist()}"
    assert int(got[-1]) == int(slot_token[2]), "a row that does not sample keeps its slot's token"


def test_sample_tokens_keep_a_peaked_rows_filters_over_many_rounds():
    """A flat row with top_k 2: most draws are rejected, each raising the pivot, until one of
    the two highest scores is drawn; the kernel follows the reference round for round."""
    slots = 4
    sampling = _sampling_rows(slots)
    sampling[:, SAMPLING_TOP_K] = 2
    zeros = torch.zeros(slots, VOCAB, dtype=torch.int32)
    logits = torch.linspace(0, 1e-3, VOCAB).repeat(slots, 1)
    logits[:, 4321] = 0.5
    logits[:, 17] = 0.4
    rows = torch.arange(slots)
    seeds = torch.tensor([3, 5, 7, 11], dtype=torch.int64)
    args = (logits, sampling, zeros, zeros, rows, torch.ones(slots, dtype=torch.bool),
            torch.zeros(slots, dtype=torch.int64), seeds, torch.arange(slots, dtype=torch.int64))
    want = reference.sampled_tokens(*args)
    assert set(want.tolist()) <= {4321, 17}
    assert torch.equal(sample_tokens(*args), want)


def test_sample_tokens_refuse_bad_rng_state():
    slots = 2
    sampling = _sampling_rows(slots)
    zeros = torch.zeros(slots, VOCAB, dtype=torch.int32)
    args = [torch.zeros(slots, VOCAB), sampling, zeros, zeros, torch.arange(slots), torch.ones(slots, dtype=torch.bool),
            torch.zeros(slots, dtype=torch.int64), torch.zeros(slots, dtype=torch.int32),
            torch.zeros(slots, dtype=torch.int64)]
    with pytest.raises(KernelInputError, match="int64"):
        sample_tokens(*args)


def _logprob_frames(slots: int, k: int):
    from flare.contract import FRAMES

    return (torch.full((FRAMES, slots, 1 + k), 7.0), torch.full((FRAMES, slots, k), -1, dtype=torch.int64),
            torch.tensor([2]))


def test_logprobs_match_the_reference_for_the_rows_that_ask():
    """Rows whose slot asks for logprobs get the reference's token and top-k logprobs in the
    step's frame at their slot (ids exact: the logits have no ties); a row whose slot does not
    ask leaves its frame row untouched, and the other frames are never written."""
    from flare.contract import SAMPLING_LOGPROBS
    from flare.model.kernels.sampling import write_logprobs

    k, slots = 5, 6
    gen = torch.Generator().manual_seed(3)
    sampling = torch.zeros(slots, SAMPLING_COLUMNS)
    sampling[[2, 4, 5], SAMPLING_LOGPROBS] = 1.0
    rows = torch.tensor([4, 0, 2, 5])
    logits = torch.randn(4, VOCAB, generator=gen) * 3
    logits[3, :4000] = float("-inf")  # slot 5: a grammar-masked row with 1,000 tokens left
    logits[3, 4999] = 20.0  # its best token in the last, partial block
    token = torch.tensor([17, 5, 4321, 4500])
    out_lp, out_ids, frame = _logprob_frames(slots, k)
    write_logprobs(logits, token, rows, sampling=sampling, frame=frame, out_logprobs=out_lp, out_top_ids=out_ids)
    values, ids = reference.token_logprobs(logits, token, k)
    for row, slot in enumerate(rows.tolist()):
        if slot == 0:
            assert torch.all(out_lp[2, slot] == 7.0) and torch.all(out_ids[2, slot] == -1), "slot 0 did not ask"
            continue
        assert torch.equal(out_ids[2, slot], ids[row]), f"row {row}: ids {out_ids[2, slot]} != {ids[row]}"
        torch.testing.assert_close(out_lp[2, slot], values[row], rtol=0, atol=2e-6)
    assert int(out_ids[2, 5, 0]) == 4999
    untouched = torch.ones(out_lp.shape[0], dtype=torch.bool)
    untouched[2] = False
    assert torch.all(out_lp[untouched] == 7.0) and torch.all(out_ids[untouched] == -1)


def test_logprobs_break_ties_to_the_lowest_id_and_list_each_token_once():
    """Equal logits across and within blocks come lowest id first; with fewer finite logits
    than k, the rest are distinct masked tokens at -inf (the host leaves those out)."""
    from flare.contract import SAMPLING_LOGPROBS
    from flare.model.kernels.sampling import write_logprobs

    k = 6
    sampling = torch.zeros(2, SAMPLING_COLUMNS)
    sampling[:, SAMPLING_LOGPROBS] = 1.0
    logits = torch.zeros(2, VOCAB)
    logits[0, [4500, 2100, 3000, 9]] = 5.0
    logits[1] = float("-inf")
    logits[1, [3, 2049]] = torch.tensor([1.0, 2.0])
    out_lp, out_ids, frame = _logprob_frames(2, k)
    write_logprobs(logits, torch.tensor([0, 3]), torch.tensor([0, 1]), sampling=sampling, frame=frame,
                   out_logprobs=out_lp, out_top_ids=out_ids)
    assert out_ids[2, 0].tolist() == [9, 2100, 3000, 4500, 0, 1]
    lse = torch.logsumexp(logits[0], 0)
    torch.testing.assert_close(out_lp[2, 0, 1:5], (5.0 - lse).repeat(4), rtol=0, atol=2e-6)
    assert out_ids[2, 1, :2].tolist() == [2049, 3]
    assert len(set(out_ids[2, 1].tolist())) == k
    assert torch.all(torch.isinf(out_lp[2, 1, 3:])) and torch.all(torch.isfinite(out_lp[2, 1, :3]))


def test_logprobs_refuse_bad_frames():
    from flare.model.kernels.sampling import write_logprobs

    sampling = torch.zeros(2, SAMPLING_COLUMNS)
    out_lp, out_ids, frame = _logprob_frames(2, 4)
    with pytest.raises(KernelInputError, match="write_logprobs: out_logprobs must be float32"):
        write_logprobs(torch.zeros(2, VOCAB), torch.zeros(2, dtype=torch.int64), torch.arange(2), sampling=sampling,
                       frame=frame, out_logprobs=out_lp[:, :, :4], out_top_ids=out_ids)
    with pytest.raises(KernelInputError, match="write_logprobs: frame must be int64"):
        write_logprobs(torch.zeros(2, VOCAB), torch.zeros(2, dtype=torch.int64), torch.arange(2), sampling=sampling,
                       frame=frame.to(torch.int32), out_logprobs=out_lp, out_top_ids=out_ids)

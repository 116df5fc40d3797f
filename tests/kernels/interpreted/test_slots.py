"""The slot bookkeeping kernels against StepPrograms' own torch methods, under the interpreter."""

from __future__ import annotations

import pytest
import torch

from flare.contract import GraphKind, PreparedContract
from flare.model.decoder import Decoder
from flare.model.kernels import slots as slot_kernels
from flare.model.programs import StepPrograms

from .test_decoder_ops import _spec, _weights


def _programs(seed: int) -> StepPrograms:
    spec = _spec("llama")
    contract = PreparedContract.build(max_active=6, context=256, prefill_chunk_size=64, num_pages=24,
                                      num_snapshot_rows=2, vocab_size=spec.vocab_size, hidden_size=spec.hidden_size)
    programs = StepPrograms(Decoder(spec, _weights(spec, seed=1), max_positions=256), contract)
    gen = torch.Generator().manual_seed(seed)
    buf = programs.buffers
    for name in ("slot.generation", "slot.token", "slot.generated"):
        buf[name].copy_(torch.randint(0, spec.vocab_size, buf[name].shape, generator=gen))
    # Positions anywhere in the context, one at its very end (the clamp), page tables full.
    buf["slot.position"].copy_(torch.randint(0, 256, buf["slot.position"].shape, generator=gen))
    buf["slot.position"][3] = 255
    buf["slot.page_table"].copy_(torch.randint(1, 25, buf["slot.page_table"].shape, generator=gen))
    buf["step.frame"].fill_(1)
    programs.output_counts.copy_(torch.randint(0, 3, programs.output_counts.shape, generator=gen, dtype=torch.int32))
    return programs


def _state(programs: StepPrograms) -> dict[str, torch.Tensor]:
    return {name: t.clone() for name, t in programs.buffers.items()} | {"counts": programs.output_counts.clone(),
                                                                        "hidden": programs.hidden.clone()}


def test_decode_inputs_match_the_torch_reads():
    programs = _programs(seed=3)
    slots = torch.tensor([3, 1, 6, 0])  # padding row last
    want_tokens, want = programs._decode_inputs(slots)
    tokens, got = slot_kernels.decode_inputs(programs.buffers, slots, programs.contract.context,
                                             programs.contract.page_tokens)
    assert torch.equal(tokens, want_tokens)
    for field in ("positions", "write_index", "page_table", "kv_lens"):
        assert torch.equal(getattr(got, field), getattr(want, field)), field
    assert int(got.positions[0, 0]) == 255 and int(got.kv_lens[0]) == 256


def test_commit_matches_the_torch_writes():
    # A decode step also stores the rows' new positions (its kv_lens), which the records read;
    # decode and prefill steps store their final hidden rows into the slots' rows.
    width = _programs(seed=4).hidden.shape[1]
    rows = torch.randn(3, width, generator=torch.Generator().manual_seed(5))
    for kind, do_sample, positions, hidden in (
            (GraphKind.DECODE, [True, True, True], torch.tensor([40, 7, 256]), rows),
            (GraphKind.DECODE, [True, True, True], None, None),
            (GraphKind.PREFILL, [True, False, True], None, rows),
            (GraphKind.RESUME, [True, False, True], None, None)):
        want_programs, got_programs = _programs(seed=4), _programs(seed=4)
        slots = torch.tensor([2, 5, 4])
        token = torch.tensor([7, 96, 0])
        sample = torch.tensor(do_sample)
        before = got_programs.hidden.clone()
        want_programs._commit(slots, token, sample, kind, positions, hidden)
        slot_kernels.commit_samples(got_programs.buffers, got_programs.output_counts, slots, token, sample, kind,
                                    positions, hidden, hidden=got_programs.hidden)
        want, got = _state(want_programs), _state(got_programs)
        for name in want:
            assert torch.equal(got[name], want[name]), f"{kind.name}: {name}"
        assert int(got["out.records"][1, 5, 0]) == 5, "the record goes to frame step.frame, row slot"
        if positions is not None:
            assert torch.equal(got["slot.position"][slots], positions)
        if hidden is not None:
            assert torch.equal(got["hidden"][slots], hidden) and not torch.equal(got["hidden"], before)
            untouched = torch.ones(before.shape[0], dtype=torch.bool)
            untouched[slots] = False
            assert torch.equal(got["hidden"][untouched], before[untouched]), "other slots' rows stay"
        else:
            assert torch.equal(got["hidden"], before)


def test_commit_rejects_rows_without_a_matching_store():
    from flare.model.kernels import KernelInputError

    programs = _programs(seed=4)
    slots, token, sample = torch.tensor([2, 5]), torch.tensor([7, 96]), torch.tensor([True, True])
    width = programs.hidden.shape[1]
    with pytest.raises(KernelInputError, match="hidden store"):
        slot_kernels.commit_samples(programs.buffers, programs.output_counts, slots, token, sample, GraphKind.DECODE,
                                    None, torch.zeros(2, width))
    with pytest.raises(KernelInputError, match="rows must be"):
        slot_kernels.commit_samples(programs.buffers, programs.output_counts, slots, token, sample, GraphKind.DECODE,
                                    None, torch.zeros(2, width + 1), hidden=programs.hidden)


def _verification_programs(seed: int, width: int, drafts: list[int]) -> tuple[StepPrograms, torch.Tensor]:
    """Programs whose step rows hold ``drafts[r]`` random drafts each, on slots [2, 5, 4, 0]."""
    programs = _programs(seed)
    gen = torch.Generator().manual_seed(seed + 1)
    buf = programs.buffers
    slots = torch.tensor([2, 5, 4, 0])[:len(drafts)]
    buf["step.slots"][:len(drafts)] = slots
    buf["step.num_tokens"][:len(drafts)] = torch.tensor(drafts)
    buf["step.tokens"].copy_(torch.randint(0, programs.decoder.spec.vocab_size, buf["step.tokens"].shape,
                                           generator=gen))
    buf["slot.position"][slots] = torch.tensor([17, 63, 253, 9])[:len(drafts)]  # 63: the drafts cross a page
    return programs, slots


def test_verification_inputs_match_the_torch_reads():
    width = 5
    programs, slots = _verification_programs(seed=6, width=width, drafts=[4, 2, 0, 1])
    want_tokens, want = programs._verification_inputs(slots, width)
    tokens, got = slot_kernels.verification_inputs(programs.buffers, slots, width, programs.contract.context,
                                                   programs.contract.page_tokens)
    assert torch.equal(tokens, want_tokens)
    for field in ("positions", "write_index", "page_table", "kv_lens"):
        assert torch.equal(getattr(got, field), getattr(want, field)), field
    assert got.keys_this_step == want.keys_this_step == width, "no attention preload over the round's own keys"
    assert int(got.positions[2 * width + 4, 0]) == 255, "positions past the context are clamped"
    assert int(got.write_index[width + 3, 0]) == 0, "a position past the row's drafts writes the scratch page"


def _logits_accepting(programs: StepPrograms, slots: torch.Tensor, width: int, accept: list[int]) -> torch.Tensor:
    """Logits whose argmax at each row's first ``accept[r]`` positions is the draft fed after
    them (so those drafts are accepted) and a random token elsewhere, with ties at position 0."""
    vocab = programs.decoder.spec.vocab_size
    gen = torch.Generator().manual_seed(9)
    logits = torch.randn(len(slots) * width, vocab, generator=gen)
    drafts = programs.buffers["step.tokens"]
    for r, n in enumerate(accept):
        for q in range(width - 1):
            logits[r * width + q, int(drafts[r, q])] = 10.0 if q < n else -10.0
    logits[0, :] = 1.0  # all tied: the argmax is token 0
    return logits


def test_greedy_verification_commit_matches_the_torch_writes():
    width = 5
    drafts, accept = [4, 2, 3, 1], [4, 1, 0, 1]  # row 1 accepts 1 of 2; row 2 none; row 3 its only draft
    hidden_width = _programs(seed=4).hidden.shape[1]
    rows = torch.randn(4 * width, hidden_width, generator=torch.Generator().manual_seed(8))
    want_programs, slots = _verification_programs(seed=7, width=width, drafts=drafts)
    got_programs, _ = _verification_programs(seed=7, width=width, drafts=drafts)
    want_programs.buffers["step.tokens"][0, 0] = 0  # row 0's all-tied position picks token 0: accepted
    got_programs.buffers["step.tokens"][0, 0] = 0
    logits = _logits_accepting(want_programs, slots, width, accept)
    want_programs._commit_verification(slots, rows, width, logits=logits)
    slot_kernels.commit_verification(got_programs.buffers, got_programs.output_counts, slots, rows, width,
                                     logits=logits, hidden=got_programs.hidden)
    want, got = _state(want_programs), _state(got_programs)
    for name in want:
        assert torch.equal(got[name], want[name]), name
    from flare.contract import REC_NEW_TOKENS
    assert got["out.records"][1, slots[:3], REC_NEW_TOKENS].tolist() == [5, 2, 1]


def test_sampled_verification_commit_matches_the_torch_writes():
    width = 4
    gen = torch.Generator().manual_seed(11)
    hidden_width = _programs(seed=4).hidden.shape[1]
    rows = torch.randn(3 * width, hidden_width, generator=gen)
    token = torch.randint(0, 96, (3, width), generator=gen)
    token[1, 0] = token[1, 2]  # a token emitted twice counts twice
    accepted = torch.tensor([[True, True, False, False], [True, True, True, False], [False, True, True, False]])
    want_programs, slots = _verification_programs(seed=12, width=width, drafts=[3, 3, 2])
    got_programs, _ = _verification_programs(seed=12, width=width, drafts=[3, 3, 2])
    want_programs._commit_verification(slots, rows, width, token=token, accepted=accepted)
    slot_kernels.commit_verification(got_programs.buffers, got_programs.output_counts, slots, rows, width,
                                     token=token, accepted=accepted, hidden=got_programs.hidden)
    want, got = _state(want_programs), _state(got_programs)
    for name in want:
        assert torch.equal(got[name], want[name]), name

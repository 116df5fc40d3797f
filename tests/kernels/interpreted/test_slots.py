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

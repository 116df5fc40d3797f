"""Paged attention kernels against paged_attention_reference, under the interpreter.

Tiny shapes: the interpreter runs every program in Python. Each case still spans
several pages, ragged lengths, shared and scratch pages, GQA groups and splits.
"""

from __future__ import annotations

import pytest
import torch

from flare.model.attention import AttentionBatch
from flare.model.kernels import (
    MAX_SPLITS,
    AttentionLaunch,
    KernelInputError,
    choose_num_splits,
    paged_attention,
    paged_decode_attention,
    paged_prefill_attention,
)

from ..paged_cases import build_case, check_attention, tolerance

DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("num_splits", [1, 3, None], ids=["splits1", "splits3", "auto"])
def test_decode_gqa_ragged_shared_pages(dtype, num_splits):
    # Lengths: a single key, exactly one page, a page plus one, a long row; rows 1-3
    # share row 0's first page (a reused prefix).
    case = build_case(kv_lens=[1, 64, 65, 250], q_len=1, num_heads=8, num_kv_heads=2, head_dim=64,
                      max_pages=5, dtype=dtype, seed=1, shared_pages=1)
    out = paged_decode_attention(case.q, case.k_pool, case.v_pool, case.batch, case.scale, num_splits=num_splits)
    check_attention("paged_decode_attention", out, case)


@pytest.mark.parametrize("heads, kv_heads, head_dim", [(2, 2, 32), (16, 2, 128), (4, 1, 96)],
                         ids=["mha-d32", "group8-d128", "mqa-d96"])
def test_decode_head_layouts(heads, kv_heads, head_dim):
    case = build_case(kv_lens=[130, 7], q_len=1, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                      max_pages=3, dtype=torch.float32, seed=2)
    out = paged_decode_attention(case.q, case.k_pool, case.v_pool, case.batch, case.scale, num_splits=2)
    check_attention("paged_decode_attention", out, case)


@pytest.mark.parametrize("num_splits", [3, MAX_SPLITS], ids=["splits3", "splits16"])
def test_decode_merge_in_kernel_matches_the_merge_kernel(num_splits):
    """The last split merging the partials itself gives the merge kernel's output bit for
    bit (same helper, same split order), with empty splits and padding rows, and leaves
    its counters at zero for the next launch."""
    from dataclasses import replace

    from flare.model.kernels import DECODE_LAUNCH
    from flare.model.kernels.attention import _COUNTERS

    case = build_case(kv_lens=[3, 0, 190, 250], q_len=1, num_heads=8, num_kv_heads=2, head_dim=64,
                      max_pages=4, dtype=torch.bfloat16, seed=4, padding_rows=(1,))
    args = (case.q, case.k_pool, case.v_pool, case.batch, case.scale)
    want = paged_decode_attention(*args, num_splits=num_splits)
    for _ in range(2):  # a second launch finds the counters reset
        got = paged_decode_attention(*args, num_splits=num_splits, launch=replace(DECODE_LAUNCH, merge_in_kernel=True))
        assert torch.equal(got, want)
    check_attention("paged_decode_attention (merge in kernel)", got, case)
    assert all(int(t.abs().sum()) == 0 for held in _COUNTERS.values() for t in held), "counters must return to zero"


@pytest.mark.parametrize("merge_in_kernel", [False, True], ids=["merge_kernel", "merge_in_kernel"])
@pytest.mark.parametrize("min_steps", [2, 4])
def test_decode_min_split_steps(monkeypatch, min_steps, merge_in_kernel):
    """With a minimum of steps a split, short rows run in fewer splits than the launch has
    (the rest find no keys) and long rows in all of them; either merge gives the reference.
    Applied only to grids covering half the SMs: here 2 of them."""
    from dataclasses import replace

    from flare.model.kernels import DECODE_LAUNCH, attention

    monkeypatch.setattr(attention, "sm_count", lambda device: 2)
    case = build_case(kv_lens=[1, 0, 64, 65, 190, 600], q_len=1, num_heads=8, num_kv_heads=2, head_dim=64,
                      max_pages=10, dtype=torch.bfloat16, seed=6, padding_rows=(1,))
    args = (case.q, case.k_pool, case.v_pool, case.batch, case.scale)
    launch = replace(DECODE_LAUNCH, min_split_steps=min_steps, merge_in_kernel=merge_in_kernel,
                     balanced_programs_per_sm=0)
    got = paged_decode_attention(*args, num_splits=4, launch=launch)
    check_attention(f"paged_decode_attention (min {min_steps} steps a split)", got, case)
    # A row no longer than one split's minimum runs in one split: what the unsplit kernel gives.
    unsplit = paged_decode_attention(*args, num_splits=1)
    short = [0, 2] if min_steps == 2 else [0, 2, 3, 4]
    assert torch.equal(got[short], unsplit[short])
    with pytest.raises(KernelInputError, match="min_split_steps"):
        paged_decode_attention(*args, num_splits=4, launch=replace(launch, min_split_steps=0))


@pytest.mark.parametrize("pages_per_step", [1, 2])
def test_decode_preload_matches_the_plain_kernel(pages_per_step):
    """The decode kernel with each split's first step loaded before its wait (and the new
    key's row read again after it) computes what the plain kernel does, bit for bit: new
    keys in a split's first step and in a later one, empty splits, a padding row, and a
    grid too large for the preload (which then runs the plain kernel)."""
    from dataclasses import replace

    from flare.model.kernels import DECODE_LAUNCH, attention

    case = build_case(kv_lens=[3, 0, 130, 380], q_len=1, num_heads=8, num_kv_heads=2, head_dim=64,
                      max_pages=6, dtype=torch.bfloat16, seed=5, padding_rows=(1,))
    args = (case.q, case.k_pool, case.v_pool, case.batch, case.scale)
    plain = replace(DECODE_LAUNCH, preload=False, pages_per_step=pages_per_step, balanced_programs_per_sm=0)
    for splits in (1, 2, MAX_SPLITS):
        want = paged_decode_attention(*args, num_splits=splits, launch=plain)
        got = paged_decode_attention(*args, num_splits=splits, launch=replace(plain, preload=True))
        assert torch.equal(got, want), f"splits={splits}: the preloading kernel differs from the plain one"
        check_attention(f"paged_decode_attention (preload, splits={splits})", got, case)
    launched = []
    kernel = attention._paged_attention_kernel
    original = kernel.run
    try:
        kernel.run = lambda *a, **kw: launched.append(kw["PRELOAD"]) or original(*a, **kw)
        paged_decode_attention(*args, num_splits=2, launch=replace(plain, preload=True))
        big = build_case(kv_lens=[70] * 40, q_len=1, num_heads=8, num_kv_heads=2, head_dim=64, max_pages=2,
                         dtype=torch.bfloat16, seed=6)
        paged_decode_attention(big.q, big.k_pool, big.v_pool, big.batch, big.scale, num_splits=4,
                               launch=replace(plain, preload=True))
    finally:
        kernel.run = original
    assert launched == [True, False], f"preload chosen as {launched} for 16 and 320 programs (132 SMs)"


def test_decode_more_splits_than_pages_and_padding_rows():
    # 16 splits over rows of 1-3 pages: most splits are empty and must weigh nothing.
    case = build_case(kv_lens=[3, 0, 190, 0], q_len=1, num_heads=4, num_kv_heads=2, head_dim=32,
                      max_pages=4, dtype=torch.bfloat16, seed=3, padding_rows=(1, 3))
    out = paged_decode_attention(case.q, case.k_pool, case.v_pool, case.batch, case.scale, num_splits=MAX_SPLITS)
    check_attention("paged_decode_attention", out, case)
    assert torch.equal(out[1].float(), torch.zeros_like(out[1].float())), "a row with no keys must output zeros"


@pytest.mark.parametrize("min_steps", [1, 4])
def test_decode_reads_only_the_splits_holding_keys(monkeypatch, min_steps):
    """A split decode row is built from the splits that hold its keys alone: a row that one
    split holds is written by it directly, and the merge reads no other split's partial.
    The partial buffers start as NaN, so any read of a split that stored nothing would show;
    every row matches the unsplit kernel where one split holds it and the reference always."""
    from dataclasses import replace

    from flare.model.kernels import DECODE_LAUNCH, attention

    monkeypatch.setattr(attention, "sm_count", lambda device: 2)  # min_steps applies from 1 pair an SM
    case = build_case(kv_lens=[1, 0, 64, 65, 190, 600], q_len=1, num_heads=8, num_kv_heads=2, head_dim=64,
                      max_pages=10, dtype=torch.bfloat16, seed=8, padding_rows=(1,))
    args = (case.q, case.k_pool, case.v_pool, case.batch, case.scale)
    kernel = attention._paged_attention_kernel
    original = kernel.run

    def poisoned(*a, **kw):
        a[4].fill_(float("nan"))  # part_o
        a[5].fill_(float("nan"))  # part_lse
        return original(*a, **kw)

    launch = replace(DECODE_LAUNCH, min_split_steps=min_steps, direct_single_split=True, balanced_programs_per_sm=0)
    monkeypatch.setattr(kernel, "run", poisoned)
    got = paged_decode_attention(*args, num_splits=4, launch=launch)
    monkeypatch.setattr(kernel, "run", original)
    assert not torch.isnan(got).any(), "a split that stored no partial was merged"
    check_attention(f"paged_decode_attention (min {min_steps} steps a split, NaN partials)", got, case)
    unsplit = paged_decode_attention(*args, num_splits=1)
    one_split = [0, 1, 2] if min_steps == 1 else [0, 1, 2, 3, 4]
    assert torch.equal(got[one_split], unsplit[one_split])
    assert torch.equal(got, paged_decode_attention(*args, num_splits=4, launch=launch)), "same bits unpoisoned"


@pytest.mark.parametrize("min_steps", [1, 4])
def test_decode_balanced_grid(monkeypatch, min_steps):
    """The balanced decode grid (AttentionLaunch.balanced_programs_per_sm): two SMs, eight programs
    each, take the (row, kv head, split) items of the batch in turn. The rows' 1 + 0 + 1 + 2 +
    3 + 10 steps over two kv heads ask for 34 items of 16 programs: at most 3 steps an item
    (min_steps 1: the long row in four splits, as the static launch of four splits cuts it) or
    4 (three splits); the short rows stay whole, written directly, and are what the unsplit
    kernel gives. The partials start as NaN: a merge reading a split that stored nothing shows."""
    from dataclasses import replace

    from flare.model.kernels import DECODE_LAUNCH, attention

    monkeypatch.setattr(attention, "sm_count", lambda device: 2)
    case = build_case(kv_lens=[1, 0, 64, 65, 190, 600], q_len=1, num_heads=8, num_kv_heads=2, head_dim=64,
                      max_pages=10, dtype=torch.bfloat16, seed=6, padding_rows=(1,))
    args = (case.q, case.k_pool, case.v_pool, case.batch, case.scale)
    kernel = attention._balanced_decode_kernel
    original = kernel.run
    grids = []

    def poisoned(*a, **kw):
        a[4].fill_(float("nan"))  # part_o
        a[5].fill_(float("nan"))  # part_lse
        grids.append(kw["grid"])
        return original(*a, **kw)

    launch = replace(DECODE_LAUNCH, balanced_programs_per_sm=8, balanced_min_steps=min_steps, preload=False)
    monkeypatch.setattr(kernel, "run", poisoned)
    got = paged_decode_attention(*args, num_splits=4, launch=launch)
    monkeypatch.setattr(kernel, "run", original)
    assert grids == [(16,)], grids
    assert not torch.isnan(got).any(), "a split that stored no partial was merged"
    check_attention(f"paged_decode_attention (balanced, min {min_steps} steps)", got, case)
    unsplit = paged_decode_attention(*args, num_splits=1)
    assert torch.equal(got[:5], unsplit[:5]), "a row of one split must be what the unsplit kernel gives"
    if min_steps == 1:  # 10 steps as 3 + 3 + 3 + 1: the static launch's four splits, merged alike
        static = paged_decode_attention(*args, num_splits=4, launch=replace(launch, balanced_programs_per_sm=0))
        assert torch.equal(got[5], static[5])
    # Fewer programs than items: each takes several in turn; every row fits one program's share.
    few = paged_decode_attention(*args, num_splits=4, launch=replace(launch, balanced_programs_per_sm=1))
    assert torch.equal(few, unsplit)
    # The last split of a row to finish merging it: the merge kernel's bits, the counters back at zero.
    for _ in range(2):
        merged = paged_decode_attention(*args, num_splits=4, launch=replace(launch, merge_in_kernel=True))
        assert torch.equal(merged, got)
    assert all(int(t.abs().sum()) == 0 for held in attention._COUNTERS.values() for t in held)
    with pytest.raises(KernelInputError, match="balanced_min_steps"):
        paged_decode_attention(*args, num_splits=4, launch=replace(launch, balanced_min_steps=0))


def test_decode_balanced_grid_only_where_the_preload_is_not():
    """Decode grids that fit the GPU at once keep the preloading kernel; larger ones, a MIXED
    step's decode cohort and verification rows take the balanced grid when it is on."""
    from dataclasses import replace

    from flare.model.kernels import DECODE_LAUNCH, attention

    launch = replace(DECODE_LAUNCH, balanced_programs_per_sm=2)
    small = build_case(kv_lens=[3, 130], q_len=1, num_heads=8, num_kv_heads=2, head_dim=32, max_pages=3,
                       dtype=torch.bfloat16, seed=14)
    big = build_case(kv_lens=[70] * 40, q_len=1, num_heads=8, num_kv_heads=2, head_dim=32, max_pages=2,
                     dtype=torch.bfloat16, seed=15)
    ran = []
    kernels = (attention._paged_attention_kernel, attention._balanced_decode_kernel)
    originals = [k.run for k in kernels]
    try:
        for k, original in zip(kernels, originals):
            k.run = (lambda name, run: lambda *a, **kw: ran.append(name) or run(*a, **kw))(k.fn.__name__, original)
        for case in (small, big):
            out = paged_decode_attention(case.q, case.k_pool, case.v_pool, case.batch, case.scale, num_splits=4,
                                         launch=launch)
            check_attention("paged_decode_attention (balanced where the preload is not)", out, case)
    finally:
        for k, original in zip(kernels, originals):
            k.run = original
    assert ran == ["_paged_attention_kernel", "_balanced_decode_kernel"], ran

@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("num_splits", [1, 4], ids=["splits1", "splits4"])
def test_prefill_chunk_over_cached_prefix(dtype, num_splits):
    # Q=64 chunk after a 100-token prefix (keys 0..163), G=2.
    case = build_case(kv_lens=[164], q_len=64, num_heads=4, num_kv_heads=2, head_dim=64, max_pages=4,
                      dtype=dtype, seed=4)
    out = paged_prefill_attention(case.q, case.k_pool, case.v_pool, case.batch, case.scale, num_splits=num_splits)
    check_attention("paged_prefill_attention", out, case)


def test_prefill_q128_ragged_rows_with_padding_tokens_and_rows():
    # Row 0: whole chunk of 128 from position 0. Row 1: 37 new tokens after a shared
    # 64-token prefix, the other 91 queries are padding tokens. Row 2: a padding row.
    case = build_case(kv_lens=[128, 101, 0], num_new=[128, 37, 0], q_len=128, num_heads=4, num_kv_heads=1,
                      head_dim=32, max_pages=3, dtype=torch.bfloat16, seed=5, shared_pages=1, padding_rows=(2,))
    out = paged_prefill_attention(case.q, case.k_pool, case.v_pool, case.batch, case.scale, num_splits=2)
    check_attention("paged_prefill_attention", out, case)


@pytest.mark.parametrize("q_len, num_splits", [(1, 3), (64, 2)], ids=["decode", "prefill"])
def test_two_pages_per_step(q_len, num_splits):
    # 5 pages per row: an odd count, so the last two-page step runs past the row's pages
    # (and, for the full row, past Pmax).
    case = build_case(kv_lens=[320, 250, 0], q_len=q_len, num_heads=4, num_kv_heads=2, head_dim=32, max_pages=5,
                      dtype=torch.bfloat16, seed=9, shared_pages=2, padding_rows=(2,))
    launch = AttentionLaunch(pages_per_step=2, num_stages=2)
    fn = paged_decode_attention if q_len == 1 else paged_prefill_attention
    out = fn(case.q, case.k_pool, case.v_pool, case.batch, case.scale, num_splits=num_splits, launch=launch)
    check_attention(f"{fn.__name__} (pages_per_step=2)", out, case)


def test_dispatch_by_query_length():
    decode = build_case(kv_lens=[70, 9], q_len=1, num_heads=4, num_kv_heads=2, head_dim=32, max_pages=2,
                        dtype=torch.float32, seed=6)
    check_attention("paged_attention (Q=1)", paged_attention(decode.q, decode.k_pool, decode.v_pool,
                                                             decode.batch, decode.scale), decode)
    prefill = build_case(kv_lens=[80], q_len=16, num_heads=4, num_kv_heads=2, head_dim=32, max_pages=2,
                         dtype=torch.float32, seed=7)
    check_attention("paged_attention (Q=16)", paged_attention(prefill.q, prefill.k_pool, prefill.v_pool,
                                                              prefill.batch, prefill.scale), prefill)


def test_split_count_depends_only_on_static_shapes():
    cpu = torch.device("cpu")  # the heuristic assumes the H200's 132 SMs off CUDA
    assert choose_num_splits(1, 8, 1, 128, cpu) == MAX_SPLITS  # batch-1 decode, 8k context
    assert choose_num_splits(64, 8, 1, 128, cpu) == 3  # 512 programs: 3 splits reach 8 x 132
    assert choose_num_splits(128, 8, 1, 128, cpu) == 1  # 1024 programs fill the GPU
    assert choose_num_splits(1, 8, 1, 3, cpu) == 3  # never more splits than pages
    # Prefill (2 waves): a Q=512 chunk (32 blocks of 64 rows x 8 kv heads) is left whole,
    # a Q=64 chunk over a long prefix (4 blocks) is split.
    assert choose_num_splits(1, 8, 32, 128, cpu, waves=2) == 1
    assert choose_num_splits(1, 8, 4, 128, cpu, waves=2) == 9


def test_bad_inputs_raise_typed_errors():
    case = build_case(kv_lens=[10], q_len=1, num_heads=4, num_kv_heads=2, head_dim=32, max_pages=1,
                      dtype=torch.float32, seed=8)
    with pytest.raises(KernelInputError, match="paged_decode_attention: q must be"):
        paged_decode_attention(case.q.expand(1, 2, 4, 32), case.k_pool, case.v_pool, case.batch, case.scale)
    with pytest.raises(KernelInputError, match="multiple of kv heads"):
        paged_attention(case.q[:, :, :3], case.k_pool, case.v_pool, case.batch, case.scale)
    with pytest.raises(KernelInputError, match="dtypes differ"):
        paged_attention(case.q.bfloat16(), case.k_pool, case.v_pool, case.batch, case.scale)
    with pytest.raises(KernelInputError, match="kv_lens must be"):
        bad = AttentionBatch(case.batch.positions, case.batch.write_index, case.batch.page_table,
                             case.batch.kv_lens.repeat(2))
        paged_attention(case.q, case.k_pool, case.v_pool, bad, case.scale)
    with pytest.raises(KernelInputError, match="num_splits"):
        paged_decode_attention(case.q, case.k_pool, case.v_pool, case.batch, case.scale, num_splits=MAX_SPLITS + 1)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
def test_prefill_dispatch_mixes_fresh_and_cached_rows(dtype):
    """paged_attention serves a row without a cached prefix from torch's SDPA over its own
    chunk and the other rows from the paged kernel, in one static-shape call."""
    from flare.model.attention import fresh_sdpa_attention

    # Row 0: a fresh 70-token prompt; row 1: 70 new tokens after 130 cached; row 2: a fresh
    # 40-token prompt (30 padding tokens); row 3: a padding row.
    case = build_case(kv_lens=[70, 200, 40, 1], q_len=70, num_new=[70, 70, 40, 1], num_heads=8, num_kv_heads=2,
                      head_dim=64, max_pages=4, dtype=dtype, seed=7, padding_rows=(3,))
    out = paged_attention(case.q, case.k_pool, case.v_pool, case.batch, case.scale)
    check_attention("paged_attention (prefill dispatch)", out, case)
    own = fresh_sdpa_attention(case.q, case.k_pool, case.v_pool, case.batch, case.scale)
    assert torch.equal(out[0], own[0]), "the fresh row must come from SDPA"
    assert not torch.equal(out[1], own[1]), "the cached row must come from the paged kernel"


def _packed_rows(case, num_new: list[int], pad_tokens: int):
    """The real tokens of a rectangular case's rows, packed back to back into one flat stream
    (then ``pad_tokens`` tokens no row owns): the PackedRows of a MIXED step."""
    from flare.model.attention import PackedRows

    q = torch.cat([case.q[row, :n] for row, n in enumerate(num_new)]
                  + [torch.randn(pad_tokens, *case.q.shape[2:]).to(case.q.dtype)])
    positions = torch.cat([case.batch.positions[row, :n] for row, n in enumerate(num_new)]
                          + [torch.full((pad_tokens,), 7, dtype=torch.int64)])
    lens = torch.tensor(num_new, dtype=torch.int64)
    starts = torch.cumsum(lens, 0) - lens
    return q, PackedRows(positions=positions, q_start=starts, q_len=lens, page_table=case.batch.page_table,
                         kv_lens=case.batch.kv_lens)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
def test_packed_rows_match_each_row_as_a_chunk(dtype):
    """Variable-length rows packed in one stream (a fresh prompt, a chunk over a cached
    prefix, a one-token row, an empty padding row, trailing padding tokens) get what each
    row gets as its own prefill chunk; tokens no row owns come out zero."""
    from flare.model.attention import packed_rows_reference
    from flare.model.kernels import packed_rows_attention

    num_new = [70, 30, 1, 0]
    case = build_case(kv_lens=[70, 190, 5, 0], q_len=70, num_heads=8, num_kv_heads=2, head_dim=64, max_pages=4,
                      dtype=dtype, seed=11, num_new=num_new, padding_rows=(3,))
    q, rows = _packed_rows(case, num_new, pad_tokens=9)
    got = packed_rows_attention(q, case.k_pool, case.v_pool, rows, case.scale)
    want = packed_rows_reference(q, case.k_pool, case.v_pool, rows, case.scale)
    rect = case.reference()
    total = sum(num_new)
    assert torch.equal(got[total:], torch.zeros_like(got[total:]))
    max_abs, _ = tolerance(dtype)
    at = 0
    for row, n in enumerate(num_new):
        if n:
            assert (got[at:at + n].float() - rect[row, :n].float()).abs().max() <= max_abs
        at += n
    assert (got.float() - want.float()).abs().max() <= max_abs


def test_packed_attention_runs_the_decode_cohort_beside_the_rows():
    """A packed step's attention: the prefill rows, then decode rows as a [w, 1] decode batch."""
    from flare.model.attention import PackedBatch, packed_attention_reference
    from flare.model.kernels import packed_attention

    num_new = [40, 3]
    rows_case = build_case(kv_lens=[40, 100], q_len=40, num_heads=4, num_kv_heads=2, head_dim=32, max_pages=3,
                           dtype=torch.bfloat16, seed=12, num_new=num_new)
    q_rows, rows = _packed_rows(rows_case, num_new, pad_tokens=5)
    dec = build_case(kv_lens=[1, 129, 65], q_len=1, num_heads=4, num_kv_heads=2, head_dim=32, max_pages=3,
                     dtype=torch.bfloat16, seed=13)
    # one pool for both: the decode rows' pages are appended after the rows' pages
    offset = rows_case.k_pool.shape[0]
    k_pool = torch.cat([rows_case.k_pool, dec.k_pool])
    v_pool = torch.cat([rows_case.v_pool, dec.v_pool])
    decode = AttentionBatch(dec.batch.positions, dec.batch.write_index,
                            torch.where(dec.batch.page_table > 0, dec.batch.page_table + offset, 0), dec.batch.kv_lens)
    n = q_rows.shape[0]
    flat = torch.cat([rows.positions, decode.positions.view(-1)]).view(1, -1)
    batch = PackedBatch(positions=flat, write_index=flat, prefill=rows, decode=decode)
    q = torch.cat([q_rows, dec.q[:, 0]]).unsqueeze(0)
    got = packed_attention(q, k_pool, v_pool, batch, rows_case.scale)
    want = packed_attention_reference(q, k_pool, v_pool, batch, rows_case.scale)
    assert got.shape == want.shape == (1, n + 3, 4, 32)
    assert (got.float() - want.float()).abs().max() <= tolerance(torch.bfloat16)[0]
    # one output for both parts: tokens no row owns (between the rows and the cohort) stay 0
    assert torch.equal(got[0, sum(num_new):n], torch.zeros_like(got[0, sum(num_new):n]))


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
def test_unmasked_steps_change_no_bit(dtype):
    """Steps every row of a block sees whole skip the visibility mask: the same sums, so under
    the interpreter the outputs are the masked kernel's bit for bit, for chunks (with splits)
    and for packed rows (compiled, the two may round apart: tests/gpu checks them close)."""
    from dataclasses import replace

    from flare.model.kernels import PREFILL_LAUNCH, packed_rows_attention

    num_new = [128, 30, 0]
    case = build_case(kv_lens=[300, 190, 0], q_len=128, num_heads=4, num_kv_heads=2, head_dim=32, max_pages=5,
                      dtype=dtype, seed=21, num_new=num_new, padding_rows=(2,))
    masked, unmasked = (replace(PREFILL_LAUNCH, unmasked_steps=flag) for flag in (False, True))
    for splits in (1, 2):
        want = paged_prefill_attention(case.q, case.k_pool, case.v_pool, case.batch, case.scale, num_splits=splits,
                                       launch=masked)
        got = paged_prefill_attention(case.q, case.k_pool, case.v_pool, case.batch, case.scale, num_splits=splits,
                                      launch=unmasked)
        assert torch.equal(got, want), f"splits={splits}"
        check_attention("paged_prefill_attention (unmasked steps)", got, case)
    q, rows = _packed_rows(case, num_new, pad_tokens=3)
    want = packed_rows_attention(q, case.k_pool, case.v_pool, rows, case.scale, launch=masked)
    got = packed_rows_attention(q, case.k_pool, case.v_pool, rows, case.scale, launch=unmasked)
    assert torch.equal(got, want)

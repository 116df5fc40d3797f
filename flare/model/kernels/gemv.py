"""Small-batch linear layers that stream the weight matrix once (decode batches up to 64 rows).

At decode batch sizes a linear layer is a pass over its weight: ``out = x @ w.T``
with x ``[M, K]`` and w ``[N, K]`` reads ``2*N*K`` bytes and does ``2*M*N*K``
FLOPs, far under the H200's ~206 FLOP/byte balance point, so time is bytes over
bandwidth. cuBLAS reaches about 82-89% of the floor there (DEVICE.md; 3.93-4.07 ms
for the 15.0 GB of a Llama-3-8B step in tools/bench_kernels.py); this kernel keeps
every multiprocessor streaming contiguous weight rows with several tiles in flight
and did the same step in 3.69 ms at M=1 (95% of the floor) and 3.82 ms at M=8 (92%).

A program owns ``BLOCK_N`` output columns (weight rows) and one of ``split_k``
slices of K. Three inner products are available (:class:`GemvConfig`.mode):

- ``"fma"`` (up to FMA_MAX_ROWS rows; the default at one and two): multiply-accumulate
  the weight tile against each x row in registers and reduce once at the end; no tensor
  cores, no shared memory.
- ``"dot"``: ``x[16, BK] @ w[BN, BK].T`` on the tensor cores, x padded to 16 rows.
- ``"swap"``: ``w[BN, BK] @ x[16, BK].T``, the weight as the wide operand.

With ``split_k > 1`` each slice writes fp32 partials; either the last program of each
output tile to finish (an atomic ticket) adds them in split order and runs the epilogue
(``GemvConfig.last_reduces``, the decode default up to 32 rows), or a second kernel sums
them (the plain product only). Both are deterministic. Under programmatic dependent launch (``_common``) a
program loads its first weight tile before waiting on the previous kernel.

Epilogues: the plain product (optionally stored as float32, for the logits), the
gate/up product's SiLU-mul (:func:`linear_silu_small_m`) and the qkv product's RoPE
and K/V scatter (:func:`linear_qkv_rope_small_m`); each permutes which weight rows
a program owns so that it holds every input of its outputs. The o and down
projections' epilogue adds the residual and prepares the next RMSNorm
(:func:`linear_add_rms_norm_small_m`), which the next GEMV applies to its input
(:class:`NormedRows`): a small-batch step runs no norm kernel between its first
and its last. :func:`linear`, :func:`linear_silu`, :func:`linear_float`,
:func:`linear_qkv_rope_write` and :func:`linear_add_rms_norm` are the selectors:
they run the kernel where it was measured to beat ``torch.nn.functional.linear``
and fall back to torch (and the elementwise kernels) everywhere else.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ._common import (
    INTERPRETED,
    PDL_LATE,
    next_power_of_2,
    pdl_level,
    pdl_options,
    require,
    require_inner_contiguous,
    require_same_device,
    sm_count,
    start_next_kernel_early,
    start_next_kernel_late,
    wait_for_inputs,
)
from .elementwise import _rotate_half, add_rms_norm, check_rope_targets, qkv_rope_write, rms_norm, silu, silu_mul

# Rows one launch takes (a tensor-core tile of up to 128 x rows), and the row counts the
# selectors (:func:`linear` and the others) send here rather than to cuBLAS, as inclusive
# ranges. tools/bench_step.py --curve, H200, 2026-12-03, ms a step against cuBLAS with the
# elementwise kernels: batch 64 5.255-5.265 against 5.518-5.522 (two calls), then 5.099
# against 5.445 with the wide launches plain; batch 32 4.821 against 5.043 and batch 16
# 4.504 against 4.836 once the narrow shapes split K with the last program reducing
# (default_config). Unsplit, 9..32 rows had lost to cuBLAS (5.43 against 5.11 at 32).
MAX_ROWS = 128
ROUTED_ROWS: tuple[tuple[int, int], ...] = ((1, 64),)


def routes_rows(m: int) -> bool:
    """Whether the selectors send a product of ``m`` rows to the GEMV kernel (ROUTED_ROWS)."""
    return any(first <= m <= last for first, last in ROUTED_ROWS)
# Epilogues of the GEMV kernel (its EPILOGUE argument), and their kernel-side constants.
EPILOGUE_PLAIN, EPILOGUE_GLU, EPILOGUE_ROPE = 0, 1, 2
_GLU, _ROPE = tl.constexpr(EPILOGUE_GLU), tl.constexpr(EPILOGUE_ROPE)
PRELOAD_TILES = 1  # GemvConfig.preload_tiles of the batch-1 default
K_FOLD = 1  # GemvConfig.k_fold of the batch-1 default (the qkv product's is 8)
ROPE_MAX_REGISTERS = 80  # GemvConfig.max_registers of the batch-1 qkv product (its RoPE epilogue)
# GemvConfig fields :func:`default_config` overrides for (N, K) weight shapes at batch 1
# (tools/bench_step.py sets them per variant).
SHAPE_OVERRIDES: dict[tuple[int, int], dict] = {}
# The same for 2..8 rows (a verification step's flat rows, small decode batches).
MULTI_ROW_OVERRIDES: dict[tuple[int, int], dict] = {}
# The same for 9..MAX_ROWS rows.
WIDE_ROW_OVERRIDES: dict[tuple[int, int], dict] = {}
_MODES = {"fma": 0, "dot": 1, "swap": 2}
# The kernel's MODE for mode "fma" over several rows (one register accumulator a row).
MODE_FMA_ROWS = 3
_FMA_ROWS = tl.constexpr(MODE_FMA_ROWS)
FMA_MAX_ROWS = 8
FMA_ROWS = 2  # rows that default_config puts on the FMA tiles


@dataclass(frozen=True)
class GemvConfig:
    """Launch shape of :func:`linear_small_m` (see the module docstring for modes).

    The field defaults are only a valid shape; :func:`default_config` picks the tuned one.
    """

    block_n: int = 32
    block_k: int = 256
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 4
    mode: str = "dot"
    # Under PDL: weight tiles (0, 1 or 2) loaded into registers before the grid-dependency wait.
    preload_tiles: int = 1
    # Under PDL: let the next kernel start only once this program's K loop is done (the
    # launch's level is _common.PDL_LATE), so its early programs overlap this kernel's
    # epilogue and tail rather than its whole weight stream.
    trigger_after_loop: bool = False
    # "fma" mode: each thread sums this many adjacent products of a tile (1, 2, 4 or 8;
    # 8 bf16 are one 16-byte load) before adding them to the accumulator, which shrinks by
    # as much. sm_90 compile of the batch-1 Llama-3-8B GEMVs with 8: qkv 153 -> 92
    # registers at two warps, gate_up 70 -> 46 and o/down 122 -> 56 at four, with no
    # shared memory or barrier added and fewer float instructions in the PTX. On the
    # H200 it pays only for qkv, with a register cap (default_config).
    k_fold: int = 1
    # A register cap per thread for the compiler (ptxas -maxnreg; 0: its own choice), so
    # more programs fit an SM: qkv with k_fold 8 at two warps compiles to 75 registers
    # under a cap of 80 without spilling, 12 programs an SM, its 1,536 in one wave.
    max_registers: int = 0
    # With split_k > 1: the last program of each output tile to finish (an atomic ticket)
    # sums the splits' partials and runs the epilogue, so the fused epilogues (norm, SiLU-mul,
    # RoPE, residual) take a split K and no second kernel runs. Otherwise a sum kernel adds
    # the partials (the plain product only).
    last_reduces: bool = False
    # Whether the launch uses programmatic dependent launch where the device has it (a
    # wide-row launch may run plain: the next kernels' early programs compete for its SMs).
    pdl: bool = True


@triton.jit
def _load_w(w_rows, ks, k_stop, n_ok, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr):
    """The weight tile [BLOCK_N, BLOCK_K] at columns ``ks``."""
    if EVEN_N and EVEN_K:
        return tl.load(w_rows + ks[None, :])
    return tl.load(w_rows + ks[None, :], mask=n_ok[:, None] & (ks < k_stop)[None, :], other=0.0)


@triton.jit
def _load_x(x_rows, ks, k_stop, m_ok, EVEN_K: tl.constexpr):
    """The x tile [BLOCK_M, BLOCK_K] at columns ``ks``."""
    if EVEN_K:
        return tl.load(x_rows + ks[None, :], mask=m_ok[:, None], other=0.0)
    return tl.load(x_rows + ks[None, :], mask=m_ok[:, None] & (ks < k_stop)[None, :], other=0.0)


@triton.jit
def _accumulate(acc, w, x, MODE: tl.constexpr, FOLD: tl.constexpr):
    if MODE == 0:
        acc = _fma(acc, w.to(tl.float32), x, FOLD)
    elif MODE == 1:
        acc = tl.dot(x, tl.trans(w), acc)
    else:
        acc = tl.dot(w, tl.trans(x), acc)
    return acc


@triton.jit
def _fma(acc, w, x, FOLD: tl.constexpr):
    """acc [N, K / FOLD] += w [N, K] (fp32) * x [1, K], each thread's FOLD adjacent columns summed
    first (K is split in 16-byte runs, so they are one thread's)."""
    product = w * x.to(tl.float32)
    if FOLD == 1:
        return acc + product
    return acc + tl.sum(tl.reshape(product, [product.shape[0], product.shape[1] // FOLD, FOLD]), axis=2)


@triton.jit
def _fma_rows(accs, w, x_ptr, s_xm, ks, k_stop, ROWS: tl.constexpr, EVEN_K: tl.constexpr, FOLD: tl.constexpr):
    """MODE_FMA_ROWS: the weight tile [N, K] against each of ROWS x rows, one [N, K / FOLD]
    accumulator a row (the tuple ``accs``). Each row is loaded as a [1, K] tile, so it takes the
    weight tile's layout: one [M, N, K] product was relaid through shared memory every step and
    took 255 registers (sm_90)."""
    wide = w.to(tl.float32)
    sums = ()
    for m in tl.static_range(ROWS):
        if EVEN_K:
            x = tl.load(x_ptr + m * s_xm + ks[None, :])
        else:
            x = tl.load(x_ptr + m * s_xm + ks[None, :], mask=(ks < k_stop)[None, :], other=0.0)
        sums = sums + (_fma(accs[m], wide, x, FOLD),)
    return sums


@triton.jit
def _accumulate_tile(acc, w, x_ptr, x_rows, s_xm, ks, k_stop, m_ok, EVEN_K: tl.constexpr, MODE: tl.constexpr,
                     ROWS: tl.constexpr, FOLD: tl.constexpr):
    """acc plus the weight tile ``w`` (columns ``ks``) against the x rows, in any MODE."""
    if MODE == _FMA_ROWS:
        acc = _fma_rows(acc, w, x_ptr, s_xm, ks, k_stop, ROWS, EVEN_K, FOLD)
    else:
        acc = _accumulate(acc, w, _load_x(x_rows, ks, k_stop, m_ok, EVEN_K), MODE, FOLD)
    return acc


@triton.jit
def _rope_inputs(pid_n, offs_m, m_ok, cos_ptr, sin_ptr, pos_ptr, widx_ptr, s_cos, s_sin,
                 BLOCK_N: tl.constexpr, HALF: tl.constexpr):
    """The program's RoPE table entries and write indices (the ROPE epilogue), loaded before the
    K loop so their latency hides under the weight stream."""
    j = (pid_n * (BLOCK_N // 2)) % HALF + tl.arange(0, BLOCK_N // 2)
    mask = m_ok[:, None] & (j < HALF)[None, :]
    pos = tl.load(pos_ptr + offs_m, mask=m_ok, other=0)
    slot = tl.load(widx_ptr + offs_m, mask=m_ok, other=0)
    c_row = cos_ptr + pos[:, None] * s_cos + j[None, :]
    s_row = sin_ptr + pos[:, None] * s_sin + j[None, :]
    c1 = tl.load(c_row, mask=mask, other=0.0)
    c2 = tl.load(c_row + HALF, mask=mask, other=0.0)
    s1 = tl.load(s_row, mask=mask, other=0.0)
    s2 = tl.load(s_row + HALF, mask=mask, other=0.0)
    return slot, c1, c2, s1, s2


@triton.jit
def _rope_epilogue(result, pid_n, offs_m, m_ok, q_ptr, k_pool_ptr, v_pool_ptr, slot, c1, c2, s1, s2,
                   num_heads, num_kv, dtype: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   HALF: tl.constexpr):
    """decoder.qkv_rope_write for one program's rotation pairs (the ROPE epilogue).

    result: [BLOCK_M, BLOCK_N] fp32, lanes alternating the first and second half of
    each pair. q rows go to q_ptr ([M, heads, 2 * HALF]), k and v rows into the pools
    at each row's write index ``slot``; q and k rotated with the table entries c1, c2,
    s1, s2 ([BLOCK_M, BLOCK_N // 2], from _rope_inputs), rounded where the reference
    rounds (elementwise._rotate_half).
    """
    rounded = result.to(dtype).to(tl.float32)
    x1, x2 = tl.split(tl.reshape(rounded, [BLOCK_M, BLOCK_N // 2, 2]))  # [BLOCK_M, BLOCK_N // 2] each
    first = pid_n * (BLOCK_N // 2)
    head = first // HALF
    j = first % HALF + tl.arange(0, BLOCK_N // 2)
    mask = m_ok[:, None] & (j < HALF)[None, :]
    d = 2 * HALF
    if head < num_heads + num_kv:
        out1, out2 = _rotate_half(x1, x2, c1, c2, s1, s2, dtype)
        if head < num_heads:
            q_dst = q_ptr + (offs_m.to(tl.int64)[:, None] * num_heads + head) * d + j[None, :]
            tl.store(q_dst, out1, mask=mask)
            tl.store(q_dst + HALF, out2, mask=mask)
        else:
            k_dst = k_pool_ptr + (slot[:, None] * num_kv + (head - num_heads)) * d + j[None, :]
            tl.store(k_dst, out1, mask=mask)
            tl.store(k_dst + HALF, out2, mask=mask)
    else:
        v_dst = v_pool_ptr + (slot[:, None] * num_kv + (head - num_heads - num_kv)) * d + j[None, :]
        tl.store(v_dst, x1.to(dtype), mask=mask)
        tl.store(v_dst + HALF, x2.to(dtype), mask=mask)


@triton.jit
def _linear_small_m_kernel(
    x_ptr, w_ptr, bias_ptr, out_ptr, part_ptr, ticket_ptr, sq_ptr, res_ptr, next_norm_ptr, scaled_ptr, sq_out_ptr,
    cos_ptr, sin_ptr, pos_ptr, widx_ptr, k_pool_ptr, v_pool_ptr,
    M, N, K, s_xm, s_wn, s_om, s_cos, s_sin, num_heads, num_kv, num_parts, eps,
    HAS_BIAS: tl.constexpr, NORM: tl.constexpr, ADD_NORM: tl.constexpr, BLOCK_P: tl.constexpr,
    SPLIT_K: tl.constexpr, LAST_REDUCES: tl.constexpr, MODE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, EPILOGUE: tl.constexpr, HALF: tl.constexpr, PDL: tl.constexpr,
    PRELOAD: tl.constexpr, FOLD: tl.constexpr, ROWS: tl.constexpr,
):
    # EPILOGUE: PLAIN stores x @ w.T (+ bias); GLU silu(gate) * up; ROPE the qkv
    # projection's RoPE and K/V scatter (qkv_rope_write without q/k norm). The rope
    # arguments (cos_ptr .. num_kv, HALF) are read only by ROPE.
    # ADD_NORM (PLAIN): stores h = res + x @ w.T, rounded as the torch sum rounds (res_ptr
    # rows have out's stride), and prepares the RMSNorm of h with weight next_norm_ptr
    # for the next GEMV: h * weight at scaled_ptr (out's layout) and the program's sum of
    # h^2 at sq_out_ptr[m, pid_n]. NORM: x is such a scaled h; the program sums the
    # num_parts partial squares at sq_ptr[m, :] and scales its product by 1 / rms(h) (eps).
    # SPLIT_K > 1: each program stores its fp32 partial; LAST_REDUCES: into part_ptr
    # [SPLIT_K, programs, BLOCK_M, BLOCK_N], and the last of a tile's programs to take a
    # ticket (ticket_ptr[pid_n], left at 0 for the next launch) sums them in split order
    # (the same result whichever finishes last) and runs the epilogue; otherwise into
    # part_ptr [SPLIT_K, M, N] for _sum_splits_kernel (PLAIN, no NORM).
    # At PDL_LATE the next kernel may start once every program is past its K loop.
    # MODE_FMA_ROWS (mode "fma" with 2..FMA_MAX_ROWS rows): ROWS == M accumulators.
    start_next_kernel_early(PDL)
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    lane = tl.arange(0, BLOCK_N)
    if EPILOGUE == _GLU:
        # N outputs silu(gate) * up from a [2N, K] weight: the program's weight rows
        # alternate gate row j and up row N + j, so it holds both factors of BLOCK_N // 2
        # outputs.
        cols = pid_n * (BLOCK_N // 2) + lane // 2
        n_ok = cols < N
        w_index = cols + (lane % 2) * N
    elif EPILOGUE == _ROPE:
        # Rotation pairs (dims j and j + HALF of one head) of the [heads * 2 * HALF, K]
        # qkv weight: the program's rows alternate the two halves of BLOCK_N // 2 pairs,
        # all of one head (HALF is a multiple of BLOCK_N // 2).
        pair = pid_n * (BLOCK_N // 2) + lane // 2
        w_index = (pair // HALF) * (2 * HALF) + pair % HALF + (lane % 2) * HALF
        n_ok = w_index < N
    else:
        w_index = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = w_index < N
    # This split's K range, in whole BLOCK_K tiles.
    k_span = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
    k_start = split * k_span
    k_stop = tl.minimum(k_start + k_span, K)

    w_rows = w_ptr + w_index.to(tl.int64)[:, None] * s_wn  # [BLOCK_N, 1]
    x_rows = x_ptr + offs_m[:, None] * s_xm  # [BLOCK_M, 1]
    if MODE == 0:
        acc = tl.zeros([BLOCK_N, BLOCK_K // FOLD], dtype=tl.float32)
    elif MODE == _FMA_ROWS:
        acc = ()
        for _ in tl.static_range(ROWS):
            acc = acc + (tl.zeros([BLOCK_N, BLOCK_K // FOLD], dtype=tl.float32),)
    elif MODE == 1:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    first = k_start
    if PDL and PRELOAD > 0:
        # Weights are never written during a step: the first weight tiles stream in
        # while the previous kernel finishes, x (its output) is read after the wait.
        ks = k_start + offs_k
        w_first = _load_w(w_rows, ks, k_stop, n_ok, EVEN_N, EVEN_K)
        if PRELOAD == 2:  # masked: the range may hold one tile
            w_second = _load_w(w_rows, ks + BLOCK_K, k_stop, n_ok, EVEN_N, False)
    wait_for_inputs(PDL)
    if NORM:
        # Issued before the first x tile, so both L2 round trips overlap and the sum (a
        # warp stalls there until the partials land) waits for one of them, not two.
        # Summed after the loop instead, the partials' registers cost gate_up a fifth of
        # its speed on the H200.
        parts = tl.arange(0, BLOCK_P)
        squares = tl.load(sq_ptr + offs_m[:, None] * num_parts + parts[None, :],
                          mask=m_ok[:, None] & (parts < num_parts)[None, :], other=0.0)
    if PDL and PRELOAD > 0:
        acc = _accumulate_tile(acc, w_first, x_ptr, x_rows, s_xm, ks, k_stop, m_ok, EVEN_K, MODE, ROWS, FOLD)
        first = k_start + BLOCK_K
        if PRELOAD == 2:
            acc = _accumulate_tile(acc, w_second, x_ptr, x_rows, s_xm, ks + BLOCK_K, k_stop, m_ok, False, MODE, ROWS,
                                   FOLD)
            first += BLOCK_K
    # The epilogue's inputs (0.0 where it takes none), after the wait and before the loop,
    # so their latency hides under the weight stream.
    if EPILOGUE == _ROPE:  # the step's own torch ops wrote these
        slot, c1, c2, s1, s2 = _rope_inputs(pid_n, offs_m, m_ok, cos_ptr, sin_ptr, pos_ptr, widx_ptr, s_cos, s_sin,
                                            BLOCK_N, HALF)
    else:
        slot, c1, c2, s1, s2 = 0.0, 0.0, 0.0, 0.0, 0.0
    if ADD_NORM:
        res = tl.load(res_ptr + offs_m[:, None] * s_om + w_index[None, :], mask=m_ok[:, None] & n_ok[None, :],
                      other=0.0)
        next_norm = tl.load(next_norm_ptr + w_index, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    else:
        res, next_norm = 0.0, 0.0
    if NORM:
        inv_rms = libdevice.rsqrt(tl.sum(squares, axis=1) / K + eps)  # [BLOCK_M]
    else:
        inv_rms = 0.0
    for k in range(first, k_stop, BLOCK_K):
        ks = k + offs_k
        w = _load_w(w_rows, ks, k_stop, n_ok, EVEN_N, EVEN_K)
        acc = _accumulate_tile(acc, w, x_ptr, x_rows, s_xm, ks, k_stop, m_ok, EVEN_K, MODE, ROWS, FOLD)
    start_next_kernel_late(PDL)
    if MODE == 0:
        result = tl.sum(acc, axis=1)[None, :]  # [1, BLOCK_N]
    elif MODE == _FMA_ROWS:
        result = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for m in tl.static_range(ROWS):
            result = tl.where(offs_m[:, None] == m, tl.sum(acc[m], axis=1)[None, :], result)
    elif MODE == 1:
        result = acc
    else:
        result = tl.trans(acc)  # [BLOCK_M, BLOCK_N]
    if SPLIT_K == 1:
        _epilogue(result, inv_rms, res, next_norm, slot, c1, c2, s1, s2, pid_n, offs_m, m_ok, w_index, n_ok,
                  x_ptr, bias_ptr, out_ptr, scaled_ptr, sq_out_ptr, k_pool_ptr, v_pool_ptr, s_om, N, num_heads, num_kv,
                  HAS_BIAS, NORM, ADD_NORM, EPILOGUE, BLOCK_M, BLOCK_N, HALF)
    elif LAST_REDUCES:
        step = tl.num_programs(0) * BLOCK_M * BLOCK_N
        tile = part_ptr + (pid_n * BLOCK_M + offs_m[:, None]) * BLOCK_N + lane[None, :]  # split 0's
        tl.store(tile + split * step, result)
        # Every thread's partial is stored before the ticket releases them to the last program.
        tl.debug_barrier()
        if tl.atomic_add(ticket_ptr + pid_n, 1, sem="acq_rel", scope="gpu") == SPLIT_K - 1:
            tl.atomic_xchg(ticket_ptr + pid_n, 0)  # the next launch's tickets start from 0
            # In split order, its own partial from registers (the value it stored).
            total = tl.zeros_like(result)
            for other in tl.static_range(SPLIT_K):
                theirs = tl.load(tile + other * step, mask=m_ok[:, None] & (other != split), other=0.0,
                                 cache_modifier=".cg")
                total += tl.where(other == split, result, theirs)
            _epilogue(total, inv_rms, res, next_norm, slot, c1, c2, s1, s2, pid_n, offs_m, m_ok, w_index, n_ok,
                      x_ptr, bias_ptr, out_ptr, scaled_ptr, sq_out_ptr, k_pool_ptr, v_pool_ptr, s_om, N, num_heads,
                      num_kv, HAS_BIAS, NORM, ADD_NORM, EPILOGUE, BLOCK_M, BLOCK_N, HALF)
    else:  # _sum_splits_kernel adds the partials
        tl.store(part_ptr + (split * M + offs_m[:, None]) * N + w_index[None, :], result,
                 mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _epilogue(result, inv_rms, res, next_norm, slot, c1, c2, s1, s2, pid_n, offs_m, m_ok, w_index, n_ok,
              x_ptr, bias_ptr, out_ptr, scaled_ptr, sq_out_ptr, k_pool_ptr, v_pool_ptr, s_om, N, num_heads, num_kv,
              HAS_BIAS: tl.constexpr, NORM: tl.constexpr, ADD_NORM: tl.constexpr, EPILOGUE: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HALF: tl.constexpr):
    """The GEMV's output for one tile's whole-K product ``result`` [BLOCK_M, BLOCK_N] (fp32)."""
    if NORM:
        result = result * inv_rms[:, None]
    if EPILOGUE == _ROPE:
        if HAS_BIAS:
            result += tl.load(bias_ptr + w_index, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        _rope_epilogue(result, pid_n, offs_m, m_ok, out_ptr, k_pool_ptr, v_pool_ptr, slot, c1, c2, s1, s2,
                       num_heads, num_kv, x_ptr.dtype.element_ty, BLOCK_M, BLOCK_N, HALF)
    elif EPILOGUE == _GLU:
        # layers.silu_mul over the rounded projections (silu rounds before the product).
        rounded = result.to(x_ptr.dtype.element_ty).to(tl.float32)
        gate, up = tl.split(tl.reshape(rounded, [BLOCK_M, BLOCK_N // 2, 2]))
        act = silu(gate).to(x_ptr.dtype.element_ty).to(tl.float32)
        out_cols = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        tl.store(out_ptr + offs_m[:, None] * s_om + out_cols[None, :], (act * up).to(out_ptr.dtype.element_ty),
                 mask=m_ok[:, None] & (out_cols < N)[None, :])
    else:
        if HAS_BIAS:
            result += tl.load(bias_ptr + w_index, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        # Rounded to x's dtype even into a wider output: float32 logits of a bf16 model
        # hold what F.linear(...).float() holds.
        value = result.to(x_ptr.dtype.element_ty)
        if ADD_NORM:
            value = (value.to(tl.float32) + res.to(tl.float32)).to(x_ptr.dtype.element_ty)
            h = value.to(tl.float32)
            tl.store(scaled_ptr + offs_m[:, None] * s_om + w_index[None, :], (h * next_norm).to(x_ptr.dtype.element_ty),
                     mask=m_ok[:, None] & n_ok[None, :])
            tl.store(sq_out_ptr + offs_m * tl.num_programs(0) + pid_n, tl.sum(h * h, axis=1), mask=m_ok)
        value = value.to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + offs_m[:, None] * s_om + w_index[None, :], value, mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _sum_splits_kernel(
    part_ptr, bias_ptr, out_ptr, M, N, s_om,
    HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
):
    wait_for_inputs(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # flat over [M, N]
    ok = offs < M * N
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for split in tl.static_range(SPLIT_K):
        acc += tl.load(part_ptr + split * M * N + offs, mask=ok, other=0.0)
    m = offs // N
    n = offs % N
    if HAS_BIAS:
        acc += tl.load(bias_ptr + n, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + m * s_om + n, acc.to(out_ptr.dtype.element_ty), mask=ok)


def default_config(m: int, n: int, k: int, device: torch.device, epilogue: int = EPILOGUE_PLAIN) -> GemvConfig:
    """The launch shape used when none is given, from an H200 sweep (tools/bench_kernels.py --sweep gemv).

    Per-call figures at Llama-3-8B shapes, % of the 4.28 TB/s copy ceiling, 32
    distinct weights per shape (cuBLAS in brackets):

    - M=1: FMA over 4 x 1024 tiles, two warps: qkv 81.6 (76.0), o 76.1 (61.3),
      gate_up 98.7 (89.9), down 95.0 (85.8), lm_head 103.2 (98.5). In the step, o and
      down do better with 8 x 1024 tiles over four warps (below).
    - M=8 (the tensor-core "swap" mode, weight as the wide operand): qkv 80.2 (74.8)
      with 64 x 128 x 6 stages, o 69.5 (60.0) and down 90.1 (84.0) with 32 x 256,
      gate_up 96.6 (96.4) and lm_head 101.7 (97.9) with 64 x 128 x 4 stages.
    - M=2: the FMA tiles again (one accumulator a row); from three rows the tensor-core
      tiles win in the step (below).

    ``epilogue``: the launch's EPILOGUE_* (the gate/up product takes four warps at M=1).
    """
    sms = sm_count(device)
    if m == 1:
        # Narrow outputs over a long K (Llama-3-8B's o and down, which prepare the fused
        # norms): 8 rows over 4 warps, half the programs and half the partial squares for
        # the next GEMV to sum. tools/bench_step.py, H200: 3.790-3.801 ms a step against
        # 3.811-3.818 with 4 rows over 2 warps (and 3.799-3.800 against 3.811-3.816).
        # The gate/up product (a fused norm's consumer too, like qkv) over four warps as
        # well: each thread sums half as many of the partial squares and holds half the
        # tile. tools/bench_step.py, H200, two calls: 3.688-3.707 ms a step against
        # 3.753-3.774 with two warps (3.704 against 3.761-3.775); qkv lost with four
        # (3.810), as did lm_head (3.786) and the gate/up product with eight (3.936).
        # The qkv product (the RoPE epilogue) folds its accumulator and is capped at 80
        # registers: 75 without spills against 153 (sm_90), so 12 of its two-warp programs
        # fit an SM and Llama-3-8B's 1,536 run in one wave, not two. tools/bench_step.py,
        # H200, two calls: 3.722-3.737 ms a step against 3.737-3.771 unfolded, and
        # 3.653-3.671 against 3.687-3.707 (folded without the cap 3.693, a cap of 72
        # 3.690, 8 x 1024 over four warps 3.690); folding the other GEMVs lost (3.839-3.858).
        narrow = n <= 4096 and k >= 4096
        warps = 4 if narrow or epilogue == EPILOGUE_GLU else 2
        rope = epilogue == EPILOGUE_ROPE
        cfg = GemvConfig(block_n=8 if narrow else 4, block_k=1024, num_warps=warps, num_stages=3,
                         mode="fma", preload_tiles=PRELOAD_TILES, k_fold=8 if rope else K_FOLD,
                         max_registers=ROPE_MAX_REGISTERS if rope else 0)
        cfg = replace(cfg, **SHAPE_OVERRIDES.get((n, k), {}))
    elif m <= FMA_ROWS:
        # Two rows: batch 1's FMA tiles over four warps (a thread holds eight columns of K for
        # each row, folded), one register accumulator a row, preloading a tile and letting the
        # next kernel start at once as batch 1 does. tools/bench_step.py (mr_fma_early), H200,
        # two calls: batch 2 3.978 and 3.980 ms a step against 4.208 and 4.197 on the
        # tensor-core tiles; the late start read 4.233. At three rows they lost (4.539 against
        # 4.214), at four 5.080 against 4.269 and at eight 9.238 against 4.304: the FMA pipes,
        # not the weight stream, bound them.
        cfg = GemvConfig(block_n=8 if n <= 4096 and k >= 4096 else 4, block_k=1024, num_warps=4, num_stages=3,
                         mode="fma", k_fold=8)
    elif m > 8:
        # 9..128 rows: the tile's other side is the next power of two of M, so these are
        # Hopper warpgroup products (wgmma) wherever one side holds 64 rows. H200 sweep
        # (tools/bench_kernels.py --sweep gemv --sweep-rows 64,16, % of the copy ceiling,
        # cuBLAS in brackets). M=16, weight as the 64-row side: qkv 73.3 (73.0), o 69.0
        # (57.6), down 81.6 (83.2), gate_up 94.0 (95.3), lm_head 100.4 (96.8); 32-row tiles
        # fall back to mma.sync and lost (41-53 on the narrow shapes). M=64: qkv 67.9
        # (71.3) with 64-row weight tiles, o 65.5 (65.2) and down 77.1 (75.0) with x as the
        # 64-row side over 32-row weight tiles ("dot"), gate_up 87.6 (87.2) and lm_head 93.7
        # (87.6) with 128-row weight tiles. Unsplit K everywhere: the epilogues (norm, SiLU-mul, RoPE) need it.
        # In the step two more stages on the narrow shapes took batch 32 from 6.03 to 5.43 ms
        # and batch 64 from 5.29 to 5.26 (tools/bench_step.py wide_deep), so past 16 rows
        # qkv takes 6 and o and down 7. At M=128 every tile lost to cuBLAS (37-83 against
        # 57-87 per call).
        # Up to 32 rows the narrow shapes (qkv, o, down) take 128-row weight tiles with K split
        # in two (four from K = 8,192) and the last program of each tile reducing, so the
        # epilogues stay fused: more programs than output tiles, and x re-read by a quarter as
        # many programs as with 32-row tiles (tools/bench_step.py --curve, H200, 2026-12-03,
        # one call: batch 16 4.504 ms a step against 4.836 with cuBLAS and 5.128 unsplit,
        # batch 32 4.821 against 5.043 and 5.389). At 64 rows the split lost (5.46-6.35
        # against 5.15: each tile's reduction reads 32 KB a split). Where the wide launches let
        # the next kernel start is below.
        wide = n >= 16384  # gate/up and the vocabulary: output tiles for every SM
        if m <= 32 and not wide:
            splits, block_k = (4 if k >= 8192 else 2), 64
            cfg = GemvConfig(block_n=128, block_k=block_k, num_warps=4, num_stages=6, mode="swap",
                             split_k=splits if k >= 4 * block_k * splits else 1, last_reduces=True)
        elif m <= 16:
            cfg = GemvConfig(block_n=64, block_k=128, num_warps=4, num_stages=4 if wide else 5, mode="swap")
        elif wide:
            # The gate/up product (its SiLU-mul epilogue) over three stages: 224 programs of
            # 147 KB took one an SM, 92 in a second wave beside 40 idle multiprocessors; at
            # 73 KB the grid is resident at once. tools/bench_step.py (w_gu_s3), H200, one
            # call: batch 64 5.031 ms a step against 5.101, batch 32 4.763 against 4.819
            # (tools/bench_kernels.py --sweep-rows 64: 89.7% of the copy ceiling against 88.8).
            stages = 3 if epilogue == EPILOGUE_GLU else 6
            cfg = GemvConfig(block_n=128, block_k=64, num_warps=4, num_stages=stages, mode="swap")
        elif n <= 4096:  # o and down
            cfg = GemvConfig(block_n=32, block_k=128, num_warps=4, num_stages=7, mode="dot")
        else:  # qkv
            cfg = GemvConfig(block_n=64, block_k=128, num_warps=4, num_stages=6, mode="swap")
        if m > 64:  # 128-row x tiles: three stages fit the shared memory
            cfg = replace(cfg, num_stages=3)
    elif k >= 8192:
        cfg = GemvConfig(block_n=32, block_k=256, num_warps=4, num_stages=6, mode="swap")
    elif n <= 4096:
        # The o projection splits K in two with the last program reducing: 256 programs, not
        # 128 under one an SM. tools/bench_step.py (mr_o_split2), H200, one call, ms a step
        # against unsplit: batch 3 4.112 / 4.215, 4 4.160 / 4.276 (4.164 / 4.271 in another
        # call), 5 4.163 / 4.211, 8 4.257 / 4.298. Four splits, and two on down or qkv as
        # well, lost (batch 4: 4.255, 4.334, 4.257).
        splits = 2 if k >= 4 * 256 * 2 else 1
        cfg = GemvConfig(block_n=32, block_k=256, num_warps=4, num_stages=5, mode="swap", split_k=splits,
                         last_reduces=True)
    else:
        cfg = GemvConfig(block_n=64, block_k=128, num_warps=4, num_stages=6 if n < 16384 else 4, mode="swap")
    if cfg.mode != "fma":
        # The tensor-core tiles run under PDL with nothing loaded before the wait, and let the
        # next kernel start only once every program is past its K loop: its early programs then
        # overlap this launch's epilogues and tail, not its weight stream. tools/bench_step.py
        # (w_pdl_late_p0, mr_late_p0), H200, two calls, ms a step against the PDL level's early
        # start with one tile preloaded (and plain launches past 32 rows): batch 64 5.048 against
        # 5.152 and 5.054 against 5.171, batch 32 4.829 against 4.849, 16 4.482 against 4.541,
        # 8 4.340 against 4.418, 4 4.298 against 4.331, 2 4.233 against 4.249. The late start with
        # a preloaded tile lost (batch 64 5.287, batch 8 4.463), as did PDL at its level past 32
        # rows (5.256) and the late start at batch 1 (3.833 against 3.723).
        cfg = replace(cfg, preload_tiles=0, trigger_after_loop=True)
    if 1 < m <= 8:
        cfg = replace(cfg, **MULTI_ROW_OVERRIDES.get((n, k), {}))
    elif m > 8:
        cfg = replace(cfg, **WIDE_ROW_OVERRIDES.get((n, k), {}))
    # Small models' narrow layers: split K until the grid covers half the SMs (a quarter with
    # wide rows, where Llama-3-8B's o and down keep K whole for their epilogues: 64 programs
    # of 64 x 128 tiles at M=16 measured 69.0 and 81.6% unsplit).
    split_k = cfg.split_k  # an override may set it
    target = sms // 2 if m <= 8 else sms // 4
    while triton.cdiv(n, cfg.block_n) * split_k < target and k >= 4 * cfg.block_k * split_k and split_k < 8:
        split_k *= 2
    return replace(cfg, split_k=split_k)


def _check(kernel: str, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> None:
    require(w.dim() == 2, kernel, f"w must be [N, K], got {tuple(w.shape)}")
    require(x.dim() >= 1 and x.shape[-1] == w.shape[1], kernel,
            f"x must be [..., K={w.shape[1]}], got {tuple(x.shape)}")
    require(x.dtype == w.dtype and x.dtype in (torch.bfloat16, torch.float16, torch.float32), kernel,
            f"x and w must share a float dtype, got {x.dtype} and {w.dtype}")
    require(w.stride(1) == 1, kernel, f"w rows must be contiguous, got strides {tuple(w.stride())}")
    require_inner_contiguous(kernel, "x", x)
    tensors = {"x": x, "w": w}
    if bias is not None:
        require(bias.shape == (w.shape[0],) and bias.dtype == w.dtype and bias.is_contiguous(), kernel,
                f"bias must be contiguous [{w.shape[0]}] {w.dtype}, got {tuple(bias.shape)} {bias.dtype}")
        tensors["bias"] = bias
    require_same_device(kernel, **tensors)


@dataclass(frozen=True)
class NormedRows:
    """``rms_norm(x, weight, eps)`` (:func:`flare.model.layers.rms_norm`), left to the GEMV
    that takes it.

    :func:`linear_add_rms_norm_small_m` returns this: its epilogue already holds every
    element of x (the new residual stream), so it also writes ``scaled = x * weight``
    and ``squares`` ``[M, P]``, each program's fp32 sum of x^2. The next small-batch
    GEMV streams ``scaled`` as its input, sums the P partials once and scales its fp32
    product by 1 / rms: the norm costs neither a launch nor a pass over memory, and the
    GEMV's inner loop is unchanged. It differs from the composite by rounding only (x
    is normalised after the product, not rounded in between). Where no kernel can
    take it, :meth:`materialize` computes the norm.
    """

    x: torch.Tensor
    weight: torch.Tensor
    eps: float
    scaled: torch.Tensor
    squares: torch.Tensor

    def materialize(self) -> torch.Tensor:
        return rms_norm(self.x, self.weight, self.eps)


def _rows(x: torch.Tensor | NormedRows) -> torch.Tensor:
    """The tensor a kernel reads for input x (a NormedRows' scaled rows: x's shape, dtype
    and device)."""
    return x.scaled if isinstance(x, NormedRows) else x


def linear_small_m(x: torch.Tensor | NormedRows, w: torch.Tensor, bias: torch.Tensor | None = None, *,
                   config: GemvConfig | None = None, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``x @ w.T (+ bias)`` for at most MAX_ROWS rows: x ``[..., K]``, w ``[N, K]`` -> ``[..., N]``.

    fp32 accumulation, rounded to x's dtype; stored as ``out_dtype`` (default x's
    dtype: float32 logits hold exactly what ``F.linear(x, w).float()`` would). x may
    be a :class:`NormedRows`: the product of the normalised rows, normalised in the
    kernel. ``config`` overrides :func:`default_config` (the benchmark sweeps it).
    """
    kernel = "linear_small_m"
    rows, cfg, norm = _prepare(kernel, x, w, bias, config)
    require(out_dtype is None or out_dtype in (rows.dtype, torch.float32), kernel,
            f"out_dtype must be x's dtype or float32, got {out_dtype}")
    out = torch.empty((rows.shape[0], w.shape[0]), dtype=out_dtype or rows.dtype, device=rows.device)
    _launch(rows, w, bias, out, cfg, epilogue=EPILOGUE_PLAIN, outputs=w.shape[0], norm=norm)
    return out.view(*_rows(x).shape[:-1], w.shape[0])


def _add_norm_problem(out_shape: tuple, dtype: torch.dtype, residual: torch.Tensor,
                      weight: torch.Tensor) -> str | None:
    """Why the residual and norm weight cannot go into the add+norm epilogue of a product of
    ``out_shape`` in ``dtype`` (None: they can)."""
    n = out_shape[-1]
    if not (residual.shape == out_shape and residual.dtype == dtype and residual.is_contiguous()):
        return (f"residual must be a contiguous {out_shape} {dtype} tensor, got {tuple(residual.shape)} "
                f"{residual.dtype}")
    if not (weight.shape == (n,) and weight.dtype == dtype and weight.is_contiguous()):
        return f"the norm weight must be a contiguous [{n}] {dtype} tensor, got {tuple(weight.shape)} {weight.dtype}"
    return None


def linear_add_rms_norm_small_m(x: torch.Tensor | NormedRows, w: torch.Tensor, residual: torch.Tensor,
                                weight: torch.Tensor, eps: float, *,
                                config: GemvConfig | None = None) -> NormedRows:
    """``h = residual + x @ w.T``, and the next RMSNorm of h left to the GEMV that takes it.

    One launch: the epilogue adds the residual (rounded as the torch sum rounds) and
    writes, besides h, ``h * weight`` and each program's sum of ``h^2``; returns them as
    a :class:`NormedRows` whose ``x`` is h (the new residual stream). residual: ``[..., N]``
    contiguous, x's dtype; weight: ``[N]``. Needs an unsplit K.
    """
    kernel = "linear_add_rms_norm_small_m"
    rows, cfg, norm = _prepare(kernel, x, w, None, config)
    n = w.shape[0]
    out_shape = (*_rows(x).shape[:-1], n)
    problem = _add_norm_problem(out_shape, rows.dtype, residual, weight)
    require(problem is None, kernel, problem or "")
    require(_whole_k(cfg), kernel, f"needs an unsplit K or last_reduces, got {cfg}")
    require_same_device(kernel, x=rows, residual=residual, weight=weight)
    h = torch.empty(out_shape, dtype=rows.dtype, device=rows.device)
    scaled = torch.empty_like(h)
    squares = torch.empty((rows.shape[0], triton.cdiv(n, cfg.block_n)), dtype=torch.float32, device=rows.device)
    _launch(rows, w, None, h.view(-1, n), cfg, epilogue=EPILOGUE_PLAIN, outputs=n, norm=norm,
            add_norm=(residual.view(-1, n), weight, scaled, squares))
    return NormedRows(h, weight, eps, scaled, squares)


def linear_silu_small_m(x: torch.Tensor | NormedRows, w: torch.Tensor, *,
                        config: GemvConfig | None = None) -> torch.Tensor:
    """``silu(gate) * up`` of ``x @ w.T`` with w the fused ``[2I, K]`` gate/up weight -> ``[..., I]``.

    One launch: the SiLU-mul is the GEMV's epilogue, rounded as
    ``layers.silu_mul(F.linear(x, w))`` rounds. Needs an unsplit K (``config.split_k == 1``).
    x as in :func:`linear_small_m`.
    """
    kernel = "linear_silu_small_m"
    rows, cfg, norm = _prepare(kernel, x, w, None, config, EPILOGUE_GLU)
    inter = w.shape[0] // 2
    require(w.shape[0] % 2 == 0 and _whole_k(cfg) and cfg.block_n % 2 == 0, kernel,
            f"needs a [2I, K] weight, an even block_n and no K split (or last_reduces), got {tuple(w.shape)} and {cfg}")
    out = torch.empty((rows.shape[0], inter), dtype=rows.dtype, device=rows.device)
    _launch(rows, w, None, out, cfg, epilogue=EPILOGUE_GLU, outputs=inter, norm=norm)
    return out.view(*_rows(x).shape[:-1], inter)


def fuses_qkv_rope(x: torch.Tensor, w: torch.Tensor, head_dim: int, config: GemvConfig | None = None) -> bool:
    """Whether :func:`linear_qkv_rope_small_m` takes this product: bf16, an unsplit K, and
    rotation pairs that tile each head (head_dim / 2 a multiple of block_n / 2)."""
    m = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if not 1 <= m <= MAX_ROWS or x.dtype != torch.bfloat16:
        return False
    cfg = config or default_config(m, *w.shape, x.device, EPILOGUE_ROPE)
    return _whole_k(cfg) and cfg.block_n % 2 == 0 and head_dim % 2 == 0 and (head_dim // 2) % (cfg.block_n // 2) == 0


def linear_qkv_rope_small_m(x: torch.Tensor | NormedRows, w: torch.Tensor, bias: torch.Tensor | None, num_heads: int,
                            cos_table: torch.Tensor, sin_table: torch.Tensor, positions: torch.Tensor,
                            write_index: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, *,
                            config: GemvConfig | None = None) -> torch.Tensor:
    """``decoder.qkv_rope_write(F.linear(x, w, bias), num_heads, None, None, ...)`` in one launch.

    x ``[B, Q, K]`` (B * Q <= MAX_ROWS, bf16), w the fused ``[(H + 2 * Hkv) * D, K]``
    qkv weight. The GEMV's epilogue rotates q and k at ``positions`` and scatters k
    and v into the pools at ``write_index``; returns q ``[B, Q, H, D]``. Needs
    :func:`fuses_qkv_rope`. Compiled without multiply-add contraction (the RoPE
    products are rounded before their sums, see elementwise), so the projection
    itself may differ from :func:`linear_small_m`'s by rounding. x as in
    :func:`linear_small_m`.
    """
    kernel = "linear_qkv_rope_small_m"
    inputs = _rows(x)
    require(inputs.dim() == 3, kernel, f"x must be [B, Q, K], got {tuple(inputs.shape)}")
    rows, cfg, norm = _prepare(kernel, x, w, bias, config, EPILOGUE_ROPE)
    b, nq, _ = inputs.shape
    hkv, d = check_rope_targets(kernel, inputs, cos_table, sin_table, positions, write_index, k_pool, v_pool)
    require(w.shape[0] == (num_heads + 2 * hkv) * d, kernel,
            f"qkv weight rows {w.shape[0]} are not (H={num_heads} + 2*Hkv={hkv}) * D={d}")
    require(fuses_qkv_rope(inputs, w, d, cfg), kernel,
            f"needs bf16, no K split and head_dim / 2 a multiple of block_n / 2, got {inputs.dtype}, {cfg}, D={d}")
    positions, write_index = positions.reshape(-1), write_index.reshape(-1)  # [B * Q] rows, as x's
    q = torch.empty((b, nq, num_heads, d), dtype=inputs.dtype, device=inputs.device)
    _launch(rows, w, bias, q, cfg, epilogue=EPILOGUE_ROPE, outputs=w.shape[0], norm=norm,
            rope=(cos_table, sin_table, positions, write_index, k_pool, v_pool, num_heads, hkv, d // 2))
    return q


def _prepare(kernel: str, x: torch.Tensor | NormedRows, w: torch.Tensor, bias: torch.Tensor | None,
             config: GemvConfig | None, epilogue: int = EPILOGUE_PLAIN,
             ) -> tuple[torch.Tensor, GemvConfig, tuple[torch.Tensor, float] | None]:
    """Checks shared by the launchers; -> (the kernel's x as [M, K] rows, the launch config,
    (partial squares [M, P], eps) when x is a NormedRows, else None)."""
    inputs = _rows(x)
    _check(kernel, inputs, w, bias)
    n, k = w.shape
    rows = inputs.reshape(-1, k)
    m = rows.shape[0]
    require(1 <= m <= MAX_ROWS, kernel, f"x must have 1..{MAX_ROWS} rows, got {m} (shape {tuple(inputs.shape)})")
    cfg = config or default_config(m, n, k, inputs.device, epilogue)
    require(cfg.mode in _MODES, kernel, f"unknown mode {cfg.mode!r}")
    require(cfg.mode != "fma" or m <= FMA_MAX_ROWS, kernel, f"mode 'fma' takes 1..{FMA_MAX_ROWS} rows, got {m}")
    require(cfg.block_k >= 32 and cfg.block_n >= (1 if cfg.mode == "fma" else 16), kernel,
            f"block_k must be >= 32 and block_n >= 16 for tensor-core modes, got {cfg}")
    require(cfg.preload_tiles in (0, 1, 2), kernel, f"preload_tiles must be 0, 1 or 2, got {cfg.preload_tiles}")
    require(cfg.max_registers == 0 or 24 <= cfg.max_registers <= 255, kernel,
            f"max_registers must be 0 (no cap) or 24..255, got {cfg.max_registers}")
    require(cfg.k_fold in (1, 2, 4, 8) and (cfg.k_fold == 1 or cfg.mode == "fma") and cfg.block_k % cfg.k_fold == 0,
            kernel, f"k_fold must be 1, 2, 4 or 8 (more than 1 only in mode 'fma') and divide block_k, got {cfg}")
    if not isinstance(x, NormedRows):
        return rows, cfg, None
    require(_whole_k(cfg), kernel, f"a fused norm needs an unsplit K or last_reduces, got {cfg}")
    require(x.squares.dim() == 2 and x.squares.shape[0] == m and x.squares.dtype == torch.float32
            and x.squares.is_contiguous(), kernel,
            f"the norm's partial squares must be contiguous float32 [{m}, P], got {tuple(x.squares.shape)}")
    require_same_device(kernel, x=rows, squares=x.squares)
    return rows, cfg, (x.squares, x.eps)


# Ticket counters of the launches whose last program reduces the splits, one per output tile:
# zero between launches (each tile's last program resets its own), so the launches of one
# stream share them. One buffer per device and stream (the stream is kept, so its handle is
# never another's): a drafter's graphs, captured on their own stream and replayed beside the
# target's, never take the target's tickets. Allocated outside graph capture (the warm-up
# runs each launch on the capture stream first).
_TICKETS: dict[tuple, tuple[object, torch.Tensor]] = {}


def ticket_counters() -> list[torch.Tensor]:
    """Every ticket buffer (tests check that launches leave them at zero)."""
    return [tickets for _, tickets in _TICKETS.values()]


def _tickets(device: torch.device, programs: int) -> torch.Tensor:
    stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
    key = (device, stream.cuda_stream if stream is not None else 0)
    _, tickets = _TICKETS.get(key, (None, None))
    if tickets is None or tickets.numel() < programs:
        require(stream is None or not torch.cuda.is_current_stream_capturing(), "linear_small_m",
                f"split-K ticket counters for {programs} tiles must exist before graph capture (run the launch "
                "once on the capture stream outside it)")
        tickets = torch.zeros(max(programs, 4096), dtype=torch.int32, device=device)
        _TICKETS[key] = (stream, tickets)
    return tickets


def _launch(rows: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor, cfg: GemvConfig, *,
            epilogue: int, outputs: int, rope: tuple | None = None, norm: tuple[torch.Tensor, float] | None = None,
            add_norm: tuple | None = None) -> None:
    """One GEMV launch (plus the split sum); ``outputs``: output columns (N of the kernel).

    norm: (partial squares, eps) of a NormedRows input; add_norm: (residual, norm weight,
    scaled out, squares out) of :func:`linear_add_rms_norm_small_m`.
    """
    m, k = rows.shape
    n = outputs
    bias_arg = bias if bias is not None else out
    block_m = next_power_of_2(m) if cfg.mode == "fma" else max(16, next_power_of_2(m))
    mode = MODE_FMA_ROWS if cfg.mode == "fma" and m > 1 else _MODES[cfg.mode]
    per_program = cfg.block_n // 2 if epilogue == EPILOGUE_GLU else cfg.block_n
    programs = triton.cdiv(n, per_program)
    reduces = cfg.split_k > 1 and cfg.last_reduces
    if reduces:
        part = torch.empty((cfg.split_k, programs, block_m, cfg.block_n), dtype=torch.float32, device=rows.device)
        tickets = _tickets(rows.device, programs)
    else:
        part = torch.empty((cfg.split_k, m, n), dtype=torch.float32, device=rows.device) if cfg.split_k > 1 else out
        tickets = out
    if rope is not None:
        cos, sin, pos, widx, k_pool, v_pool, num_heads, num_kv, half = rope
        rope_args = (cos, sin, pos, widx, k_pool, v_pool)
        rope_scalars = (cos.stride(0), sin.stride(0), num_heads, num_kv)
    else:
        rope_args, rope_scalars, half = (out,) * 6, (0, 0, 0, 0), 1
    pdl = pdl_level(rows) if cfg.pdl else 0
    level = PDL_LATE if pdl and cfg.trigger_after_loop else pdl  # the GEMV's own; the split sum keeps pdl
    squares, eps = norm if norm is not None else (out, 0.0)
    num_parts = squares.shape[1] if norm is not None else 1
    add_norm_args = add_norm if add_norm is not None else (out,) * 4
    _linear_small_m_kernel[(programs, cfg.split_k)](
        rows, w, bias_arg, out, part, tickets, squares, *add_norm_args, *rope_args,
        m, n, k, rows.stride(0), w.stride(0), out.stride(0) if out.dim() == 2 else 0, *rope_scalars, num_parts,
        float(eps), HAS_BIAS=bias is not None, NORM=norm is not None, ADD_NORM=add_norm is not None,
        BLOCK_P=next_power_of_2(num_parts), SPLIT_K=cfg.split_k, LAST_REDUCES=reduces, MODE=mode,
        BLOCK_M=block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        EVEN_N=n % per_program == 0, EVEN_K=k % (cfg.block_k * cfg.split_k) == 0, EPILOGUE=epilogue, HALF=half,
        PDL=level, PRELOAD=cfg.preload_tiles, FOLD=cfg.k_fold, ROWS=m if mode == MODE_FMA_ROWS else 1,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **({"maxnreg": cfg.max_registers} if cfg.max_registers and not INTERPRETED else {}),
        # RoPE rounds each product before its sum: no multiply-add contraction there.
        **({"enable_fp_fusion": False} if epilogue == EPILOGUE_ROPE else {}), **pdl_options(pdl),
    )
    if cfg.split_k > 1 and not reduces:
        block = 1024
        _sum_splits_kernel[(triton.cdiv(m * n, block),)](
            part, bias_arg, out, m, n, out.stride(0),
            HAS_BIAS=bias is not None, SPLIT_K=cfg.split_k, BLOCK=block, PDL=pdl, num_warps=4, **pdl_options(pdl),
        )


def prefers_small_m(m: int, n: int, k: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether :func:`linear` routes an ``[m, k] x [n, k]`` product to the Triton kernel.

    On the H200 the kernel beat or tied cuBLAS at every Llama-3-8B shape for
    M = 1..8 (gate_up at M >= 2 within 1%, the rest 3-25% faster), and the decode
    step at batch 64 with its wide tiles, so every half-precision product whose row
    count ROUTED_ROWS holds goes there.
    """
    return device.type == "cuda" and dtype in (torch.bfloat16, torch.float16) and routes_rows(m) and k % 8 == 0


def _routes_small_m(x: torch.Tensor, w: torch.Tensor) -> bool:
    m = x.numel() // x.shape[-1] if x.shape[-1] else 0
    return w.dim() == 2 and w.stride(1) == 1 and x.shape[-1] == w.shape[1] and x.dtype == w.dtype \
        and prefers_small_m(m, w.shape[0], w.shape[1], x.dtype, x.device)


def _unsplit(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether the default launch of this small-batch product gives its epilogue the whole-K
    product (unsplit, or split with the last program reducing: the fused norm, the GLU and
    the residual need it)."""
    return _whole_k(default_config(x.numel() // x.shape[-1], *w.shape, x.device))


def _whole_k(cfg: GemvConfig) -> bool:
    """Whether a launch's epilogue sees each tile's whole-K product (the fused epilogues need it)."""
    return cfg.split_k == 1 or cfg.last_reduces


def _input(x: torch.Tensor | NormedRows, w: torch.Tensor) -> torch.Tensor | NormedRows:
    """A selector's input: a NormedRows only where the small-batch kernel takes it."""
    if isinstance(x, NormedRows) and not (_routes_small_m(x.scaled, w) and _unsplit(x.scaled, w)):
        return x.materialize()
    return x


def linear_add_rms_norm(x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                        eps: float) -> tuple[torch.Tensor | NormedRows, torch.Tensor]:
    """``decoder.linear_add_rms_norm``: ``h = residual + x @ w.T``; -> ``(rms_norm(h), h)``.

    On the small-batch path one GEMV adds the residual and leaves the norm to the next
    GEMV (a :class:`NormedRows`); elsewhere the product and one
    :func:`elementwise.add_rms_norm` pass.
    """
    if _routes_small_m(x, w) and _unsplit(x, w) \
            and _add_norm_problem((*x.shape[:-1], w.shape[0]), x.dtype, residual, weight) is None:
        normed = linear_add_rms_norm_small_m(x, w, residual, weight, eps)
        return normed, normed.x
    return add_rms_norm(linear(x, w), residual, weight, eps)


def linear(x: torch.Tensor | NormedRows, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` with small-batch products routed to :func:`linear_small_m`.

    The decision reads only shapes, dtypes and the device, so it is fixed per
    captured graph.
    """
    x = _input(x, w)
    if _routes_small_m(_rows(x), w):
        return linear_small_m(x, w, bias)
    return F.linear(x, w, bias)


def linear_float(x: torch.Tensor | NormedRows, w: torch.Tensor) -> torch.Tensor:
    """``F.linear(x, w).float()`` (the logits), one launch on the small-batch path."""
    x = _input(x, w)
    if _routes_small_m(_rows(x), w):
        return linear_small_m(x, w, out_dtype=torch.float32)
    return F.linear(x, w).float()


def linear_qkv_rope_write(x: torch.Tensor | NormedRows, w: torch.Tensor, bias: torch.Tensor | None,
                          num_heads: int, q_norm: torch.Tensor | None, k_norm: torch.Tensor | None, eps: float,
                          cos_table: torch.Tensor, sin_table: torch.Tensor, positions: torch.Tensor,
                          write_index: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor) -> torch.Tensor:
    """:func:`flare.model.decoder.linear_qkv_rope_write`: one launch on the small-batch path
    (no q/k norm: Qwen3's needs whole heads), else the GEMM and ``qkv_rope_write``."""
    args = (cos_table, sin_table, positions, write_index, k_pool, v_pool)
    x = _input(x, w)
    rows = _rows(x)
    if q_norm is None and _routes_small_m(rows, w) and rows.dim() == 3 and fuses_qkv_rope(rows, w, k_pool.shape[-1]):
        return linear_qkv_rope_small_m(x, w, bias, num_heads, *args)
    return qkv_rope_write(linear(x, w, bias), num_heads, q_norm, k_norm, eps, *args)


def linear_silu(x: torch.Tensor | NormedRows, w: torch.Tensor) -> torch.Tensor:
    """``silu_mul(F.linear(x, w))`` over the fused gate/up weight, fused on the small-batch path."""
    x = _input(x, w)
    rows = _rows(x)
    if _routes_small_m(rows, w):
        if _unsplit(rows, w):
            return linear_silu_small_m(x, w)
        return silu_mul(linear_small_m(x, w))
    return silu_mul(F.linear(x, w))


__all__ = ["GemvConfig", "MAX_ROWS", "NormedRows", "ROUTED_ROWS", "default_config", "fuses_qkv_rope", "linear",
           "linear_add_rms_norm", "linear_add_rms_norm_small_m", "linear_float", "linear_qkv_rope_small_m",
           "linear_qkv_rope_write", "linear_silu", "linear_silu_small_m", "linear_small_m", "prefers_small_m",
           "routes_rows"]

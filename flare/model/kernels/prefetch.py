"""Pull a weight into L2 while the GPU is busy with latency-bound work.

A small-batch decode step is a weight stream (GEMVs at 95% of the copy ceiling)
broken by short kernels that move almost no bytes: q/k norm + RoPE + KV write,
attention, the norms, SiLU. While those run, HBM idles. The H200 has 50 MB of
L2, more than an o projection of Llama-3-8B (32 MiB), so the next weight can be
streamed into L2 during those gaps and the GEMV that follows reads it from there.

:class:`L2Prefetch` does that inside the captured graph: ``start`` forks a side
stream behind the work already queued (the GEMV that just streamed its weight) and
launches :func:`l2_prefetch` there; ``join`` makes the main stream wait for the side
stream before the GEMV that reads the weight. The prefetch kernel only issues Hopper
bulk prefetches (``cp.async.bulk.prefetch.L2``, 16 KiB each, no registers, no
completion wait), so it ends in about a launch's time and the join costs nothing;
the lines arrive while the main stream's short kernels run. A prefetch is a hint:
it changes no value, only where the GEMV finds its bytes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import require

CHUNK_BYTES = 16384  # one bulk prefetch instruction
# How much of the next weight to ask for: all of it (up to this) across the attention
# stretch of a layer (~10 us at batch 1, ~40 MB of HBM time), only its head across a
# norm or SiLU (~2 us). Untuned first values; tools/bench_gpu.py reports the step time
# with and without prefetching.
LONG_GAP_BYTES = 40 << 20
SHORT_GAP_BYTES = 8 << 20
_CHUNKS_PER_PROGRAM = 32  # one per thread of a one-warp program
_BULK_PREFETCH = tl.constexpr(f"cp.async.bulk.prefetch.L2.global [$1], {CHUNK_BYTES}; // dummy $0")


@triton.jit
def _l2_prefetch_kernel(base_ptr, num_chunks, CHUNK: tl.constexpr, PER_PROGRAM: tl.constexpr):
    chunk = tl.program_id(0) * PER_PROGRAM + tl.arange(0, PER_PROGRAM)
    chunk = tl.minimum(chunk, num_chunks - 1)  # the last program's spare threads repeat the last chunk
    tl.inline_asm_elementwise(_BULK_PREFETCH, "=r,l", [base_ptr + chunk.to(tl.int64) * CHUNK], dtype=tl.int32,
                              is_pure=False, pack=1)


def l2_prefetch(weight: torch.Tensor, max_bytes: int) -> None:
    """Ask for the first ``max_bytes`` of ``weight`` (contiguous, CUDA) to be pulled into L2.

    Whole 16 KiB chunks only: a tail shorter than a chunk is left to the reader.
    """
    kernel = "l2_prefetch"
    require(weight.is_cuda and weight.is_contiguous(), kernel, "weight must be a contiguous CUDA tensor")
    require(weight.data_ptr() % 16 == 0, kernel, "weight must be 16-byte aligned")
    chunks = min(max_bytes, weight.numel() * weight.element_size()) // CHUNK_BYTES
    if chunks == 0:
        return
    raw = weight.view(-1).view(torch.uint8)
    _l2_prefetch_kernel[(triton.cdiv(chunks, _CHUNKS_PER_PROGRAM),)](
        raw, chunks, CHUNK=CHUNK_BYTES, PER_PROGRAM=_CHUNKS_PER_PROGRAM, num_warps=1,
    )


class L2Prefetch:
    """Fork/join of weight prefetches on a side stream (graph-capturable).

    Used only where a step streams weights through GEMVs (at most ``max_rows`` rows);
    larger products are compute-bound and read each weight tile from L2 many times
    anyway. ``start`` and ``join`` always come in pairs, so a capture ends joined.
    """

    long_gap = LONG_GAP_BYTES
    short_gap = SHORT_GAP_BYTES

    def __init__(self, device: torch.device, max_rows: int):
        self.side = torch.cuda.Stream(device)
        self.max_rows = max_rows
        self._open = False

    def applies(self, rows: int) -> bool:
        return rows <= self.max_rows

    def start(self, weight: torch.Tensor, max_bytes: int) -> None:
        require(not self._open, "l2_prefetch", "start without a join of the previous prefetch")
        main = torch.cuda.current_stream(weight.device)
        self.side.wait_stream(main)
        with torch.cuda.stream(self.side):
            l2_prefetch(weight, max_bytes)
        self._open = True

    def join(self) -> None:
        if self._open:
            torch.cuda.current_stream(self.side.device).wait_stream(self.side)
            self._open = False


__all__ = ["CHUNK_BYTES", "LONG_GAP_BYTES", "SHORT_GAP_BYTES", "L2Prefetch", "l2_prefetch"]

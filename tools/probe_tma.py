"""Probe (issue 27): does a TMA-fed weight stream beat the cp.async one at 16-64 rows?

Per-call us of x @ w.T at M rows on the Llama-3-8B shapes (32 distinct weights, graph
replays), three ways: linear_small_m's default launch (plain epilogue), cuBLAS, and a
plain kernel whose weight and x tiles arrive by tensor-memory-accelerator descriptors.
Split launches store fp32 partials and nothing reduces them (main loop only).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_kernels import DEV, LINEARS, graph_us, read_ceiling_gbs  # noqa: E402

from flare.model.kernels import default_config, linear_small_m  # noqa: E402


@triton.jit
def _tma_kernel(x_desc, w_desc, out_ptr, M, N, K, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr):
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    span = K // SPLIT_K
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for k in tl.range(split * span, split * span + span, BLOCK_K, num_stages=STAGES):
        w = w_desc.load([pid_n * BLOCK_N, k])
        x = x_desc.load([0, k])
        acc = tl.dot(w, tl.trans(x), acc)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    res = tl.trans(acc)
    if SPLIT_K == 1:
        tl.store(out_ptr + offs_m[:, None] * N + offs_n[None, :], res.to(tl.bfloat16), mask=(offs_m < M)[:, None])
    else:
        tl.store(out_ptr + (split * M + offs_m[:, None]) * N + offs_n[None, :], res, mask=(offs_m < M)[:, None])


def tma_call(x, w, bn, bk, stages, split, warps=4):
    m, k = x.shape
    n = w.shape[0]
    bm = max(16, triton.next_power_of_2(m))
    out = torch.empty((split * m, n) if split > 1 else (m, n), device=x.device,
                      dtype=torch.float32 if split > 1 else torch.bfloat16)
    xd = TensorDescriptor.from_tensor(x, [bm, bk])
    wd = TensorDescriptor.from_tensor(w, [bn, bk])
    grid = (n // bn, split)

    def call():
        _tma_kernel[grid](xd, wd, out, m, n, k, SPLIT_K=split, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, STAGES=stages,
                          num_warps=warps)
    return call, out


def main() -> None:
    rows = [int(r) for r in (sys.argv[1] if len(sys.argv) > 1 else "64").split(",")]
    gen = torch.Generator(device=DEV).manual_seed(0)
    ceiling = read_ceiling_gbs(8 << 30)[0]
    print(f"read ceiling {ceiling:,.0f} GB/s")
    variants = [(64, 128, 4, 1), (64, 128, 6, 1), (64, 64, 8, 1), (128, 64, 4, 1), (128, 128, 3, 1),
                (64, 128, 4, 2), (64, 64, 8, 2), (128, 64, 4, 2), (128, 128, 3, 2), (64, 128, 4, 4)]
    for name, (n, k) in LINEARS.items():
        ws = [(torch.randn(n, k, device=DEV, generator=gen) / k ** 0.5).bfloat16() for _ in range(32)]
        nbytes = n * k * 2
        pct = lambda us: 100 * nbytes / (us * 1e-6) / 1e9 / ceiling  # noqa: E731
        for m in rows:
            x = torch.randn(m, k, device=DEV, generator=gen).bfloat16()
            ours = graph_us([lambda w=w: linear_small_m(x, w) for w in ws])
            ref = graph_us([lambda w=w: F.linear(x, w) for w in ws])
            cfg = default_config(m, n, k, DEV)
            print(f"{name:>8} M={m:<3} flare {ours:7.2f} us {pct(ours):5.1f}%  ({cfg.mode} {cfg.block_n}x{cfg.block_k} "
                  f"s{cfg.num_stages} split{cfg.split_k})  cublas {ref:7.2f} us {pct(ref):5.1f}%", flush=True)
            want = F.linear(x, ws[0]).float()
            for bn, bk, stages, split in variants:
                if n % bn or k % (bk * split):
                    continue
                try:
                    pairs = [tma_call(x, w, bn, bk, stages, split) for w in ws]
                    pairs[0][0]()
                    got = pairs[0][1].float().view(split, m, n).sum(0)
                    err = float((got - want).abs().max())
                    us = graph_us([c for c, _ in pairs])
                except Exception as exc:  # noqa: BLE001 (a shape the device refuses)
                    print(f"{'':>8} tma {bn}x{bk} s{stages} split{split}: failed {type(exc).__name__}: "
                          f"{str(exc).splitlines()[0][:120]}", flush=True)
                    continue
                print(f"{'':>8} tma {bn:>3}x{bk:<3} s{stages} split{split}: {us:7.2f} us {pct(us):5.1f}%  "
                      f"(max err {err:.3g})", flush=True)


if __name__ == "__main__":
    main()

"""Every Triton kernel launch of the CUDA path compiles for the H200 (sm_90), without a GPU.

The interpreter (tests/kernels/interpreted) checks what the kernels compute, but it
accepts programs that the compiler rejects (a variable bound to a pointer in one
branch of a runtime ``if`` and to an integer in the other, say). Here each kernel
wrapper runs on CPU tensors with Triton's launch intercepted; every intercepted
launch (its argument types, constexprs and launch options) is then compiled to a
cubin for sm_90 by Triton's own compiler and ptxas, which need no device.
"""

from __future__ import annotations

import os
import re
from dataclasses import replace

import pytest
import torch

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip("compilation needs the compiler, not the interpreter", allow_module_level=True)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from flare.model import kernels  # noqa: E402
from flare.model.attention import AttentionBatch  # noqa: E402
from flare.model.kernels import GemvConfig, gemv  # noqa: E402

from .paged_cases import build_case  # noqa: E402

H200 = GPUTarget("cuda", 90, 32)
_TYPES = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32", torch.int64: "*i64",
          torch.bool: "*i1",
          torch.int32: "*i32", torch.uint8: "*u8"}
_OPTIONS = ("num_warps", "num_stages", "launch_pdl", "enable_fp_fusion", "maxnreg")


def _signature(fn: JITFunction, args: tuple, kwargs: dict) -> tuple[dict, dict, dict]:
    bound = dict(zip(fn.arg_names, args)) | {k: v for k, v in kwargs.items() if k in fn.arg_names}
    signature, constexprs = {}, {}
    for i, name in enumerate(fn.arg_names):
        value = bound.get(name, fn.params[i].default if hasattr(fn.params[i], "default") else None)
        if i in fn.constexprs:
            signature[name] = "constexpr"
            constexprs[name] = value
        elif isinstance(value, torch.Tensor):
            signature[name] = _TYPES[value.dtype]
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, int):
            signature[name] = "i32" if -2**31 <= value < 2**31 else "i64"
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            raise TypeError(f"{fn.__name__}: cannot type argument {name}={value!r}")
    options = {k: v for k, v in kwargs.items() if k in _OPTIONS}
    return signature, constexprs, options


@pytest.fixture(params=[("off", 0), ("on", 1), ("on", 2)], ids=["plain", "pdl1", "pdl2"])
def launches(monkeypatch, request):
    """The intercepted launches, each test run without and with programmatic dependent launch."""
    from flare.model.kernels import _common

    mode, level = request.param
    monkeypatch.setattr(_common, "pdl_mode", mode)
    monkeypatch.setattr(_common, "PDL_AUTO_LEVEL", level or _common.PDL_AUTO_LEVEL)
    seen: list[tuple[JITFunction, tuple, dict]] = []

    def intercept(self, *args, grid, warmup, **kwargs):
        seen.append((self, args, kwargs))

    monkeypatch.setattr(JITFunction, "run", intercept)
    return seen


def _specialize(fn: JITFunction, args: tuple, kwargs: dict, signature: dict, constexprs: dict) -> dict:
    """What Triton's launcher assumes of the arguments a real launch passes (the CPU tensors'
    allocations stand in for the device's, which are 256-byte aligned): integers equal to
    1 become constants, and pointers and integers divisible by 16 say so. -> ASTSource attrs."""
    bound = dict(zip(fn.arg_names, args)) | {k: v for k, v in kwargs.items() if k in fn.arg_names}
    attrs = {}
    for i, name in enumerate(fn.arg_names):
        value, kind = bound.get(name), signature[name]
        if kind.startswith("*"):
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif kind in ("i32", "i64") and value == 1:
            signature[name], constexprs[name] = "constexpr", 1
        elif kind in ("i32", "i64") and value % 16 == 0:
            attrs[(i,)] = [["tt.divisibility", 16]]
    return attrs


def _compile_all(seen, ptx: dict[str, list[str]] | None = None, specialize: bool = False) -> list[str]:
    compiled = set()
    for fn, args, kwargs in seen:
        signature, constexprs, options = _signature(fn, args, kwargs)
        attrs = _specialize(fn, args, kwargs, signature, constexprs) if specialize else None
        key = (fn.__name__, tuple(sorted(signature.items())), tuple(sorted(map(repr, constexprs.items()))),
               tuple(sorted(options.items())))
        if key in compiled:
            continue
        options.pop("launch_pdl", None)
        binary = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs),
                                target=H200, options=options)
        assert binary.asm.get("cubin"), f"{fn.__name__}: no cubin"
        if ptx is not None:
            ptx.setdefault(fn.__name__, []).append(binary.asm["ptx"])
        compiled.add(key)
    return sorted({k[0] for k in compiled})


def _bf16(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).bfloat16()


def test_elementwise_kernels_compile_for_sm90(launches):
    x, w = _bf16(4, 4096), _bf16(4096, seed=1)
    kernels.rms_norm(x, w, 1e-5)
    kernels.add_rms_norm(x, _bf16(4, 4096, seed=2), w, 1e-5)
    # prefill chunks: the variance summed in torch's order, a warp a row (64 rows) or 128 lanes (3 rows)
    kernels.add_rms_norm(_bf16(2, 32, 4096), _bf16(2, 32, 4096, seed=2), w, 1e-5)
    kernels.rms_norm(_bf16(1, 3, 4096), w, 1e-5)
    kernels.silu_mul(_bf16(2, 2 * 14336))
    kernels.embed_rms_norm(torch.zeros(4, 1, dtype=torch.int64), _bf16(128256, 4096), w, 1e-5)
    table = torch.randn(4096, 128)
    for norm in (None, _bf16(128)):
        for b, nq in ((8, 1), (2, 256)):  # decode and (cohort) prefill
            pool = torch.zeros(40, 64, 8, 128, dtype=torch.bfloat16)
            kernels.qkv_rope_write(_bf16(b, nq, 48 * 128), 32, norm, norm, 1e-5, table, table,
                                   torch.zeros(b, nq, dtype=torch.int64), torch.zeros(b, nq, dtype=torch.int64),
                                   pool, pool.clone())
    ptx: dict[str, list[str]] = {}
    names = _compile_all(launches, ptx)
    expected = {"_rms_norm_kernel", "_rms_norm_ordered_kernel", "_silu_mul_kernel", "_qkv_rope_write_kernel"}
    assert expected <= set(names), names
    # Rounded as the torch reference rounds: no contracted multiply-add may skip the
    # rounding of a product (a bf16 FMA did, in RoPE, before fusion was turned off), and
    # SiLU divides with the correctly rounded division torch's kernel uses.
    for name, texts in ptx.items():
        for text in texts:
            assert "fma.rn.bf16" not in text, f"{name}: a bf16 multiply-add skips a rounding point"
    assert all("div.rn.f32" in text for text in ptx["_silu_mul_kernel"]), "silu_mul: approximate division"
    # torch squares, then sums: a contracted square-and-add would skip the square's rounding
    assert not any("fma.rn.f32" in text for text in ptx["_rms_norm_ordered_kernel"]), "ordered norm: fused square-add"


def test_gemv_kernels_compile_for_sm90(launches):
    w = _bf16(4096, 4096)
    gate_up = torch.empty(2 * 14336, 4096, dtype=torch.bfloat16)  # only launched, never run
    for rows in (1, 2, 8, 32, 128):  # the wide rows: tensor-core tiles of up to 128 rows
        kernels.linear_small_m(_bf16(rows, 4096), w)
        kernels.linear_silu_small_m(_bf16(rows, 4096), gate_up)
    kernels.linear_small_m(_bf16(1, 4096), w, out_dtype=torch.float32)
    kernels.linear_small_m(_bf16(1, 4096), w, config=GemvConfig(block_n=4, block_k=1024, num_warps=2, mode="fma",
                                                                 preload_tiles=2))
    kernels.linear_small_m(_bf16(1, 4096), w, config=GemvConfig(block_n=4, block_k=1024, num_warps=2, mode="fma",
                                                                 k_fold=8, max_registers=80))
    kernels.linear_small_m(_bf16(4, 1024), _bf16(256, 1024), config=GemvConfig(split_k=4))  # + the split sum
    kernels.linear_small_m(_bf16(2, 4096), w, _bf16(4096), config=GemvConfig(mode="dot"))
    # The add+norm epilogue, and its NormedRows into each consumer (batch 1 is FMA).
    for rows in (1, 2, 64):
        normed = kernels.linear_add_rms_norm_small_m(_bf16(rows, 4096), w, _bf16(rows, 4096, seed=3),
                                                     _bf16(4096, seed=4), 1e-5)
        kernels.linear_small_m(normed, w, out_dtype=torch.float32)
        kernels.linear_silu_small_m(normed, gate_up)
    kernels.linear_small_m(normed, w, config=GemvConfig(mode="dot"))
    table, pool = torch.randn(4096, 128), torch.zeros(40, 64, 8, 128, dtype=torch.bfloat16)
    one = kernels.linear_add_rms_norm_small_m(_bf16(1, 1, 4096), w, _bf16(1, 1, 4096, seed=3), _bf16(4096), 1e-5)
    kernels.linear_qkv_rope_small_m(one, _bf16(48 * 128, 4096), None, 32, table, table,
                                    torch.zeros(1, 1, dtype=torch.int64), torch.zeros(1, 1, dtype=torch.int64),
                                    pool, pool.clone())
    wide = kernels.linear_add_rms_norm_small_m(_bf16(64, 1, 4096), w, _bf16(64, 1, 4096, seed=3), _bf16(4096), 1e-5)
    kernels.linear_qkv_rope_small_m(wide, _bf16(48 * 128, 4096), None, 32, table, table,
                                    torch.zeros(64, 1, dtype=torch.int64), torch.zeros(64, 1, dtype=torch.int64),
                                    pool, pool.clone())
    # Split K with the last program of each tile reducing and running every epilogue, a wide
    # launch without PDL, and wide launches letting the next kernel start after their K loop
    # (with no weight tile or one before the wait).
    for cfg in (GemvConfig(block_n=128, block_k=64, split_k=4, mode="swap", last_reduces=True),
                GemvConfig(block_n=32, block_k=128, split_k=2, mode="dot", last_reduces=True, pdl=False),
                GemvConfig(block_n=128, block_k=64, mode="swap", preload_tiles=0, trigger_after_loop=True),
                GemvConfig(block_n=32, block_k=128, mode="dot", trigger_after_loop=True)):
        normed = kernels.linear_add_rms_norm_small_m(_bf16(64, 1, 4096), w, _bf16(64, 1, 4096, seed=3),
                                                     _bf16(4096, seed=4), 1e-5, config=cfg)
        kernels.linear_silu_small_m(normed, gate_up, config=cfg)
        kernels.linear_small_m(normed, w, config=cfg, out_dtype=torch.float32)
        kernels.linear_qkv_rope_small_m(normed, _bf16(48 * 128, 4096), None, 32, table, table,
                                        torch.zeros(64, 1, dtype=torch.int64), torch.zeros(64, 1, dtype=torch.int64),
                                        pool, pool.clone(), config=replace(cfg, block_n=64))
    kernels.linear_small_m(_bf16(1, 4096), w, config=GemvConfig(block_n=8, block_k=1024, split_k=2, mode="fma",
                                                                 last_reduces=True))
    names = _compile_all(launches)
    assert {"_linear_small_m_kernel", "_sum_splits_kernel"} <= set(names), names


def test_batch1_qkv_default_fits_its_register_cap_without_spilling(launches, monkeypatch, capfd):
    """The batch-1 qkv product's default config caps its registers (GemvConfig.max_registers)
    so that all of Llama-3-8B's programs fit the H200 at once; the cap must not cost local
    memory. ptxas reports the registers and spills of the cubin it writes. Compiled as a
    real launch specializes it (aligned pointers): without that the loads are not
    vectorized and the same kernel spills 340 bytes under the cap."""
    monkeypatch.setattr(triton.knobs.nvidia, "dump_ptxas_log", True)
    monkeypatch.setattr(triton.knobs.compilation, "always_compile", True)
    w = _bf16(48 * 128, 4096)
    cfg = kernels.default_config(1, *w.shape, torch.device("cpu"), gemv.EPILOGUE_ROPE)
    assert cfg.max_registers and cfg.k_fold > 1, cfg
    table, pool = torch.randn(4096, 128), torch.zeros(40, 64, 8, 128, dtype=torch.bfloat16)
    one = kernels.linear_add_rms_norm_small_m(_bf16(1, 1, 4096), _bf16(4096, 4096), _bf16(1, 1, 4096, seed=3),
                                              _bf16(4096), 1e-5)
    launches.clear()
    kernels.linear_qkv_rope_small_m(one, w, None, 32, table, table, torch.zeros(1, 1, dtype=torch.int64),
                                    torch.zeros(1, 1, dtype=torch.int64), pool, pool.clone())
    capfd.readouterr()
    assert _compile_all(launches, specialize=True) == ["_linear_small_m_kernel"]
    log = capfd.readouterr().out
    used = [int(n) for n in re.findall(r"Used (\d+) registers", log)]
    assert used and max(used) <= cfg.max_registers, log
    # 65,536 registers an SM: at least 12 two-warp programs, 1,536 programs in one wave of 132 SMs
    assert 65536 // (max(used) * 32 * cfg.num_warps) * 132 >= 6144 // cfg.block_n, log
    assert re.findall(r"(\d+) bytes spill stores", log) == ["0"] and "0 bytes spill loads" in log, log


def test_two_row_fma_defaults_compile_without_spilling(launches, monkeypatch, capfd):
    """Two decode rows take the FMA tiles (one register accumulator a row): every Llama-3-8B
    launch of a two-row step must compile without local memory, specialized as a real launch."""
    monkeypatch.setattr(triton.knobs.nvidia, "dump_ptxas_log", True)
    monkeypatch.setattr(triton.knobs.compilation, "always_compile", True)
    w, down = torch.empty(4096, 4096, dtype=torch.bfloat16), torch.empty(4096, 14336, dtype=torch.bfloat16)
    table, pool = torch.randn(4096, 128), torch.zeros(40, 64, 8, 128, dtype=torch.bfloat16)
    normed = kernels.linear_add_rms_norm_small_m(_bf16(2, 1, 4096), w, _bf16(2, 1, 4096, seed=3), _bf16(4096), 1e-5)
    kernels.linear_qkv_rope_small_m(normed, torch.empty(48 * 128, 4096, dtype=torch.bfloat16), None, 32, table, table,
                                    torch.zeros(2, 1, dtype=torch.int64), torch.zeros(2, 1, dtype=torch.int64),
                                    pool, pool.clone())
    kernels.linear_silu_small_m(normed, torch.empty(2 * 14336, 4096, dtype=torch.bfloat16))
    kernels.linear_add_rms_norm_small_m(_bf16(2, 1, 14336), down, _bf16(2, 1, 4096, seed=3), _bf16(4096), 1e-5)
    kernels.linear_small_m(normed, torch.empty(128256, 4096, dtype=torch.bfloat16), out_dtype=torch.float32)
    for fn, args, kwargs in launches:
        if fn.__name__ == "_linear_small_m_kernel":
            assert kwargs["MODE"] == gemv.MODE_FMA_ROWS and kwargs["ROWS"] == 2, kwargs
    capfd.readouterr()
    assert _compile_all(launches, specialize=True) == ["_linear_small_m_kernel"]
    log = capfd.readouterr().out
    spills = re.findall(r"(\d+) bytes spill stores", log)
    assert len(spills) >= 4 and set(spills) == {"0"}, log  # o and down may compile to one kernel


def test_attention_kernels_compile_for_sm90(launches):
    decode = build_case(kv_lens=[1, 64, 700], q_len=1, num_heads=32, num_kv_heads=8, head_dim=128,
                        max_pages=12, dtype=torch.bfloat16)
    kernels.paged_decode_attention(decode.q, decode.k_pool, decode.v_pool, decode.batch, decode.scale)
    kernels.paged_decode_attention(decode.q, decode.k_pool, decode.v_pool, decode.batch, decode.scale, num_splits=1)
    merge = replace(kernels.DECODE_LAUNCH, merge_in_kernel=True, balanced_programs_per_sm=0)
    kernels.paged_decode_attention(decode.q, decode.k_pool, decode.v_pool, decode.batch, decode.scale, launch=merge)
    full = replace(kernels.DECODE_LAUNCH, direct_single_split=False)  # every split stored, all merged
    kernels.paged_decode_attention(decode.q, decode.k_pool, decode.v_pool, decode.batch, decode.scale, launch=full)
    # the balanced grid and its merge (3 rows x 8 kv heads x 12 splits: too many programs for the preload)
    balanced = replace(kernels.DECODE_LAUNCH, balanced_programs_per_sm=2)
    kernels.paged_decode_attention(decode.q, decode.k_pool, decode.v_pool, decode.batch, decode.scale,
                                   launch=balanced)
    kernels.paged_decode_attention(decode.q, decode.k_pool, decode.v_pool, decode.batch, decode.scale,
                                   launch=replace(balanced, preload=False))
    kernels.paged_decode_attention(decode.q, decode.k_pool, decode.v_pool, decode.batch, decode.scale,
                                   launch=replace(balanced, merge_in_kernel=True))
    prefill = build_case(kv_lens=[300, 90], q_len=128, num_heads=32, num_kv_heads=8, head_dim=128,
                         max_pages=6, dtype=torch.bfloat16, num_new=[128, 90])
    kernels.paged_prefill_attention(prefill.q, prefill.k_pool, prefill.v_pool, prefill.batch, prefill.scale)
    assert isinstance(prefill.batch, AttentionBatch)
    from flare.model.attention import PackedRows  # a MIXED step's packed rows (the VARLEN variant)
    lens = torch.tensor([128, 90])
    rows = PackedRows(positions=torch.zeros(256, dtype=torch.int64), q_start=torch.cumsum(lens, 0) - lens,
                      q_len=lens, page_table=prefill.batch.page_table, kv_lens=prefill.batch.kv_lens)
    kernels.packed_rows_attention(prefill.q.reshape(-1, 32, 128), prefill.k_pool, prefill.v_pool, rows,
                                  prefill.scale)
    ptx: dict[str, list[str]] = {}
    names = _compile_all(launches, ptx)
    assert {"_paged_attention_kernel", "_merge_splits_kernel", "_balanced_decode_kernel",
            "_balanced_merge_kernel"} <= set(names), names
    # The in-kernel merge: a CTA barrier after the partial stores, then one device-scope
    # acq_rel count, and the last split reads the partials from L2.
    for name in ("_paged_attention_kernel", "_balanced_decode_kernel"):
        merging = [text for text in ptx[name] if "atom.global.gpu.acq_rel.add" in text]
        for text in merging:
            body = text[text.index(".entry"):]
            count = body.index("atom.global.gpu.acq_rel.add")
            assert "bar.sync" in body[:count] and "ld.global.cg" in body[count:], \
                f"{name}: the in-kernel merge lost its barrier, its ordered count or its L2 reads"
        assert merging, f"{name}: no in-kernel merge was compiled"


def test_token_choice_kernels_compile_for_sm90(launches):
    from flare.contract import FRAMES, SAMPLING_COLUMNS
    from flare.model.kernels.sampling import greedy_tokens, sample_tokens, write_logprobs
    from flare.request import MAX_TOP_LOGPROBS

    slots = 65
    counts = torch.zeros(slots, 128256, dtype=torch.int32)
    seeds = torch.zeros(slots, dtype=torch.int64)
    frames = dict(frame=torch.zeros(1, dtype=torch.int64),
                  out_logprobs=torch.zeros(FRAMES, slots, 1 + MAX_TOP_LOGPROBS),
                  out_top_ids=torch.zeros(FRAMES, slots, MAX_TOP_LOGPROBS, dtype=torch.int64))
    for b in (1, 64):
        args = (torch.randn(b, 128256), torch.ones(slots, SAMPLING_COLUMNS), counts, counts.clone(), torch.arange(b),
                torch.ones(b, dtype=torch.bool), torch.zeros(slots, dtype=torch.int64))
        greedy_tokens(*args)
        sample_tokens(*args, seeds, seeds.clone())
        write_logprobs(args[0], args[6][:b], args[4], sampling=args[1], **frames)
    ptx: dict[str, list[str]] = {}
    names = _compile_all(launches, ptx)
    assert {"_penalized_block_max_kernel", "_pick_kernel", "_sample_stats_kernel", "_first_draw_kernel",
            "_first_counts_kernel", "_rounds_kernel", "_logprob_blocks_kernel", "_logprob_rows_kernel"} <= set(names), \
        names
    for name in ("_penalized_block_max_kernel", "_sample_stats_kernel", "_first_draw_kernel",
                 "_first_counts_kernel", "_rounds_kernel"):
        assert all("div.rn.f32" in text and "fma.rn.f32" not in text for text in ptx[name]), \
            f"{name}: penalties and temperature must divide and subtract as the torch reference does"


def test_grammar_mask_kernel_compiles_for_sm90(launches):
    from flare.contract import SAMPLING_COLUMNS, mask_words
    from flare.model.kernels.sampling import apply_grammar_masks

    slots, vocab = 65, 128256
    masks = torch.zeros(slots, mask_words(vocab), dtype=torch.int32)
    for b in (1, 64):
        apply_grammar_masks(torch.randn(b, vocab), torch.ones(slots, SAMPLING_COLUMNS), masks, torch.arange(b))
    names = _compile_all(launches, {})
    assert names == ["_grammar_mask_kernel"], names


def test_slot_bookkeeping_kernels_compile_for_sm90(launches):
    from flare.contract import RECORD_FIELDS, GraphKind
    from flare.model.kernels import slots

    s1, vocab = 65, 128256
    buffers = {"slot.token": torch.zeros(s1, dtype=torch.int64), "slot.position": torch.zeros(s1, dtype=torch.int64),
               "slot.generated": torch.zeros(s1, dtype=torch.int64),
               "slot.generation": torch.zeros(s1, dtype=torch.int64),
               "slot.page_table": torch.zeros(s1, 64, dtype=torch.int64),
               "out.records": torch.zeros(2, s1, RECORD_FIELDS, dtype=torch.int64),
               "step.frame": torch.zeros(1, dtype=torch.int64), "step.tokens": torch.zeros(64, 8, dtype=torch.int64),
               "step.num_tokens": torch.zeros(64, dtype=torch.int64)}
    counts = torch.zeros(s1, vocab, dtype=torch.int32)
    hidden = torch.zeros(s1, 4096, dtype=torch.bfloat16)
    for b, w in ((1, 5), (32, 2)):
        index = torch.arange(b)
        rows = torch.zeros(b * w, 4096, dtype=torch.bfloat16)
        slots.verification_inputs(buffers, index, w, 4096, 64)
        slots.commit_verification(buffers, counts, index, rows, w, logits=torch.zeros(b * w, vocab), hidden=hidden)
        slots.commit_verification(buffers, counts, index, rows, w, token=torch.zeros(b, w, dtype=torch.int64),
                                  accepted=torch.zeros(b, w, dtype=torch.bool), hidden=hidden)
    for b in (1, 64):
        index = torch.arange(b)
        slots.decode_inputs(buffers, index, 4096, 64)
        slots.commit_samples(buffers, torch.zeros(s1, vocab, dtype=torch.int32), index, index,
                             torch.ones(b, dtype=torch.bool), GraphKind.DECODE, index,
                             torch.zeros(b, 4096, dtype=torch.bfloat16),
                             hidden=torch.zeros(s1, 4096, dtype=torch.bfloat16))
        slots.commit_samples(buffers, torch.zeros(s1, vocab, dtype=torch.int32), index, index,
                             torch.ones(b, dtype=torch.bool), GraphKind.PREFILL)
    names = _compile_all(launches)
    assert {"_decode_inputs_kernel", "_commit_kernel", "_verification_inputs_kernel", "_verification_commit_kernel",
            "_block_max_kernel"} <= set(names), names


def test_prefill_norm_holds_its_row_without_spilling(launches, monkeypatch, capfd):
    """The ordered prefill norm loads a whole 4,096-wide row (and its residual) before summing
    it: that must fit in registers, as a real launch specializes it."""
    monkeypatch.setattr(triton.knobs.nvidia, "dump_ptxas_log", True)
    monkeypatch.setattr(triton.knobs.compilation, "always_compile", True)
    kernels.add_rms_norm(_bf16(1, 2048, 4096), _bf16(1, 2048, 4096, seed=2), _bf16(4096, seed=1), 1e-5)
    capfd.readouterr()
    assert _compile_all(launches, specialize=True) == ["_rms_norm_ordered_kernel"]
    log = capfd.readouterr().out
    assert re.findall(r"(\d+) bytes spill stores", log) == ["0"] and "0 bytes spill loads" in log, log

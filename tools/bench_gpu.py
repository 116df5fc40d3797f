#!/usr/bin/env python3
"""GPU speed figures (issue 8) in one process, beside transformers on the same GPU.

1. Make a random-weight bf16 checkpoint of a real shape (default Llama-3-8B) on the
   GPU and export it as a Flare core (skipped when they already exist).
2. transformers, same weights: teacher-forced next-token argmaxes over a random
   sequence, and `generate` with a static cache at batch 1 and 64 (prompt 128, 128
   new tokens), per-step time = (long run - 1-token run) / 127.
3. Flare: load the core with CUDA graphs; teacher-forced agreement (eager forward
   with the serving kernels); batch 1 and batch 64 decode through the runtime, with
   the per-step device time from CUDA events (the median of every step of the
   measured round) and the wall time per step; the HBM floor for the bytes a decode
   step reads.
4. Structured output: the same decode rounds with every row constrained by an extraction
   schema (tools/bench_grammar.py's send_email), beside the unconstrained rounds of step 3;
   the mask kernel's device time, the mask upload (bytes per step and their copy time), the
   host's mask computation per step, and compile / cache-hit times of the 20 schemas.
5. Serving through HTTP: the same loaded model behind the real server, driven by
   tools/bench_serving.py (random prompts 1,024 in, 256 out, 256 requests, concurrency
   64); device busy fraction = measured step time / wall time while all 64 slots are
   live (steady decode), and over the whole run.

Decode figures are judged against the streaming-read ceiling measured in the same run
(read_ceiling_gbs: a read-only kernel over a weight-sized buffer; bs1/bs64_vs_read_floor),
with the copy-ceiling ratio (bs1_vs_floor) kept beside them.

Prints a table, then one JSON line with bs1_ms_per_step, bs1_floor_ms,
bs1_hf_ms_per_step, bs64_tok_s, bs64_hf_tok_s, serving_output_tok_s,
serving_ttft_p50_ms, serving_itl_p50_ms, gpu_busy_fraction (and more).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPES = {
    "llama3-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, rope_theta=500000.0,
                      max_position_embeddings=8192, rms_norm_eps=1e-5, tie_word_embeddings=False),
    "llama3.2-1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                        num_attention_heads=32, num_key_value_heads=8, rope_theta=500000.0,
                        max_position_embeddings=8192, rms_norm_eps=1e-5, tie_word_embeddings=True),
    "llama-1b-test": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=4,
                          num_attention_heads=32, num_key_value_heads=8, rope_theta=500000.0,
                          max_position_embeddings=8192, rms_norm_eps=1e-5, tie_word_embeddings=False),
}
COPY_CEILING_BPS = 4.27e12  # measured device-to-device copy on the H200 (shared/DEVICE.md)
RESULTS: dict = {}


def log(message: str) -> None:
    print(f"[bench_gpu {time.strftime('%H:%M:%S')}] {message}", flush=True)


def save_results(out: Path | None) -> None:
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench_gpu.json").write_text(json.dumps(RESULTS, indent=2))


def make_checkpoint(path: Path, shape: str, tokenizer: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM
    if (path / "config.json").exists():
        return
    t0 = time.perf_counter()
    torch.manual_seed(0)
    config = LlamaConfig(**SHAPES[shape], torch_dtype="bfloat16")
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(path, max_shard_size="4GB")
    shutil.copyfile(tokenizer, path / "tokenizer.json")
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": 128001}))
    del model
    gc.collect()
    torch.cuda.empty_cache()
    log(f"random {shape} checkpoint written in {time.perf_counter() - t0:.1f} s")


def export(checkpoint: Path, core: Path, context: int, *, max_active: int = 64, chunk: int = 512,
           mixed: bool = False) -> None:
    from flare.core.export import ExportOptions, export_core
    if (core / "core.json").exists():
        return
    t0 = time.perf_counter()
    from make_test_core import CHAT_TEMPLATE  # a Llama 3 style chat template, for the chat workload

    export_core(checkpoint, core, ExportOptions(context=context, max_active=max_active, prefill_chunk_size=chunk,
                                                mixed_prefill=mixed, served_names=("bench",), dtype="bfloat16",
                                                chat_template=CHAT_TEMPLATE), log)
    log(f"core exported in {time.perf_counter() - t0:.1f} s")


def hf_part(checkpoint: Path, seq: torch.Tensor, compile_hf: bool, timing: bool = True) -> None:
    from transformers import AutoModelForCausalLM
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16, device_map="cuda",
                                                 attn_implementation="sdpa").eval()
    log(f"transformers loaded in {time.perf_counter() - t0:.1f} s")
    with torch.no_grad():
        RESULTS["hf_argmax"] = model(seq.cuda()[None]).logits[0].argmax(-1).tolist()
        # the same weights in float32: how much bf16 alone moves the argmax of random weights
        model.float()
        RESULTS["hf_fp32_argmax"] = model(seq.cuda()[None]).logits[0].argmax(-1).tolist()
        model.to(torch.bfloat16)
        gc.collect()
        torch.cuda.empty_cache()
    if not compile_hf:
        model.generation_config.disable_compile = True
    rng = torch.Generator().manual_seed(1)
    for batch in (1, 64) if timing else ():
        ids = torch.randint(1000, 120000, (batch, 128), generator=rng).cuda()

        def gen(n: int, model=model, ids=ids) -> float:
            torch.cuda.synchronize()
            start = time.perf_counter()
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                           do_sample=False, cache_implementation="static", pad_token_id=0)
            torch.cuda.synchronize()
            return time.perf_counter() - start

        t0 = time.perf_counter()
        gen(8)  # warm-up (and compilation, when enabled)
        gen(129)
        log(f"transformers batch {batch} warm-up {time.perf_counter() - t0:.1f} s")
        long, short = min(gen(129) for _ in range(2)), min(gen(1) for _ in range(2))
        per_step = (long - short) / 128
        RESULTS[f"bs{batch}_hf_ms_per_step"] = round(per_step * 1e3, 3)
        RESULTS[f"bs{batch}_hf_tok_s"] = round(batch / per_step, 1)
        log(f"transformers batch {batch}: {per_step * 1e3:.2f} ms/step, {batch / per_step:.0f} tok/s")
    RESULTS["hf_compiled"] = compile_hf
    del model
    gc.collect()
    torch.cuda.empty_cache()


def teacher_forced(model, seq: torch.Tensor) -> None:
    """Our serving kernels, eagerly over the whole sequence; argmax at every position.

    The sequence is one fresh prefill chunk, so its attention is torch's SDPA (the call
    transformers makes); what can still differ is the other kernels' rounding and the
    fused qkv and gate/up GEMMs (cuBLAS may pick another algorithm for the wider
    product). Two diagnostic runs separate those: the torch composites in place of
    the fused elementwise kernels, and, on top, each fused GEMM computed as
    transformers' separate projections (row slices of the fused weight).
    """
    from dataclasses import replace

    import torch.nn.functional as F

    from flare.model import decoder as decoder_module
    from flare.model import layers
    from flare.model.attention import AttentionBatch
    programs = model.loaded.programs
    decoder = programs.decoder
    spec = decoder.spec
    t = seq.shape[0]
    pages = torch.arange(1, t // 64 + 2, device="cuda")  # physical pages 1.. (scratch is 0)
    positions = torch.arange(t, device="cuda")[None]
    batch = AttentionBatch(positions=positions, write_index=(pages[positions // 64] * 64 + positions % 64),
                           page_table=pages[None], kv_lens=torch.tensor([t], device="cuda"))
    qkv_rows = [spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim,
                spec.num_kv_heads * spec.head_dim]

    def split_linear(x, w, bias=None):
        if bias is None and w.shape[0] in (sum(qkv_rows), 2 * spec.intermediate_size):
            sizes = qkv_rows if w.shape[0] == sum(qkv_rows) else [spec.intermediate_size] * 2
            return torch.cat([F.linear(x, part) for part in w.split(sizes)], dim=-1)
        return F.linear(x, w, bias)

    serving_ops = decoder.ops
    torch_elementwise = replace(serving_ops, rms_norm=layers.rms_norm, embed_rms_norm=decoder_module.embed_rms_norm,
                                add_rms_norm=decoder_module.add_rms_norm,
                                linear_add_rms_norm=decoder_module.linear_add_rms_norm,
                                linear_silu=decoder_module.linear_silu,
                                linear_qkv_rope_write=decoder_module.linear_qkv_rope_write)
    split_gemms = replace(torch_elementwise, linear=split_linear,
                          linear_silu=lambda x, w: layers.silu_mul(split_linear(x, w)),
                          linear_qkv_rope_write=lambda x, w, b, *rest: decoder_module.qkv_rope_write(
                              split_linear(x, w, b), *rest))
    variants = {"": serving_ops, "_torch_elementwise": torch_elementwise,
                "_torch_elementwise_split_gemms": split_gemms}
    argmaxes = {}
    try:
        for name, ops in variants.items():
            decoder.ops = ops
            with torch.inference_mode():
                hidden = decoder.forward(seq.cuda()[None], batch, programs.kv, torch.arange(t, device="cuda")[None])
                argmaxes[name] = decoder.logits(hidden[0]).argmax(-1).tolist()
    finally:
        decoder.ops = serving_ops
    ref = RESULTS.pop("hf_argmax")
    ref32 = RESULTS.pop("hf_fp32_argmax")

    def agreement(a, b):
        return round(sum(x == y for x, y in zip(a, b)) / len(b), 4)

    for name, ours in argmaxes.items():
        RESULTS[f"teacher_forced_agreement{name}"] = agreement(ours, ref)
    RESULTS["teacher_forced_agreement_vs_fp32"] = agreement(argmaxes[""], ref32)
    RESULTS["hf_bf16_vs_fp32_agreement"] = agreement(ref, ref32)
    log(f"teacher-forced next-token argmax agreement over {len(ref)} positions: flare vs transformers bf16 "
        f"{RESULTS['teacher_forced_agreement']} (torch elementwise ops "
        f"{RESULTS['teacher_forced_agreement_torch_elementwise']}, and split GEMMs "
        f"{RESULTS['teacher_forced_agreement_torch_elementwise_split_gemms']}), flare vs transformers fp32 "
        f"{RESULTS['teacher_forced_agreement_vs_fp32']}, transformers bf16 vs fp32 "
        f"{RESULTS['hf_bf16_vs_fp32_agreement']}")


@contextlib.contextmanager
def observed_steps(sched):
    """Every CUDA-event step time the scheduler observes while inside, by graph index."""
    observed: dict[int, list[int]] = {}

    def observe(graph_index: int, duration_ns: int, now: float, _original=sched.timing.observe) -> None:
        observed.setdefault(graph_index, []).append(duration_ns)
        _original(graph_index, duration_ns, now)

    sched.timing.observe = observe
    try:
        yield observed
    finally:
        del sched.timing.observe  # the class's method again


def decode_runs(model) -> None:
    sched = model.runtime.scheduler
    contract = model.loaded.contract
    spec = model.core.recipe
    rng = np.random.default_rng(2)
    # The reported figure is the median of the measured round's step times (the scheduler's
    # own estimate, the median of the last nine, is printed beside it).
    with observed_steps(sched) as observed:
        _decode_rounds(model, sched, contract, rng, observed)
    # bytes a decode step must read: every weight but the embedding table (one row), plus the KV;
    # under tensor parallel each GPU reads its own share of both (the replicated norms are 0.5 MB)
    world = RESULTS.get("tensor_parallel", 1)
    weight_bytes = (spec.num_params - spec.vocab_size * spec.hidden_size) * 2 // world
    kv_row = 2 * spec.num_layers * 192 * spec.num_kv_heads * spec.head_dim * 2 // world  # ~192 cached positions
    floor = (weight_bytes + kv_row) / COPY_CEILING_BPS * 1e3
    RESULTS["bs1_floor_ms"] = round(floor, 3)
    RESULTS["bs1_vs_floor"] = round(RESULTS["bs1_ms_per_step"] / floor, 3)
    log(f"HBM floor for a batch-1 step ({(weight_bytes + kv_row) / 1e9:.2f} GB a GPU at 4.27 TB/s copy): "
        f"{floor:.3f} ms -> {RESULTS['bs1_vs_floor']:.3f}x")
    # The streaming-read ceiling of this run (issue 27): a read-only kernel over a weight-sized
    # buffer, or what free memory allows beside the loaded model.
    from bench_kernels import read_ceiling_gbs

    free = torch.cuda.mem_get_info()[0]
    size = int(min(weight_bytes, free - (2 << 30)))
    read_gbs, shapes = read_ceiling_gbs(size)
    RESULTS["read_ceiling_gbs"] = round(read_gbs, 1)
    RESULTS["read_ceiling_buffer_gb"] = round(size / 1e9, 2)
    for batch in (1, 64):
        read_floor = (weight_bytes + batch * kv_row) / (read_gbs * 1e9) * 1e3
        RESULTS[f"bs{batch}_read_floor_ms"] = round(read_floor, 3)
        RESULTS[f"bs{batch}_vs_read_floor"] = round(RESULTS[f"bs{batch}_ms_per_step"] / read_floor, 3)
        log(f"read floor for a batch-{batch} step at {read_gbs:,.0f} GB/s (read over {size / 1e9:.2f} GB): "
            f"{read_floor:.3f} ms -> {RESULTS[f'bs{batch}_vs_read_floor']:.3f}x")


def _decode_rounds(model, sched, contract, rng, observed: dict[int, list[int]]) -> None:
    from flare.contract import GraphKind
    from flare.request import PreparedPrompt, SamplingParams, TokenEvent

    for batch in (1, 64):
        times: dict[int, list[float]] = {}
        done = threading.Event()
        finished = [0]

        def make_sink(i, times=times, done=done, finished=finished, batch=batch):
            def sink(event):
                if isinstance(event, TokenEvent):
                    times.setdefault(i, []).append(time.perf_counter())
                else:  # FinishEvent or ErrorEvent ends the request
                    finished[0] += 1
                    if finished[0] == batch:
                        done.set()
            return sink

        for _ in range(2):  # the first round measures and warms every graph it uses
            times.clear()
            observed.clear()
            finished[0] = 0
            done.clear()
            for i in range(batch):
                prompt = PreparedPrompt(rng.integers(1000, 120000, 128).astype(np.int32))
                model.submit(prompt, SamplingParams(max_tokens=129, temperature=0.0, ignore_eos=True), make_sink(i))
            if not done.wait(600):
                raise RuntimeError("decode run did not finish")
        # greedy requests without logprobs run the greedy decode variant
        graph = contract.graph(GraphKind.DECODE, next(b for b in contract.batch_capacities if b >= batch),
                               greedy=True)
        # The figure is the median of every step of the measured round, timed with CUDA
        # events by the scheduler: the round's cached lengths run from 128 to 256 keys,
        # 192 on average, as the floor assumes. The scheduler's own estimate (the median of
        # the last nine steps, the longest contexts) is kept beside it.
        steps = np.array(observed.get(graph.index, []), dtype=np.float64) / 1e6
        if steps.size < 64:
            raise RuntimeError(f"batch {batch}: only {steps.size} timed steps of decode graph {graph.index}")
        p10, p50, p90 = np.percentile(steps, [10, 50, 90])
        last9_ms = sched.timing.estimate_ns(graph.index) / 1e6
        gaps = [b - a for ts in times.values() for a, b in zip(ts[len(ts) // 4:], ts[len(ts) // 4 + 1:])]
        wall_ms = float(np.median(gaps)) * 1e3
        RESULTS[f"bs{batch}_steady_wall_ms_per_step"] = round(steady_gap_ms(times), 3)
        RESULTS[f"bs{batch}_ms_per_step"] = round(float(p50), 3)
        RESULTS[f"bs{batch}_round_ms_p10_p50_p90"] = [round(float(v), 3) for v in (p10, p50, p90)]
        RESULTS[f"bs{batch}_ms_per_step_last9"] = round(last9_ms, 3)
        RESULTS[f"bs{batch}_wall_ms_per_step"] = round(wall_ms, 3)
        RESULTS[f"bs{batch}_tok_s"] = round(batch / (wall_ms / 1e3), 1)
        log(f"flare batch {batch}: {p50:.3f} ms/step on the device (median of the round's {steps.size} CUDA-event "
            f"step times; p10 {p10:.3f}, p90 {p90:.3f}, last nine {last9_ms:.3f}), {wall_ms:.3f} ms/step wall, "
            f"{batch / (wall_ms / 1e3):.0f} tok/s")


def structured_runs(model, out: Path | None = None) -> None:
    """Decode with every row grammar-constrained, beside the unconstrained figures of
    decode_runs (same prompts' shape, same lengths, same run)."""
    from bench_grammar import SCHEMAS

    from flare.contract import SAMPLING_COLUMNS, SAMPLING_GRAMMAR
    from flare.engine import runtime as runtime_module
    from flare.frontend.grammar import GrammarCompiler
    from flare.request import GrammarRequest

    core = model.core
    # compile: the 20 schemas on a fresh compiler (its token tries built first, timed apart)
    compiler = GrammarCompiler(core.asset("tokenizer.json"), "bench",
                               core.recipe.eos_token_ids, model.loaded.contract.vocab_size)
    t0 = time.perf_counter()
    compiler.warm()
    RESULTS["grammar_tokenizer_setup_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
    compile_ms, hit_ms, refused = [], [], []
    for name, schema in SCHEMAS.items():
        request = GrammarRequest("json_schema", schema)
        t0 = time.perf_counter()
        try:
            compiler.compile(request)
        except Exception as exc:  # noqa: BLE001 - a refused schema is reported, not fatal
            refused.append(f"{name}: {exc}")
            continue
        compile_ms.append((time.perf_counter() - t0) * 1e3)
        for _ in range(20):
            t0 = time.perf_counter()
            compiler.compile(request)
            hit_ms.append((time.perf_counter() - t0) * 1e3)
    RESULTS["grammar_compile_ms_median_p90_max"] = [round(float(v), 3) for v in
                                                    (np.median(compile_ms), np.percentile(compile_ms, 90),
                                                     max(compile_ms))]
    RESULTS["grammar_cache_hit_ms_median"] = round(float(np.median(hit_ms)), 4)
    RESULTS["grammar_refused"] = refused
    log(f"grammar compile over {len(compile_ms)} schemas: median {np.median(compile_ms):.2f} ms, "
        f"p90 {np.percentile(compile_ms, 90):.2f}, max {max(compile_ms):.2f}; cache hit "
        f"{np.median(hit_ms) * 1e3:.1f} us; refused: {refused}")

    # the mask kernel alone: [b, V] logits, every row constrained, then none
    programs = model.loaded.programs
    vocab, s1 = model.loaded.contract.vocab_size, model.loaded.contract.max_active + 1
    masks = torch.randint(-2**31, 2**31 - 1, tuple(programs.buffers["slot.grammar_mask"].shape),
                          dtype=torch.int32, device="cuda")
    for batch in (1, 64):
        for flag in (1.0, 0.0):
            sampling = torch.zeros(s1, SAMPLING_COLUMNS, device="cuda")
            sampling[:, SAMPLING_GRAMMAR] = flag
            logits = torch.randn(batch, vocab, device="cuda")
            slots = torch.arange(1, batch + 1, device="cuda")
            programs.apply_grammar_masks(logits, sampling, masks, slots)
            # 100 launches in one CUDA graph, as the step replays it: device time, not launch cost
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(100):
                    programs.apply_grammar_masks(logits, sampling, masks, slots)
            graph.replay()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            torch.cuda.synchronize()
            key = f"grammar_kernel_bs{batch}_{'constrained' if flag else 'free'}_us"
            RESULTS[key] = round(start.elapsed_time(end) * 10, 2)  # ms per 100 launches -> us per launch
    log("mask kernel: " + ", ".join(f"{k} {v}" for k, v in RESULTS.items() if k.startswith("grammar_kernel")))

    # host mask computation per step, measured inside the runtime
    fill_s: list[float] = []
    original_fill = runtime_module.fill_masks

    def timed_fill(matchers):
        t0 = time.perf_counter()
        original_fill(matchers)
        if matchers:
            fill_s.append(time.perf_counter() - t0)

    runtime_module.fill_masks = timed_fill
    schema = SCHEMAS["send_email"]
    sched = model.runtime.scheduler
    # the model thread's host work per step, by phase (instance attributes shadow the methods)
    runtime = model.runtime
    phases: dict[str, list[float]] = {}

    def timed(name, method):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                phases.setdefault(name, []).append(time.perf_counter() - t0)
        return wrapper

    patched = {(runtime, "_advance_grammars"), (runtime, "_release_held"), (runtime, "_publish"),
               (sched, "complete"), (sched, "plan"), (sched, "commit"), (runtime.executor, "submit"),
               (runtime.executor, "release")}
    for owner, name in patched:
        setattr(owner, name, timed(name, getattr(owner, name)))
    rng = np.random.default_rng(5)
    from flare.frontend.grammar import matcher as matcher_module
    default_executor = matcher_module._parallel()

    def medians_us() -> dict[str, float]:
        return {name: round(float(np.median(v)) * 1e6, 1) for name, v in sorted(phases.items())}

    with observed_steps(sched) as observed:
        try:
            for batch in (1, 64):
                phases.clear()
                _structured_round(model, batch, schema, rng, observed, fill_s)
                RESULTS[f"structured_bs{batch}_host_us"] = medians_us()
                log(f"structured batch {batch} host phases (median us per call): "
                    f"{RESULTS[f'structured_bs{batch}_host_us']}")
            # the grammar engine's thread pool size against batch 64's host turn
            import llguidance
            for threads in (2, 4, 8):
                matcher_module._executor = llguidance.LLExecutor(num_threads=threads)
                phases.clear()
                _structured_round(model, 64, schema, rng, observed, fill_s, label=f"threads{threads}")
                RESULTS[f"structured_bs64_threads{threads}_host_us"] = medians_us()
                log(f"  {threads} grammar threads: {RESULTS[f'structured_bs64_threads{threads}_host_us']}")
            matcher_module._executor = default_executor
            if out is not None:  # where a grammar step's host turn goes (cProfile: slower, proportions only)
                import cProfile
                import io
                import pstats

                profiler = cProfile.Profile()
                complete = runtime._complete

                def profiled(*args, **kwargs):
                    profiler.enable()
                    try:
                        return complete(*args, **kwargs)
                    finally:
                        profiler.disable()

                runtime._complete = profiled
                try:
                    _structured_round(model, 64, schema, rng, observed, fill_s, label="profiled")
                finally:
                    del runtime._complete
                text = io.StringIO()
                pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(40)
                (out / "profile_structured_b64.txt").write_text(text.getvalue())
        finally:
            matcher_module._executor = default_executor
            runtime_module.fill_masks = original_fill
            for owner, name in patched:
                delattr(owner, name)


def _structured_round(model, batch, schema, rng, observed, fill_s, label: str = "") -> None:
    from flare.contract import GraphKind
    from flare.request import FinishEvent, GrammarRequest, PreparedPrompt, SamplingParams, TokenEvent

    contract = model.loaded.contract
    runtime = model.runtime
    request = GrammarRequest("json_schema", schema)
    graph = contract.graph(GraphKind.DECODE, next(b for b in contract.batch_capacities if b >= batch), greedy=True)
    for _ in range(2):  # warm, then measured
        times: dict[int, list[float]] = {}
        finishes: list[tuple[float, int, str]] = []
        done = threading.Event()
        observed.clear()
        fill_s.clear()
        uploaded0, steps0 = runtime.inputs.uploaded_bytes, runtime.counters.grammar_steps
        held0 = runtime.counters.grammar_held_steps

        def make_sink(i):
            def sink(event):
                now = time.perf_counter()
                if isinstance(event, TokenEvent):
                    times.setdefault(i, []).append(now)
                else:
                    finishes.append((now, i, event.reason if isinstance(event, FinishEvent) else repr(event)))
                    if len(finishes) == batch:
                        done.set()
            return sink

        for i in range(batch):
            prompt = PreparedPrompt(rng.integers(1000, 120000, 128).astype(np.int32))
            params = SamplingParams(max_tokens=129, temperature=0.0, ignore_eos=True, grammar=request)
            model.submit(prompt, params, make_sink(i), model.grammars.compile(request).matcher())
        if not done.wait(600):
            raise RuntimeError("structured decode run did not finish")
    first_end = min(t for t, _, _ in finishes)
    gaps = [b - a for ts in times.values() for a, b in zip(ts[len(ts) // 4:], ts[len(ts) // 4 + 1:]) if b < first_end]
    if not gaps:
        gaps = [b - a for ts in times.values() for a, b in zip(ts, ts[1:])]
    wall_ms = float(np.median(gaps)) * 1e3
    steps = np.array(observed.get(graph.index, []), dtype=np.float64) / 1e6
    grammar_steps = runtime.counters.grammar_steps - steps0
    upload_kb = (runtime.inputs.uploaded_bytes - uploaded0) / max(1, grammar_steps) / 1024
    tokens = [len(ts) for ts in times.values()]
    by_grammar = sum(1 for _, _, reason in finishes if reason == "stop")
    free_wall = RESULTS.get(f"bs{batch}_wall_ms_per_step")
    steady_ms = steady_gap_ms(times)
    free_steady = RESULTS.get(f"bs{batch}_steady_wall_ms_per_step")
    key = f"structured_bs{batch}{'_' + label if label else ''}"
    RESULTS[f"{key}_steady_wall_ms_per_token"] = round(steady_ms, 3)
    RESULTS[f"{key}_steady_vs_free"] = round(steady_ms / free_steady, 3) if free_steady else None
    log(f"structured batch {batch}{' (' + label + ')' if label else ''}: steady {steady_ms:.3f} ms/token "
        f"(free steady {free_steady}) -> {RESULTS[f'{key}_steady_vs_free']}x")
    if label:  # a variant: its wall time and ratio only
        RESULTS[f"structured_bs{batch}_{label}_wall_ms_per_token"] = round(wall_ms, 3)
        RESULTS[f"structured_bs{batch}_{label}_vs_free_wall"] = round(wall_ms / free_wall, 3) if free_wall else None
        log(f"structured batch {batch} ({label}): {wall_ms:.3f} ms/token wall -> "
            f"{RESULTS[f'structured_bs{batch}_{label}_vs_free_wall']}x")
        return
    RESULTS[f"structured_bs{batch}_wall_ms_per_token"] = round(wall_ms, 3)
    RESULTS[f"structured_bs{batch}_ms_per_step"] = round(float(np.median(steps)), 3) if steps.size else None
    RESULTS[f"structured_bs{batch}_vs_free_wall"] = round(wall_ms / free_wall, 3) if free_wall else None
    RESULTS[f"structured_bs{batch}_host_mask_ms_per_step"] = round(float(np.median(fill_s)) * 1e3, 3) if fill_s \
        else None
    RESULTS[f"structured_bs{batch}_upload_kb_per_step"] = round(upload_kb, 1)
    RESULTS[f"structured_bs{batch}_held_share"] = round((runtime.counters.grammar_held_steps - held0)
                                                        / max(1, grammar_steps), 3)
    RESULTS[f"structured_bs{batch}_mean_tokens"] = round(float(np.mean(tokens)), 1)
    RESULTS[f"structured_bs{batch}_ended_by_grammar"] = by_grammar
    # the upload's own copy time: that many bytes, pinned host -> device, timed with events
    nbytes = max(1, int(upload_kb * 1024))
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dev.copy_(host, non_blocking=True)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        dev.copy_(host, non_blocking=True)
    end.record()
    torch.cuda.synchronize()
    RESULTS[f"structured_bs{batch}_upload_copy_us"] = round(start.elapsed_time(end) / 20 * 1e3, 1)
    log(f"structured batch {batch}: {wall_ms:.3f} ms/token wall (free: {free_wall} -> "
        f"{RESULTS[f'structured_bs{batch}_vs_free_wall']}x), device {RESULTS[f'structured_bs{batch}_ms_per_step']} "
        f"ms/step (free: {RESULTS.get(f'bs{batch}_ms_per_step')}), host masks "
        f"{RESULTS[f'structured_bs{batch}_host_mask_ms_per_step']} ms/step, upload {upload_kb:.1f} KiB/step "
        f"({RESULTS[f'structured_bs{batch}_upload_copy_us']} us), {np.mean(tokens):.1f} tokens/request, "
        f"{by_grammar} of {batch} ended by the grammar")


def steady_gap_ms(times: dict[int, list[float]]) -> float:
    """Median token gap while every request of a round is decoding: after the last one's
    first token, before the first one's last token (admission and drain excluded)."""
    start = max(ts[0] for ts in times.values())
    end = min(ts[-1] for ts in times.values())
    gaps = [b - a for ts in times.values() for a, b in zip(ts, ts[1:]) if a >= start and b <= end]
    if not gaps:  # batch 1, or no overlap: the round's second half
        gaps = [b - a for ts in times.values() for a, b in zip(ts[len(ts) // 2:], ts[len(ts) // 2 + 1:])]
    return float(np.median(gaps)) * 1e3


def serving(model, args) -> None:
    from busy import serve_and_measure

    from flare.engine.native import NativeEngine, load_frontend

    engine = NativeEngine(model, load_frontend(model.core), ("bench",))
    run = serve_and_measure(engine, full=min(args.concurrency, model.loaded.contract.max_active),
                            requests=args.requests, concurrency=args.concurrency, input_len=args.input_len,
                            output_len=args.output_len, vocab=args.prompt_vocab, queue_capacity=512, timeout=600)
    print(run.summary, flush=True)
    RESULTS.update({f"serving_{k}": v for k, v in run.result.items() if k not in ("errors",)})
    RESULTS["serving_errors"] = run.result.get("errors")
    RESULTS["gpu_busy_fraction"] = round(run.busy_steady, 3)
    RESULTS["gpu_busy_steady_s"] = round(run.steady_s, 1)
    RESULTS["gpu_busy_fraction_whole_run"] = round(run.busy_whole, 3)
    log(f"serving: {run.result['output_tok_s']} output tok/s; device busy {run.busy_steady:.1%} of "
        f"{run.steady_s:.1f} s with all {run.full} slots live, {run.busy_whole:.1%} of the whole {run.wall_s:.1f} s")


def gemm_rate(model, tokens: int = 2048, seconds: float = 4.0) -> tuple[float, float]:
    """Prompt tokens per second that torch's bf16 GEMMs of this model's layers reach at
    ``tokens``-token batches (every layer's qkv, o, gate_up and down; no attention, no
    elementwise work): the compute floor of a prefill token. Two figures from one run of
    back-to-back passes lasting ``seconds``: the burst rate (the best pass, the first ones,
    at full clocks) and the sustained rate (the median pass of the second half). Under load
    the H200 holds its 700 W cap by lowering the SM clock (1,980 -> ~1,500 MHz in
    docs/benchmarks.md's probe): the sustained rate is what a busy server can have."""
    import torch.nn.functional as F

    weights = [lw[name] for lw in model.loaded.decoder.layers for name in ("qkv", "o", "gate_up", "down")]
    inputs = {w.shape[1]: torch.randn(tokens, w.shape[1], dtype=w.dtype, device=w.device) for w in weights}

    def forward():
        for w in weights:
            F.linear(inputs[w.shape[1]], w)

    forward()
    torch.cuda.synchronize()
    time.sleep(1.0)  # let the clocks recover from whatever ran before: the burst rate needs them
    passes = []
    begin = time.perf_counter()
    while time.perf_counter() - begin < seconds:  # ten passes a sync keeps the host ahead of the device
        events = [torch.cuda.Event(enable_timing=True) for _ in range(11)]
        events[0].record()
        for e in events[1:]:
            forward()
            e.record()
        torch.cuda.synchronize()
        passes += [a.elapsed_time(b) * 1e-3 for a, b in zip(events, events[1:])]
    steady = sorted(passes[len(passes) // 2:])[len(passes) // 4]
    return tokens / min(passes), tokens / steady


SUITE = {  # issue 23's workloads: (requests, concurrency, bench_serving.py arguments); each its own prompts
    "prefill_only": (256, 64, ("--workload", "fixed", "--input-len", "1024", "--output-len", "1", "--seed", "1")),
    "a": (256, 64, ("--workload", "fixed", "--input-len", "1024", "--output-len", "256", "--seed", "2")),
    "b": (256, 256, ("--workload", "fixed", "--input-len", "1024", "--output-len", "256", "--seed", "3")),
    "c": (1000, 128, ("--workload", "mixed", "--min-input", "50", "--max-input", "2000", "--min-output", "20",
                      "--max-output", "1000", "--seed", "4")),
    "d": (256, 64, ("--workload", "chat", "--system-len", "2000", "--input-len", "100", "--output-len", "128",
                    "--turns", "4", "--seed", "5")),
    # (a) and (b) at temperature 1: the decode cohorts run the sampling variant's graphs (prompts
    # of their own: with (a)'s, the prefix cache would hold every prompt of a run after (a))
    "a_t1": (256, 64, ("--workload", "fixed", "--input-len", "1024", "--output-len", "256", "--seed", "6",
                       "--temperature", "1.0")),
    "b_t1": (256, 256, ("--workload", "fixed", "--input-len", "1024", "--output-len", "256", "--seed", "7",
                        "--temperature", "1.0")),
}


def decode_step_s(model, rows: int) -> float:
    """The measured device time of the decode graph that holds ``rows`` rows (the scheduler's
    median estimate, from this run's own steps; the faster variant when both served steps).
    A variant that served none still holds its seed, timed at load over short contexts, which
    would understate a step at the workload's contexts: seeds count only when no variant ran."""
    sched = model.runtime.scheduler
    general, greedy = sched.decode_graph_for[min(rows, len(sched.decode_graph_for) - 1)]
    graphs = [g.index for g in (general, greedy) if g is not None and sched.timing.estimate_ns(g.index)]
    served = [g for g in graphs if not sched.timing.is_seeded(g)]
    measured = [sched.timing.estimate_ns(g) for g in (served or graphs)]
    return min(measured) * 1e-9 if measured else float("nan")


def serving_suite(model, args) -> None:
    """Issue 23's serving workloads through HTTP, each beside its bound from this run's sustained
    GEMM rate and decode step time: a step carries prompt tokens at the GEMM rate at best, and a
    request's output tokens take one step each, a step costing at least the decode step of the
    rows it carries, so wall >= max(prompt + output tokens over the GEMM rate, sequential decode
    steps x decode step time)."""
    from busy import start_server

    from flare.engine.native import NativeEngine, load_frontend

    burst, rate = gemm_rate(model)
    RESULTS["gemm_prompt_tok_s"] = round(rate)
    RESULTS["gemm_prompt_tok_s_burst"] = round(burst)
    log(f"torch bf16 GEMMs of the model's layers at 2,048-token batches: {rate:,.0f} tokens/s sustained "
        f"(the median pass of the second half of 4 s back to back), {burst:,.0f} at the burst (best pass)")
    engine = NativeEngine(model, load_frontend(model.core), ("bench",))
    max_active = model.loaded.contract.max_active
    session = start_server(engine, queue_capacity=1024)
    try:
        _run_suite(model, engine, session, rate, max_active, args)
    finally:
        session.close(grace_s=1.0)
    profile_mixed(model, args.out)


def _run_suite(model, engine, session, rate: float, max_active: int, args) -> None:
    from busy import measure

    for name in args.suite.split(","):
        requests, concurrency, load = SUITE[name]
        try:
            run = measure(engine, session, full=min(concurrency, max_active), requests=requests,
                          concurrency=concurrency, input_len=args.input_len, output_len=args.output_len,
                          vocab=args.prompt_vocab, timeout=600, load_args=load)
        except RuntimeError as exc:
            log(f"({name}) failed: {exc}")
            RESULTS[f"suite_{name}"] = {"error": str(exc)[-1500:]}
            continue
        r = run.result
        live = min(concurrency, max_active)
        step = decode_step_s(model, live)
        prompt = r.get("prompt_tokens", 0) - r.get("cached_tokens", 0)
        per_request = r["output_tokens"] / max(1, r["requests"] - r["failed"])
        waves = -(-r["requests"] // live)
        decode_steps = waves * per_request
        bound_s = max((prompt + r["output_tokens"]) / rate, decode_steps * step)
        # A tighter floor: every token through the GEMMs at their rate, plus what a decode step
        # costs beyond its weight read at this load (its KV reads, which grow with the
        # context): the serving decode step less the short-context one of decode_runs.
        kv_s = max(0.0, step - RESULTS.get("bs64_ms_per_step", 0.0) * 1e-3)
        floor_s = (prompt + r["output_tokens"]) / rate + decode_steps * kv_s
        # beside it, for history: the bound at the burst GEMM rate (the figure before 2026-12-04)
        burst = RESULTS.get("gemm_prompt_tok_s_burst", rate)
        burst_bound_s = max((prompt + r["output_tokens"]) / burst, decode_steps * step)
        r.update(bound_burst_s=round(burst_bound_s, 2), vs_bound_burst=round(burst_bound_s / r["wall_s"], 3))
        r.update(bound_s=round(bound_s, 2), vs_bound=round(bound_s / r["wall_s"], 3),
                 floor_s=round(floor_s, 2), vs_floor=round(floor_s / r["wall_s"], 3),
                 decode_step_ms=round(step * 1e3, 2), busy_steady=round(run.busy_steady, 3),
                 prompt_tok_s=round(r.get("prompt_tokens", 0) / r["wall_s"]))
        RESULTS[f"suite_{name}"] = r
        log(f"({name}) {run.summary}; total {r['total_tok_s']} tok/s, prompt {r['prompt_tok_s']} tok/s; bound "
            f"{bound_s:.2f} s -> {r['vs_bound']:.0%} of it, floor with KV reads {floor_s:.2f} s -> "
            f"{r['vs_floor']:.0%} (decode step {step * 1e3:.2f} ms at {live} rows); at the burst GEMM rate "
            f"{burst_bound_s:.2f} s -> {r['vs_bound_burst']:.0%}"
            + (f"; cached share {r['cached_share']} (ideal {r['ideal_cached_share']})" if "cached_share" in r else ""))
        save_results(args.out)
    sched = model.runtime.scheduler
    RESULTS["suite_launches"] = {k.name.lower(): v for k, v in sched.launches.items() if v}
    estimates = {g.label: round(sched.timing.estimate_ns(g.index) * 1e-6, 3) for g in model.loaded.contract.graphs
                 if sched.timing.estimate_ns(g.index)}
    RESULTS["suite_graph_ms"] = estimates
    log("measured graphs (ms): " + ", ".join(f"{k} {v}" for k, v in estimates.items()
                                             if k.startswith(("mixed", "prefill", "decode b64", "decode b256"))))


def load_graph_times(model) -> None:
    """The decode graphs' replay times measured at load (the scheduler's seeded estimates),
    the sampling variant beside the greedy one: what a temperature > 0 cohort pays a step."""
    from flare.contract import GraphKind

    sched = model.runtime.scheduler
    times = {}
    for g in model.loaded.contract.graphs:
        if g.kind == GraphKind.DECODE and sched.timing.estimate_ns(g.index):
            times.setdefault(g.batch, {})["greedy" if g.greedy else "sampled"] = sched.timing.estimate_ns(g.index) / 1e6
    rows = {b: t for b, t in sorted(times.items()) if len(t) == 2}
    for b, t in rows.items():
        RESULTS[f"load_decode_b{b}_sampled_ms"] = round(t["sampled"], 3)
        RESULTS[f"load_decode_b{b}_greedy_ms"] = round(t["greedy"], 3)
    if rows:
        log("decode graphs at load, sampled / greedy ms: " + ", ".join(
            f"b{b} {t['sampled']:.2f}/{t['greedy']:.2f}" for b, t in rows.items()))


def profile_mixed(model, out: Path | None) -> None:
    """Diagnostic: the kernels of a packed-prefill step (mixed p2048 w0) and of one carrying 64
    decoders (mixed p1024 w64 greedy), run eagerly under the profiler on whatever the buffers
    hold: where a prefill step's time goes beside its GEMMs."""
    from torch.profiler import DeviceType, ProfilerActivity, profile

    from flare.contract import GraphKind

    programs = model.loaded.programs
    graphs = [g for g in model.loaded.contract.graphs if g.kind == GraphKind.MIXED
              and (g.tokens, g.width, g.greedy) in ((2048, 0, False), (1024, 64, True))]
    for graph in graphs:
        try:
            programs.run(graph)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                programs.run(graph)
                torch.cuda.synchronize()
            totals: dict[str, float] = {}
            for e in prof.events():
                if e.device_type == DeviceType.CUDA:
                    totals[e.name[:60]] = totals.get(e.name[:60], 0.0) + e.time_range.elapsed_us() / 1e3
            top = sorted(totals.items(), key=lambda kv: -kv[1])[:12]
            RESULTS[f"profile_{graph.label}"] = {"kernel_ms": round(sum(totals.values()), 2),
                                                 "top": [(k, round(v, 2)) for k, v in top]}
            log(f"{graph.label}: {sum(totals.values()):.2f} ms of kernels; top: "
                + "; ".join(f"{k} {v:.2f}" for k, v in top[:8]))
        except Exception as exc:  # noqa: BLE001 - a diagnostic must not cost the run its figures
            log(f"mixed profile failed: {type(exc).__name__}: {exc}")


def profile_decode(model, out: Path | None) -> None:
    """Diagnostic, last (it writes into whatever state the buffers hold): the batch-1 greedy
    decode program run eagerly under the CUDA profiler, for the kernels a step launches
    and their summed device time (the graph step time minus this is launch gaps)."""
    from torch.profiler import DeviceType, ProfilerActivity, profile

    from flare.contract import GraphKind

    try:
        programs = model.loaded.programs
        graph = model.loaded.contract.graph(GraphKind.DECODE, 1, greedy=True)
        steps = 3
        programs.run(graph)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                programs.run(graph)
            torch.cuda.synchronize()
        kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
        RESULTS["bs1_kernels_per_step"] = round(len(kernels) / steps)
        RESULTS["bs1_kernel_time_ms"] = round(sum(e.time_range.elapsed_us() for e in kernels) / steps / 1e3, 3)
        log(f"batch-1 decode step: {RESULTS['bs1_kernels_per_step']} kernels, "
            f"{RESULTS['bs1_kernel_time_ms']} ms of kernel time")
        if out is not None:
            table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=40)
            (out / "profile_decode_b1.txt").write_text(table)
    except Exception as exc:  # noqa: BLE001 - a diagnostic must not cost the run its figures
        log(f"decode profile failed: {type(exc).__name__}: {exc}")


def main() -> int:
    from bench_serving import add_load_arguments

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="llama3-8b", choices=sorted(SHAPES))
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/flare-bench"))
    parser.add_argument("--tokenizer", type=Path, required=True, help="a Llama 3 tokenizer.json")
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--hf-compile", action="store_true", help="let transformers compile its static-cache forward")
    parser.add_argument("--skip-hf", action="store_true")
    parser.add_argument("--skip-hf-timing", action="store_true", help="transformers only for teacher forcing")
    parser.add_argument("--skip-serving", action="store_true")
    parser.add_argument("--skip-structured", action="store_true", help="no structured-output decode rounds")
    parser.add_argument("--suite", default="", help="issue 23's serving workloads to run, e.g. prefill_only,a,b,c,d "
                                                    "(a core with --max-active slots, mixed steps, --chunk)")
    parser.add_argument("--max-active", type=int, default=64)
    parser.add_argument("--tensor-parallel", type=int, default=1, help="ranks, one GPU each (issue 26/28)")
    parser.add_argument("--chunk", type=int, default=512, help="the core's prefill_chunk_size")
    parser.add_argument("--no-mixed", action="store_true", help="load the core without its MIXED graphs")
    add_load_arguments(parser)
    parser.add_argument("--prompt-vocab", type=int, default=120000, help="random prompt token ids below this")
    parser.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    args = parser.parse_args()
    from flare.config import EngineConfig
    from flare.engine.model import NativeModel

    RESULTS.update(shape=args.shape, device=torch.cuda.get_device_name(), torch=torch.__version__)
    ckpt = args.workdir / f"{args.shape}-hf"
    core = args.workdir / (f"{args.shape}-core-{args.max_active}-{args.chunk}" + ("-mixed" if args.suite else ""))
    make_checkpoint(ckpt, args.shape, args.tokenizer)
    export(ckpt, core, args.context, max_active=args.max_active, chunk=args.chunk, mixed=bool(args.suite))
    seq = torch.randint(1000, 120000, (512,), generator=torch.Generator().manual_seed(3))
    if not args.skip_hf:
        hf_part(ckpt, seq, args.hf_compile, timing=not args.skip_hf_timing)
        save_results(args.out)
    t0 = time.perf_counter()
    model = NativeModel.load(core, EngineConfig(device="cuda", max_active=args.max_active,
                                                mixed_prefill=False if args.no_mixed else None,
                                                tensor_parallel=args.tensor_parallel), progress=log)
    RESULTS["tensor_parallel"] = args.tensor_parallel
    RESULTS["load_and_capture_s"] = round(time.perf_counter() - t0, 1)
    log(f"flare loaded and captured in {RESULTS['load_and_capture_s']} s")
    load_graph_times(model)
    try:
        if "hf_argmax" in RESULTS:
            teacher_forced(model, seq)
        decode_runs(model)
        save_results(args.out)
        if not args.skip_structured:
            structured_runs(model, args.out)
            save_results(args.out)
        if args.suite:
            serving_suite(model, args)
        elif not args.skip_serving:
            serving(model, args)
        profile_decode(model, args.out)
    finally:
        save_results(args.out)
        model.close()
    keys = ["bs1_ms_per_step", "bs1_floor_ms", "bs1_vs_floor", "read_ceiling_gbs", "bs1_read_floor_ms",
            "bs1_vs_read_floor", "bs64_read_floor_ms", "bs64_vs_read_floor", "bs1_hf_ms_per_step", "bs64_ms_per_step",
            "bs64_tok_s", "bs64_hf_tok_s", "teacher_forced_agreement", "teacher_forced_agreement_torch_elementwise",
            "teacher_forced_agreement_torch_elementwise_split_gemms", "teacher_forced_agreement_vs_fp32",
            "hf_bf16_vs_fp32_agreement", "serving_output_tok_s",
            "serving_ttft_p50_ms", "serving_ttft_p99_ms", "serving_itl_p50_ms", "serving_itl_p99_ms",
            "gpu_busy_fraction", "gpu_busy_fraction_whole_run", "bs1_kernels_per_step", "bs1_kernel_time_ms",
            "structured_bs1_vs_free_wall", "structured_bs64_vs_free_wall", "structured_bs1_steady_vs_free",
            "structured_bs64_steady_vs_free", "grammar_compile_ms_median_p90_max",
            "grammar_cache_hit_ms_median"]
    for k in keys:
        print(f"{k:>28}: {RESULTS.get(k)}")
    print(json.dumps(RESULTS))
    return 0


if __name__ == "__main__":
    sys.exit(main())

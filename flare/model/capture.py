"""CUDA graph capture of every graph a contract declares.

Capture happens at load (graphs cannot be serialized): warm-up runs each
program once on a side stream, then every graph is captured from the largest
shape down into one shared memory pool, so the big shapes size the pool and
the smaller ones reuse it. Everything a program keeps between steps lives in
persistent buffers allocated before capture (slot state, KV pages, snapshot
rows, outputs); only intermediates come from the pool, and graphs replay
serialized on one stream, so their pooled intermediates never overlap in time.

Then each graph is replayed once more and timed (``replay_ns``): the scheduler's
first estimates, so that live requests do not pay for learning them. The
replays run the warm-up's inputs (every row a padding row on scratch slot 0),
so a graph's attention sees no keys and its estimate runs a little short until
its first real step replaces it. One rank of a tensor-parallel model skips
them: its graphs' collectives need every rank replaying in step.

The returned :class:`CapturedGraphs` owns the graphs, the pool and the
programs; the executor holds it until its streams have drained.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from functools import partial

import torch

from ..contract import GraphKind
from ..progress import Advance, Progress, reporter
from .programs import StepPrograms

log = logging.getLogger(__name__)


@dataclass
class CapturedGraphs:
    programs: StepPrograms
    graphs: list  # torch.cuda.CUDAGraph per contract graph index
    pool: object
    exec_handles: list[int] = field(default_factory=list)
    capture_s: float = 0.0
    # DECODE graph index -> (forward part, sampling part) executables (StepPrograms.run_part);
    # the variants of one batch capacity share their forward part.
    part_graphs: dict = field(default_factory=dict)
    part_handles: dict[int, tuple[int, int]] = field(default_factory=dict)
    replay_ns: list[int] = field(default_factory=list)  # each graph's timed replay (empty: not timed)


def _size(graph) -> tuple[int, int]:
    if graph.kind == GraphKind.MIXED:  # one flat stream of p + w tokens
        return (graph.tokens + graph.width, 1)
    return (graph.batch * graph.tokens, int(graph.kind == GraphKind.PREFILL))


def use_kernels(programs: StepPrograms) -> None:
    """Switch the decoder to the Triton kernels (attention, fused elementwise, small-batch GEMV),
    the greedy and sampling variants to their two- and four-launch token choices, the sampling
    variant's logprobs to two launches (only the rows that ask are computed), structured-output
    masking to one launch, a decode step's slot reads and every sampling program's slot writes
    to one launch each, and a verification step's inputs and outcome to one launch each
    (greedy: two for the outcome)."""
    from .decoder import cuda_ops
    from .kernels import slots
    from .kernels.sampling import apply_grammar_masks, greedy_tokens, sample_tokens, write_logprobs

    ops = cuda_ops()
    tp = programs.decoder.tensor_parallel
    if tp is not None:  # a rank's shard: the collectives (NCCL, captured with the graphs) around the kernels
        from .tensor_parallel import tensor_parallel_ops
        ops = tensor_parallel_ops(ops, rank=tp.rank, world=tp.world, vocab_size=programs.decoder.spec.vocab_size,
                                  group=tp.group)
    programs.decoder.ops = ops
    programs.greedy_tokens = greedy_tokens
    programs.sampled_tokens = sample_tokens
    programs.apply_grammar_masks = apply_grammar_masks
    contract = programs.contract
    programs.decode_inputs = partial(slots.decode_inputs, programs.buffers, context=contract.context,
                                     page_tokens=contract.page_tokens)
    programs.commit = partial(slots.commit_samples, programs.buffers, programs.output_counts, hidden=programs.hidden)
    buffers = programs.buffers
    programs.write_logprobs = partial(write_logprobs, sampling=buffers["slot.sampling"], frame=buffers["step.frame"],
                                      out_logprobs=buffers["out.logprobs"], out_top_ids=buffers["out.top_ids"])
    programs.verification_inputs = partial(slots.verification_inputs, programs.buffers, context=contract.context,
                                           page_tokens=contract.page_tokens)
    programs.commit_verification = partial(slots.commit_verification, programs.buffers, programs.output_counts,
                                           hidden=programs.hidden)


def _new_graph():
    try:
        return torch.cuda.CUDAGraph(keep_graph=False)
    except TypeError:  # older torch: no keep_graph argument
        return torch.cuda.CUDAGraph()


def _exec_handle(graph) -> int:
    handle = graph.raw_cuda_graph_exec()
    try:
        return int(handle)
    except TypeError as exc:
        raise TypeError(f"raw_cuda_graph_exec() returned {type(handle).__name__}, not an address") from exc


def capture_graphs(programs: StepPrograms, progress: Progress | None = None, *,
                   warmup: int = 2) -> CapturedGraphs:
    if programs.device.type != "cuda":
        raise ValueError("CUDA graphs need a CUDA device")
    use_kernels(programs)
    progress = reporter(progress)
    contract = programs.contract
    order = sorted(contract.graphs, key=_size, reverse=True)
    decodes = [g for g in order if g.kind == GraphKind.DECODE]
    stream = torch.cuda.Stream(programs.device)
    start = time.perf_counter()
    stream.wait_stream(torch.cuda.current_stream(programs.device))
    # the first runs compile the kernels (Triton): the warm-up can take longer than the capture
    with progress.task("warming up the step programs", total=warmup * len(order), unit="runs") as advance:
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                for g in order:
                    programs.run(g)
                    advance()
        torch.cuda.synchronize(programs.device)
    pool = torch.cuda.graph_pool_handle()
    graphs: list = [None] * len(contract.graphs)
    # the contract's graphs, then each DECODE graph's parts: its sampling and its batch's forward
    parts_total = len(decodes) + len({g.batch for g in decodes})
    with progress.task("capturing CUDA graphs", total=len(order) + parts_total, unit="graphs") as advance:
        for g in order:
            cuda_graph = _new_graph()
            with torch.cuda.graph(cuda_graph, pool=pool, stream=stream):
                programs.run(g)
            graphs[g.index] = cuda_graph
            advance()
        parts = _capture_parts(programs, decodes, pool, stream, warmup, advance)
        torch.cuda.synchronize(programs.device)
    handles = [_exec_handle(cg) for cg in graphs]
    part_handles = {index: (_exec_handle(fwd), _exec_handle(smp)) for index, (fwd, smp) in parts.items()}
    replay_ns = []
    if programs.decoder.tensor_parallel is None:
        try:
            replay_ns = _time_replays(graphs, handles, stream, progress)
        except (RuntimeError, TypeError, AttributeError) as exc:  # timings only speed up the start
            log.warning("graph timings not taken (%s): the scheduler measures each graph as it first runs", exc)
    return CapturedGraphs(programs, graphs, pool, handles, time.perf_counter() - start, parts, part_handles,
                          replay_ns)


def _time_replays(graphs: list, handles: list[int], stream, progress) -> list[int]:
    """Each graph's device time in one replay (ns, by graph index). Every executable is
    uploaded first, so a replay's time is its kernels', not the upload of its nodes."""
    from cuda.bindings import driver

    raw_stream = driver.CUstream(stream.cuda_stream)
    for handle in handles:
        err, = driver.cuGraphUpload(driver.CUgraphExec(handle), raw_stream)
        if err != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuGraphUpload failed: {err.name}")
    marks = [torch.cuda.Event(enable_timing=True) for _ in range(len(graphs) + 1)]
    with progress.task("timing the CUDA graphs", total=len(graphs), unit="graphs") as advance:
        with torch.cuda.stream(stream):
            marks[0].record()
            for graph, mark in zip(graphs, marks[1:]):
                graph.replay()
                mark.record()
                advance()
        stream.synchronize()
    return [max(1, int(a.elapsed_time(b) * 1e6)) for a, b in zip(marks, marks[1:])]


def _capture_parts(programs: StepPrograms, decodes: list, pool, stream, warmup: int, advance: Advance) -> dict:
    """The two parts of every DECODE graph (structured output's held steps), in the same pool;
    ``advance`` counts each graph captured."""
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            for g in decodes:
                programs.run_part(g, "forward")
                programs.run_part(g, "sample")
    torch.cuda.synchronize(programs.device)
    forwards: dict[int, object] = {}
    parts = {}
    for g in decodes:
        if g.batch not in forwards:
            forwards[g.batch] = _new_graph()
            with torch.cuda.graph(forwards[g.batch], pool=pool, stream=stream):
                programs.run_part(g, "forward")
            advance()
        sample = _new_graph()
        with torch.cuda.graph(sample, pool=pool, stream=stream):
            programs.run_part(g, "sample")
        advance()
        parts[g.index] = (forwards[g.batch], sample)
    return parts

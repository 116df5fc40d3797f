#!/usr/bin/env python3
"""All-reduce latency inside CUDA graphs at tensor parallel's message sizes: NCCL against
PyTorch's symmetric-memory one-shot and two-shot all-reduce (NVLink peer loads; multicast stays
off, as the device notes require).

Issue 28's batch-1 goal (a step at N = 2 at most 0.6x the N = 1 step) leaves the all-reduces
about 0.3 ms of the step: a decoder layer sums its o and down products across ranks, 65
all-reduces a Llama-3-8B step. This measures what one costs at the sizes a step sums (hidden x
rows, bf16 and float32), each in a graph of 64 back to back as the captured steps run them, and
checks each method's sums against the exact ones: the calls cycle through four different
partials, so a method whose next call overwrites a buffer a peer is still reading is caught
(symmetric-memory all-reduces reuse one buffer, as a step would).

    python3 tools/bench_allreduce.py [--world 2] [--rows 1,8,64,512,2048] [--hidden 4096]
    python3 tools/bench_allreduce.py --backend gloo   # the CPU smoke run: no graphs, NCCL's role played by gloo

Writes allreduce.json under --out (default $OUT) from rank 0.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

# multicast (NVLS) stays off in every process this starts (shared/DEVICE notes)
for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                      ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ[_name] = _value

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

CALLS = 64  # all-reduces a graph holds (a decoder step sums 2 a layer)
REPLAYS = 20
SLOTS = 4  # distinct partials the calls cycle through
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _inputs(rows: int, hidden: int, dtype: torch.dtype, rank: int,
            device: str) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Rank ``rank``'s SLOTS partials (partial j is base * (rank + 1) + j) and base: integers,
    exact in bf16, so every sum is exact."""
    g = torch.Generator().manual_seed(rows)
    base = torch.randint(-8, 8, (rows, hidden), generator=g).float()
    return [(base * (rank + 1) + j).to(dtype).to(device) for j in range(SLOTS)], base


def _time_graph(run, device: str) -> float:
    """Seconds one call takes, from a graph of CALLS calls (call i: ``run(i)``) replayed REPLAYS
    times (eagerly, CALLS calls, off the GPU)."""
    if device == "cpu":
        run(0)
        start = time.perf_counter()
        for i in range(CALLS):
            run(i)
        return (time.perf_counter() - start) / CALLS
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(3):
            run(i)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(CALLS):
            run(i)
    graph.replay()
    torch.cuda.synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(REPLAYS):
        graph.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / (REPLAYS * CALLS)


def _methods(partials: list[torch.Tensor], device: str, group_name: str, failed: list) -> dict:
    """name -> (run, outs): ``run(i)`` sums partial ``i % SLOTS`` of every rank into ``outs[i %
    SLOTS]`` and is capturable. Calls back to back cycle through the slots, so a method whose
    next call overwrites what a peer is still reading sums wrong. A method this build cannot set
    up is left out, its error appended to ``failed``."""
    outs = [torch.empty_like(p) for p in partials]

    def run_collective(i: int) -> None:
        j = i % SLOTS
        outs[j].copy_(partials[j])  # a step's partial is fresh each time; the copy is in every method
        dist.all_reduce(outs[j])

    methods = {dist.get_backend(): (run_collective, outs)}
    if device == "cpu":
        return methods
    try:
        import torch.distributed._symmetric_memory as symm_mem

        buffer = symm_mem.empty(*partials[0].shape, dtype=partials[0].dtype, device=device)
        symm_mem.rendezvous(buffer, group_name)
    except Exception as exc:  # noqa: BLE001 - a method this build lacks is a finding, not a crash
        failed.append(f"{type(exc).__name__}: {exc}")
        return methods
    one_shot_outs = [torch.empty_like(p) for p in partials]
    two_shot_outs = [torch.empty_like(p) for p in partials]

    def run_one_shot(i: int) -> None:
        j = i % SLOTS
        one_shot_outs[j].copy_(torch.ops.symm_mem.one_shot_all_reduce_copy(buffer, partials[j], "sum", group_name))

    def run_two_shot(i: int) -> None:
        j = i % SLOTS
        buffer.copy_(partials[j])
        torch.ops.symm_mem.two_shot_all_reduce_(buffer, "sum", group_name)
        two_shot_outs[j].copy_(buffer)

    methods["symm_one_shot"] = (run_one_shot, one_shot_outs)
    methods["symm_two_shot"] = (run_two_shot, two_shot_outs)
    return methods


def _worker(rank: int, world: int, port: int, args, results) -> None:
    device = "cpu" if args.backend == "gloo" else f"cuda:{rank}"
    if device != "cpu":
        torch.cuda.set_device(rank)
    dist.init_process_group(args.backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    group_name = dist.group.WORLD.group_name
    scale = sum(r + 1 for r in range(world))
    for dtype_name, dtype in DTYPES.items():
        for rows in [int(r) for r in args.rows.split(",")]:
            partials, base = _inputs(rows, args.hidden, dtype, rank, device)
            failed: list[str] = []
            methods = _methods(partials, device, group_name, failed)
            if failed and rank == 0:
                results.append({"dtype": dtype_name, "rows": rows, "method": "symm_mem", "error": failed[0]})
            for name, (run, outs) in methods.items():
                entry = {"dtype": dtype_name, "rows": rows, "method": name,
                         "bytes": partials[0].numel() * partials[0].element_size()}
                try:
                    entry["us"] = round(_time_graph(run, device) * 1e6, 2)
                    if device != "cpu":
                        torch.cuda.synchronize()
                    # the last call to write slot j summed partial j: base * scale + world * j
                    entry["exact"] = all(torch.equal(out.float().cpu(), base * scale + world * j)
                                         for j, out in enumerate(outs))
                except Exception as exc:  # noqa: BLE001
                    entry["error"] = f"{type(exc).__name__}: {exc}"
                if rank == 0:
                    results.append(entry)
            dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--rows", default="1,8,64,512,2048")
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    parser.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    args = parser.parse_args()
    if args.backend == "nccl" and torch.cuda.device_count() < args.world:
        print(f"bench_allreduce: needs {args.world} GPUs, found {torch.cuda.device_count()}", file=sys.stderr)
        return 1
    with mp.Manager() as manager:
        results = manager.list()
        mp.spawn(_worker, args=(args.world, _free_port(), args, results), nprocs=args.world, join=True)
        rows = list(results)
    print(f"{'dtype':>5} {'rows':>5} {'bytes':>9} {'method':>14} {'us':>8}  exact")
    for r in rows:
        if "error" in r:
            print(f"{r['dtype']:>5} {r['rows']:>5} {'':>9} {r['method']:>14}  error: {r['error'][:120]}")
        else:
            print(f"{r['dtype']:>5} {r['rows']:>5} {r['bytes']:>9} {r['method']:>14} {r['us']:>8.2f}  {r['exact']}")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "allreduce.json").write_text(json.dumps({"world": args.world, "calls_per_graph": CALLS,
                                                              "results": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

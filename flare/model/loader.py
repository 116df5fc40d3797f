"""Loading a core onto a device: weights, KV page pool sizing, step programs.

The number of KV pages comes from a memory budget, never from
max_active x context: on the CPU a fixed budget (1 GiB unless configured), on a
GPU a fraction of the memory left after weights. Prefix-cache snapshot rows
(one page per layer plus a hidden state each) come out of the same budget.

The loader reads a prepared core only through :class:`PreparedWeights` (what a
``flare.core.format.Core`` provides), so the model package does not import the
core package, which imports the model's spec and layout.

Tensor parallel (``load_model(..., tensor_parallel=TensorParallel(rank, world))`` with
world > 1, inside an initialised torch.distributed group): the shapes are checked
before any weight is read (:func:`~flare.model.tensor_parallel.check_shardable`), the
full weights are loaded and this rank's slices kept
(:func:`~flare.model.tensor_parallel.shard_weights`), and the decoder runs the per-rank
spec (its heads and MLP slice) with the collectives of
:func:`~flare.model.tensor_parallel.tensor_parallel_ops`. The KV pool is planned from
the per-rank spec: every rank computes the same number of pages from the same budget,
so the page IDs rank 0's scheduler hands out are valid on every rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Sequence

import torch
from safetensors import safe_open

from ..config import EngineConfig
from ..contract import PreparedContract, speculative_widths
from ..errors import ExecutionError, FrontendError
from ..progress import Progress, reporter
from .attention import KVCache
from .checkpoint import runtime_weight_shapes
from .decoder import Decoder, DecoderOps
from .programs import StepPrograms
from .spec import ModelSpec
from .tensor_parallel import TensorParallel, check_shardable, shard_spec, shard_weights, tensor_parallel_ops

CPU_KV_BUDGET = 1 << 30


class ServingLimits(Protocol):
    """The limits fixed at export that loading sizes buffers by (a core's ``contract``)."""

    @property
    def context(self) -> int: ...
    @property
    def max_active(self) -> int: ...
    @property
    def prefill_chunk_size(self) -> int: ...
    @property
    def page_tokens(self) -> int: ...


class PreparedWeights(Protocol):
    """What loading reads from a prepared core; ``flare.core.format.Core`` is one."""

    @property
    def recipe(self) -> ModelSpec: ...
    @property
    def dtype(self) -> str: ...  # "float32" | "bfloat16" | "float16"
    @property
    def contract(self) -> ServingLimits: ...
    @property
    def weight_files(self) -> Sequence[Path]: ...


@dataclass
class LoadedModel:
    decoder: Decoder
    contract: PreparedContract
    programs: StepPrograms
    device: torch.device


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ExecutionError(f"device {name} requested but CUDA is not available")
    return device


def load_weights(core: PreparedWeights, device: torch.device, progress: Progress | None = None, *,
                 shard: TensorParallel | None = None) -> dict[str, torch.Tensor]:
    """Every weight of the core onto ``device``, reported as one task in bytes (tensor by
    tensor: safetensors' load_file, unrolled). With ``shard``, each tensor is read on the host,
    checked, cut to the rank's slice and only that moved to ``device``: a rank never holds the
    whole model, on the device or (beyond one tensor) on the host."""
    expected = runtime_weight_shapes(core.recipe)
    weights: dict[str, torch.Tensor] = {}
    total = sum(math.prod(shape) for shape in expected.values()) * getattr(torch, core.dtype).itemsize
    files = core.weight_files
    read_on = "cpu" if shard is not None else str(device)
    with reporter(progress).task(f"loading {len(files)} weight file{'s' * (len(files) != 1)} onto {device}"
                                 + (f" (rank {shard.rank} of {shard.world}'s shard)" if shard is not None else ""),
                                 total=total) as advance:
        for path in files:
            with safe_open(str(path), framework="pt", device=read_on) as f:
                for name in f.keys():
                    tensor = f.get_tensor(name)
                    _check_shape(name, tensor, expected)
                    advance(tensor.numel() * tensor.element_size())
                    if shard is not None:
                        tensor = shard_weights({name: tensor}, core.recipe, shard.rank, shard.world)[name].to(device)
                    weights[name] = tensor
    missing = sorted(set(expected) - set(weights))
    if missing:
        raise FrontendError(f"core weights lack {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
    return weights


def _check_shape(name: str, tensor: torch.Tensor, expected: dict) -> None:
    shape = expected.get(name)
    if shape is not None and tuple(tensor.shape) != shape:
        raise FrontendError(f"core weight {name} has shape {tuple(tensor.shape)}, expected {shape}")


def _agree_on_pages(num_pages: int, device: torch.device, tp: TensorParallel) -> int:
    """Every rank's page count, made the smallest of them: rank 0's scheduler hands out page IDs
    for all ranks, and on GPUs each rank sized its pool from its own free memory."""
    import torch.distributed as dist

    count = torch.tensor([num_pages], dtype=torch.int64, device=device)
    dist.all_reduce(count, op=dist.ReduceOp.MIN, group=tp.group)
    return int(count.item())


def plan_kv(core: PreparedWeights, config: EngineConfig, device: torch.device, max_active: int,
            spec: ModelSpec | None = None) -> tuple[int, int]:
    """(num_pages, num_snapshot_rows) from the memory budget; ``spec``: the KV's shape when not
    the core's recipe (a tensor-parallel rank's share of the KV heads)."""
    spec = spec or core.recipe
    dtype = getattr(torch, core.dtype)
    page_bytes = KVCache.bytes_per_page(spec.num_layers, spec.num_kv_heads, spec.head_dim, dtype)
    if config.kv_memory_bytes:
        budget = config.kv_memory_bytes
    elif device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        budget = int(free * config.kv_memory_fraction)
    else:
        budget = CPU_KV_BUDGET
    rows = config.num_snapshot_rows or max(8, 2 * max_active)
    row_bytes = page_bytes + spec.hidden_size * dtype.itemsize
    pages = (budget - rows * row_bytes) // page_bytes - 1  # page 0 is scratch
    need = -(-core.contract.context // core.contract.page_tokens)
    if pages < need:
        raise ExecutionError(
            f"the KV budget of {budget / 2**20:.0f} MiB holds {max(pages, 0)} pages of {page_bytes / 2**20:.2f} MiB "
            f"but one {core.contract.context}-token request needs {need}; raise the KV memory budget")
    return int(pages), int(rows)


def load_model(core: PreparedWeights, config: EngineConfig = EngineConfig(), progress: Progress | None = None,
               tensor_parallel: TensorParallel | None = None) -> LoadedModel:
    """The core's decoder, contract and step programs on the configured device; with
    ``tensor_parallel`` of world > 1, this rank's shard of them (see the module docstring)."""
    device = resolve_device(config.device)
    max_active = config.max_active or core.contract.max_active
    if not 1 <= max_active <= core.contract.max_active:
        raise ExecutionError(f"max_active {max_active} must be between 1 and the core's {core.contract.max_active}")
    tp = tensor_parallel if tensor_parallel is not None and tensor_parallel.world > 1 else None
    if tp is None:
        weights = load_weights(core, device, progress)
        decoder = Decoder(core.recipe, weights, max_positions=core.contract.context)
        num_pages, rows = plan_kv(core, config, device, max_active)
    else:
        check_shardable(core.recipe, tp.world)
        spec = shard_spec(core.recipe, tp.world)
        weights = load_weights(core, device, progress, shard=tp)
        ops = tensor_parallel_ops(DecoderOps(), rank=tp.rank, world=tp.world, vocab_size=spec.vocab_size,
                                  group=tp.group)
        decoder = Decoder(spec, weights, max_positions=core.contract.context, ops=ops)
        decoder.tensor_parallel = tp
        num_pages, rows = plan_kv(core, config, device, max_active, spec)
        num_pages = _agree_on_pages(num_pages, device, tp)
    contract = PreparedContract.build(
        max_active=max_active, context=core.contract.context,
        prefill_chunk_size=core.contract.prefill_chunk_size, num_pages=num_pages,
        num_snapshot_rows=rows, vocab_size=core.recipe.vocab_size, hidden_size=core.recipe.hidden_size,
        mixed_prefill=core.contract.mixed_prefill if config.mixed_prefill is None else config.mixed_prefill,
        speculative_widths=() if config.speculative == "none" else speculative_widths(config.speculative_depth),
    )
    if progress:
        progress(f"KV cache: {num_pages} pages of {contract.page_tokens} tokens, {rows} snapshot rows")
    programs = StepPrograms(decoder, contract, bucket_pages=device.type == "cpu")
    return LoadedModel(decoder=decoder, contract=contract, programs=programs, device=device)


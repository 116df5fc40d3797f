"""Tensor parallelism, the model's half (flare/model/tensor_parallel.py): a decoder sharded over
three gloo ranks on 127.0.0.1 gives one rank's greedy tokens and logits.

Three spawned ranks load the demo core (SmolLM2-135M: 9 query heads, 3 KV heads, float32)
through ``load_model(..., TensorParallel(rank, 3))`` and drive ``Decoder.forward`` and
``Decoder.logits`` by hand (a prefill, then greedy decode steps); this process runs the
same driver on the unsharded model. The ranks also run a tiny random Qwen2 (qkv bias, an
untied lm_head, a vocabulary of 50 that splits unevenly as 17/17/16) against its one-rank
forward.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from tokenizers import Tokenizer

from flare.config import EngineConfig
from flare.core.embedded import demo_core
from flare.core.format import load_core
from flare.errors import ExecutionError
from flare.model import loader
from flare.model.attention import PAGE_TOKENS, AttentionBatch, KVCache
from flare.model.checkpoint import random_runtime_weights
from flare.model.decoder import Decoder, DecoderOps
from flare.model.loader import load_model, load_weights, plan_kv
from flare.model.spec import ModelSpec
from flare.model.tensor_parallel import (
    TensorParallel,
    check_shardable,
    shard_spec,
    shard_weights,
    tensor_parallel_ops,
    vocab_range,
)

WORLD = 3
STEPS = 4  # greedy decode steps after each prompt's prefill
KV_BYTES = 512 << 20
QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.", "List three prime numbers."]
TINY = ModelSpec(family="qwen2", architecture="test", vocab_size=50, hidden_size=48, intermediate_size=72,
                 num_layers=2, num_heads=6, num_kv_heads=3, head_dim=16, rms_norm_eps=1e-6, rope_theta=10000.0,
                 max_position_embeddings=256, tie_word_embeddings=False, qkv_bias=True)
TINY_PROMPTS = [[3, 17, 33, 49, 0, 16, 34], [48, 2]]


def _config() -> EngineConfig:
    return EngineConfig(device="cpu", max_active=1, kv_memory_bytes=KV_BYTES)


def _prompts(core_dir: Path) -> list[list[int]]:
    tokenizer = Tokenizer.from_file(str(core_dir / "tokenizer.json"))
    return [tokenizer.encode(f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n",
                             add_special_tokens=False).ids for q in QUESTIONS]


def _batch(table: torch.Tensor, start: int, q_len: int) -> AttentionBatch:
    positions = start + torch.arange(q_len).view(1, -1)
    pages = table.gather(1, positions // PAGE_TOKENS)
    return AttentionBatch(positions=positions, write_index=pages * PAGE_TOKENS + positions % PAGE_TOKENS,
                          page_table=table, kv_lens=positions[:, -1] + 1)


def greedy(decoder: Decoder, prompts: list[list[int]], steps: int) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Each prompt prefilled, then ``steps`` greedy decode steps: (tokens, logits [steps + 1, V]) per prompt."""
    spec = decoder.spec
    pages = -(-(max(map(len, prompts)) + steps) // PAGE_TOKENS)
    kv = KVCache.allocate(spec.num_layers, 1 + pages * len(prompts), spec.num_kv_heads, spec.head_dim,
                          decoder.dtype, decoder.device)
    all_tokens, all_logits = [], []
    with torch.inference_mode():
        for i, prompt in enumerate(prompts):
            table = 1 + i * pages + torch.arange(pages).view(1, -1)
            inputs, start = torch.tensor([prompt]), 0
            tokens, logits = [], []
            for _ in range(steps + 1):
                step_logits = decoder.logits(decoder.forward(inputs, _batch(table, start, inputs.shape[1]), kv))
                start += inputs.shape[1]
                logits.append(step_logits[0])
                tokens.append(int(step_logits[0].argmax()))
                inputs = torch.tensor([[tokens[-1]]])
            all_tokens.append(tokens)
            all_logits.append(torch.stack(logits))
    return all_tokens, all_logits


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, core_dir: str, prompts: list[list[int]], out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        loaded = load_model(load_core(Path(core_dir), verify=False), _config(), None, TensorParallel(rank, WORLD))
        tokens, logits = greedy(loaded.decoder, prompts, STEPS)
        full = random_runtime_weights(TINY, scale=0.3, seed=5)
        tiny = Decoder(shard_spec(TINY, WORLD), shard_weights(full, TINY, rank, WORLD), max_positions=64,
                       ops=tensor_parallel_ops(DecoderOps(), rank=rank, world=WORLD, vocab_size=TINY.vocab_size))
        tiny_tokens, tiny_logits = greedy(tiny, TINY_PROMPTS, STEPS)
        result = {"num_pages": loaded.contract.num_pages, "kv_heads": loaded.programs.kv.k[0].shape[2],
                  "tokens": tokens, "logits": logits, "tiny_tokens": tiny_tokens, "tiny_logits": tiny_logits}
        if rank == 0:
            result["tiny_ref"] = greedy(Decoder(TINY, full, max_positions=64), TINY_PROMPTS, STEPS)
        torch.save(result, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def core_dir() -> Path:
    return demo_core()


@pytest.fixture(scope="module")
def core(core_dir):
    return load_core(core_dir, verify=False)


@pytest.fixture(scope="module")
def prompts(core_dir):
    return _prompts(core_dir)


@pytest.fixture(scope="module")
def ranks(core_dir, core, prompts, tmp_path_factory):
    """Every rank's results, and the one-rank run of the demo (computed while the ranks run)."""
    out = tmp_path_factory.mktemp("tp")
    context = mp.spawn(_rank, args=(_free_port(), str(core_dir), prompts, str(out)), nprocs=WORLD, join=False)
    reference = greedy(load_model(core, _config()).decoder, prompts, STEPS)
    while not context.join():
        pass
    return [torch.load(out / f"rank{r}.pt") for r in range(WORLD)], reference


def test_sharded_demo_gives_one_ranks_greedy_tokens_and_logits(ranks):
    results, (ref_tokens, ref_logits) = ranks
    for r in results:  # every rank gathers the full logits, so every rank samples the same tokens
        assert r["tokens"] == ref_tokens
    diff = max((got - want).abs().max().item() for got, want in zip(results[0]["logits"], ref_logits))
    print(f"max |logit difference|, 3 ranks against 1: {diff:.3g}")
    assert diff <= 1e-3
    for r in results[1:]:
        for got, want in zip(r["logits"], results[0]["logits"]):
            assert torch.equal(got, want)


def test_each_rank_plans_the_same_kv_of_its_own_heads(ranks, core):
    results, _ = ranks
    pages, _ = plan_kv(core, _config(), torch.device("cpu"), 1, shard_spec(core.recipe, WORLD))
    one_rank, _ = plan_kv(core, _config(), torch.device("cpu"), 1)
    assert [r["num_pages"] for r in results] == [pages] * WORLD
    assert pages > 2 * one_rank  # each rank's pages hold a third of the KV heads
    assert [r["kv_heads"] for r in results] == [core.recipe.num_kv_heads // WORLD] * WORLD


def test_sharded_tiny_qwen2_with_uneven_vocabulary(ranks):
    results, _ = ranks
    ref_tokens, ref_logits = results[0]["tiny_ref"]
    for r in results:
        assert r["tiny_tokens"] == ref_tokens
        for got, want in zip(r["tiny_logits"], ref_logits):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_check_shardable_names_the_counts(core, monkeypatch):
    with pytest.raises(ExecutionError) as exc:
        check_shardable(core.recipe, 2)
    assert str(exc.value) == ("tensor parallel 2 needs the query heads (9), KV heads (3) and MLP width (1536) to "
                              "divide by 2; 9 and 3 do not")
    check_shardable(core.recipe, 1)
    check_shardable(core.recipe, 3)
    monkeypatch.setattr(loader, "load_weights", lambda *a, **k: pytest.fail("read weights it cannot shard"))
    with pytest.raises(ExecutionError, match="tensor parallel 2 needs"):  # refused before a weight is read
        load_model(core, _config(), None, TensorParallel(0, 2))


def test_vocab_range_splits_by_ceil():
    assert [vocab_range(50, r, 3) for r in range(3)] == [(0, 17), (17, 34), (34, 50)]
    assert [vocab_range(49152, r, 3) for r in range(3)] == [(0, 16384), (16384, 32768), (32768, 49152)]
    assert vocab_range(9, 3, 4) == (9, 9)


def _reassembles(spec: ModelSpec, full: dict[str, torch.Tensor], world: int) -> None:
    shards = [shard_weights(full, spec, r, world) for r in range(world)]
    local = shard_spec(spec, world)
    q, kv, inter = local.q_size, local.kv_size, local.intermediate_size
    for s in shards:
        assert set(s) == set(full)
    for name, tensor in full.items():
        parts = [s[name] for s in shards]
        assert all(p.is_contiguous() and p.untyped_storage().data_ptr() != tensor.untyped_storage().data_ptr()
                   for p in parts), name
        kind = name.rsplit(".", 1)[-1]
        if kind in ("qkv", "qkv_bias"):  # each rank: [its q heads; its k heads; its v heads]
            got = torch.cat([torch.cat([p[:q] for p in parts]), torch.cat([p[q:q + kv] for p in parts]),
                             torch.cat([p[q + kv:] for p in parts])])
        elif kind == "gate_up":  # each rank: [its gate rows; its up rows]
            got = torch.cat([torch.cat([p[:inter] for p in parts]), torch.cat([p[inter:] for p in parts])])
        elif kind in ("o", "down"):  # the rank's input columns
            got = torch.cat(parts, dim=1)
        elif name in ("embed", "lm_head"):  # the rank's vocabulary rows
            got = torch.cat(parts)
            assert [p.shape[0] for p in parts] == [b - a for a, b in (vocab_range(spec.vocab_size, r, world)
                                                                      for r in range(world))]
        else:  # norms: replicated
            assert all(torch.equal(p, tensor) for p in parts), name
            continue
        assert torch.equal(got, tensor), name


def test_shards_reassemble_to_the_demo_weights(core):
    _reassembles(core.recipe, load_weights(core, torch.device("cpu")), WORLD)


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_shards_reassemble_with_bias_norms_and_an_untied_head(family):
    import dataclasses

    spec = dataclasses.replace(TINY, family=family, qkv_bias=family == "qwen2", qk_norm=family == "qwen3")
    _reassembles(spec, random_runtime_weights(spec, scale=0.3, seed=1), WORLD)
    assert shard_spec(spec, WORLD).head_dim == spec.head_dim

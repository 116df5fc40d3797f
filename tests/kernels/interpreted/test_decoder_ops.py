"""The decoder forward with the CUDA kernel set (``cuda_ops``) against the torch ops, under the interpreter.

Checks the wiring of every DecoderOps slot the GPU path swaps in (argument order,
the fused qkv -> RoPE -> KV scatter, the norms) on a tiny random model: a ragged
prefill into the page pools, then a decode step reading what the prefill wrote.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from flare.model.attention import PAGE_TOKENS, AttentionBatch, KVCache
from flare.model.checkpoint import random_runtime_weights
from flare.model.decoder import Decoder, DecoderOps, cuda_ops
from flare.model.spec import ModelSpec


def _spec(family: str) -> ModelSpec:
    return ModelSpec(family=family, architecture="test", vocab_size=97, hidden_size=64, intermediate_size=96,
                     num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, rms_norm_eps=1e-6,
                     rope_theta=10000.0, max_position_embeddings=256, tie_word_embeddings=False,
                     qkv_bias=family == "qwen2", qk_norm=family == "qwen3")


def _weights(spec: ModelSpec, seed: int) -> dict[str, torch.Tensor]:
    return random_runtime_weights(spec, scale=0.2, seed=seed)


def _batch(table: torch.Tensor, start: list[int], q_len: int) -> AttentionBatch:
    positions = torch.tensor(start).view(-1, 1) + torch.arange(q_len).view(1, -1)
    pages = table.gather(1, positions // PAGE_TOKENS)
    return AttentionBatch(positions=positions, write_index=pages * PAGE_TOKENS + positions % PAGE_TOKENS,
                          page_table=table, kv_lens=positions[:, -1] + 1)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_cuda_ops_forward_matches_torch_ops(family):
    spec = _spec(family)
    weights = _weights(spec, seed=11)
    gen = torch.Generator().manual_seed(12)
    table = torch.tensor([[1, 2], [3, 4]])  # page 0 is scratch
    results = []
    for ops in (DecoderOps(), cuda_ops()):
        model = Decoder(spec, weights, max_positions=2 * PAGE_TOKENS, ops=ops)
        kv = KVCache.allocate(spec.num_layers, 5, spec.num_kv_heads, spec.head_dim, torch.float32,
                              torch.device("cpu"))
        gen.manual_seed(12)
        prompt = torch.randint(0, spec.vocab_size, (2, 70), generator=gen)
        # Both rows prefill 70 tokens (crossing into their second page), then decode one.
        hidden_prefill = model.forward(prompt, _batch(table, [0, 0], 70), kv, torch.tensor([69, 69]))
        step = torch.randint(0, spec.vocab_size, (2, 1), generator=gen)
        hidden_decode = model.forward(step, _batch(table, [70, 70], 1), kv, torch.tensor([0, 0]))
        results.append((hidden_prefill, hidden_decode, kv))
    (want_p, want_d, want_kv), (got_p, got_d, got_kv) = results
    torch.testing.assert_close(got_p, want_p, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got_d, want_d, rtol=1e-4, atol=1e-4)
    for i in range(spec.num_layers):
        torch.testing.assert_close(got_kv.k[i], want_kv.k[i], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got_kv.v[i], want_kv.v[i], rtol=1e-5, atol=1e-5)
    written = want_kv.k[0].abs().sum(dim=(-1, -2)) > 0  # [pages, P]
    assert bool(written[1].all() and written[2, :7].all() and not written[2, 7:].any()), \
        "the prefill and the decode step must fill exactly positions 0..70 of row 0"


def test_cuda_ops_swaps_every_op():
    swapped = cuda_ops()
    for field in dataclasses.fields(DecoderOps):
        assert getattr(swapped, field.name) is not getattr(DecoderOps(), field.name), field.name

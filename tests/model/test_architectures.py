"""The architecture registry and the projection seam (flare/model/architectures/).

Parity of each registered family with transformers is tests/model/test_parity_tiny.py;
here: what the registry answers, that a new family is one registration away from
config reading and the weight layout, and that Linear.shard splits a projection
so the ranks' results put together are the unsharded product.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from flare.errors import FrontendError
from flare.model import architectures
from flare.model.architectures import Architecture, Linear, Parallel
from flare.model.checkpoint import random_runtime_weights, runtime_weight_shapes
from flare.model.spec import ModelSpec

CONFIG = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2)


def test_registry_lists_the_families_and_their_names():
    assert architectures.names() == ("llama", "qwen2", "qwen3")
    assert architectures.hf_names() == ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                                        "Qwen3ForCausalLM")
    assert architectures.gguf_names() == ("llama", "qwen2", "qwen3")
    assert architectures.for_hf("MistralForCausalLM") is architectures.get("llama")
    assert architectures.for_gguf("qwen3") is architectures.get("qwen3")
    assert architectures.for_hf("MambaForCausalLM") is None and architectures.for_gguf("mamba") is None
    with pytest.raises(KeyError, match="registered: llama, qwen2, qwen3"):
        architectures.get("mamba")


def test_a_family_or_name_is_registered_once():
    with pytest.raises(ValueError, match="already registered"):
        architectures.register(architectures.get("qwen3"))

    class Clash(Architecture):
        family = "clash"
        hf_architectures = ("Qwen2ForCausalLM",)

    with pytest.raises(ValueError, match="Qwen2ForCausalLM already claimed by qwen2"):
        architectures.register(Clash())
    assert "clash" not in architectures.names()


@pytest.mark.parametrize("name,bias,qkv_bias,qk_norm", [
    ("LlamaForCausalLM", None, False, False), ("LlamaForCausalLM", True, True, False),
    ("Qwen2ForCausalLM", None, True, False), ("Qwen3ForCausalLM", None, False, True),
    ("Qwen3ForCausalLM", True, True, True),
])
def test_each_family_decides_its_layer_features(name, bias, qkv_bias, qk_norm):
    config = dict(CONFIG, architectures=[name], **({} if bias is None else {"attention_bias": bias}))
    spec = ModelSpec.from_hf_config(config)
    features = architectures.get(spec.family).features(spec)
    assert (features.qkv_bias, features.qk_norm) == (qkv_bias, qk_norm)
    shapes = runtime_weight_shapes(spec)
    assert ("layers.1.qkv_bias" in shapes) == qkv_bias and ("layers.1.q_norm" in shapes) == qk_norm


def test_a_new_family_is_one_registration(monkeypatch):
    monkeypatch.setattr(architectures, "_BY_FAMILY", dict(architectures._BY_FAMILY))
    monkeypatch.setattr(architectures, "_BY_HF", dict(architectures._BY_HF))

    class Normed(Architecture):
        family = "normed"
        hf_architectures = ("NormedForCausalLM",)

        def flags(self, config):
            return {**super().flags(config), "qk_norm": True}

    with pytest.raises(FrontendError, match="supported: LlamaForCausalLM.*Qwen3ForCausalLM$"):
        ModelSpec.from_hf_config(dict(CONFIG, architectures=["NormedForCausalLM"]))
    architectures.register(Normed())
    spec = ModelSpec.from_hf_config(dict(CONFIG, architectures=["NormedForCausalLM"]))
    assert (spec.family, spec.architecture, spec.qk_norm) == ("normed", "NormedForCausalLM", True)
    assert runtime_weight_shapes(spec)["layers.0.k_norm"] == (16,)
    assert spec.num_params == sum(t.numel() for t in random_runtime_weights(spec, scale=0.1).values())


def _qkv(spec: ModelSpec) -> Linear:
    return next(e for e in architectures.get(spec.family).layer(spec) if e.name == "qkv")


def test_column_parallel_shards_split_each_fused_part_by_heads():
    spec = ModelSpec.from_hf_config(dict(CONFIG, architectures=["Qwen2ForCausalLM"]))
    qkv = _qkv(spec)
    assert (qkv.parallel, qkv.parts, qkv.unit, qkv.bias) == (Parallel.COLUMN, (64, 32, 32), 16, True)
    gen = torch.Generator().manual_seed(0)
    w, b = torch.randn(qkv.shape, generator=gen), torch.randn(qkv.out_features, generator=gen)
    x = torch.randn(3, qkv.in_features, generator=gen)
    full = F.linear(x, w, b).split(qkv.parts, dim=-1)
    ranks = [F.linear(x, qkv.shard(w, r, 2), qkv.shard(b, r, 2)).split([p // 2 for p in qkv.parts], dim=-1)
             for r in range(2)]
    for part, want in enumerate(full):  # rank r holds heads [r*H/2, (r+1)*H/2) of q, k and v
        assert torch.equal(torch.cat([rank[part] for rank in ranks], dim=-1), want)
    with pytest.raises(ValueError, match="qkv: 32 features do not split into 4 ranks of whole 16-wide units"):
        qkv.shard(w, 0, 4)


def test_row_parallel_shards_sum_to_the_product():
    spec = ModelSpec.from_hf_config(dict(CONFIG, architectures=["LlamaForCausalLM"]))
    layer = {e.name: e for e in architectures.get("llama").layer(spec)}
    down = layer["down"]
    assert (down.parallel, down.shape, layer["o"].parallel) == (Parallel.ROW, (64, 96), Parallel.ROW)
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(down.shape, dtype=torch.float64, generator=gen)
    x = torch.randn(3, down.in_features, dtype=torch.float64, generator=gen)
    partial = [F.linear(x.narrow(-1, r * 48, 48), down.shard(w, r, 2)) for r in range(2)]
    torch.testing.assert_close(partial[0] + partial[1], F.linear(x, w))

#!/usr/bin/env python3
"""How far tensor parallel's summed partial products move a random bf16 model's greedy choices,
on the CPU, without ranks: a random transformers Llama whose o and down projections are computed
as two half-K products and summed (what two ranks' all-reduce computes), in bf16 or in float32
rounded once, against the unsplit model. Prints teacher-forced argmax agreement, the first
differing token of a few greedy runs, where each difference ranked in the reference, and how far
the chosen tokens' logprobs moved where the runs agree (docs/benchmarks.md, 2026-12-05).

    python tools/emulate_tp_sums.py [--hidden 1024] [--layers 8] [--positions 512]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F


def split_products(model, mode: dict) -> None:
    """o and down as two half-K products summed per ``mode['sum']`` (None: the plain product)."""
    for layer in model.model.layers:
        for linear in (layer.self_attn.o_proj, layer.mlp.down_proj):
            w = linear.weight
            half = w.shape[1] // 2

            def forward(x, w=w, half=half):
                if mode["sum"] is None:
                    return F.linear(x, w)
                a, b = (x[..., :half], w[:, :half]), (x[..., half:], w[:, half:])
                if mode["sum"] == "bf16":
                    return F.linear(*a) + F.linear(*b)
                return (F.linear(a[0].float(), a[1].float()) + F.linear(b[0].float(), b[1].float())).to(x.dtype)

            linear.forward = forward


def main() -> int:
    from transformers import LlamaConfig, LlamaForCausalLM

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--positions", type=int, default=512)
    parser.add_argument("--greedy", type=int, default=32, help="tokens a greedy run generates")
    args = parser.parse_args()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128256, hidden_size=args.hidden, intermediate_size=args.hidden * 7 // 2,
                         num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
                         num_key_value_heads=args.hidden // 256, rope_theta=500000.0, torch_dtype="bfloat16")
    model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    mode = {"sum": None}
    split_products(model, mode)
    seq = torch.randint(1000, 120000, (1, args.positions), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        logprobs = {}
        for name in (None, "bf16", "float32"):
            mode["sum"] = name
            logprobs[name] = torch.log_softmax(model(seq).logits[0].float(), -1)
        ref = logprobs[None]
        top = ref.topk(5, -1)
        for name in ("bf16", "float32"):
            ours = logprobs[name]
            same = ours.argmax(-1) == ref.argmax(-1)
            picked = ref.argmax(-1)[:, None]
            moved = (ref.gather(1, picked) - ours.gather(1, picked)).abs()[:, 0][same]
            ranks = [top.indices[i].tolist().index(t) if t in top.indices[i].tolist() else None
                     for i, t in zip((~same).nonzero()[:, 0].tolist(), ours.argmax(-1)[~same].tolist())]
            print(f"{name} sums: teacher-forced agreement {same.float().mean().item():.3f}; differences ranked "
                  f"{sorted(set(ranks), key=str)} in the reference's top 5; logprob moved where they agree: "
                  f"max {moved.max().item():.4f}, median {moved.median().item():.5f}")
        for p in range(3):
            prompt = torch.randint(1000, 120000, (1, 40 + 100 * p), generator=torch.Generator().manual_seed(10 + p))
            runs = {}
            for name in (None, "bf16", "float32"):
                mode["sum"] = name
                out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=args.greedy,
                                     do_sample=False, pad_token_id=0)
                runs[name] = out[0, prompt.shape[1]:].tolist()
            firsts = {name: next((i for i, (a, b) in enumerate(zip(runs[name], runs[None])) if a != b), None)
                      for name in ("bf16", "float32")}
            print(f"greedy run {p} ({prompt.shape[1]}-token prompt): first differing token {firsts}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
"""Export a small random-weight Llama chat core for running tests/server against a device.

The GPU machine reaches no registry, so the demo core (fetched with pip) is not
there; this builds a stand-in from a carried Llama 3 tokenizer.json: random
weights of a small Llama shape, a Llama 3 style chat template and the Llama 3
end-of-turn ids, exported as a core in the given dtype. Then

    FLARE_E2E_DEMO=0 FLARE_E2E_CORE=DIR python -m pytest tests/server

serves the same HTTP tests from ``flare-serve DIR`` (tools/gpu_check.sh --server-tests).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# A Llama 3 style chat format (header tokens around each role, <|eot_id|> after each turn).
CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- if message['content'] is string %}{%- set text = message['content'] %}"
    "{%- else %}{%- set text = message['content'] | map(attribute='text') | join('\\n') %}{%- endif %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + text | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
BOS, EOS_IDS = "<|begin_of_text|>", [128001, 128009]


def make_checkpoint(path: Path, tokenizer: Path, *, layers: int, hidden: int, seed: int) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=128256, hidden_size=hidden, intermediate_size=4 * hidden,
                         num_hidden_layers=layers, num_attention_heads=hidden // 64, num_key_value_heads=2,
                         rope_theta=500000.0, max_position_embeddings=32768, rms_norm_eps=1e-5,
                         tie_word_embeddings=False, bos_token_id=128000, eos_token_id=EOS_IDS)
    LlamaForCausalLM(config).save_pretrained(path)
    shutil.copyfile(tokenizer, path / "tokenizer.json")
    (path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": BOS, "eos_token": "<|eot_id|>", "add_bos_token": False, "chat_template": CHAT_TEMPLATE}))
    (path / "generation_config.json").write_text(json.dumps({"bos_token_id": 128000, "eos_token_id": EOS_IDS}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", type=Path, required=True, help="a Llama 3 tokenizer.json")
    parser.add_argument("--output", type=Path, required=True, help="the core directory to write")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--context", type=int, default=32768)
    parser.add_argument("--max-active", type=int, default=8)
    parser.add_argument("--prefill-chunk", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    from flare.core.export import ExportOptions, export_core

    if (args.output / "core.json").exists():
        print(f"core already at {args.output}")
        return 0
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="flare-test-ckpt-") as tmp:
        make_checkpoint(Path(tmp), args.tokenizer, layers=args.layers, hidden=args.hidden, seed=args.seed)
        export_core(Path(tmp), args.output, ExportOptions(
            context=args.context, max_active=args.max_active, prefill_chunk_size=args.prefill_chunk,
            served_names=("flare-test-core",), dtype=args.dtype), lambda m: print(f"  {m}", flush=True))
    print(f"core written to {args.output} in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

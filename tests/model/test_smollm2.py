"""The SmolLM2-135M-Instruct demo core (converted from its GGUF) against transformers.

The reference is transformers' own GGUF loader reading the same file, so the
conversion (dequantization, q/k un-permutation, tokenizer) is checked too.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from flare import fixtures
from flare.core.embedded import demo_core

from .harness import Harness

STEPS = 32
PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers.",
]


SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
LONG_SYSTEM = SYSTEM + ". Answer briefly, accurately and politely; say so when you do not know." * 4


def chatml(question: str, system: str = SYSTEM) -> str:
    return (f"<|im_start|>system\n{system}<|im_end|>\n"
            f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def core_dir():
    return demo_core()


@pytest.fixture(scope="module")
def harness(core_dir):
    h = Harness(core_dir, max_active=4, kv_bytes=512 << 20)
    yield h
    h.close()


@pytest.fixture(scope="module")
def tokenizer(core_dir):
    return Tokenizer.from_file(str(core_dir / "tokenizer.json"))


@pytest.fixture(scope="module")
def reference():
    from transformers import AutoModelForCausalLM
    gguf = fixtures.smollm2_gguf()
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    return model.eval()


def _ids(tokenizer, question: str, system: str = SYSTEM) -> np.ndarray:
    return np.asarray(tokenizer.encode(chatml(question, system), add_special_tokens=False).ids, dtype=np.int64)


def _check(reference, prompt, tokens, logits):
    ids = torch.tensor(np.concatenate([prompt, np.asarray(tokens[:-1], dtype=np.int64)]))[None]
    with torch.no_grad():
        ref = reference(ids).logits[0, len(prompt) - 1:].float()
    assert ref.argmax(-1).tolist() == tokens
    diff = (torch.stack(logits) - ref).abs().max().item()
    assert diff <= 1e-3, f"max |logit difference| {diff}"


def test_tokenizer_matches_transformers_gguf_tokenizer(tokenizer):
    from transformers import AutoTokenizer
    gguf = fixtures.smollm2_gguf()
    ref = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    for q in PROMPTS + ["naïve café — 東京 🚀 x=1\n\n\ttabs"]:
        text = chatml(q)
        assert tokenizer.encode(text, add_special_tokens=False).ids == ref.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("question", PROMPTS)
def test_greedy_parity_with_chunked_prefill(harness, tokenizer, reference, question):
    prompt = _ids(tokenizer, question)
    n = len(prompt)
    harness.admit(1)
    tokens = [harness.prefill(1, prompt, 0, [n // 3, n - n // 3])]
    logits = [harness.logits(1)]
    for _ in range(STEPS - 1):
        tokens.append(harness.decode([1])[1])
        logits.append(harness.logits(1))
    _check(reference, prompt, tokens, logits)


def test_ragged_batch_and_prefix_reuse(harness, tokenizer, reference):
    prompts = {s: _ids(tokenizer, q, LONG_SYSTEM) for s, q in zip((1, 2, 3), PROMPTS)}
    tokens = {s: [] for s in (1, 2, 3, 4)}
    logits = {s: [] for s in (1, 2, 3, 4)}
    for s, p in prompts.items():
        harness.admit(s, generation=100 + s)
        tokens[s].append(harness.prefill(s, p, 0, [len(p)]))
        logits[s].append(harness.logits(s))
    # slot 4 shares slot 1's first complete page (the system prompt) and prefills the rest
    p4 = _ids(tokenizer, "Name a famous French painter.", LONG_SYSTEM)
    assert (p4[:64] == prompts[1][:64]).all()
    harness.share_pages(4, harness.pages[1][:1])
    harness.admit(4, position=64)
    tokens[4].append(harness.prefill(4, p4, 64, [len(p4) - 64]))
    logits[4].append(harness.logits(4))
    prompts[4] = p4
    for _ in range(STEPS - 1):
        out = harness.decode([1, 2, 3, 4])
        for s in out:
            tokens[s].append(out[s])
            logits[s].append(harness.logits(s))
    for s, p in prompts.items():
        _check(reference, p, tokens[s], logits[s])


def test_answers_paris(harness, tokenizer):
    prompt = _ids(tokenizer, "What is the capital of France?")
    harness.admit(1)
    tokens = [harness.prefill(1, prompt, 0, [len(prompt)])]
    while len(tokens) < 24 and tokens[-1] != 2:
        tokens.append(harness.decode([1])[1])
    text = tokenizer.decode(tokens)
    assert "Paris" in text, text

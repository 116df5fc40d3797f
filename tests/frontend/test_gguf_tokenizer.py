"""GGUF vocabulary -> Hugging Face tokenizer conversion (flare.core.gguf_tokenizer).

Differential references: llama.cpp's tokenizer test vectors (``.inp``/``.out``,
produced by the original Hugging Face tokenizers), transformers' own GGUF
tokenizer loading for the SmolLM2 demo model, and a real Llama 3 tokenizer.json.
"""

from __future__ import annotations

import functools
import json
import random
from pathlib import Path

import gguf
import numpy as np
import pytest
from tokenizers import Tokenizer

from flare import fixtures
from flare.core import gguf_tokenizer as gt
from flare.errors import FrontendError

VECTOR_SEPARATOR = "\n__ggml_vocab_test__\n"

# Every vocabulary llama.cpp ships test vectors for.
VECTOR_VOCABS = ["bert-bge", "command-r", "deepseek-coder", "deepseek-llm", "falcon", "gemma-4", "gpt-2",
                 "llama-bpe", "llama-spm", "mpt", "phi-3", "qwen2", "qwen35", "refact", "starcoder"]
# Shipped without vectors: converted and checked for lossless round trips only.
UNVERIFIED_VOCABS = ["aquila", "baichuan", "gpt-neox", "nomic-bert-moe"]


def load_vectors(vocab_dir: Path, name: str) -> list[tuple[str, list[int]]]:
    """llama.cpp's format: inputs separated by a marker line; one output line of ids per input."""
    inputs = (vocab_dir / f"ggml-vocab-{name}.gguf.inp").read_text(encoding="utf-8").split(VECTOR_SEPARATOR)
    if inputs[-1] == "":  # most files end with a separator, gemma-4's with its last input
        inputs.pop()
    outputs = (vocab_dir / f"ggml-vocab-{name}.gguf.out").read_text(encoding="utf-8").split("\n")
    assert outputs.pop() == "" and len(outputs) == len(inputs)
    return [(text, [int(x) for x in line.split()]) for text, line in zip(inputs, outputs)]


def build(converted: gt.GgufTokenizer) -> Tokenizer:
    return Tokenizer.from_str(json.dumps(converted.tokenizer_json))


@functools.lru_cache(maxsize=None)
def convert_vocab(vocab_dir: Path, name: str) -> tuple[gt.GgufTokenizer, Tokenizer]:
    """Each vocabulary is converted once per test session (the large ones take seconds)."""
    converted = gt.convert_gguf_file(vocab_dir / f"ggml-vocab-{name}.gguf")
    return converted, build(converted)


def text_corpus(fixture_root: Path, shared_template_dir: Path | None, seed: int = 0) -> list[str]:
    """Real chat templates (code-like text), every vector input, and random multilingual strings."""
    corpus = [p.read_text(encoding="utf-8") for p in sorted((fixture_root / "templates").glob("*.jinja"))]
    if shared_template_dir is not None:
        corpus += [p.read_text(encoding="utf-8") for p in sorted(shared_template_dir.glob("*.jinja"))]
    for path in sorted((fixture_root / "vocab").glob("*.inp")):
        corpus += path.read_text(encoding="utf-8").split(VECTOR_SEPARATOR)
    rng = random.Random(seed)
    alphabet = ("abc XYZ 0123456789 \n\t\r.,;'\"!?-_()[]{}<>@#$%^&*+=/\\|~` éèçñüößÆøå ПриветМир 中文字符日本語"
                "한국어 😀🦙✅ العربية हिन्दी \u0301\u200d\u00a0")
    corpus += ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 120))) for _ in range(300)]
    return corpus


@pytest.mark.parametrize("name", VECTOR_VOCABS)
def test_llama_cpp_vectors(vocab_dir: Path, name: str):
    _, tokenizer = convert_vocab(vocab_dir, name)
    vectors = load_vectors(vocab_dir, name)
    assert len(vectors) >= 45
    mismatches = [(text, tokenizer.encode(text, add_special_tokens=False).ids, want)
                  for text, want in vectors if tokenizer.encode(text, add_special_tokens=False).ids != want]
    assert mismatches == []


@pytest.mark.parametrize("name", UNVERIFIED_VOCABS)
def test_vocabularies_without_vectors_round_trip(vocab_dir: Path, name: str):
    tokenizer = build(gt.convert_gguf_file(vocab_dir / f"ggml-vocab-{name}.gguf"))
    for text in ["Hello world", "Hello, y'all! 1314151", "нещо на Български", "tab\tnew\nline"]:
        encoding = tokenizer.encode(text, add_special_tokens=False)
        assert encoding.ids and tokenizer.token_to_id(encoding.tokens[0]) == encoding.ids[0]
        # The Unigram vocabulary normalizes (strips, folds); the others are lossless.
        if name != "nomic-bert-moe":
            assert tokenizer.decode(encoding.ids) == text


def test_reader_and_fast_metadata_agree(fixture_root: Path):
    path = fixtures.smollm2_gguf(fixture_root)
    from_reader = gt.convert_gguf_tokenizer(gguf.GGUFReader(path))
    assert from_reader == gt.convert_gguf_file(path)


def test_fast_reader_matches_gguf_reader_on_every_value(vocab_dir: Path):
    path = vocab_dir / "ggml-vocab-llama-spm.gguf"
    fast = gt.read_gguf_metadata(path)
    slow = gt.reader_metadata(gguf.GGUFReader(path))
    assert fast.keys() == slow.keys()
    for key, value in slow.items():
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(fast[key], value)
        else:
            assert fast[key] == value, key


@pytest.fixture(scope="module")
def smollm2(fixture_root: Path) -> tuple[gt.GgufTokenizer, Tokenizer]:
    converted = gt.convert_gguf_file(fixtures.smollm2_gguf(fixture_root))
    return converted, build(converted)


@pytest.fixture(scope="module")
def transformers_smollm2(fixture_root: Path):
    transformers = pytest.importorskip("transformers")
    path = fixtures.smollm2_gguf(fixture_root)
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def test_smollm2_assets_match_transformers_gguf_loading(smollm2, transformers_smollm2):
    converted, _ = smollm2
    reference = json.loads(transformers_smollm2.backend_tokenizer.to_str())
    ours = converted.tokenizer_json
    assert ours["model"]["vocab"] == reference["model"]["vocab"]
    assert len(ours["model"]["vocab"]) == 49152
    assert ours["model"]["merges"] == [list(m) for m in reference["model"]["merges"]]
    assert (sorted((a["id"], a["content"], a["special"]) for a in ours["added_tokens"])
            == sorted((a["id"], a["content"], a["special"]) for a in reference["added_tokens"]))


def test_smollm2_encodes_like_transformers_on_corpus(smollm2, transformers_smollm2, fixture_root,
                                                     shared_template_dir):
    """Token-exact on the corpus once transformers uses the file's "smollm" pre-tokenizer.

    transformers' GGUF loader ignores ``tokenizer.ggml.pre`` for this file and
    splits with plain GPT-2 rules; SmolLM2 (and llama.cpp's "smollm" type)
    isolate every digit first. That one difference is asserted separately below.
    """
    converted, tokenizer = smollm2
    reference = Tokenizer.from_str(transformers_smollm2.backend_tokenizer.to_str())
    reference.pre_tokenizer = tokenizer.pre_tokenizer
    corpus = text_corpus(fixture_root, shared_template_dir)
    assert len(corpus) > 400
    for text in corpus:
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        assert ids == reference.encode(text, add_special_tokens=False).ids, text[:80]
        assert ids == transformers_smollm2.encode(text, add_special_tokens=False) or any(c.isdigit() for c in text)
        assert tokenizer.decode(ids, skip_special_tokens=False) == transformers_smollm2.decode(ids)


def test_smollm2_isolates_digits_like_llama_cpp(smollm2, transformers_smollm2):
    _, tokenizer = smollm2
    pieces = tokenizer.encode("x\n\n1 2024", add_special_tokens=False).tokens
    assert pieces == ["x", "ĊĊ", "1", "Ġ", "2", "0", "2", "4"]
    # transformers' GGUF path glues a newline or space to the digit run instead.
    assert transformers_smollm2.tokenize("x\n\n1 2024") != pieces


def test_smollm2_config_and_generation_ids(smollm2):
    converted, tokenizer = smollm2
    config = converted.tokenizer_config
    assert config["bos_token"] == "<|im_start|>" and converted.bos_token_id == 1
    assert config["eos_token"] == "<|im_end|>" and config["pad_token"] == "<|im_end|>"
    assert config["add_bos_token"] is False and config["add_eos_token"] is False
    assert config["model_max_length"] == 8192
    assert "<|im_start|>" in config["chat_template"]
    # eos first, then <|endoftext|>, which llama.cpp also treats as end of generation.
    assert converted.eos_token_ids == [2, 0]
    assert tokenizer.encode("<|im_start|>user\nHi<|im_end|>", add_special_tokens=False).ids[:1] == [1]
    assert tokenizer.encode("hi", add_special_tokens=True).ids == tokenizer.encode("hi").ids


def test_llama3_fixture_matches_llama_bpe_vectors(fixture_root: Path, vocab_dir: Path):
    reference = Tokenizer.from_file(str(fixtures.llama3_tokenizer_json(fixture_root)))
    for text, want in load_vectors(vocab_dir, "llama-bpe"):
        assert reference.encode(text, add_special_tokens=False).ids == want, text


def test_converted_llama_bpe_matches_llama3_fixture(fixture_root: Path, vocab_dir: Path, shared_template_dir):
    reference = Tokenizer.from_file(str(fixtures.llama3_tokenizer_json(fixture_root)))
    converted, tokenizer = convert_vocab(vocab_dir, "llama-bpe")
    for text in text_corpus(fixture_root, shared_template_dir, seed=1)[::3]:
        assert (tokenizer.encode(text, add_special_tokens=False).ids
                == reference.encode(text, add_special_tokens=False).ids), text[:80]
    # llama.cpp adds BOS for this pre-type; the post-processor says so.
    assert tokenizer.encode("Hi").ids == [128000] + tokenizer.encode("Hi", add_special_tokens=False).ids
    assert converted.tokenizer_config["add_bos_token"] is True


def test_end_of_generation_ids_follow_llama_cpp(vocab_dir: Path):
    llama3, _ = convert_vocab(vocab_dir, "llama-bpe")
    tokens = llama3.tokenizer_json["model"]["vocab"]
    assert llama3.eos_token_ids[0] == 128001
    assert tokens["<|eot_id|>"] in llama3.eos_token_ids  # Llama 3.0 declares no eot/eom: found by text
    metadata = gt.read_gguf_metadata(vocab_dir / "ggml-vocab-llama-bpe.gguf")
    declared = gt.convert_tokenizer_metadata({**metadata, "tokenizer.ggml.eot_token_id": 128009})
    assert declared.eos_token_ids[:2] == [128001, 128009]


def test_named_chat_templates(vocab_dir: Path):
    converted, _ = convert_vocab(vocab_dir, "command-r")
    assert sorted(converted.named_chat_templates) == ["rag", "tool_use"]
    assert "<|START_OF_TURN_TOKEN|>" in converted.named_chat_templates["tool_use"]
    assert "<|START_OF_TURN_TOKEN|>" in converted.tokenizer_config["chat_template"]
    assert convert_vocab(vocab_dir, "gpt-2")[0].named_chat_templates == {}


def test_control_and_user_defined_tokens(vocab_dir: Path):
    converted, tokenizer = convert_vocab(vocab_dir, "gemma-4")
    added = {a["content"]: a for a in converted.tokenizer_json["added_tokens"]}
    metadata = gt.read_gguf_metadata(vocab_dir / "ggml-vocab-gemma-4.gguf")
    types = np.asarray(metadata["tokenizer.ggml.token_type"])
    tokens = metadata["tokenizer.ggml.tokens"]
    for index in np.flatnonzero(types == gt.TOKEN_CONTROL):
        assert added[tokens[index]]["special"] is True
    for index in np.flatnonzero(types == gt.TOKEN_USER_DEFINED):
        assert added[tokens[index]]["special"] is False
    turn = tokenizer.encode("<|turn>user\nHi<turn|>", add_special_tokens=False)
    assert turn.tokens[0] == "<|turn>" and turn.tokens[-1] == "<turn|>"
    assert tokenizer.decode(turn.ids) == "user\nHi"


def test_spm_merges_rank_by_merged_score():
    tokens = ["<unk>", "a", "b", "c", "ab", "bc", "abc"]
    scores = np.array([0, -1, -2, -3, -5, -4, -6], dtype=np.float32)
    assert gt.spm_merges(tokens, scores) == [["b", "c"], ["a", "b"], ["a", "bc"], ["ab", "c"]]


def _metadata(vocab_dir: Path, name: str) -> dict:
    return gt.read_gguf_metadata(vocab_dir / f"ggml-vocab-{name}.gguf")


def test_unsupported_model_and_pre_type_are_named(vocab_dir: Path):
    metadata = _metadata(vocab_dir, "gpt-2")
    with pytest.raises(FrontendError, match="'rwkv'"):
        gt.convert_tokenizer_metadata({**metadata, "tokenizer.ggml.model": "rwkv"})
    with pytest.raises(FrontendError, match="pre-tokenizer type 'kimi-k2'"):
        gt.convert_tokenizer_metadata({**metadata, "tokenizer.ggml.pre": "kimi-k2"})
    with pytest.raises(FrontendError, match="no tokenizer"):
        gt.convert_tokenizer_metadata({"general.architecture": "llama"})


def test_malformed_metadata_is_rejected(vocab_dir: Path, tmp_path: Path):
    metadata = _metadata(vocab_dir, "gpt-2")
    with pytest.raises(FrontendError, match="eos_token_id=99999999"):
        gt.convert_tokenizer_metadata({**metadata, "tokenizer.ggml.eos_token_id": 99999999})
    tokens = list(metadata["tokenizer.ggml.tokens"])
    tokens[5] = tokens[6]
    with pytest.raises(FrontendError, match="repeats token"):
        gt.convert_tokenizer_metadata({**metadata, "tokenizer.ggml.tokens": tokens})
    with pytest.raises(FrontendError, match="token types"):
        gt.convert_tokenizer_metadata({**metadata, "tokenizer.ggml.token_type": np.ones(3, dtype=np.int32)})
    with pytest.raises(FrontendError, match="not a pair"):
        gt.convert_tokenizer_metadata({**metadata, "tokenizer.ggml.merges": ["nospace"]})
    spm = _metadata(vocab_dir, "llama-spm")
    with pytest.raises(FrontendError, match="scores"):
        gt.convert_tokenizer_metadata({k: v for k, v in spm.items() if k != "tokenizer.ggml.scores"})

    not_gguf = tmp_path / "x.gguf"
    not_gguf.write_bytes(b"NOPE" + bytes(40))
    with pytest.raises(FrontendError, match="not a GGUF file"):
        gt.read_gguf_metadata(not_gguf)
    truncated = tmp_path / "t.gguf"
    truncated.write_bytes((vocab_dir / "ggml-vocab-gpt-2.gguf").read_bytes()[:5000])
    with pytest.raises(FrontendError, match="truncated or corrupt"):
        gt.read_gguf_metadata(truncated)


def test_transformers_loads_the_written_files(tmp_path: Path, vocab_dir: Path):
    transformers = pytest.importorskip("transformers")
    converted, tokenizer = convert_vocab(vocab_dir, "qwen2")
    (tmp_path / "tokenizer.json").write_text(json.dumps(converted.tokenizer_json), encoding="utf-8")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(converted.tokenizer_config), encoding="utf-8")
    loaded = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    for text, want in load_vectors(vocab_dir, "qwen2")[:20]:
        assert loaded.encode(text, add_special_tokens=False) == want
        assert tokenizer.encode(text).ids == want  # add_bos_token is false: nothing is added
    assert loaded.eos_token == converted.tokenizer_config["eos_token"]

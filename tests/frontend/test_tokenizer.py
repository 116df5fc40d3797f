"""flare.frontend.tokenizer: encode/decode/offsets/token bytes and the incremental decoder."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flare import fixtures
from flare.core.gguf_tokenizer import convert_gguf_file
from flare.errors import FrontendError
from flare.frontend.tokenizer import IncrementalDecoder, Tokenizer

TEXTS = [
    "Hello world! 😀🦙 нещо на Български 中文字符日本語 한국어",
    "Äpfel e\u0301 résumé — ½ months… 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "   leading spaces\n\n\ttabs   and 1234567 numbers\r\n",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
]
# Byte-level BPE, SentencePiece byte fallback, raw-UTF-8 BPE with byte fallback, WordPiece.
VOCABS = ["llama-spm", "gemma-4", "qwen2", "phi-3", "bert-bge"]


def _load(path: Path) -> Tokenizer:
    return Tokenizer(json.dumps(convert_gguf_file(path).tokenizer_json).encode())


@pytest.fixture(scope="module")
def tokenizers_by_name(fixture_root: Path) -> dict[str, Tokenizer]:
    out = {"smollm2": _load(fixtures.smollm2_gguf(fixture_root))}
    for name in VOCABS:
        out[name] = _load(fixture_root / "vocab" / f"ggml-vocab-{name}.gguf")
    return out


def _stream(decoder: IncrementalDecoder, ids: list[int], cuts: list[int]) -> list[str]:
    pieces, start = [], 0
    for cut in cuts + [len(ids)]:
        pieces.append(decoder.push(ids[start:cut]))
        start = cut
    pieces.append(decoder.flush())
    return pieces


@pytest.mark.parametrize("name", ["smollm2", *VOCABS])
def test_incremental_equals_full_decode_on_random_splits(tokenizers_by_name, name):
    tokenizer = tokenizers_by_name[name]
    rng = random.Random(name)
    for trial in range(60):
        ids = tokenizer.encode(rng.choice(TEXTS) + rng.choice(TEXTS))
        if trial % 3 == 0:  # arbitrary ids, including specials and lone byte tokens
            ids += [rng.randrange(tokenizer.vocab_size) for _ in range(8)]
        cuts = sorted(rng.sample(range(1, len(ids)), k=min(len(ids) - 1, rng.randint(0, 12))))
        for skip in (True, False):
            pieces = _stream(tokenizer.incremental_decoder(skip), ids, cuts)
            assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=skip)


@settings(max_examples=60, deadline=None)
@given(text=st.text(alphabet=st.characters(codec="utf-8"), max_size=40), data=st.data())
def test_incremental_decoding_property(tokenizers_by_name, text, data):
    """Any text, any push sizes: the pieces add up to the full decode."""
    for name in ("smollm2", "llama-spm"):
        tokenizer = tokenizers_by_name[name]
        ids = tokenizer.encode(text)
        decoder = tokenizer.incremental_decoder()
        pieces, start = [], 0
        while start < len(ids):
            size = data.draw(st.integers(1, 6))
            pieces.append(decoder.push(ids[start:start + size]))
            start += size
        pieces.append(decoder.flush())
        assert "".join(pieces) == tokenizer.decode(ids)
        for piece in pieces[:-1]:
            assert not piece.endswith("\ufffd") or "\ufffd" in text


def test_split_multibyte_characters_are_held_back(tokenizers_by_name):
    tokenizer = tokenizers_by_name["smollm2"]
    # A rare CJK character: SmolLM2 spells it as three byte-level tokens.
    ids = tokenizer.encode("龘")
    assert len(ids) > 1
    decoder = tokenizer.incremental_decoder()
    assert [decoder.push([i]) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert decoder.push(ids[-1:]) == "龘"
    assert decoder.flush() == ""
    # A generation that stops mid-character flushes the incomplete bytes as U+FFFD, like a full decode.
    decoder = tokenizer.incremental_decoder()
    assert decoder.push(ids[:1]) == ""
    assert decoder.flush() == tokenizer.decode(ids[:1]) == "\ufffd"


def test_byte_fallback_pieces_are_held_back(tokenizers_by_name):
    tokenizer = tokenizers_by_name["llama-spm"]
    ids = tokenizer.encode("a🦙b")
    pieces = [tokenizer.id_to_token(i) for i in ids]
    assert "<0xF0>" in pieces  # the llama is not in the vocabulary: four byte tokens
    decoder = tokenizer.incremental_decoder()
    out = [decoder.push([i]) for i in ids]
    assert out == ["a", "", "", "", "🦙", "b"]


def test_invalid_byte_streams_do_not_grow_the_window(tokenizers_by_name):
    tokenizer = tokenizers_by_name["llama-spm"]
    lone = tokenizer.token_to_id("<0x80>")  # a continuation byte with no lead byte: never completes
    ids = tokenizer.encode("ok") + [lone] * 60 + tokenizer.encode(" done") + [tokenizer.token_to_id("<0xE2>")]
    decoder = tokenizer.incremental_decoder()
    pieces, longest = [], 0
    for i in ids:
        pieces.append(decoder.push([i]))
        longest = max(longest, len(decoder._ids))
    assert longest <= 2 * IncrementalDecoder.MAX_PENDING + 4
    pieces.append(decoder.flush())
    assert "".join(pieces) == tokenizer.decode(ids)
    assert "".join(pieces[:50]).count("\ufffd") >= 25  # released while the stream continues


def test_special_tokens_skipped_or_kept(tokenizers_by_name):
    tokenizer = tokenizers_by_name["smollm2"]
    ids = tokenizer.encode("<|im_start|>assistant\nHi<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2
    decoder = tokenizer.incremental_decoder(skip_special_tokens=True)
    assert "".join(decoder.push([i]) for i in ids) + decoder.flush() == "assistant\nHi"
    decoder = tokenizer.incremental_decoder(skip_special_tokens=False)
    assert "".join(decoder.push([i]) for i in ids) + decoder.flush() == "<|im_start|>assistant\nHi<|im_end|>"
    assert decoder.num_tokens == len(ids)


@pytest.mark.parametrize("name", ["smollm2", "qwen2", "llama-spm"])
def test_kept_special_tokens_show_and_the_others_stay_skipped(tokenizers_by_name, name):
    """An output parser's special markers stay in the text (decode_keeping); any other special
    token is still dropped, and the text around them decodes as a full decode would."""
    tokenizer = tokenizers_by_name[name]
    specials = sorted(tokenizer.special_ids)[:2]
    texts = [tokenizer.backend.id_to_token(t) for t in specials]
    assert tokenizer.special_token_ids(texts + ["not a token"]) == dict(zip(texts, specials))
    kept, dropped = specials[0], specials[-1]
    rng = random.Random(name)
    for _ in range(20):
        ids = (tokenizer.encode(rng.choice(TEXTS)) + [kept] + tokenizer.encode(rng.choice(TEXTS)) + [dropped]
               + tokenizer.encode(rng.choice(TEXTS)))
        expected = tokenizer.decode_keeping(ids, frozenset({kept}))
        parts = [tokenizer.decode(ids[:ids.index(kept)]), texts[0]]
        assert expected.startswith("".join(parts)) and expected.count(texts[0]) >= 1
        if kept != dropped:
            assert texts[1] not in expected.replace(texts[0], "")
        cuts = sorted(rng.sample(range(1, len(ids)), k=min(len(ids) - 1, 6)))
        assert "".join(_stream(tokenizer.incremental_decoder(keep=frozenset({kept})), ids, cuts)) == expected


def test_token_bytes_concatenate_to_the_text(tokenizers_by_name):
    for name in ("smollm2", "qwen2", "llama-spm", "gemma-4"):
        tokenizer = tokenizers_by_name[name]
        text = "Hello world! 😀🦙 нещо 中文"
        ids = tokenizer.encode(text)
        joined = b"".join(tokenizer.token_bytes(i) for i in ids)
        # SentencePiece writes the prefix space as part of the first piece.
        assert joined.decode("utf-8").lstrip(" ") == text, name
    smollm2 = tokenizers_by_name["smollm2"]
    partial = smollm2.encode("龘")
    assert len(smollm2.token_bytes(partial[0])) < 3  # an incomplete UTF-8 prefix, kept as raw bytes
    assert smollm2.token_bytes(2) == b"<|im_end|>"
    with pytest.raises(FrontendError, match="outside the vocabulary"):
        smollm2.token_bytes(10**7)


def test_offsets_are_untrimmed_with_a_trimming_post_processor(tokenizers_by_name):
    data = json.loads(tokenizers_by_name["smollm2"].backend.to_str())
    data["post_processor"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                              "use_regex": True}
    trimming = Tokenizer(json.dumps(data).encode())
    text = "Hello   world\n\nagain"
    ids, starts, ends = trimming.encode_offsets(text)
    assert ids.tolist() == trimming.encode(text)
    # Offsets tile the text: each token starts where the previous one ended.
    assert starts[0] == 0 and ends[-1] == len(text)
    assert (starts[1:] == ends[:-1]).all()
    trimmed = trimming.backend.encode(text, add_special_tokens=False).offsets
    assert [tuple(o) for o in zip(starts.tolist(), ends.tolist())] != trimmed


def test_bad_tokenizer_json_is_a_frontend_error():
    with pytest.raises(FrontendError, match="could not be parsed"):
        Tokenizer(b"{not json")
    with pytest.raises(FrontendError, match="could not be parsed"):
        Tokenizer(json.dumps({"model": {"type": "Nope"}}).encode())


@pytest.mark.parametrize("name", ["smollm2", *VOCABS])
def test_long_texts_tokenize_the_same_without_holding_the_gil(tokenizers_by_name, name):
    """Past GIL_FREE_ENCODE_CHARS the ids come from the GIL-free batch call and (byte-level
    vocabularies) the spans from the tokens' bytes: the same as the tokenizer's own."""
    import numpy as np

    from flare.frontend.tokenizer import GIL_FREE_ENCODE_CHARS

    tok = tokenizers_by_name[name]
    text = "".join(TEXTS) * (GIL_FREE_ENCODE_CHARS // 100)
    assert len(text) >= GIL_FREE_ENCODE_CHARS
    reference = tok.backend.encode(text, add_special_tokens=False)
    ids, starts, ends = tok.encode_offsets(text)
    offsets = np.asarray(reference.offsets).reshape(-1, 2)
    assert ids.tolist() == reference.ids
    assert starts.tolist() == offsets[:, 0].tolist() and ends.tolist() == offsets[:, 1].tolist()
    assert tok.encode(text, add_special_tokens=True) == tok.backend.encode(text, add_special_tokens=True).ids

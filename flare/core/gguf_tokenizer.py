"""Hugging Face tokenizers rebuilt from a GGUF vocabulary.

A GGUF file carries no ``tokenizer.json``: llama.cpp stores the vocabulary as
metadata (``tokenizer.ggml.*``) and picks the pre-tokenizer from the
``tokenizer.ggml.pre`` name. :func:`convert_gguf_tokenizer` turns that metadata
back into the three Hugging Face files a checkpoint directory holds: a complete
``tokenizer.json`` for the ``tokenizers`` library, ``tokenizer_config.json``
and the end-of-generation ids for ``generation_config.json``.

Vocabulary kinds (``tokenizer.ggml.model``):

- ``gpt2``: byte-level BPE. The merges are in the file; the pre-tokenizer comes
  from :data:`PRE_TOKENIZERS`, keyed by ``tokenizer.ggml.pre``.
- ``llama``: SentencePiece BPE with byte fallback. The file has no merges, so
  they are derived from the vocabulary: every split of a token into two tokens
  is a merge, ranked by the merged token's score (highest first), which is the
  order llama.cpp's SentencePiece tokenizer applies them in.
- ``gemma4``: BPE over raw UTF-8 characters with spaces escaped to U+2581 and
  byte fallback; merges are in the file.
- ``bert``: WordPiece. llama.cpp stores word-initial pieces with a U+2581
  prefix and continuation pieces without ``##``; both are undone here.

Token types: ``CONTROL`` and ``UNKNOWN`` tokens become special added tokens
(matched whole in text, skipped by ``skip_special_tokens``); ``USER_DEFINED``
tokens become non-special added tokens (matched whole, kept when decoding),
which is how llama.cpp's converter labelled them from the original
``added_tokens``.

:func:`read_gguf_metadata` is a metadata-only reader (no tensor views) for the
places that only need the vocabulary: opening a 262k-token vocabulary with
``gguf.GGUFReader`` takes tens of seconds on a small CPU, this takes one.
"""

from __future__ import annotations

import base64
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple

import numpy as np

from ..errors import FrontendError

# llama.cpp's token types (gguf.TokenType).
TOKEN_NORMAL = 1
TOKEN_UNKNOWN = 2
TOKEN_CONTROL = 3
TOKEN_USER_DEFINED = 4
TOKEN_UNUSED = 5
TOKEN_BYTE = 6

SPACE_ESCAPE = "\u2581"  # SentencePiece's visible space

# Token texts llama.cpp treats as end of generation whatever the file declares
# (llama-vocab.cpp, the special_eog_ids scan).
EOG_TOKEN_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>",
    "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>",
})


@dataclass(frozen=True)
class GgufTokenizer:
    """The Hugging Face tokenizer files a GGUF vocabulary describes."""

    tokenizer_json: dict  # a complete tokenizer.json
    tokenizer_config: dict  # tokenizer_config.json
    eos_token_ids: list[int]  # generation_config.json eos_token_id: eos first, then end-of-turn tokens
    bos_token_id: int | None
    # Named extra templates (tokenizer.chat_template.<name>, e.g. Command R's "tool_use" and "rag").
    named_chat_templates: dict[str, str] = field(default_factory=dict)


# -- pre-tokenizers ----------------------------------------------------------

def _split(pattern: str) -> dict:
    """Cut at every regex match, keeping matches and gaps as separate pieces (llama.cpp's regex split)."""
    return {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}


def _byte_level(use_regex: bool) -> dict:
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": use_regex}


def _digits(individual: bool) -> dict:
    return {"type": "Digits", "individual_digits": individual}


# The regexes below are the patterns of the original tokenizer.json files, as
# llama.cpp's llama-vocab.cpp quotes them for each pre-tokenizer type (it
# rewrites case-insensitive groups for its own engine; Oniguruma takes the
# originals).
GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN35_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
TEKKEN_REGEX = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
                r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
                r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
GPT4O_REGEX = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
               r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
               r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
               r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
               r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SEED_CODER_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}"
                    r"| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+")
BAILING_REGEX = (r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}"
                 r"| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+")
DEEPSEEK3_REGEXES = (
    r"\p{N}{1,3}",
    r"[一-龥぀-ゟ゠-ヿ]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)
# DeepSeek LLM's letter class: the cased letters (Lu, Ll, Lt) of its Unicode
# version, as code point ranges. Written as \x{...} escapes because several
# endpoints (U+1F7D, U+1FBE, U+1FD3, U+1FDB, U+2126, U+212A) are canonical
# singletons that any NFC pass over the source would silently rewrite.
_DEEPSEEK_LETTERS = (
    (0x41, 0x5A), (0x61, 0x7A), (0xB5, 0xB5), (0xC0, 0xD6), (0xD8, 0xF6), (0xF8, 0x1BA), (0x1BC, 0x1BF),
    (0x1C4, 0x293), (0x295, 0x2AF), (0x370, 0x373), (0x376, 0x377), (0x37B, 0x37D), (0x37F, 0x37F),
    (0x386, 0x386), (0x388, 0x38A), (0x38C, 0x38C), (0x38E, 0x3A1), (0x3A3, 0x3F5), (0x3F7, 0x481),
    (0x48A, 0x52F), (0x531, 0x556), (0x10A0, 0x10C5), (0x13A0, 0x13F5), (0x13F8, 0x13FD), (0x1C90, 0x1CBA),
    (0x1CBD, 0x1CBF), (0x1D00, 0x1D2B), (0x1D6B, 0x1D77), (0x1D79, 0x1D9A), (0x1E00, 0x1F15), (0x1F18, 0x1F1D),
    (0x1F20, 0x1F45), (0x1F48, 0x1F4D), (0x1F50, 0x1F57), (0x1F59, 0x1F59), (0x1F5B, 0x1F5B), (0x1F5D, 0x1F5D),
    (0x1F5F, 0x1F7D), (0x1F80, 0x1FB4), (0x1FB6, 0x1FBC), (0x1FBE, 0x1FBE), (0x1FC2, 0x1FC4), (0x1FC6, 0x1FCC),
    (0x1FD0, 0x1FD3), (0x1FD6, 0x1FDB), (0x1FE0, 0x1FEC), (0x1FF2, 0x1FF4), (0x1FF6, 0x1FFC), (0x2102, 0x2102),
    (0x2107, 0x2107), (0x210A, 0x2113), (0x2115, 0x2115), (0x2119, 0x211D), (0x2124, 0x2124), (0x2126, 0x2126),
    (0x2128, 0x2128), (0x212A, 0x212D), (0x212F, 0x2134), (0x2139, 0x2139), (0x213C, 0x213F), (0x2145, 0x2149),
    (0x214E, 0x214E), (0x2183, 0x2184), (0x2C00, 0x2C7B), (0x2C7E, 0x2CE4), (0x2CEB, 0x2CEE), (0x2CF2, 0x2CF3),
    (0xA640, 0xA66D), (0xA680, 0xA69B), (0xA722, 0xA76F), (0xA771, 0xA787), (0xA78B, 0xA78E), (0xAB70, 0xABBF),
    (0xFB00, 0xFB06), (0xFB13, 0xFB17), (0xFF21, 0xFF3A), (0xFF41, 0xFF5A), (0x10400, 0x1044F),
    (0x104B0, 0x104D3), (0x104D8, 0x104FB), (0x10C80, 0x10CB2), (0x10CC0, 0x10CF2), (0x118A0, 0x118DF),
    (0x1E900, 0x1E943),
)


def _char_class(ranges: tuple[tuple[int, int], ...]) -> str:
    return "".join(f"\\x{{{a:X}}}" if a == b else f"\\x{{{a:X}}}-\\x{{{b:X}}}" for a, b in ranges)


DEEPSEEK_LLM_REGEXES = (
    r"[\r\n]",
    r"\s?[" + _char_class(_DEEPSEEK_LETTERS) + r"]+",
    r"\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+",
    r"\s+$",
    r"[\x{4E00}-\x{9FA5}\x{0800}-\x{4E00}\x{AC00}-\x{D7FF}]+",
)
DEEPSEEK_CODER_REGEXES = (r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", DEEPSEEK_LLM_REGEXES[4])
BLOOM_REGEX = r" ?[^(\s|.,!?…。，、।۔،)]+"
# llama.cpp's fallback when the file names no pre-tokenizer ("default").
DEFAULT_REGEXES = (r"[\p{P}\$\+<=>\^~\|]+", GPT2_REGEX, r"\p{N}+", r"[0-9][0-9][0-9]")


@dataclass(frozen=True)
class PreTokenizer:
    """How one ``tokenizer.ggml.pre`` type cuts text before byte-level BPE."""

    steps: tuple[dict, ...]  # tokenizers pre-tokenizer JSON, applied in order
    nfc: bool = False  # the original tokenizer.json normalizes to NFC first
    ignore_merges: bool = False  # whole-vocabulary words skip the merges (llama 3 family)
    clean_spaces: bool = True  # clean_up_tokenization_spaces, as llama.cpp sets it


def _regex_then_bytes(*patterns: str, **flags: Any) -> PreTokenizer:
    return PreTokenizer(tuple(_split(p) for p in patterns) + (_byte_level(False),), **flags)


_GPT2 = PreTokenizer((_byte_level(True),))
_STARCODER = PreTokenizer((_digits(True), _byte_level(True)))
_LLAMA3 = _regex_then_bytes(LLAMA3_REGEX, ignore_merges=True)

PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "default": _regex_then_bytes(*DEFAULT_REGEXES),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"),
                    _LLAMA3),
    **dict.fromkeys(("dbrx", "smaug-bpe"), _regex_then_bytes(LLAMA3_REGEX)),
    **dict.fromkeys(("chatglm-bpe", "glm4"), _regex_then_bytes(LLAMA3_REGEX)),
    "deepseek-llm": PreTokenizer(tuple(_split(p) for p in DEEPSEEK_LLM_REGEXES)
                                 + (_digits(False), _byte_level(False)), clean_spaces=False),
    "deepseek-coder": PreTokenizer(tuple(_split(p) for p in DEEPSEEK_CODER_REGEXES)
                                   + (_digits(True), _byte_level(False)), clean_spaces=False),
    **dict.fromkeys(("deepseek-v3", "hunyuan-dense"), _regex_then_bytes(*DEEPSEEK3_REGEXES, clean_spaces=False)),
    # Falcon's tokenizer.json: punctuation runs, the GPT-2 split, digit runs, then groups of three digits.
    "falcon": PreTokenizer(({"type": "Punctuation", "behavior": "Contiguous"}, _byte_level(True), _digits(False),
                            _split(r"[0-9][0-9][0-9]"))),
    "mpt": PreTokenizer((_byte_level(True),), nfc=True),
    **dict.fromkeys(("gpt-2", "phi-2", "roberta-bpe", "olmo", "jais", "exaone4", "trillion", "mellum",
                     "gigachat", "a.x-4.0", "jina-es", "jina-de", "jina-v1-en", "jina-v2-es", "jina-v2-de",
                     "jina-v2-code"), _GPT2),
    "granite-docling": PreTokenizer((_byte_level(True),), clean_spaces=False),
    **dict.fromkeys(("starcoder", "refact", "codeshell", "exaone", "minerva-7b"), _STARCODER),
    "smollm": PreTokenizer((_digits(True), _byte_level(True)), clean_spaces=False),
    "command-r": PreTokenizer((_digits(True), _byte_level(True)), nfc=True, clean_spaces=False),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen"), _regex_then_bytes(QWEN2_REGEX, nfc=True, clean_spaces=False)),
    **dict.fromkeys(("kormo", "hunyuan", "grok-2"), _regex_then_bytes(QWEN2_REGEX, clean_spaces=False)),
    **dict.fromkeys(("stablelm2", "megrez"), _regex_then_bytes(QWEN2_REGEX)),
    # Qwen3.5 has no NFC step: llama.cpp's vectors keep decomposed accents apart.
    "qwen35": _regex_then_bytes(QWEN35_REGEX, clean_spaces=False),
    "tekken": _regex_then_bytes(TEKKEN_REGEX, ignore_merges=True, clean_spaces=False),
    **dict.fromkeys(("gpt-4o", "llama4", "minimax-m2"), _regex_then_bytes(GPT4O_REGEX, clean_spaces=False)),
    "poro-chat": _regex_then_bytes(BLOOM_REGEX, clean_spaces=False),
    **dict.fromkeys(("bloom", "gpt3-finnish"), _regex_then_bytes(BLOOM_REGEX)),
    "viking": _regex_then_bytes(BLOOM_REGEX, r"\p{N}", clean_spaces=False),
    "seed-coder": _regex_then_bytes(SEED_CODER_REGEX, clean_spaces=False),
    **dict.fromkeys(("bailingmoe", "bailingmoe2", "llada-moe"), _regex_then_bytes(BAILING_REGEX, clean_spaces=False)),
}

# llama.cpp adds BOS by default for these byte-level types (llama_vocab::impl::load).
_BPE_ADD_BOS = frozenset({"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                          "tekken"})


# -- metadata ----------------------------------------------------------------

class _Metadata:
    """Typed access to the ``tokenizer.*`` and ``general.*`` keys."""

    def __init__(self, values: Mapping[str, Any]):
        self.values = values

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def token_id(self, name: str, num_tokens: int) -> int | None:
        value = self.values.get(f"tokenizer.ggml.{name}_token_id")
        if value is None:
            return None
        value = int(value)
        if not 0 <= value < num_tokens:
            raise FrontendError(f"GGUF tokenizer.ggml.{name}_token_id={value} is outside the vocabulary "
                                f"of {num_tokens} tokens")
        return value


def _field_value(field: Any) -> Any:
    """One GGUFReader field as Python data (strings decoded, arrays as lists or numpy arrays)."""
    import gguf

    types = field.types
    if not types:
        return None
    if types[0] == gguf.GGUFValueType.ARRAY:
        if len(types) > 1 and types[1] == gguf.GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8") for i in field.data]
        if not field.data:
            return np.zeros(0)
        first, step = field.data[0], (field.data[1] - field.data[0]) if len(field.data) > 1 else 1
        return np.concatenate([np.asarray(p).reshape(-1) for p in field.parts[first::step][:len(field.data)]])
    if types[0] == gguf.GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    value = field.parts[field.data[0]][0]
    return bool(value) if types[0] == gguf.GGUFValueType.BOOL else value.item()


def _wanted(key: str) -> bool:
    return key.startswith("tokenizer.") or key.startswith("general.") or key.endswith(".context_length")


def reader_metadata(reader: Any) -> dict[str, Any]:
    """The tokenizer-relevant metadata of an open ``gguf.GGUFReader``."""
    return {key: _field_value(field) for key, field in reader.fields.items() if _wanted(key)}


# GGUF value types: (struct format, size) for scalars.
_SCALARS = {0: ("B", 1), 1: ("b", 1), 2: ("H", 2), 3: ("h", 2), 4: ("I", 4), 5: ("i", 4), 6: ("f", 4),
            7: ("?", 1), 10: ("Q", 8), 11: ("q", 8), 12: ("d", 8)}
_NUMPY = {0: "u1", 1: "i1", 2: "u2", 3: "i2", 4: "u4", 5: "i4", 6: "f4", 7: "u1", 10: "u8", 11: "i8", 12: "f8"}
_STRING, _ARRAY = 8, 9


def read_gguf_metadata(path: str | Path) -> dict[str, Any]:
    """Read a GGUF file's tokenizer-relevant metadata without mapping its tensors.

    Returns the same mapping as :func:`reader_metadata` on a ``GGUFReader``
    (string arrays as lists, numeric arrays as numpy arrays).
    """
    data = Path(path).read_bytes() if Path(path).stat().st_size < (1 << 26) else None
    if data is None:  # a model file: read only the metadata region, which comes first
        with open(path, "rb") as f:
            data = f.read(1 << 26)
    buf = memoryview(data)
    if bytes(buf[:4]) != b"GGUF":
        raise FrontendError(f"{path} is not a GGUF file")
    order = "<"
    (version,) = struct.unpack_from("<I", buf, 4)
    if version & 0xFFFF == 0:  # written big-endian
        order = ">"
        (version,) = struct.unpack_from(">I", buf, 4)
    if version < 2:
        raise FrontendError(f"{path}: GGUF version {version} is not supported")
    _, num_kv = struct.unpack_from(order + "QQ", buf, 8)
    pos = 24

    def read_string(pos: int) -> tuple[str, int]:
        (n,) = struct.unpack_from(order + "Q", buf, pos)
        return bytes(buf[pos + 8:pos + 8 + n]).decode("utf-8"), pos + 8 + n

    def read_value(kind: int, pos: int) -> tuple[Any, int]:
        if kind == _STRING:
            return read_string(pos)
        if kind == _ARRAY:
            item_kind, count = struct.unpack_from(order + "IQ", buf, pos)
            pos += 12
            if item_kind in _NUMPY:
                dtype = np.dtype(_NUMPY[item_kind]).newbyteorder(order)
                end = pos + count * dtype.itemsize
                array = np.frombuffer(buf[pos:end], dtype=dtype).astype(dtype.newbyteorder("="))
                return (array.astype(bool) if item_kind == 7 else array), end
            items = []
            for _ in range(count):
                item, pos = read_value(item_kind, pos)
                items.append(item)
            return items, pos
        if kind not in _SCALARS:
            raise FrontendError(f"{path}: unknown GGUF value type {kind}")
        fmt, size = _SCALARS[kind]
        (value,) = struct.unpack_from(order + fmt, buf, pos)
        return value, pos + size

    out: dict[str, Any] = {}
    try:
        for _ in range(num_kv):
            key, pos = read_string(pos)
            (kind,) = struct.unpack_from(order + "I", buf, pos)
            value, pos = read_value(kind, pos + 4)
            if _wanted(key):
                out[key] = value
    except (struct.error, UnicodeDecodeError) as exc:
        raise FrontendError(f"{path}: truncated or corrupt GGUF metadata ({exc})") from None
    return out


# -- conversion --------------------------------------------------------------

def convert_gguf_tokenizer(reader: Any) -> GgufTokenizer:
    """Build the Hugging Face tokenizer files from an open ``gguf.GGUFReader``.

    Raises :class:`FrontendError` naming the vocabulary kind or pre-tokenizer
    type when the file describes one this module cannot rebuild.
    """
    return convert_tokenizer_metadata(reader_metadata(reader))


def convert_gguf_file(path: str | Path) -> GgufTokenizer:
    """:func:`convert_gguf_tokenizer` for a path, through the fast metadata reader."""
    return convert_tokenizer_metadata(read_gguf_metadata(path))


class _Built(NamedTuple):
    """What a vocabulary-kind builder produces."""

    body: dict  # normalizer, pre_tokenizer, decoder, model
    tokens: list[str]  # the token texts as the tokenizer spells them (added-token contents)
    add_bos: bool  # llama.cpp's default when the file has no add_bos_token flag
    clean_spaces: bool  # clean_up_tokenization_spaces
    sep_id: int | None = None  # WordPiece appends [SEP]


def convert_tokenizer_metadata(metadata: Mapping[str, Any]) -> GgufTokenizer:
    """Build the Hugging Face tokenizer files from GGUF metadata (``tokenizer.*`` keys)."""
    meta = _Metadata(metadata)
    model = meta.get("tokenizer.ggml.model")
    tokens = meta.get("tokenizer.ggml.tokens")
    if model is None or tokens is None:
        raise FrontendError("GGUF file has no tokenizer (tokenizer.ggml.model / tokenizer.ggml.tokens missing)")
    builder = _BUILDERS.get(model)
    if builder is None:
        raise FrontendError(f"GGUF tokenizer model {model!r} is not supported "
                            f"(supported: {', '.join(sorted(_BUILDERS))})")
    tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]  # as llama.cpp renames them
    types = meta.get("tokenizer.ggml.token_type")
    types = (np.full(len(tokens), TOKEN_NORMAL, dtype=np.int32) if types is None
             else np.asarray(types, dtype=np.int32))
    if len(types) != len(tokens):
        raise FrontendError(f"GGUF has {len(tokens)} tokens but {len(types)} token types")
    return _assemble(meta, types, builder(meta, tokens, types))


def _vocab(tokens: list[str]) -> dict[str, int]:
    vocab: dict[str, int] = {}
    for index, token in enumerate(tokens):
        if vocab.setdefault(token, index) != index:
            raise FrontendError(f"GGUF vocabulary repeats token {token!r} (ids {vocab[token]} and {index})")
    return vocab


def _added_tokens(tokens: list[str], types: np.ndarray) -> list[dict]:
    added = []
    for index in np.flatnonzero((types == TOKEN_CONTROL) | (types == TOKEN_UNKNOWN) | (types == TOKEN_USER_DEFINED)):
        index = int(index)
        added.append({"id": index, "content": tokens[index], "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": int(types[index]) != TOKEN_USER_DEFINED})
    return added


def _split_merge(merge: str) -> list[str]:
    # llama.cpp cuts at the first space after the first character.
    cut = merge.find(" ", 1)
    if cut < 0:
        raise FrontendError(f"GGUF merge {merge!r} is not a pair")
    return [merge[:cut], merge[cut + 1:]]


def _file_merges(meta: _Metadata, model: str) -> list[list[str]]:
    merges = meta.get("tokenizer.ggml.merges")
    if merges is None:
        raise FrontendError(f"GGUF {model} tokenizer has no tokenizer.ggml.merges")
    return [_split_merge(m) for m in merges]


def _bpe_model(tokens: list[str], merges: list[list[str]], *, byte_fallback: bool = False,
               unk_token: str | None = None, ignore_merges: bool = False) -> dict:
    return {"type": "BPE", "dropout": None, "unk_token": unk_token, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": byte_fallback, "byte_fallback": byte_fallback,
            "ignore_merges": ignore_merges, "vocab": _vocab(tokens), "merges": merges}


def _unk_token(meta: _Metadata, tokens: list[str]) -> str | None:
    unk_id = meta.token_id("unknown", len(tokens))
    return tokens[unk_id] if unk_id is not None else None


_ESCAPE_SPACES = {"type": "Replace", "pattern": {"String": " "}, "content": SPACE_ESCAPE}
_SPM_DECODERS = ({"type": "Replace", "pattern": {"String": SPACE_ESCAPE}, "content": " "},
                 {"type": "ByteFallback"}, {"type": "Fuse"})


def _build_byte_level(meta: _Metadata, tokens: list[str], types: np.ndarray) -> _Built:
    pre_name = meta.get("tokenizer.ggml.pre") or "default"
    pre = PRE_TOKENIZERS.get(pre_name)
    if pre is None:
        raise FrontendError(f"GGUF pre-tokenizer type {pre_name!r} is not supported "
                            f"(supported: {', '.join(sorted(PRE_TOKENIZERS))})")
    steps = list(pre.steps)
    body = {
        "normalizer": {"type": "NFC"} if pre.nfc else None,
        "pre_tokenizer": steps[0] if len(steps) == 1 else {"type": "Sequence", "pretokenizers": steps},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": _bpe_model(tokens, _file_merges(meta, "gpt2"), ignore_merges=pre.ignore_merges),
    }
    return _Built(body, tokens, add_bos=pre_name in _BPE_ADD_BOS, clean_spaces=pre.clean_spaces)


def spm_merges(tokens: list[str], scores: np.ndarray) -> list[list[str]]:
    """Merges implied by a SentencePiece vocabulary, best first.

    llama.cpp merges the adjacent pair whose concatenation is the vocabulary
    token with the highest score (leftmost on ties). As BPE ranks: every way to
    split a token into two tokens is a merge, ordered by the token's score,
    descending, then by token id.
    """
    vocab = {t: i for i, t in enumerate(tokens)}
    candidates: list[tuple[float, int, int, int]] = []
    for index, token in enumerate(tokens):
        for cut in range(1, len(token)):
            left = vocab.get(token[:cut])
            if left is None:
                continue
            right = vocab.get(token[cut:])
            if right is not None:
                candidates.append((-float(scores[index]), index, left, right))
    candidates.sort()
    return [[tokens[left], tokens[right]] for _, _, left, right in candidates]


def _build_spm(meta: _Metadata, tokens: list[str], types: np.ndarray) -> _Built:
    scores = meta.get("tokenizer.ggml.scores")
    if scores is None:
        raise FrontendError("GGUF llama (SentencePiece) tokenizer has no tokenizer.ggml.scores")
    add_space_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    # llama.cpp puts a space before every text fragment that starts the text or
    # follows a special token: a Prepend normalizer runs once per such fragment.
    normalizer = ({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": SPACE_ESCAPE}, _ESCAPE_SPACES]}
                  if add_space_prefix else _ESCAPE_SPACES)
    decoders = list(_SPM_DECODERS)
    if add_space_prefix:
        decoders.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    body = {
        "normalizer": normalizer,
        "pre_tokenizer": None,
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": _bpe_model(tokens, spm_merges(tokens, np.asarray(scores, dtype=np.float32)), byte_fallback=True,
                            unk_token=_unk_token(meta, tokens)),
    }
    return _Built(body, tokens, add_bos=True, clean_spaces=False)


def _build_gemma4(meta: _Metadata, tokens: list[str], types: np.ndarray) -> _Built:
    body = {
        "normalizer": _ESCAPE_SPACES,
        # llama.cpp's gemma4 pre-type keeps newline runs apart from other text.
        "pre_tokenizer": _split(r"[^\n]+|[\n]+"),
        "decoder": {"type": "Sequence", "decoders": list(_SPM_DECODERS)},
        "model": _bpe_model(tokens, _file_merges(meta, "gemma4"), byte_fallback=True,
                            unk_token=_unk_token(meta, tokens)),
    }
    return _Built(body, tokens, add_bos=True, clean_spaces=False)


def _build_wordpiece(meta: _Metadata, tokens: list[str], types: np.ndarray) -> _Built:
    # llama.cpp's converter wrote word-initial pieces as U+2581 + piece and
    # continuation pieces without their "##"; bracketed specials stay as they are.
    pieces = [token[1:] if token.startswith(SPACE_ESCAPE)
              else token if token.startswith("[") and token.endswith("]")
              else "##" + token for token in tokens]
    unk_id = meta.token_id("unknown", len(tokens))
    if unk_id is None:
        raise FrontendError("GGUF bert tokenizer has no tokenizer.ggml.unknown_token_id")
    body = {
        "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                       "strip_accents": None, "lowercase": True},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
        "model": {"type": "WordPiece", "unk_token": pieces[unk_id], "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 100, "vocab": _vocab(pieces)},
    }
    return _Built(body, pieces, add_bos=True, clean_spaces=True,
                  sep_id=meta.token_id("seperator", len(tokens)))


def _build_unigram(meta: _Metadata, tokens: list[str], types: np.ndarray) -> _Built:
    scores = meta.get("tokenizer.ggml.scores")
    if scores is None:
        raise FrontendError("GGUF t5 (Unigram) tokenizer has no tokenizer.ggml.scores")
    _vocab(tokens)
    normalizers: list[dict] = []
    charsmap = meta.get("tokenizer.ggml.precompiled_charsmap")
    if charsmap is not None and len(charsmap):
        blob = np.asarray(charsmap, dtype=np.uint8).tobytes()
        normalizers.append({"type": "Precompiled", "precompiled_charsmap": base64.b64encode(blob).decode("ascii")})
    if meta.get("tokenizer.ggml.remove_extra_whitespaces", False):
        normalizers.append({"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "})
    prepend = "always" if meta.get("tokenizer.ggml.add_space_prefix", True) else "never"
    unk_id = meta.token_id("unknown", len(tokens))
    body = {
        "normalizer": {"type": "Sequence", "normalizers": normalizers} if normalizers else None,
        "pre_tokenizer": {"type": "Metaspace", "replacement": SPACE_ESCAPE, "prepend_scheme": prepend,
                          "split": True},
        "decoder": {"type": "Metaspace", "replacement": SPACE_ESCAPE, "prepend_scheme": prepend, "split": True},
        "model": {"type": "Unigram", "unk_id": unk_id, "byte_fallback": False,
                  "vocab": [[t, float(s)] for t, s in zip(tokens, scores)]},
    }
    return _Built(body, tokens, add_bos=False, clean_spaces=True)


_BUILDERS: dict[str, Callable[[_Metadata, list, np.ndarray], _Built]] = {
    "gpt2": _build_byte_level,
    "llama": _build_spm,
    "gemma4": _build_gemma4,
    "bert": _build_wordpiece,
    "t5": _build_unigram,
}


def _template_processor(prefix: list[tuple[str, int]], suffix: list[tuple[str, int]]) -> dict:
    """A post-processor that wraps every sequence in the given special tokens."""
    def special(token: str) -> dict:
        return {"SpecialToken": {"id": token, "type_id": 0}}

    def wrap(sequence: str, type_id: int) -> list[dict]:
        return ([special(t) for t, _ in prefix] + [{"Sequence": {"id": sequence, "type_id": type_id}}]
                + [special(t) for t, _ in suffix])

    specials = {t: {"id": t, "ids": [i], "tokens": [t]} for t, i in prefix + suffix}
    return {"type": "TemplateProcessing", "single": wrap("A", 0), "pair": wrap("A", 0) + wrap("B", 1),
            "special_tokens": specials}


def _assemble(meta: _Metadata, types: np.ndarray, built: _Built) -> GgufTokenizer:
    tokens = built.tokens
    ids = {name: meta.token_id(name, len(tokens))
           for name in ("bos", "eos", "unknown", "padding", "eot", "eom", "cls", "mask")}
    model = meta.get("tokenizer.ggml.model")
    bos_id = ids["cls"] if model == "bert" and ids["cls"] is not None else ids["bos"]
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", built.add_bos))
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", model == "t5"))
    prefix = [(tokens[bos_id], bos_id)] if add_bos and bos_id is not None else []
    suffix = [(tokens[ids["eos"]], ids["eos"])] if add_eos and ids["eos"] is not None else []
    if built.sep_id is not None:
        suffix = [(tokens[built.sep_id], built.sep_id)]
    tokenizer_json = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": _added_tokens(tokens, types),
        "normalizer": built.body["normalizer"],
        "pre_tokenizer": built.body["pre_tokenizer"],
        "post_processor": _template_processor(prefix, suffix) if prefix or suffix else None,
        "decoder": built.body["decoder"],
        "model": built.body["model"],
    }

    def name(token_id: int | None) -> str | None:
        return tokens[token_id] if token_id is not None else None

    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": name(bos_id),
        "eos_token": name(ids["eos"]),
        "unk_token": name(ids["unknown"]),
        "pad_token": name(ids["padding"]),
        "sep_token": name(built.sep_id),
        "mask_token": name(ids["mask"]),
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "clean_up_tokenization_spaces": built.clean_spaces,
        "model_max_length": _context_length(meta),
        "chat_template": meta.get("tokenizer.chat_template") or None,
    }
    config = {key: value for key, value in config.items() if value is not None}
    named = {name: meta.get(f"tokenizer.chat_template.{name}") for name in meta.get("tokenizer.chat_templates") or ()}
    return GgufTokenizer(tokenizer_json=tokenizer_json, tokenizer_config=config,
                         eos_token_ids=_eog_ids(tokens, ids), bos_token_id=bos_id,
                         named_chat_templates={name: text for name, text in named.items() if text})


def _context_length(meta: _Metadata) -> int | None:
    arch = meta.get("general.architecture")
    value = meta.get(f"{arch}.context_length") if arch else None
    return int(value) if value is not None else None


def _eog_ids(tokens: list[str], ids: dict[str, int | None]) -> list[int]:
    """End-of-generation ids: the declared eos, eot and eom, then the token texts llama.cpp also stops at."""
    out: list[int] = []
    for name in ("eos", "eot", "eom"):
        if ids[name] is not None and ids[name] not in out:
            out.append(ids[name])
    for index, token in enumerate(tokens):
        if token in EOG_TOKEN_TEXTS and index not in out:
            out.append(index)
    return out

"""Template annotations: where complete preambles and messages end.

A served chat template needs ``{% mark %}`` tags at the end of the preamble
and of every complete message, so a render reports the byte offsets where the
scheduler may place prefix checkpoints. Three paths, decided once at load
(:func:`annotate_template`):

- ``"marked"``: the template already contains marks (a recipe-annotated
  template supplied by the core); it is used as it is.
- ``"annotation"``: a bundled annotation (``bundled.json``) matches the
  template's SHA-256. It is a list of insertions (byte offset in the source,
  mark text); applying them must give the recorded result SHA-256, and removing
  them gives back the source bytes exactly.
- ``"differential"``: any other template. Message endpoints are derived per
  request by rendering growing prefixes of the conversation and keeping only
  the byte positions every later render preserves
  (:func:`differential_endpoints`).

The bundled annotations cover the families served first: ChatML/SmolLM2,
Qwen2.5, Qwen3 (with thinking), Llama 3.x, Mistral, Gemma and the DeepSeek R1
distills. :mod:`.anchors` regenerates ``bundled.json`` from the templates.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Callable, Sequence

from ...errors import FrontendError

BUNDLED_FILE = "bundled.json"
MARK_TAGS = ("{% mark", "{%- mark", "{%+ mark")

PATH_MARKED = "marked"
PATH_ANNOTATION = "annotation"
PATH_DIFFERENTIAL = "differential"


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Annotation:
    """Mark insertions for one exact template source."""

    name: str  # e.g. "qwen2.5"
    family: str  # e.g. "qwen"
    source_sha256: str
    result_sha256: str
    insertions: tuple[tuple[int, str], ...]  # (byte offset in the source, inserted text), ascending

    def apply(self, source: bytes) -> bytes:
        """Insert the marks; both SHA-256 guards must hold."""
        if sha256_hex(source) != self.source_sha256:
            raise FrontendError(f"annotation {self.name!r} is for template {self.source_sha256}, "
                                f"not {sha256_hex(source)}")
        result = insert_marks(source, self.insertions)
        if sha256_hex(result) != self.result_sha256:
            raise FrontendError(f"annotation {self.name!r} produced {sha256_hex(result)}, "
                                f"expected {self.result_sha256}")
        return result

    def remove(self, result: bytes) -> bytes:
        """The inverse of :meth:`apply`: the source bytes back from the annotated ones."""
        return remove_marks(result, self.insertions)

    def to_json(self) -> dict:
        return {"name": self.name, "family": self.family, "source_sha256": self.source_sha256,
                "result_sha256": self.result_sha256, "insertions": [list(i) for i in self.insertions]}

    @classmethod
    def from_json(cls, data: dict) -> "Annotation":
        return cls(data["name"], data["family"], data["source_sha256"], data["result_sha256"],
                   tuple((int(offset), str(text)) for offset, text in data["insertions"]))


def insert_marks(source: bytes, insertions: Sequence[tuple[int, str]]) -> bytes:
    out, last = [], 0
    for offset, text in insertions:
        if offset < last or offset > len(source):
            raise FrontendError(f"annotation insertion at byte {offset} is out of order or past the template end")
        out += [source[last:offset], text.encode("utf-8")]
        last = offset
    out.append(source[last:])
    return b"".join(out)


def remove_marks(result: bytes, insertions: Sequence[tuple[int, str]]) -> bytes:
    out, position, shift = [], 0, 0
    for offset, text in insertions:
        start = offset + shift
        mark = text.encode("utf-8")
        if result[start:start + len(mark)] != mark:
            raise FrontendError(f"annotated template has no mark at byte {start}")
        out.append(result[position:start])
        position = start + len(mark)
        shift += len(mark)
    out.append(result[position:])
    return b"".join(out)


@lru_cache(maxsize=1)
def bundled_annotations() -> dict[str, Annotation]:
    """The bundled annotations, keyed by source SHA-256."""
    data = json.loads(resources.files(__name__).joinpath(BUNDLED_FILE).read_text(encoding="utf-8"))
    annotations = [Annotation.from_json(item) for item in data["annotations"]]
    return {a.source_sha256: a for a in annotations}


@dataclass(frozen=True)
class AnnotatedTemplate:
    """A template ready to compile, and which endpoint path it uses."""

    source: str  # the template as supplied
    text: str  # what to compile: the source, or the source with bundled marks
    path: str  # PATH_MARKED, PATH_ANNOTATION or PATH_DIFFERENTIAL
    name: str | None = None  # the bundled annotation's name

    @property
    def has_marks(self) -> bool:
        return self.path != PATH_DIFFERENTIAL


def has_mark_tags(source: str) -> bool:
    return any(tag in source for tag in MARK_TAGS)


def annotate_template(source: bytes) -> AnnotatedTemplate:
    """Choose the endpoint path for template ``source`` (its exact bytes)."""
    try:
        text = source.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FrontendError(f"chat template is not valid UTF-8: {exc}") from None
    if has_mark_tags(text):
        return AnnotatedTemplate(text, text, PATH_MARKED)
    annotation = bundled_annotations().get(sha256_hex(source))
    if annotation is None:
        return AnnotatedTemplate(text, text, PATH_DIFFERENTIAL)
    return AnnotatedTemplate(text, annotation.apply(source).decode("utf-8"), PATH_ANNOTATION, annotation.name)


def _common_prefix_len(a: bytes, b: bytes) -> int:
    if b.startswith(a):
        return len(a)
    if a.startswith(b):
        return len(b)
    lo, hi = 0, min(len(a), len(b))  # binary search on memcmp of growing prefixes
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def differential_endpoints(render_prefix: Callable[[int], str | None], num_messages: int, final: bytes,
                           max_prefixes: int = 64) -> list[int]:
    """Byte offsets up to which each prefix render survives in every later render.

    ``render_prefix(k)`` renders the first ``k`` messages without a generation
    prompt (``None`` when the template rejects that prefix; errors that fail the
    request, such as its render budget running out, propagate). For render ``k``
    the kept offset is the longest part of it that every later render and
    ``final`` (the actual prompt) start with: usually all of it, the end of a
    complete message; less when a template closes a conversation differently
    (an end-of-sequence token when there is no generation prompt) or rewrites
    earlier turns (reasoning dropped once a new user turn arrives). By the
    chain rule of common prefixes, the common prefix of consecutive renders
    bounds it. Only the last ``max_prefixes`` prefixes (and the empty one, the
    preamble) are rendered. Callers round each offset down to a token boundary.
    """
    first = max(1, num_messages - max_prefixes + 1)
    renders: list[bytes] = []
    for k in [0] + list(range(first, num_messages + 1)):
        text = render_prefix(k)
        if text is not None:
            renders.append(text.encode("utf-8"))
    endpoints: set[int] = set()
    bound = len(final)  # the least common prefix of everything after the current render
    later = final
    for data in reversed(renders):
        bound = min(bound, _common_prefix_len(data, later))
        if 0 < bound < len(final):
            endpoints.add(bound)
        later = data
    return sorted(endpoints)

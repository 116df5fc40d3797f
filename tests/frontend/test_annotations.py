"""Bundled template annotations and differential endpoints (flare.frontend.annotations)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flare.errors import FrontendError
from flare.frontend import annotations as ann
from flare.frontend.annotations import anchors
from flare.frontend.template import compile_template

TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                         "parameters": {"type": "object",
                                                        "properties": {"city": {"type": "string"}},
                                                        "required": ["city"]}}}
CALL = {"id": "call12345", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}}
CONVERSATIONS = {
    "user": [{"role": "user", "content": "Hi"}],
    "system": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    "turns": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
              {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"}],
    "alternating": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                    {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"},
                    {"role": "user", "content": "e"}],
    "tools": [{"role": "user", "content": "Weather in Paris?"},
              {"role": "assistant", "content": "", "tool_calls": [CALL]},
              {"role": "tool", "tool_call_id": "call12345", "name": "get_weather", "content": "{\"t\": 20}"},
              {"role": "assistant", "content": "20C"}, {"role": "user", "content": "thanks"}],
    "reasoning": [{"role": "user", "content": "a"},
                  {"role": "assistant", "content": "b", "reasoning_content": "think 1"},
                  {"role": "user", "content": "c"}],
}
SPECIALS = {"bos_token": "<BOS>", "eos_token": "<EOS>"}


@pytest.fixture(scope="module")
def sources(fixture_root: Path, shared_template_dir: Path | None) -> dict[str, bytes]:
    return anchors.template_sources(fixture_root, shared_template_dir, anchors.smollm2_template)


@pytest.fixture(scope="module")
def compiled(sources) -> dict[str, tuple]:
    out = {}
    for spec in anchors.SPECS:
        if spec.source in sources:
            annotated = ann.annotate_template(sources[spec.source])
            out[spec.name] = (annotated, compile_template(annotated.source), compile_template(annotated.text))
    return out


def _contexts(name: str):
    for conversation, messages in CONVERSATIONS.items():
        for add_generation_prompt in (True, False):
            for thinking in (None, True, False):
                context = {**SPECIALS, "messages": messages, "add_generation_prompt": add_generation_prompt}
                if thinking is not None:
                    context["enable_thinking"] = thinking
                if conversation == "tools":
                    context["tools"] = [TOOL]
                yield conversation, context


def test_bundled_data_regenerates_from_the_templates(sources):
    """bundled.json is exactly what the anchor specs produce from the template sources."""
    built = {a.name: a for a in anchors.build_all(sources)}
    bundled = {a.name: a for a in ann.bundled_annotations().values()}
    assert set(built) <= set(bundled)
    assert len(bundled) == len(anchors.SPECS) == 15
    for name, annotation in built.items():
        assert bundled[name] == annotation
    families = {a.family for a in bundled.values()}
    assert families == {"chatml", "qwen", "llama3", "mistral", "gemma", "deepseek-r1-distill"}


def test_removing_marks_reproduces_the_source(sources):
    for spec in anchors.SPECS:
        if spec.source not in sources:
            continue
        source = sources[spec.source]
        annotation = ann.bundled_annotations()[ann.sha256_hex(source)]
        result = annotation.apply(source)
        assert result != source and result.count(b"mark") - source.count(b"mark") == len(spec.marks)
        assert annotation.remove(result) == source
        assert ann.annotate_template(source).path == ann.PATH_ANNOTATION


def test_sha256_guards(sources):
    source = sources["fixture:Qwen-Qwen2.5-7B-Instruct.jinja"]
    annotation = ann.bundled_annotations()[ann.sha256_hex(source)]
    # One changed byte: no annotation matches, the template takes the differential path.
    edited = source.replace(b"Alibaba Cloud", b"Alibaba-Cloud", 1)
    assert ann.annotate_template(edited).path == ann.PATH_DIFFERENTIAL
    with pytest.raises(FrontendError, match="is for template"):
        annotation.apply(edited)
    # Offsets that no longer give the recorded result are refused.
    shifted = ann.Annotation(annotation.name, annotation.family, annotation.source_sha256, annotation.result_sha256,
                             tuple((offset + 1, text) for offset, text in annotation.insertions))
    with pytest.raises(FrontendError, match="produced"):
        shifted.apply(source)
    with pytest.raises(FrontendError, match="no mark"):
        annotation.remove(source)
    with pytest.raises(FrontendError, match="out of order"):
        ann.insert_marks(b"abc", [(2, "x"), (1, "y")])


def test_template_with_its_own_marks_is_used_as_is():
    source = "{% for m in messages %}{{ m.content }}{% mark %}{% endfor %}".encode()
    annotated = ann.annotate_template(source)
    assert annotated.path == ann.PATH_MARKED and annotated.text == source.decode()
    with pytest.raises(FrontendError, match="UTF-8"):
        ann.annotate_template(b"\xff{{ x }}")


@pytest.mark.parametrize("name", [spec.name for spec in anchors.SPECS])
def test_annotated_render_is_byte_identical_and_marks_messages(compiled, name):
    if name not in compiled:
        pytest.skip("template source not available (shared templates missing)")
    _, plain, marked = compiled[name]
    rendered = 0
    for conversation, context in _contexts(name):
        try:
            expected = plain.render(dict(context))
        except FrontendError as exc:  # the template rejects this conversation: so must the annotated one
            with pytest.raises(FrontendError) as caught:
                marked.render_marked(dict(context))
            assert str(caught.value) == str(exc)
            continue
        text, marks = marked.render_marked(dict(context))
        assert text == expected
        assert list(marks) == sorted(marks) and all(0 <= m <= len(text.encode()) for m in marks)
        rendered += 1
        if conversation == "alternating" and not context["add_generation_prompt"]:
            # Five messages, five distinct message ends; nothing but whitespace after the last one.
            ends = sorted({m for m in marks if m > 0})
            assert len(ends) >= 5
            assert text.encode()[ends[-1]:].strip() == b""
    assert rendered >= 12


@pytest.mark.parametrize("name", [spec.name for spec in anchors.SPECS])
def test_marks_survive_the_next_turn(compiled, name):
    """A checkpoint at a mark of turn t is a prefix of turn t+1's prompt, at a mark there too."""
    if name not in compiled:
        pytest.skip("template source not available (shared templates missing)")
    _, _, marked = compiled[name]
    for conversation in ("user", "turns", "alternating"):
        if name.startswith("mistral-nemo") and conversation == "turns":
            continue  # Mistral Nemo moves the system prompt into the last user message
        messages = CONVERSATIONS[conversation]
        before = {**SPECIALS, "messages": messages, "add_generation_prompt": True}
        after = {**SPECIALS, "messages": messages + [{"role": "assistant", "content": "ok"},
                                                     {"role": "user", "content": "more"}],
                 "add_generation_prompt": True}
        try:
            text_before, marks_before = marked.render_marked(before)
        except FrontendError:
            continue
        text_after, marks_after = marked.render_marked(after)
        for mark in marks_before:
            assert mark in marks_after, (conversation, mark)
            assert text_after.encode()[:mark] == text_before.encode()[:mark]


def test_differential_endpoints_keep_only_positions_every_later_render_preserves():
    renders = {0: "<s>", 1: "<s>A|", 2: "<s>A|B|", 3: "<s>A*|B|C|"}  # render 3 rewrites message 1
    endpoints = ann.differential_endpoints(lambda k: renders.get(k), 3, b"<s>A*|B|C|>>")
    assert endpoints == [3, 4, 10]  # "<s>", then only "<s>A" of renders 1 and 2 survives, then render 3
    # A template that closes every render with an end token keeps what precedes it (here plus the
    # "<" the end token shares with what follows: the token mapping rounds that down).
    closed = {1: "Q1.</s>", 2: "Q1.A1.</s>"}
    assert ann.differential_endpoints(lambda k: closed.get(k), 2, b"Q1.A1.<gen>") == [3, 7]
    assert ann.differential_endpoints(lambda k: None, 3, b"xyz") == []
    # Only the last max_prefixes prefixes are rendered, plus the empty one.
    seen = []
    ann.differential_endpoints(lambda k: seen.append(k) or "x" * k, 100, b"x" * 200, max_prefixes=4)
    assert seen == [0, 97, 98, 99, 100]


def test_bundled_json_is_well_formed():
    data = json.loads((Path(ann.__file__).parent / ann.BUNDLED_FILE).read_text(encoding="utf-8"))
    assert data["format"] == 1
    for item in data["annotations"]:
        offsets = [offset for offset, _ in item["insertions"]]
        assert offsets == sorted(offsets) and all(text.strip("{%- }") == "mark" for _, text in item["insertions"])

"""Differential test: every real chat template (70 llama.cpp fixtures + 50 from
../shared/templates) crossed with the conversation corpus must render byte-identically
to jinja2 as Transformers configures it, or fail with the same message."""

from __future__ import annotations

import os
from pathlib import Path

from template_corpus import contexts
from template_reference import reference_compile

from flare.errors import FrontendError
from flare.frontend.template import compile_template

CONTEXTS = list(contexts())


def _template_files(template_dir: Path, shared_template_dir: Path | None) -> list[Path]:
    files = sorted(template_dir.glob("*.jinja"))
    if shared_template_dir is not None:
        files += sorted(shared_template_dir.glob("*.jinja"))
    return files


def pytest_generate_tests(metafunc):
    if "template_path" in metafunc.fixturenames:
        from flare import fixtures
        root = fixtures.ensure_fixtures()
        shared = Path(__file__).resolve().parents[3] / "shared" / "templates"
        files = _template_files(root / "templates", shared if shared.is_dir() else None)
        metafunc.parametrize("template_path", files,
                             ids=[f"{p.parent.name}/{p.name}" for p in files])


def _outcome(render, ctx):
    try:
        return ("ok", render(ctx))
    except FrontendError as exc:
        return ("error", str(exc))


def test_template_matches_jinja2(template_path: Path):
    source = template_path.read_text(encoding="utf-8")
    reference = reference_compile(source)
    ours = compile_template(source)

    def ref_render(ctx):
        try:
            return reference.render(**ctx)
        except Exception as exc:  # noqa: BLE001 - jinja2's exception message is the outcome
            raise FrontendError(str(exc)) from exc

    mismatches = []
    for name, ctx in CONTEXTS:
        expected = _outcome(ref_render, ctx)
        got = _outcome(ours.render, ctx)
        if got != expected:
            mismatches.append((name, expected[0], expected[1][:200], got[0], got[1][:200]))
    assert not mismatches, f"{len(mismatches)}/{len(CONTEXTS)} cases differ: {mismatches[:3]}"


def test_corpus_covers_the_brief():
    names = {name.split("/")[0] for name, _ in CONTEXTS}
    assert {"tools_object_args", "tools_string_args", "reasoning", "multimodal",
            "unicode_emoji", "empty_strings", "history_200", "system_multi_turn"} <= names
    options = {(c.get("add_generation_prompt"), c.get("enable_thinking", "absent"))
               for _, c in CONTEXTS}
    assert {(True, True), (False, False), (True, "absent")} <= options
    long = dict(CONTEXTS)["history_200"]
    assert len(long["messages"]) > 200


# Randomised conversations (roles in any order, missing or None fields, tool calls with
# string/object arguments, content parts) against every template: whatever jinja2
# renders or raises, we must render or raise identically.
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_TEXT = st.lists(st.sampled_from(list("ab <>/\n{}\"'é😀") + ["</think>", "<think>",
                                                             "<tool_response>"]),
                 max_size=8).map("".join)
_ARGS = st.one_of(st.dictionaries(st.sampled_from(["city", "n", "q"]),
                                  st.one_of(_TEXT, st.integers(-3, 3), st.booleans()), max_size=2),
                  _TEXT)
_TOOL_CALL = st.fixed_dictionaries(
    {"type": st.just("function"), "function": st.fixed_dictionaries(
        {"name": st.sampled_from(["get_weather", "web_search"]), "arguments": _ARGS})},
    optional={"id": st.sampled_from(["c1", "c2"])})
_CONTENT = st.one_of(_TEXT, st.none(), st.lists(st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": _TEXT}),
    st.fixed_dictionaries({"type": st.just("image")})), max_size=2))
_MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool"]), "content": _CONTENT},
    optional={"tool_calls": st.lists(_TOOL_CALL, max_size=2), "reasoning_content": _TEXT,
              "name": st.just("get_weather")})
_CONTEXT = st.fixed_dictionaries(
    {"messages": st.lists(_MESSAGE, min_size=1, max_size=5),
     "add_generation_prompt": st.booleans(),
     "tools": st.none()},
    optional={"enable_thinking": st.booleans()})


def _all_templates():
    from flare import fixtures
    root = fixtures.ensure_fixtures()
    shared = Path(__file__).resolve().parents[3] / "shared" / "templates"
    files = _template_files(root / "templates", shared if shared.is_dir() else None)
    out = []
    for path in files:
        source = path.read_text(encoding="utf-8")
        out.append((path.name, reference_compile(source), compile_template(source)))
    return out


_TEMPLATES: list = []


@settings(max_examples=int(os.environ.get("FLARE_FUZZ_EXAMPLES", "25")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(ctx=_CONTEXT)
def test_random_conversations_match_jinja2(ctx):
    if not _TEMPLATES:
        _TEMPLATES.extend(_all_templates())
    from template_corpus import SPECIAL_TOKENS, WEATHER_TOOL
    ctx = {**ctx, **SPECIAL_TOKENS, "documents": None}
    for tools in (None, [WEATHER_TOOL]):
        ctx["tools"] = tools
        for name, reference, ours in _TEMPLATES:
            def ref_render(c, reference=reference):
                try:
                    return reference.render(**c)
                except Exception as exc:  # noqa: BLE001
                    raise FrontendError(str(exc)) from exc
            assert _outcome(ours.render, ctx) == _outcome(ref_render, ctx), name

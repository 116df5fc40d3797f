"""Frontend: a tokenizer and a chat template loaded from fingerprinted bytes.

``Frontend.load`` hashes each asset and parses it from the same bytes, so what
runs is exactly what the core's fingerprints name. ``render_chat`` builds the
template context the way Transformers' ``apply_chat_template`` does (messages
with None-valued keys dropped and reasoning fields aliased, tools, the special
tokens map, template defaults overridden by request options), renders with the
compiled template, tokenizes the prompt as Transformers tokenizes a chat (no
special tokens added: the template writes them) and maps message endpoints
from byte offsets to token counts.

A byte cut becomes a token endpoint only when some token ends exactly there
and no token straddles it; endpoints are sorted, unique and strictly inside
the prompt. Which endpoint path a template uses (bundled annotation, marks of
its own, or differential rendering) is decided at load and reported as
``Frontend.endpoint_path``.

All renders done for one request (the prompt and, on the differential path, up
to 65 prefix renders) share one ``RenderBudget``: ``TemplateLimits.time_limit_s``
of wall clock in all, so a slow template fails the request instead of holding a
frontend thread for the sum of its renders.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import FrontendError
from ..request import PreparedPrompt
from .annotations import AnnotatedTemplate, annotate_template, differential_endpoints, sha256_hex
from .forms import TemplateForms, adapt_arguments, adapt_content, detect_forms, renders_tools
from .template import CompiledTemplate, RenderBudget, TemplateBudgetError, TemplateLimits, compile_template
from .tokenizer import IncrementalDecoder, Tokenizer

# Transformers copies reasoning under all three names (chat_template_utils._alias_reasoning_fields).
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
# Transformers' continuation tag (render_jinja_template): appended, rendered, then cut at.
CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# Options the frontend consumes; everything else is a template kwarg.
FRONTEND_OPTIONS = ("add_generation_prompt", "continue_final_message")


@dataclass(frozen=True)
class TokenSettings:
    """Special tokens and tokenization flags (tokenizer_config.json / generation_config.json)."""

    bos_token: str | None = None
    eos_token: str | None = None
    unk_token: str | None = None
    sep_token: str | None = None
    pad_token: str | None = None
    cls_token: str | None = None
    mask_token: str | None = None
    add_bos_token: bool | None = None  # None: the tokenizer.json post-processor decides
    add_eos_token: bool | None = None
    eos_token_ids: tuple[int, ...] = ()

    @classmethod
    def from_tokenizer_config(cls, config: Mapping[str, Any], eos_token_ids: Sequence[int] = ()) -> "TokenSettings":
        """Read tokenizer_config.json; token values may be strings or AddedToken dicts."""
        def token(name: str) -> str | None:
            value = config.get(name)
            if isinstance(value, Mapping):
                value = value.get("content")
            if value is not None and not isinstance(value, str):
                raise FrontendError(f"tokenizer_config {name} must be a string, got {type(value).__name__}")
            return value

        def flag(name: str) -> bool | None:
            value = config.get(name)
            return None if value is None else bool(value)

        return cls(**{name: token(name) for name in SPECIAL_TOKEN_NAMES},
                   add_bos_token=flag("add_bos_token"), add_eos_token=flag("add_eos_token"),
                   eos_token_ids=tuple(int(i) for i in eos_token_ids))

    def special_tokens_map(self) -> dict[str, str]:
        """What Transformers passes to templates as bos_token, eos_token, ..."""
        return {name: getattr(self, name) for name in SPECIAL_TOKEN_NAMES if getattr(self, name) is not None}


@dataclass(frozen=True)
class AssetFingerprints:
    """Expected SHA-256 (hex) of each asset ``Frontend.load`` receives."""

    tokenizer_json: str
    chat_template: str | None = None


@dataclass(frozen=True)
class RenderedChat:
    """A rendered, tokenized chat prompt."""

    text: str
    prompt: bytes  # text as UTF-8
    token_ids: np.ndarray  # [T] int32
    message_endpoints: tuple[int, ...]  # token counts where a preamble or complete message ends
    byte_endpoints: tuple[int, ...] = field(default=())  # the byte cuts the endpoints came from

    def to_prepared(self) -> PreparedPrompt:
        return PreparedPrompt(self.token_ids, self.message_endpoints, self.text)


class Frontend:
    """Tokenizer + chat template for one prepared core. Thread-safe: renders share nothing mutable."""

    def __init__(self, tokenizer: Tokenizer, template: AnnotatedTemplate | None, compiled: CompiledTemplate | None,
                 settings: TokenSettings, defaults: Mapping[str, Any], fingerprints: AssetFingerprints,
                 limits: TemplateLimits | None = None):
        self.tokenizer = tokenizer
        self.limits = limits or TemplateLimits()  # what templates loaded over this tokenizer get
        self.template = template
        self._compiled = compiled  # annotated when the template has marks, else the source as it is
        self.settings = settings
        self.defaults = dict(defaults)
        self.fingerprints = fingerprints
        self._bos_id = self._token_id(settings.bos_token) if settings.add_bos_token else None
        self._eos_id = self._token_id(settings.eos_token) if settings.add_eos_token else None
        # The input forms the template takes (content string/parts, arguments string/mapping), probed once.
        self.forms = detect_forms(self._probe_render) if compiled is not None else TemplateForms()
        # Whether a request's tools reach the model at all (Ollama's "tools" capability).
        self.renders_tools = compiled is not None and renders_tools(self._probe_render)

    @classmethod
    def load(cls, tokenizer_json: bytes, chat_template: bytes | None, expected: AssetFingerprints,
             settings: TokenSettings, defaults: Mapping[str, Any] | None = None,
             limits: TemplateLimits | None = None) -> "Frontend":
        """Verify each asset's SHA-256, then parse it from the same bytes.

        ``defaults`` are the template options a request may override
        (add_generation_prompt, enable_thinking, other chat_template_kwargs);
        ``limits`` bound the template's renders (default ``TemplateLimits()``).
        """
        _verify("tokenizer.json", tokenizer_json, expected.tokenizer_json)
        tokenizer = Tokenizer(bytes(tokenizer_json))
        limits = limits or TemplateLimits()
        template = compiled = None
        if chat_template is not None:
            template, compiled = _load_template(chat_template, expected.chat_template, limits)
        return cls(tokenizer, template, compiled, settings, defaults or {}, expected, limits)

    def with_chat_template(self, chat_template: bytes, expected_sha256: str,
                           defaults: Mapping[str, Any] | None = None) -> "Frontend":
        """Another template over the same tokenizer and settings (e.g. a named tool-use template)."""
        template, compiled = _load_template(chat_template, expected_sha256, self.limits)
        fingerprints = AssetFingerprints(self.fingerprints.tokenizer_json, expected_sha256)
        return Frontend(self.tokenizer, template, compiled, self.settings,
                        self.defaults if defaults is None else defaults, fingerprints, self.limits)

    @property
    def endpoint_path(self) -> str | None:
        """"annotation", "marked", "differential", or None without a template."""
        return self.template.path if self.template is not None else None

    # -- chat ---------------------------------------------------------------

    def render_chat(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None,
                    options: Mapping[str, Any] | None = None) -> RenderedChat:
        """Render and tokenize a conversation; FrontendError for anything the template or inputs reject."""
        if self._compiled is None:
            raise FrontendError("this model has no chat template")
        merged = {"add_generation_prompt": True, **self.defaults, **(options or {})}
        add_generation_prompt = bool(merged.pop("add_generation_prompt"))
        continue_final = merged.pop("continue_final_message", False)
        if continue_final and add_generation_prompt:
            raise FrontendError("continue_final_message and add_generation_prompt are not compatible")
        chat = prepare_messages(messages, self.forms)
        documents = prepare_documents(merged.pop("documents", None))
        context = {**self.settings.special_tokens_map(), **merged, "messages": chat,
                   "tools": prepare_tools(tools), "documents": documents,
                   "add_generation_prompt": add_generation_prompt}
        continue_text = None
        if continue_final:
            continue_text = _tag_final_message(chat, continue_final, self.template.source)
        budget = self._compiled.budget()  # one deadline for every render of this request
        if self.template.has_marks:
            text, marks = self._compiled.render_marked(context, budget)
            cuts = list(marks)
        else:
            text = self._compiled.render(context, budget)
            cuts = None
        if continue_text is not None:
            text = _cut_at_tag(text, continue_text)
        prompt = text.encode("utf-8")
        if cuts is None:
            cuts = self._differential(context, len(chat), prompt, continue_text is not None, budget)
            # Any shorter prefix of a preserved prefix is preserved too: round down to a token boundary.
            return self._tokenize(text, prompt, cuts, round_down=True)
        return self._tokenize(text, prompt, cuts)

    def _probe_render(self, probe: Mapping[str, Any]) -> str:
        """Render a form probe over the context every request starts from (detect_forms)."""
        context = {**self.settings.special_tokens_map(), "add_generation_prompt": True, **self.defaults,
                   "tools": None, "documents": None, **probe}
        return self._compiled.render(context)

    def prepare_chat(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None,
                     options: Mapping[str, Any] | None = None) -> PreparedPrompt:
        return self.render_chat(messages, tools, options).to_prepared()

    def _differential(self, context: dict, num_messages: int, prompt: bytes, continued: bool,
                      budget: RenderBudget) -> list[int]:
        # With continuation the final message is open: its end is not a message end.
        num_complete = num_messages - 1 if continued else num_messages

        def render_prefix(k: int) -> str | None:
            try:
                return self._compiled.render({**context, "messages": context["messages"][:k],
                                              "add_generation_prompt": False}, budget)
            except TemplateBudgetError:
                raise  # the request's budget is spent: no later render can succeed
            except FrontendError:
                return None  # the template rejects this prefix

        return differential_endpoints(render_prefix, num_complete, prompt)

    def _tokenize(self, text: str, prompt: bytes, cuts: Sequence[int], round_down: bool = False) -> RenderedChat:
        ids, starts, ends = self.tokenizer.encode_offsets(text)
        byte_cuts = sorted({c for c in cuts if 0 < c < len(prompt)})
        endpoints = token_endpoints(byte_cuts, prompt, starts, ends, round_down=round_down)
        return RenderedChat(text, prompt, ids, tuple(endpoints), tuple(byte_cuts))

    # -- tokens -------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Tokenize raw text. With special tokens, explicit add_bos/add_eos settings win over the post-processor."""
        if not add_special_tokens:
            return self.tokenizer.encode(text)
        if self.settings.add_bos_token is None and self.settings.add_eos_token is None:
            return self.tokenizer.encode(text, add_special_tokens=True)
        ids = self.tokenizer.encode(text)
        if self._bos_id is not None:
            ids.insert(0, self._bos_id)
        if self._eos_id is not None:
            ids.append(self._eos_id)
        return ids

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def incremental_decoder(self, skip_special_tokens: bool = True,
                            keep: frozenset[int] = frozenset()) -> IncrementalDecoder:
        return IncrementalDecoder(self.tokenizer, skip_special_tokens=skip_special_tokens, keep=keep)

    def token_bytes(self, token_id: int) -> bytes:
        return self.tokenizer.token_bytes(token_id)

    def token_strings(self, token_ids: Sequence[int]) -> list[str]:
        """Each token's vocabulary string (``convert_ids_to_tokens``); "" for an ID the vocabulary lacks."""
        return [self.tokenizer.id_to_token(int(t)) or "" for t in token_ids]

    def check_token_ids(self, token_ids: Sequence[int]) -> list[int]:
        """``token_ids`` as ints, or FrontendError naming the first outside the vocabulary."""
        size = self.tokenizer.vocab_size
        ids = [int(t) for t in token_ids]
        bad = next((t for t in ids if not 0 <= t < size), None)
        if bad is not None:
            raise FrontendError(f"token ID {bad} is outside the vocabulary of {size}")
        return ids

    def _token_id(self, token: str | None) -> int | None:
        if token is None:
            return None
        token_id = self.tokenizer.token_to_id(token)
        if token_id is None:
            raise FrontendError(f"special token {token!r} is not in the vocabulary")
        return token_id


class RequestTemplates:
    """Frontends for chat templates that requests carry (--trust-request-chat-template).

    Each distinct template is compiled, annotated and probed once over the base
    frontend's tokenizer and settings, then kept in a bounded LRU keyed by its
    SHA-256; thread-safe (frontend workers share it). A template that fails to
    compile raises FrontendError naming the line and column, and is not kept.
    """

    def __init__(self, base: Frontend, capacity: int = 8):
        self.base = base
        self.capacity = capacity
        self._frontends: OrderedDict[str, Frontend] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._frontends)

    def get(self, source: str) -> Frontend:
        data = source.encode("utf-8")
        digest = sha256_hex(data)
        with self._lock:
            frontend = self._frontends.get(digest)
            if frontend is not None:
                self._frontends.move_to_end(digest)
                return frontend
        frontend = self.base.with_chat_template(data, digest)  # compiled outside the lock
        with self._lock:
            self._frontends[digest] = frontend
            self._frontends.move_to_end(digest)
            while len(self._frontends) > self.capacity:
                self._frontends.popitem(last=False)
        return frontend


def read_template_file(path: str | Path, limits: TemplateLimits | None = None, *, check: bool = True) -> bytes:
    """The bytes of a chat-template file (--chat-template), checked to be UTF-8 and (``check``) to compile;
    a caller that compiles them itself next passes ``check=False``.

    FrontendError names the file, and the line and column of a compile error.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise FrontendError(f"cannot read chat template {path}: {exc.strerror or exc}") from None
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FrontendError(f"chat template {path} is not UTF-8: {exc}") from None
    if not check:
        return data
    try:
        compile_template(annotate_template(data).text, limits)
    except FrontendError as exc:
        raise FrontendError(f"chat template {path}: {exc}") from None
    return data


def _load_template(chat_template: bytes, expected: str | None,
                   limits: TemplateLimits) -> tuple[AnnotatedTemplate, CompiledTemplate]:
    if expected is None:
        raise FrontendError("chat template supplied without an expected SHA-256")
    _verify("chat template", chat_template, expected)
    template = annotate_template(bytes(chat_template))
    compiled = compile_template(template.text, limits)
    if compiled.mark_kind == "segment":
        raise FrontendError("chat template uses segment-count marks ({% mark expr %}), which need a segmented "
                            "renderer; annotate it with byte marks ({% mark %}) instead")
    return template, compiled


def _verify(asset: str, data: bytes, expected: str) -> None:
    actual = sha256_hex(bytes(data))
    if actual != expected.lower():
        raise FrontendError(f"{asset} fingerprint mismatch: expected SHA-256 {expected}, got {actual}")


# -- inputs --------------------------------------------------------------------

def prepare_messages(messages: Sequence[Mapping[str, Any]], forms: TemplateForms = TemplateForms()) -> list[dict]:
    """Fresh message dicts as Transformers hands them to templates, in the forms the template takes.

    Keys whose value is None are dropped and reasoning is aliased under all
    three names (both as Transformers does); content and tool-call arguments
    keep the client's form unless ``forms`` says the template cannot take it
    (frontend/forms.py). Arguments strings must hold JSON objects either way.
    The caller's messages are never modified.
    """
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise FrontendError("messages must be a list of message objects")
    if not messages:
        raise FrontendError("cannot render an empty conversation: provide at least one message")
    chat = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise FrontendError(f"messages[{index}] must be an object, got {type(message).__name__}")
        out = {key: value for key, value in message.items() if value is not None}
        if "content" not in out and out.get("role") == "assistant" and out.get("tool_calls"):
            # A tool-call turn without content (OpenAI's null) reads as "", as vLLM renders it:
            # templates such as Qwen3's test `in content` on it and would fail on a missing key.
            out["content"] = ""
        if "content" in out:
            out["content"] = adapt_content(out["content"], forms.content)
        calls = out.get("tool_calls")
        if calls is not None:
            out["tool_calls"] = _prepare_tool_calls(calls, index, forms.arguments)
        reasoning = next((out[key] for key in REASONING_FIELDS if out.get(key) is not None), None)
        if reasoning is not None:
            out = {"thinking": reasoning, **out, "reasoning_content": reasoning}
        chat.append(out)
    return chat


def _prepare_tool_calls(calls: Any, index: int, form: str) -> list:
    if not isinstance(calls, Sequence) or isinstance(calls, (str, bytes)):
        raise FrontendError(f"messages[{index}].tool_calls must be a list")
    prepared = []
    for number, call in enumerate(calls):
        if not isinstance(call, Mapping):
            raise FrontendError(f"messages[{index}].tool_calls[{number}] must be an object")
        call = dict(call)
        where = f"messages[{index}].tool_calls[{number}] arguments"
        function = call.get("function")
        if isinstance(function, Mapping):
            function = dict(function)
            function["arguments"] = adapt_arguments(function.get("arguments"), form, where)
            call["function"] = function
        elif "arguments" in call:
            call["arguments"] = adapt_arguments(call["arguments"], form, where)
        prepared.append(call)
    return prepared


def prepare_documents(documents: Any) -> list | None:
    """RAG documents for the template (``documents``): a list of objects, as Transformers requires."""
    if documents is None:
        return None
    if isinstance(documents, (str, bytes)) or not isinstance(documents, Sequence):
        raise FrontendError("documents must be a list of document objects")
    for number, document in enumerate(documents):
        if not isinstance(document, Mapping):
            raise FrontendError(f"documents[{number}] must be an object, got {type(document).__name__}")
    return [dict(document) for document in documents]


def prepare_tools(tools: Sequence[Mapping[str, Any]] | None) -> list | None:
    if tools is None:
        return None
    if isinstance(tools, (str, bytes)) or not isinstance(tools, Sequence):
        raise FrontendError("tools must be a list of tool objects")
    for number, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise FrontendError(f"tools[{number}] must be an object, got {type(tool).__name__}")
    return [dict(tool) for tool in tools]


def _tag_final_message(chat: list[dict], field_name: Any, template_source: str) -> str:
    """Append Transformers' continuation tag to the final message; return the text being continued."""
    name = field_name if isinstance(field_name, str) else "content"
    final = chat[-1]
    value = final.get(name)
    if value is None:
        raise FrontendError(f'continue_final_message is set but the final message has no "{name}" to continue')
    fields = [name]
    if name in REASONING_FIELDS:
        fields = [f for f in REASONING_FIELDS if final.get(f) == value]
    if not any(f in template_source for f in fields):
        raise FrontendError(f'continue_final_message is set to "{name}" but the chat template does not use it')
    if isinstance(value, (list, tuple)):
        blocks = [dict(block) if isinstance(block, Mapping) else block for block in value]
        for block in reversed(blocks):
            if isinstance(block, dict) and "text" in block:
                text = block["text"]
                block["text"] = text + CONTINUE_TAG
                final[name] = blocks
                return text
        raise FrontendError("continue_final_message is set but the final message has no text to continue")
    if not isinstance(value, str):
        raise FrontendError("continue_final_message needs the final message content to be text")
    for f in fields:
        final[f] = final[f] + CONTINUE_TAG
    return value


def _cut_at_tag(rendered: str, final_text: str) -> str:
    """Cut the render where the continuation tag landed (Transformers' rule, spacing included)."""
    tag = CONTINUE_TAG.strip()
    if final_text.strip() not in rendered or tag not in rendered:
        raise FrontendError("continue_final_message is set but the final message does not appear in the "
                            "rendered chat (the template deletes part of it)")
    location = rendered.rindex(tag)
    if rendered[location:location + len(CONTINUE_TAG)] == CONTINUE_TAG:
        return rendered[:location]
    return rendered[:location].rstrip()


# -- endpoints -----------------------------------------------------------------

def token_endpoints(byte_cuts: Sequence[int], prompt: bytes, starts: np.ndarray, ends: np.ndarray,
                    round_down: bool = False) -> list[int]:
    """Token counts for byte cuts where a token ends exactly and none straddles.

    ``starts``/``ends`` are token character offsets. A cut ``c`` (as a
    character index) maps to ``k`` tokens when the first ``k`` tokens all end
    at or before ``c`` with one ending exactly at ``c``, and every later token
    starts at or after ``c``. With ``round_down`` a cut that falls inside a
    token moves back to the last such clean boundary before it instead of
    being dropped. Only 0 < k < len(tokens) is kept.
    """
    num_tokens = len(starts)
    if num_tokens < 2 or not byte_cuts:
        return []
    char_cuts = _byte_to_char(prompt, byte_cuts)
    end_max = np.maximum.accumulate(ends)  # [T] the furthest end among the first k tokens
    start_min = np.minimum.accumulate(starts[::-1])[::-1]  # [T] the earliest start from token k on
    # clean[k-1]: the first k tokens end where all later ones start (a cut there splits nothing).
    clean = np.append(start_min[1:] >= end_max[:-1], False)  # [T]
    out = []
    for cut in char_cuts:
        k = int(np.searchsorted(end_max, cut, side="right"))  # tokens whose prefix ends at or before cut
        if round_down:
            while k > 0 and not clean[k - 1]:
                k -= 1
        elif k == 0 or end_max[k - 1] != cut or not clean[k - 1]:
            continue
        if 0 < k < num_tokens:
            out.append(k)
    return sorted(set(out))


def _byte_to_char(prompt: bytes, byte_cuts: Sequence[int]) -> list[int]:
    """Character indices of sorted byte offsets (each on a UTF-8 boundary: marks are)."""
    out, chars, last = [], 0, 0
    for cut in byte_cuts:
        try:
            chars += len(prompt[last:cut].decode("utf-8"))
        except UnicodeDecodeError:
            raise FrontendError(f"endpoint at byte {cut} splits a UTF-8 character") from None
        out.append(chars)
        last = cut
    return out

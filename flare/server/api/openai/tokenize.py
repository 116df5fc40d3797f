"""vLLM's tokenizer routes: ``POST /tokenize`` and ``POST /detokenize``.

``/tokenize`` takes either ``prompt`` (raw text; ``add_special_tokens``
defaults to true, as for completions) or ``messages`` with the chat-prompt
fields chat completions take (``tools``, ``documents``,
``chat_template_kwargs``, ``add_generation_prompt``,
``continue_final_message``, and ``chat_template`` under
--trust-request-chat-template; ``add_special_tokens`` defaults to false: the
template writes them). It answers ``count``, ``max_model_len``, ``tokens`` and
``token_strs`` (the vocabulary strings, when ``return_token_strs`` is true,
else null). The IDs are exactly what a generation request with the same
fields would prefill. ``/detokenize`` takes ``tokens`` and answers
``prompt``, decoded with special tokens kept.

Both need auth like the other routes, hold an HTTP admission permit (they
share the frontend workers with generation) and render on a worker thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...generation import check_model
from ...protocol import HttpConnection, HttpRequest
from ...request_body import decode_json
from ...response import Response
from .schema import CHAT_PROMPT_FIELDS, MAX_TOKEN_ID, _bool, _check_fields, _invalid, chat_prompt

if TYPE_CHECKING:
    from ...app import ServerState

_COMMON = frozenset({"model", "add_special_tokens", "return_token_strs"})
TOKENIZE_PROMPT_FIELDS = _COMMON | {"prompt"}
TOKENIZE_CHAT_FIELDS = _COMMON | CHAT_PROMPT_FIELDS
DETOKENIZE_FIELDS = frozenset({"model", "tokens"})


def _body(state: "ServerState", request: HttpRequest) -> dict[str, Any]:
    body = decode_json(request.body, max_depth=state.config.max_json_depth)
    if not isinstance(body, dict):
        raise _invalid("request body must be a JSON object", None)
    model = body.get("model")
    if model is not None:
        if not isinstance(model, str):
            raise _invalid("'model' must be a string", "model")
        check_model(state, model)
    return body


def check_request_template(state: "ServerState", template: str | None) -> None:
    """A request's own chat template is refused unless the server trusts them (vLLM's rule)."""
    if template is not None and not state.config.trust_request_chat_template:
        raise _invalid("a chat template was sent with the request, but the server was not started with "
                       "--trust-request-chat-template", "chat_template")


async def tokenize(state: "ServerState", request: HttpRequest, conn: HttpConnection) -> Response:
    body = _body(state, request)
    engine = state.engine
    if "messages" in body:
        _check_fields(body, TOKENIZE_CHAT_FIELDS)
        prompt = chat_prompt(body)
        check_request_template(state, prompt.chat_template)
        add_special = _bool(body, "add_special_tokens", False)

        def run() -> list[int]:
            prepared = engine.prepare_chat(prompt.messages, tools=prompt.tools, options=prompt.options,
                                           chat_template=prompt.chat_template)
            if add_special:  # on top of what the template wrote, as vLLM does
                return engine.encode(prepared.text, add_special_tokens=True)
            return prepared.token_ids.tolist()
    else:
        _check_fields(body, TOKENIZE_PROMPT_FIELDS)
        text = body.get("prompt")
        if not isinstance(text, str):
            raise _invalid("'prompt' (a string) or 'messages' is required", "prompt")
        add_special = _bool(body, "add_special_tokens", True)

        def run() -> list[int]:
            return engine.encode(text, add_special_tokens=add_special)
    want_strs = _bool(body, "return_token_strs")
    ids = await state.frontend.run(run)
    strs = await state.frontend.run(engine.token_strings, ids) if want_strs else None
    return Response.json(200, {"count": len(ids), "max_model_len": state.card.max_model_len, "tokens": ids,
                               "token_strs": strs})


async def detokenize(state: "ServerState", request: HttpRequest, conn: HttpConnection) -> Response:
    body = _body(state, request)
    _check_fields(body, DETOKENIZE_FIELDS)
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= MAX_TOKEN_ID for t in tokens):
        raise _invalid(f"'tokens' must be a list of token IDs (integers 0..{MAX_TOKEN_ID})", "tokens")
    text = await state.frontend.run(state.engine.decode, tokens)
    return Response.json(200, {"prompt": text})

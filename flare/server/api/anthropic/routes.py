"""Anthropic Messages routes: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

``/v1/messages`` validates its body (schema.py), checks the model name and hands
the rest to the shared generation layer (server/generation.py) with its format
(format.py): the same admission, limits, prefix cache, disconnect cancellation
and metrics as the OpenAI routes. ``count_tokens`` renders the same prompt on a
frontend worker and answers its length; it takes an HTTP admission permit too,
since it shares the workers with generation.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from ...generation import check_model, generate
from ...protocol import HttpConnection, HttpRequest
from ...request_body import decode_json, shorten
from ...response import Response
from .errors import error_response
from .format import MessageFormat
from .schema import MessagesRequest, parse_count_tokens, parse_messages

if TYPE_CHECKING:
    from ...app import Router, ServerState


def install(router: "Router", state: "ServerState") -> None:
    """Add the Anthropic routes to ``router`` (after the OpenAI family: see _share_models)."""
    router.add("POST", "/v1/messages", lambda request, conn: messages(state, request, conn), generation=True,
               errors=error_response, name="anthropic.messages")
    router.add("POST", "/v1/messages/count_tokens", lambda request, conn: count_tokens(state, request, conn),
               generation=True, errors=error_response)
    _share_models(router, state)


# -- discovery: GET /v1/models is both APIs' path ---------------------------------

ANTHROPIC_VERSION = b"anthropic-version"  # every anthropic SDK request carries it


def _share_models(router: "Router", state: "ServerState") -> None:
    """Answer ``GET /v1/models`` and ``/v1/models/{id}`` in Anthropic's shape for requests that carry
    ``anthropic-version``, and leave every other request to the OpenAI route already installed."""
    listed, _, _ = router.resolve("GET", "/v1/models")
    single, _, _ = router.resolve("GET", "/v1/models/x")
    if listed is None or single is None:
        raise RuntimeError("the Anthropic family installs after the OpenAI family (session.FAMILIES)")

    def list_models(request: HttpRequest, conn: HttpConnection):
        if request.header(ANTHROPIC_VERSION) is None:
            return listed.handler(request, conn)
        info = _model_info(state)
        return Response.json(200, {"data": [info], "first_id": info["id"], "last_id": info["id"], "has_more": False})

    def get_model(request: HttpRequest, conn: HttpConnection):
        if request.header(ANTHROPIC_VERSION) is None:
            return single.handler(request, conn)
        name = unquote(request.params["tail"])
        if name != state.card.id and not state.card.matches(name):
            return error_response(404, f"the model '{shorten(name)}' does not exist", code="model_not_found")
        return Response.json(200, _model_info(state))

    router.add("GET", "/v1/models", list_models, errors=listed.errors)
    router.add_prefix("GET", "/v1/models/", get_model, errors=single.errors)


def _model_info(state: "ServerState") -> dict[str, Any]:
    card = state.card
    created = datetime.fromtimestamp(card.created, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"type": "model", "id": card.id, "display_name": card.identifier, "created_at": created,
            "max_input_tokens": card.max_model_len, "max_tokens": card.max_model_len}


def _json_body(state: "ServerState", request: HttpRequest) -> Any:
    return decode_json(request.body, max_depth=state.config.max_json_depth)


def _prepare(state: "ServerState", request: MessagesRequest):
    prompt, engine = request.prompt, state.engine
    return lambda: engine.prepare_chat(prompt.messages, tools=prompt.tools, options=prompt.options,
                                       chat_template=None)


async def messages(state: "ServerState", request: HttpRequest, conn: HttpConnection) -> Response | None:
    body = parse_messages(_json_body(state, request), state.generation_defaults)
    check_model(state, body.model)
    fmt = MessageFormat(state, body)
    return await generate(state, request, conn, fmt, _prepare(state, body), fmt.resolve, stream=body.stream,
                          output=state.output_plan(body.prompt.tools, body.tool_choice))


async def count_tokens(state: "ServerState", request: HttpRequest, conn: HttpConnection) -> Response:
    body = parse_count_tokens(_json_body(state, request))
    check_model(state, body.model)
    prompt = await state.frontend.run(_prepare(state, body))
    return Response.json(200, {"input_tokens": len(prompt)})

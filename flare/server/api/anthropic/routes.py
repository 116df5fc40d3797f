"""Anthropic Messages routes: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

``/v1/messages`` validates its body (schema.py), checks the model name and hands
the rest to the shared generation layer (server/generation.py) with its format
(format.py): the same admission, limits, prefix cache, disconnect cancellation
and metrics as the OpenAI routes. ``count_tokens`` renders the same prompt on a
frontend worker and answers its length; it takes an HTTP admission permit too,
since it shares the workers with generation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ....errors import AdmissionError
from ...generation import generate
from ...protocol import HttpConnection, HttpRequest
from ...request_body import decode_json, shorten
from ...response import Response
from .errors import error_response
from .format import MessageFormat
from .schema import MessagesRequest, parse_count_tokens, parse_messages

if TYPE_CHECKING:
    from ...app import Router, ServerState


def install(router: "Router", state: "ServerState") -> None:
    """Add the Anthropic routes to ``router``."""
    router.add("POST", "/v1/messages", lambda request, conn: messages(state, request, conn), generation=True,
               errors=error_response)
    router.add("POST", "/v1/messages/count_tokens", lambda request, conn: count_tokens(state, request, conn),
               generation=True, errors=error_response)


def _json_body(state: "ServerState", request: HttpRequest) -> Any:
    return decode_json(request.body, max_depth=state.config.max_json_depth)


def _check_model(state: "ServerState", request: MessagesRequest) -> None:
    if request.model != state.card.id and not state.card.matches(request.model):
        raise AdmissionError(f"the model '{shorten(request.model)}' does not exist", status=404,
                             code="model_not_found", param="model")


def _prepare(state: "ServerState", request: MessagesRequest):
    prompt, engine = request.prompt, state.engine
    return lambda: engine.prepare_chat(prompt.messages, tools=prompt.tools, options=prompt.options,
                                       chat_template=None)


async def messages(state: "ServerState", request: HttpRequest, conn: HttpConnection) -> Response | None:
    body = parse_messages(_json_body(state, request), state.generation_defaults)
    _check_model(state, body)
    fmt = MessageFormat(state, body)
    return await generate(state, request, conn, fmt, _prepare(state, body), fmt.resolve, stream=body.stream,
                          parser=state.output_parser)


async def count_tokens(state: "ServerState", request: HttpRequest, conn: HttpConnection) -> Response:
    body = parse_count_tokens(_json_body(state, request))
    _check_model(state, body)
    prompt = await state.frontend.run(_prepare(state, body))
    return Response.json(200, {"input_tokens": len(prompt)})

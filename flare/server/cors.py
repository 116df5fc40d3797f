"""Requests from web pages (CORS): which origins may call the server, and the preflight.

A browser sends ``Origin`` with every cross-origin request and asks first (an ``OPTIONS``
preflight) before a POST with a JSON body or an ``Authorization`` header. A request with
no ``Origin`` (curl, the official SDKs, Prometheus) is not a browser's and is never refused
here.

Which origins: the loopback ones always (``http`` or ``https`` on ``localhost``,
``127.0.0.1``, ``[::1]`` or ``0.0.0.0``, any port), so a chat UI served on this machine
works out of the box, as with Ollama's default. ``ServerConfig.allowed_origins``
(``--allowed-origin``, repeatable) adds others: an exact origin
(``https://chat.example.com``), one with ``*`` standing for any run of host or port
characters (``https://*.example.com``, ``http://10.0.0.5:*``), or ``*`` for every origin
(vLLM's and llama-server's default). A request from any other origin gets 403 before its
body is read: a page elsewhere on the web cannot make this server work for it, not even
with the "simple" requests a browser sends without asking.
"""

from __future__ import annotations

import re

from .response import Response

LOOPBACK_ORIGINS = tuple(f"{scheme}://{host}{port}" for scheme in ("http", "https")
                         for host in ("localhost", "127.0.0.1", "[::1]", "0.0.0.0") for port in ("", ":*"))
# an origin as a browser serializes it: scheme "://" host [":" port], no path (RFC 6454)
_ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://(\[[0-9a-f:.]+\]|[a-z0-9.*-]+)(:([0-9]+|\*))?", re.IGNORECASE)
_TOKEN_LIST = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+(\s*,\s*[!#$%&'*+.^_`|~0-9A-Za-z-]+)*")
# what a preflight allows when it names no headers: those the API families' clients send
_DEFAULT_ALLOW_HEADERS = (b"authorization, content-type, x-api-key, anthropic-version, anthropic-beta, "
                          b"openai-organization, openai-project")
PREFLIGHT_MAX_AGE_S = 600
_CACHE_LIMIT = 256  # origins remembered with their verdict (a page's origin repeats on every request)


def check_origin_pattern(pattern: str) -> str | None:
    """Why ``pattern`` cannot be an allowed origin, or None when it can."""
    if pattern == "*":
        return None
    if not _ORIGIN.fullmatch(pattern):
        return (f"allowed origin {pattern!r} must be '*' or scheme://host[:port] without a path "
                "('*' may stand for any run of host or port characters)")
    return None


def _compile(pattern: str) -> re.Pattern[str]:
    # '*' stands for any run of host characters (no '/', no '@'); everything else is literal
    parts = [re.escape(part) for part in pattern.lower().split("*")]
    return re.compile("[^/@]*".join(parts))


class OriginPolicy:
    """Decides on a request's ``Origin`` and answers preflights."""

    def __init__(self, patterns: tuple[str, ...] = ()):
        for pattern in patterns:
            problem = check_origin_pattern(pattern)
            if problem:
                raise ValueError(problem)
        self.allow_all = "*" in patterns
        self._patterns = tuple(_compile(p) for p in (*LOOPBACK_ORIGINS, *patterns) if p != "*")
        self._verdicts: dict[bytes, bool] = {}

    def allows(self, origin: bytes) -> bool:
        if self.allow_all:
            return True
        verdict = self._verdicts.get(origin)
        if verdict is None:
            text = origin.decode("latin-1").lower()
            verdict = bool(_ORIGIN.fullmatch(text)) and any(p.fullmatch(text) for p in self._patterns)
            if len(self._verdicts) >= _CACHE_LIMIT:
                self._verdicts.clear()
            self._verdicts[origin] = verdict
        return verdict

    @staticmethod
    def response_headers(origin: bytes) -> tuple[tuple[bytes, bytes], ...]:
        """The headers every response to an allowed origin carries."""
        return (b"access-control-allow-origin", origin), (b"vary", b"origin")

    @staticmethod
    def preflight(origin: bytes | None, requested_headers: bytes | None, methods: tuple[str, ...]) -> Response:
        """204 for ``OPTIONS`` on a route: its methods, and the CORS grant when a page asks."""
        allow = ", ".join(sorted({*methods, "OPTIONS"})).encode()
        headers = [(b"allow", allow)]
        if origin is not None:
            names = requested_headers.strip() if requested_headers else b""
            headers += [(b"access-control-allow-methods", allow),
                        (b"access-control-allow-headers",
                         names if names and _TOKEN_LIST.fullmatch(names) else _DEFAULT_ALLOW_HEADERS),
                        (b"access-control-max-age", b"%d" % PREFLIGHT_MAX_AGE_S),
                        (b"vary", b"access-control-request-method, access-control-request-headers")]
        return Response(204, b"", headers=headers)

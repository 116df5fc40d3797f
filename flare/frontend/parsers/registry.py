"""Output parsers by name: one module per model family registers its class here.

A tool-call parser's class has ``kind == "tool"`` and takes ``tools=`` (the request's
declared tools); a reasoning parser's has ``kind == "reasoning"`` and takes ``opened=``
(the prompt already opened its block). :func:`flare.frontend.parsers.build` composes one
of each; ``get(name)()`` makes either alone with its defaults.
"""

from __future__ import annotations

from typing import Callable, TypeVar

from ...errors import FrontendError
from .base import OutputParser

ParserFactory = Callable[..., OutputParser]  # called once per request
_T = TypeVar("_T", bound=type)

_PARSERS: dict[str, ParserFactory] = {}


def register(name: str) -> Callable[[_T], _T]:
    """Class decorator: make the parser class available as ``name``."""
    def add(cls: _T) -> _T:
        if name in _PARSERS:
            raise ValueError(f"an output parser named {name!r} is already registered")
        _PARSERS[name] = cls
        return cls
    return add


def get(name: str) -> ParserFactory:
    """The factory of the parser ``name``; call it once per request."""
    try:
        return _PARSERS[name]
    except KeyError:
        raise LookupError(f"no output parser named {name!r} (known: {', '.join(names())})") from None


def names() -> tuple[str, ...]:
    """Every registered parser's name, sorted."""
    return tuple(sorted(_PARSERS))


def parser_names(kind: str) -> tuple[str, ...]:
    """The names of the parsers of ``kind`` ("tool" or "reasoning"), sorted."""
    return tuple(sorted(name for name, factory in _PARSERS.items() if getattr(factory, "kind", "") == kind))


def tool_parser_names() -> tuple[str, ...]:
    return parser_names("tool")


def reasoning_parser_names() -> tuple[str, ...]:
    return parser_names("reasoning")


def served(option: str, model: str | None) -> str | None:
    """The parser served for a --tool-parser / --reasoning-parser ``option`` ("auto": the
    model's, "none": None, else the name given) against the model's own parser."""
    return model if option == "auto" else None if option == "none" else option


def syntax_of(*parsers: str | None) -> tuple[str, ...]:
    """The marker texts of the named parsers' syntax (None: no parser)."""
    return tuple(text for name in parsers if name for text in getattr(get(name), "syntax", ()))


def check_parser_name(name: str, kind: str) -> str:
    """``name`` when it names a parser of ``kind``; FrontendError (naming the known ones) otherwise."""
    known = parser_names(kind)
    if name not in known:
        raise FrontendError(f"no {kind} parser named {name!r} (known: {', '.join(known)})")
    return name

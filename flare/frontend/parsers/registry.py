"""Output parsers by name: one module per model family registers its class here."""

from __future__ import annotations

from typing import Callable, TypeVar

from .base import OutputParser

ParserFactory = Callable[[], OutputParser]  # called once per request
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

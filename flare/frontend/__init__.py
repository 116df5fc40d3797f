"""The native frontend: tokenizer, chat templates (compiler + VM), annotations, images.

Public entry points (imported lazily, so ``flare.frontend.images`` does not pull
in the tokenizer or the template VM):

- :class:`Frontend` (``Frontend.load(tokenizer_json, chat_template, expected, settings)``),
  :class:`TokenSettings`, :class:`AssetFingerprints`, :class:`RenderedChat`
- :class:`Tokenizer`, :class:`IncrementalDecoder`
"""

# NOTE: no ``from __future__ import annotations`` here: it would bind the name
# ``annotations`` on this package and shadow the ``annotations`` subpackage.
import importlib
from typing import Any

_EXPORTS = {
    "Frontend": "frontend", "TokenSettings": "frontend", "AssetFingerprints": "frontend",
    "RenderedChat": "frontend", "Tokenizer": "tokenizer", "IncrementalDecoder": "tokenizer",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)

"""The Ollama family: /api/tags, /api/show, /api/ps, /api/version, /api/chat, /api/generate.

schema.py validates bodies (messages and options into the shared pipeline's
terms), format.py writes NDJSON lines and whole responses, models.py
describes the served model, errors.py is the error shape, routes.py ties them
to the generation layer.
"""

from .errors import error_response
from .routes import install

__all__ = ["error_response", "install"]

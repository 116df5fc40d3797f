"""The OpenAI family: /v1/models, /v1/chat/completions, /v1/completions.

schema.py validates bodies, format.py writes chunks and whole responses,
errors.py is the error shape, routes.py ties them to the generation layer.
"""

# NOTE: app.py imports errors.py (the default error shape), so nothing in this
# package may import app.py at run time: ServerState and Router are types here.
from .errors import error_response
from .routes import install

__all__ = ["error_response", "install"]

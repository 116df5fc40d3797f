"""The OpenAI Responses family: POST /v1/responses, GET and DELETE /v1/responses/{id}.

schema.py validates bodies (items.py turns input items into chat messages),
format.py writes response objects and their stream events, store.py keeps
finished responses for previous_response_id, routes.py ties them to the
generation layer. Errors are OpenAI's shape (openai/errors.py).
"""

# NOTE: app.py imports the OpenAI family's errors.py, so nothing here may import app.py at run time.
from .routes import install

__all__ = ["install"]

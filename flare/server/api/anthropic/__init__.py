"""The Anthropic family: /v1/messages and /v1/messages/count_tokens.

schema.py turns Messages bodies into chat prompts and sampling settings,
format.py writes message bodies and SSE events, errors.py is the error shape,
routes.py ties them to the generation layer.
"""

# NOTE: as in the OpenAI package, ServerState and Router are only types here: the
# families sit below app.py and session.py, which import them.
from .errors import error_response
from .routes import install

__all__ = ["error_response", "install"]

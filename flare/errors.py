"""The error hierarchy.

Every error Flare raises on purpose derives from :class:`Error`. The three
families of the spec stay distinct through worker channels:

- :class:`AdmissionError`: the request cannot be admitted (validation, context,
  capacity, unsupported features). Carries the HTTP status to answer with.
- :class:`ExecutionError`: the model could not run (worker failure, poison,
  drain failure, CUDA errors). Always a 500 at the HTTP edge.
- :class:`FrontendError`: assets or inputs the frontend cannot accept
  (templates, tokenizers, images, fingerprints). A 400 when caused by a request.
  Its :class:`CoreError` refuses a core directory at load, naming file and field.
"""

from __future__ import annotations


class Error(Exception):
    """Base class. ``status`` is the HTTP status, ``code`` a stable machine code."""

    status: int = 500
    code: str = "internal_error"

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None,
                 param: str | None = None, hint: str | None = None):
        if hint:
            message = f"{message} ({hint})"
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        if code is not None:
            self.code = code
        self.param = param

    def __str__(self) -> str:
        return self.message


class AdmissionError(Error):
    """A request that cannot be admitted: 400 validation, 429/503 capacity."""

    status = 400
    code = "invalid_request_error"


class ExecutionError(Error):
    """Model execution failed; the executor may be poisoned."""

    status = 500
    code = "execution_error"


class FrontendError(Error):
    """Templates, tokenizers, images or core assets the frontend cannot accept."""

    status = 400
    code = "frontend_error"


class CoreError(FrontendError):
    """A core directory that is refused at load. The message starts with the file
    (``.../core.json``, ``.../weights-00001.safetensors``), then the field at fault."""

    code = "core_error"

    def __init__(self, file: object, message: str, *, field: str | None = None):
        super().__init__(f"{file}: {message}")
        self.file = str(file)
        self.field = field


class GrammarError(FrontendError):
    """A structured-output constraint that does not compile (a 400 naming the problem), or a
    matcher that failed while a constrained request ran (reported on that request only)."""

    code = "invalid_grammar"

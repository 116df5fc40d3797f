"""The two 400s a route family's field validation raises, in one wording of their codes.

:func:`invalid` is a field of the wrong type, shape or range (``invalid_request_error``);
:func:`unsupported` a valid field at a value this server does not honour
(``unsupported_parameter``). Each family's error renderer gives them its own shape.
"""

from __future__ import annotations

from ...errors import AdmissionError


def invalid(message: str, param: str | None) -> AdmissionError:
    return AdmissionError(message, status=400, code="invalid_request_error", param=param)


def unsupported(message: str, param: str) -> AdmissionError:
    return AdmissionError(message, status=400, code="unsupported_parameter", param=param)

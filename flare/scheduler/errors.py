"""Scheduler contract violations. Each leaves the scheduler unchanged."""

from __future__ import annotations

from ..errors import AdmissionError, ExecutionError


class SchedulerError(ExecutionError):
    """A caller broke the scheduler's contract."""


class StalePlanError(SchedulerError):
    """commit() got a plan whose requests changed since plan() (or another scheduler's plan)."""


class CompletionError(SchedulerError):
    """complete() got records that do not match what was committed."""


class ResourceError(SchedulerError):
    """An ID pool could not satisfy a request it had promised."""


class UnknownRequestError(SchedulerError):
    """The handle names no live request (wrong slot or generation)."""


class CapacityError(AdmissionError):
    """The request can never fit this model's prepared capacities."""

    status = 400

"""Scheduler hot loops: candidate selection, completion-record validation, fairness debts."""

import numpy as np
import numpy.typing as npt

def record_layout() -> dict[str, int]:
    """The completion-record offsets compiled in from records.pxd, by their flare.contract names."""

def select_candidate(value: npt.NDArray[np.float64], est_ms: npt.NDArray[np.float64],
                     wait_per_ms: npt.NDArray[np.float64]) -> int:
    """Index of the best candidate (-1 when there is none)."""

def validate_records(records: npt.NDArray[np.int64], slots: npt.NDArray[np.int64],
                     generations: npt.NDArray[np.int64], consumed: npt.NDArray[np.int64],
                     generated: npt.NDArray[np.int64], max_new: int) -> int:
    """First row whose record disagrees with what was committed, or -1."""

def validate_verification(records: npt.NDArray[np.int64], slots: npt.NDArray[np.int64],
                          generations: npt.NDArray[np.int64], consumed: npt.NDArray[np.int64],
                          generated: npt.NDArray[np.int64], width: npt.NDArray[np.int64]) -> int:
    """validate_records for a SPECULATIVE step (1..width[i] new tokens per row), or -1."""

def update_debts(phase: npt.NDArray[np.int64], ended: npt.NDArray[np.uint8], token_debt: npt.NDArray[np.float64],
                 delivery_debt: npt.NDArray[np.float64], served_slots: npt.NDArray[np.int64],
                 served_tokens: npt.NDArray[np.int64], delivered_slots: npt.NDArray[np.int64],
                 per_prompt_s: float, per_output_s: float, elapsed: float, fade: float,
                 first_runnable: int, decoding: int) -> None:
    """Fairness debts after one frame (see flare.scheduler.policy)."""

"""flare/contract.py: the torch-free ABI, and its one Cython copy (flare/_fast/records.pxd).

The completion-record offsets exist twice, in Python (flare.contract) and in Cython
(records.pxd, cimported by sched.pyx); a record validated by the scheduler and written
by the programs must mean the same fields in both, so every field is compared.
"""

from __future__ import annotations

import subprocess
import sys

from flare import contract
from flare._fast import sched


def _python_layout() -> dict[str, int]:
    return {name: getattr(contract, name) for name in dir(contract)
            if name.startswith(("REC_", "RECORD_"))}


def test_the_cython_record_layout_equals_the_contracts():
    python, cython = _python_layout(), sched.record_layout()
    assert set(python) == set(cython), (sorted(set(python) ^ set(cython)))
    for name, value in python.items():
        assert cython[name] == value, f"{name}: flare.contract {value}, records.pxd {cython[name]}"


def test_the_record_layout_is_well_formed():
    layout = _python_layout()
    meta = [v for k, v in layout.items() if k.startswith("REC_") and not k.startswith("REC_FLAG_")
            and k != "REC_TOKEN0"]
    assert len(meta) == len(set(meta)) and all(0 <= v < contract.RECORD_META for v in meta)
    assert contract.REC_TOKEN0 == contract.RECORD_META
    assert contract.RECORD_FIELDS == contract.RECORD_META + contract.RECORD_TOKENS
    flags = [v for k, v in layout.items() if k.startswith("REC_FLAG_")]
    assert all(v and not v & (v - 1) for v in flags) and len(set(flags)) == len(flags)


def test_the_contract_imports_no_torch_and_no_sibling_package():
    code = ("import sys, flare.contract; "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.split('.')[:2] in "
            "(['flare', 'model'], ['flare', 'execution'], ['flare', 'scheduler'], ['flare', 'engine'])))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"

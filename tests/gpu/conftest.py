"""GPU tests: they run only where CUDA is present (the H200 device machine)."""

import pytest
import torch

collect_ignore_glob: list[str] = []


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(skip)

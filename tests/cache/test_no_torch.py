"""The prefix cache is pure metadata: using it must never import torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = """
import sys
import numpy as np
from flare.cache import PrefixCheckpointCache, PrefixHistory
history = PrefixHistory(b"i" * 32, np.arange(200, dtype=np.int32), [(70, b"e" * 32)])
cache = PrefixCheckpointCache(b"i" * 32, num_pages=8, num_snapshots=2)
created = cache.publish(history, 130, parent=None, pages=[0, 1], snapshot=0, consumed=130,
                        ready_fence=1)
cache.advance_completed(1)
assert cache.lookup(history).checkpoint == created.checkpoint
cache.evict(snapshot_target=1)
cache.advance_completed(1)
loaded = sorted(name for name in sys.modules if name == "torch" or name.startswith("torch."))
print(",".join(loaded))
"""


def test_the_cache_never_imports_torch():
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", SCRIPT], cwd=root, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"torch modules were imported: {result.stdout.strip()}"

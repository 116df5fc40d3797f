"""tests/kernels: Triton kernels checked on CPU tensors under Triton's interpreter.

The interpreter is chosen when a kernel is defined (TRITON_INTERPRET read at
``@triton.jit`` time), so it must never leak into a process that also runs the
CUDA kernels. ``interpreted/`` is therefore collected only in a process started
with TRITON_INTERPRET=1; ``test_interpreter.py`` starts that process.
"""

import os

collect_ignore = [] if os.environ.get("TRITON_INTERPRET") == "1" else ["interpreted"]

"""Build the Cython extensions under flare/_fast/.

Every ``flare/_fast/<name>.pyx`` becomes the extension ``flare._fast.<name>``.
``FLARE_BUILD_ONLY=a,b`` restricts an in-place development build to the named
modules, so one module can be rebuilt while another is being edited.
"""

import os
from pathlib import Path

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

HERE = Path(__file__).parent
FAST = HERE / "flare" / "_fast"


def _extensions():
    only = {name for name in os.environ.get("FLARE_BUILD_ONLY", "").split(",") if name}
    exts = []
    for pyx in sorted(FAST.glob("*.pyx")):
        if only and pyx.stem not in only:
            continue
        exts.append(
            Extension(
                f"flare._fast.{pyx.stem}",
                [str(pyx.relative_to(HERE))],
                include_dirs=[numpy.get_include()],
                define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
                extra_compile_args=["-O3"],
            )
        )
    return exts


setup(
    ext_modules=cythonize(
        _extensions(),
        language_level=3,
        compiler_directives={"embedsignature": True, "cdivision": True},
    ),
)

"""The one compiled piece: cupyops._cfast, the per-call work of the memoized fast calls
(cupyops/_cfast.c). It is optional: where no C compiler or Python headers exist the build
goes on without it and the same calls run in Python (cupyops/_fast.py)."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("cupyops._cfast", ["cupyops/_cfast.c"], optional=True,
                             extra_compile_args=["-O2"])])

"""CPU tier: packaging, import cost, source inlining, variant tables."""
import os
import subprocess
import sys

import pytest

import cupyops
from cupyops import _kernels


def test_import_is_cheap_and_lazy():
    # The best of five new processes: a busy or throttled host only ever adds time (on the
    # CPU-tier host, `import numpy` alone has measured anywhere from 0.09 to 1.8 s from one
    # process to the next), so the minimum is what the import itself costs.
    code = (
        "import time, sys; t = time.perf_counter(); import cupyops; "
        "dt = time.perf_counter() - t; print(dt, 'cupy' in sys.modules)"
    )
    # Bytecode caching on, as a user's Python has it (pip also compiles an installed package):
    # with PYTHONDONTWRITEBYTECODE set (some CI hosts set it) every run would recompile the
    # package's sources, ~0.1 s that is not the cost of importing it.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    times = []
    for _ in range(5):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env=env).stdout
        dt, cupy_loaded = out.split()
        assert cupy_loaded == "False", "import cupyops must not import CuPy"
        times.append(float(dt))
    assert min(times) < 0.3, f"import cupyops took {', '.join(f'{t:.3f}' for t in times)} s"


def test_kernel_sources_are_package_data():
    d = _kernels.kernel_dir()
    for name in ("common.cuh", "reduce.cu", "softmax.cu", "norm.cu"):
        assert (d / name).is_file(), name


def test_includes_are_inlined_with_line_markers():
    src = _kernels.kernel_source("softmax.cu")
    assert '#include "common.cuh"' not in src
    assert '#line 1 "common.cuh"' in src and '#line 1 "softmax.cu"' in src
    assert "struct MaxSum" in src  # the header's text is part of the source, so of CuPy's cache key


@pytest.mark.parametrize("threads", [0, -1, 1.5, True])
def test_warmup_rejects_a_bad_thread_count_before_anything(threads):
    with pytest.raises(ValueError, match="threads: must be a positive int"):
        cupyops.warmup(threads=threads)


def test_template_name():
    assert _kernels.template_name("k") == "k"
    assert _kernels.template_name("softmax_fused", "__half", 4) == "softmax_fused<__half, 4>"


@pytest.mark.parametrize("op", cupyops.OPS)
def test_variants_ladder(op):
    ladder = cupyops.variants(op)
    assert len(ladder) >= 2
    assert all(isinstance(v, str) and v for v in ladder.values())
    assert "auto" not in ladder


def test_variants_unknown_op():
    with pytest.raises(ValueError, match="op: unknown operator 'conv'"):
        cupyops.variants("conv")


def test_name_expressions_are_unique_and_known_kernels():
    for kf in _kernels.KernelFile.registry.values():
        assert len(kf.name_expressions) == len(set(kf.name_expressions))
        src = _kernels.kernel_source(kf.filename)
        for ne in kf.name_expressions:
            assert f" {ne.split('<')[0]}(" in src.replace("\n", " "), ne


def test_readme_api_tour_defines_every_name_before_use():
    # the tour must run as pasted (the GPU tier runs it: test_gpu_readme.py); here, with no
    # GPU, at least every name it loads is imported or assigned on an earlier line
    import ast
    import builtins
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "README.md").read_text().split("## API tour", 1)[1]
    tree = ast.parse(re.search(r"```python\n(.*?)```", text, re.S).group(1))
    defined, missing = set(dir(builtins)), []
    for stmt in tree.body:
        missing += [(n.id, n.lineno) for n in ast.walk(stmt)
                    if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in defined]
        for n in ast.walk(stmt):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                defined.add(n.id)
            elif isinstance(n, (ast.Import, ast.ImportFrom)):
                defined.update((a.asname or a.name).split(".")[0] for a in n.names)
    assert not missing, f"used before they are defined: {missing}"

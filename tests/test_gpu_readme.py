"""GPU tier: the README's API tour runs as pasted (every name defined before its use, every
call accepted), top to bottom, in a fresh namespace."""
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

README = Path(__file__).resolve().parent.parent / "README.md"


def api_tour():
    text = README.read_text()
    section = text.split("## API tour", 1)[1]
    m = re.search(r"```python\n(.*?)```", section, re.S)
    assert m, "README: no python block under '## API tour'"
    return m.group(1)


def test_the_api_tour_runs_as_pasted():
    import cupy

    source = api_tour()
    if cupy.cuda.Device().compute_capability != "90":  # the tour marks scaled_matmul H100/H200 only
        source = "\n".join("pass" if "scaled_matmul(" in line else line for line in source.splitlines())
    namespace = {}
    exec(compile(source, "README.md (API tour)", "exec"), namespace)

    cupy.cuda.runtime.deviceSynchronize()
    assert namespace["o"].shape == (4, 32, 4096, 128)  # the last line's bhsd attention
    if "y8" in namespace:  # (Hopper)
        assert namespace["y8"].shape == (16, 11008) and namespace["y8"].dtype.name == "bfloat16"

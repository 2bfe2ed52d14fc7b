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
    namespace = {}
    exec(compile(api_tour(), "README.md (API tour)", "exec"), namespace)
    import cupy

    cupy.cuda.runtime.deviceSynchronize()
    assert namespace["o"].shape == (4, 32, 4096, 128)  # the last line's bhsd attention

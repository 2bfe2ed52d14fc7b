"""GPU tier: every example notebook runs top to bottom (examples/notebooks.py's executor:
the cells in one namespace, as Jupyter would run them) and ends with its plot."""
import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
_spec = importlib.util.spec_from_file_location("cupyops_notebooks", EXAMPLES / "notebooks.py")
notebooks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(notebooks)


@pytest.mark.parametrize("name", sorted(notebooks.sources()))
def test_notebook_runs(name):
    pytest.importorskip("matplotlib")
    outputs = notebooks.execute(notebooks.sources()[name])
    printed = "".join("".join(o["text"]) for cell in outputs for o in cell if o["output_type"] == "stream")
    assert "rel err" in printed  # every rung was validated before it was timed
    assert any(o["output_type"] == "display_data" for o in outputs[-1]), f"{name}: the last cell drew no figure"

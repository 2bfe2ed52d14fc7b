"""CPU tier: every example notebook (examples/*.ipynb) is a valid nbformat-4 notebook that
plain Jupyter opens, paired with its # %% source (jupytext's py:percent) and in sync with
it: same cells, same sources. Rebuild with `python examples/notebooks.py`."""
import importlib.util
import json
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
_spec = importlib.util.spec_from_file_location("cupyops_notebooks", EXAMPLES / "notebooks.py")
notebooks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(notebooks)


def test_every_ladder_has_a_notebook():
    assert set(notebooks.sources()) == {"softmax_ladder", "gemm_ladder", "attention_ladder"}


@pytest.mark.parametrize("name", sorted(notebooks.sources()))
def test_notebook_is_valid_and_in_sync(name):
    path = EXAMPLES / f"{name}.ipynb"
    assert path.exists(), f"{path.name} missing: python examples/notebooks.py"
    nb = json.loads(path.read_text())
    assert nb["nbformat"] == 4 and nb["metadata"]["jupytext"]["formats"] == "ipynb,py:percent"
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    want = notebooks.cells(notebooks.sources()[name])
    assert len(nb["cells"]) == len(want), f"{name}: out of sync: python examples/notebooks.py"
    for cell, (kind, src, meta) in zip(nb["cells"], want):
        assert cell["cell_type"] == kind and "".join(cell["source"]) == src, f"{name}: out of sync"
        assert cell["metadata"] == meta
        if kind == "code":
            assert isinstance(cell["outputs"], list) and "execution_count" in cell
            for out in cell["outputs"]:
                assert out["output_type"] in ("stream", "display_data")
    assert any(c["cell_type"] == "markdown" for c in nb["cells"])


def test_cells_of_the_percent_format(tmp_path):
    src = tmp_path / "x_ladder.py"
    src.write_text("# %% [markdown]\n# # Title\n#\n# text\n\n# %%\nimport os\n\n\n# %% A titled cell\nx = 1\n")
    assert notebooks.cells(src) == [("markdown", "# Title\n\ntext", {}), ("code", "import os", {}),
                                     ("code", "x = 1", {"title": "A titled cell"})]
    nb = notebooks.notebook(src)
    assert [c["source"] for c in nb["cells"]] == [["# Title\n", "\n", "text"], ["import os"], ["x = 1"]]
    assert nb["cells"][1]["outputs"] == [] and nb["cells"][1]["execution_count"] is None

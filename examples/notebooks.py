"""Build the example notebooks (``examples/*.ipynb``) from their ``# %%`` sources, the way
jupytext pairs them (``py:percent``), optionally executing every cell and keeping its
printed output and matplotlib figures.

    python examples/notebooks.py                 # write the notebooks, no outputs
    python examples/notebooks.py --execute       # run them (needs a GPU) and keep the outputs
    python examples/notebooks.py --execute softmax_ladder --out /tmp/nb

The notebooks open in plain Jupyter; with jupytext installed (``pip install ".[notebook]"``)
editing either file of a pair updates the other. The executor here needs neither Jupyter
nor a kernel: it runs the cells in one namespace in this process (what a GPU machine
without Jupyter can do), which is also how the GPU tier checks that they run.
"""
import argparse
import base64
import contextlib
import io
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}


def sources():
    """The paired sources, by notebook name."""
    return {p.stem: p for p in sorted(HERE.glob("*_ladder.py"))}


def cells(py_path):
    """The cells of a ``py:percent`` file: [(cell_type, source, metadata)]. A ``# %%``
    line opens a code cell (text after it is the cell's title), ``# %% [markdown]`` a
    markdown cell whose lines lose their leading ``# ``; blank lines around a cell are
    not part of it."""
    out, kind, title, lines = [], None, None, []

    def close():
        if kind is None:
            return
        body = list(lines)
        while body and not body[-1].strip():
            body.pop()
        while body and not body[0].strip():
            body.pop(0)
        if kind == "markdown":
            body = [ln[2:] if ln.startswith("# ") else ln.lstrip("#") for ln in body]
        out.append((kind, "\n".join(body), {"title": title} if title else {}))

    for line in Path(py_path).read_text().splitlines():
        if line.startswith("# %%"):
            close()
            rest = line[4:].strip()
            if rest.startswith("[markdown]"):
                kind, title = "markdown", None
            else:
                kind, title = "code", rest or None
            lines = []
        elif kind is not None:
            lines.append(line)
    close()
    return out


def _source_lines(text):
    """nbformat's multi-line source: lines with their newlines, the last without."""
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def notebook(py_path, outputs=None):
    """The nbformat-4 notebook of ``py_path``; ``outputs``: per code cell, its outputs (as
    ``execute`` returns them), or None for none."""
    nb_cells, n = [], 0
    for kind, src, meta in cells(py_path):
        cell = {"cell_type": kind, "metadata": meta, "source": _source_lines(src)}
        if kind == "code":
            cell["execution_count"] = n + 1 if outputs else None
            cell["outputs"] = outputs[n] if outputs else []
            n += 1
        nb_cells.append(cell)
    return {
        "cells": nb_cells,
        "metadata": {"jupytext": {"formats": "ipynb,py:percent"}, "kernelspec": KERNELSPEC,
                     "language_info": {"name": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def execute(py_path):
    """Run the code cells of ``py_path`` in one namespace (``__name__`` "__main__", as a
    notebook's) and return each cell's outputs: its printed
    text as a stream, then each matplotlib figure it left open as a PNG. An exception
    stops the run (re-raised, naming the cell)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = {"__name__": "__main__"}
    results = []
    for i, (kind, src, _) in enumerate(c for c in cells(py_path) if c[0] == "code"):
        buf = io.StringIO()
        try:
            with contextlib.redirect_stdout(buf):
                exec(compile(src, f"{Path(py_path).name} (code cell {i + 1})", "exec"), ns)
        except Exception as exc:
            raise RuntimeError(f"{Path(py_path).name}: code cell {i + 1} failed: {exc!r}") from exc
        outs = []
        if buf.getvalue():
            outs.append({"output_type": "stream", "name": "stdout", "text": _source_lines(buf.getvalue())})
        for num in plt.get_fignums():
            fig = plt.figure(num)
            png = io.BytesIO()
            fig.savefig(png, format="png", dpi=100)
            outs.append({"output_type": "display_data", "metadata": {},
                         "data": {"image/png": base64.b64encode(png.getvalue()).decode("ascii"),
                                  "text/plain": [f"<Figure size {fig.get_figwidth():g}x{fig.get_figheight():g}>"]}})
        plt.close("all")
        results.append(outs)
    return results


def write(nb, path):
    Path(path).write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help=f"notebooks (default all: {', '.join(sources())})")
    ap.add_argument("--execute", action="store_true", help="run the cells and keep their outputs (needs a GPU)")
    ap.add_argument("--out", default=str(HERE), help="directory to write the .ipynb files to")
    args = ap.parse_args(argv)
    src = sources()
    for name in args.names or src:
        if name not in src:
            sys.exit(f"names: no examples/{name}.py; expected one of {', '.join(src)}")
        outputs = execute(src[name]) if args.execute else None
        path = Path(args.out) / f"{name}.ipynb"
        write(notebook(src[name], outputs), path)
        print(f"wrote {path}" + (" (executed)" if outputs else ""))


if __name__ == "__main__":
    main()

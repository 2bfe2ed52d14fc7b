"""The command-line benchmark of cupyops (``cupyops-bench`` or ``python -m cupyops.bench``).

Modules, each small:
  operators  one description per operator: dtypes, inputs, reference, calls, baselines,
             bytes, flops, tolerance (pure Python; what a new operator adds, see there)
  cases    what to run: options parsing, suites, the plan, bytes per case (pure Python)
  timing   CUDA-event timing with L2 flushes, copy bandwidth, host overhead per call
  runners  inputs, cupyops and baseline calls, validation against cupyops.reference
  report   GB/s, % of copy bandwidth, speedups; text table, markdown, JSON (pure Python)
  cli      the argument parser and the run itself

Importing this package (or ``cli``) never imports CuPy or PyTorch: ``--help`` and the CPU
tests work on machines without a GPU.
"""


def main(argv=None):
    from .cli import main as _main

    return _main(argv)

"""Host time per call at decode size with the fast calls' per-call work in C
(cupyops/_cfast.c) and in Python (CUPYOPS_FAST_C=0), against PyTorch's eager equivalents:
each mode in its own process (the choice is made at import), alternating, ``--rounds``
times each, so that drift of the host shows as spread rather than as a difference.
    python benchmarks/host_fast_c.py [--rounds 2] [--calls 2000] [--ops softmax,rms_norm]
"""
import argparse
import json
import os
import subprocess
import sys

CHILD = """
import json, sys, torch
from cupyops import _fast
from cupyops.bench import host
ops = sys.argv[2].split(",")
rows = host.per_op_us(int(sys.argv[1]), torch, log=lambda s: None, ops=ops)
print(json.dumps({"c": _fast.USE_C, "rows": rows}))
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--ops", default="softmax,rms_norm,layer_norm,sum,matmul,attention")
    args = ap.parse_args()
    runs = []
    for r in range(args.rounds):
        for mode in ("1", "0"):
            env = dict(os.environ, CUPYOPS_FAST_C=mode)
            out = subprocess.run([sys.executable, "-c", CHILD, str(args.calls), args.ops], env=env,
                                 capture_output=True, text=True, check=True).stdout
            got = json.loads(out.strip().splitlines()[-1])
            runs.append(got)
            label = "C" if got["c"] else "Python"
            for op, row in got["rows"].items():
                f = {k: ("-" if v is None else f"{v:5.1f}") for k, v in row.items() if k != "shape"}
                print(f"round {r} {label:6s} {op:10s} cupy in {f.get('cupyops')}  torch in {f.get('cupyops_torch_in')}"
                      f"  torch {f.get('torch')}  graph {f.get('cupyops_graph')} / {f.get('torch_graph')} us", flush=True)
    print(json.dumps(runs))


if __name__ == "__main__":
    main()

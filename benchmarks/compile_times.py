"""Cold NVRTC compile time of each kernel file (empty CuPy cache) and the time a new
process takes to load each compiled module from the warm disk cache.

    python benchmarks/compile_times.py [--json PATH] [--files attention.cu,attention_flash.cu]
    python benchmarks/compile_times.py --parallel [--ops sum,softmax,matmul]

--parallel compiles the files behind --ops (default: all) at once, as cupyops.warmup()
and the benchmark do, and reports each file's time and the wall time of the whole set.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys, time
import cupy
cupy.cuda.runtime.getDevice()
cupy.empty(1)  # context creation stays out of the numbers
from cupyops.ops import kernel_files
only = set(sys.argv[1].split(",")) if len(sys.argv) > 1 and sys.argv[1] else None
times = {}
for kf in kernel_files():
    if only and kf.filename not in only:
        continue
    t = time.perf_counter()
    kf.compile()
    times[kf.filename] = time.perf_counter() - t
print(json.dumps(times))
"""

CHILD_PARALLEL = r"""
import json, sys, time
import cupy
cupy.cuda.runtime.getDevice()
cupy.empty(1)
from cupyops._kernels import warmup_async
ops = sys.argv[1].split(",") if len(sys.argv) > 1 and sys.argv[1] else None
times = {}
t = time.perf_counter()
warmup_async(ops, on_compiled=lambda f, s: times.__setitem__(f, s))()
times["(wall, all at once)"] = time.perf_counter() - t
print(json.dumps(times))
"""


def run_child(cache_dir, files, child=CHILD):
    env = dict(os.environ, CUPY_CACHE_DIR=cache_dir)
    out = subprocess.run([sys.executable, "-c", child, files], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json")
    ap.add_argument("--files", default="", help="comma-separated kernel file names (default: all)")
    ap.add_argument("--parallel", action="store_true", help="compile the files behind --ops at once")
    ap.add_argument("--ops", default="", help="with --parallel: comma-separated operators (default: all)")
    args = ap.parse_args()
    if args.parallel:
        with tempfile.TemporaryDirectory() as cache:
            times = run_child(cache, args.ops, CHILD_PARALLEL)
        for f, t in times.items():
            print(f"{f:24s} {t:7.2f} s")
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(times, fh, indent=1)
        return
    with tempfile.TemporaryDirectory() as cache:
        cold = run_child(cache, args.files)
        warm = run_child(cache, args.files)
    rows = [{"file": f, "cold_s": round(cold[f], 3), "warm_load_ms": round(warm[f] * 1e3, 2)} for f in cold]
    for r in rows:
        print(f"{r['file']:12s} cold compile {r['cold_s']:7.2f} s   warm-cache load {r['warm_load_ms']:7.2f} ms")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# One device call: install, GPU test tier, compile times, benchmark. Logs under $OUT.
# usage: bash benchmarks/device_run.sh [pytest|bench|all] [extra cupyops-bench args]
set -uo pipefail
what=${1:-all}; shift || true
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
if [[ $what == all || $what == pytest ]]; then
  python3 -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | tee "$OUT/pytest_gpu.log" | tail -n 25
fi
if [[ $what == all || $what == bench ]]; then
  python3 benchmarks/compile_times.py --json "$OUT/compile_times.json"
  python3 benchmarks/host_overhead.py | tee "$OUT/host_overhead.txt"
  cupyops-bench "$@" --json "$OUT/bench.json" --md "$OUT/bench.md" 2>"$OUT/bench_progress.log" | tee "$OUT/bench.txt"
fi

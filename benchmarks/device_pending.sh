#!/usr/bin/env bash
# What this code base has written but not yet run on a GPU, in one device call (logs and
# results under $OUT): the CUDA-graph test after its stream fix, flash3's three-consumer
# head_dim-64 configurations (GPU tests, compute-sanitizer, the sweep at head_dim 64), the
# sanitizer on the configurations added after the last sanitizer run, and the softmax
# notebook executed (copy $OUT/softmax_ladder.ipynb to examples/ and commit it).
#   bash benchmarks/device_pending.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
t() { timeout "$@"; echo "rc=$? ($2 $3)"; }
t 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rf -n 8 -o faulthandler_timeout=90 \
    tests/test_gpu_graphs.py tests/test_gpu_attention_flash3.py >"$OUT/pytest_pending.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest_pending.log" | tail -8
t 150 compute-sanitizer --tool memcheck python3 benchmarks/sanitize_attention_flash3.py >"$OUT/memcheck.txt" 2>&1
tail -2 "$OUT/memcheck.txt"
t 200 compute-sanitizer --tool racecheck python3 benchmarks/sanitize_attention_flash3.py >"$OUT/racecheck.txt" 2>&1
tail -2 "$OUT/racecheck.txt"
t 90 python3 benchmarks/attention_sweep.py --rungs flash3 --dtypes bfloat16 --dims 64 --json "$OUT/sweep_d64.json" \
    >"$OUT/sweep_d64.txt" 2>&1; grep -E "flash3|sdpa-cudnn|WRONG" "$OUT/sweep_d64.txt" | cut -c1-150
t 60 python3 examples/notebooks.py softmax_ladder --execute --out "$OUT" 2>&1 | tail -2

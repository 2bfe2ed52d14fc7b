#!/usr/bin/env bash
# What this code base has written but not yet run on a GPU, in one device call (logs and
# results under $OUT): the Hopper attention rung's GPU tests and sweep against SDPA, the
# CUDA-graph, interop and row fast-path tests, the executed notebooks, scaled_matmul in
# cupyops-bench, and the host time per call.
#   bash benchmarks/device_pending.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
t() { timeout "$@"; echo "rc=$? ($2 ...)"; }
t 100 python3 -m pytest -q -m gpu -p no:cacheprovider -rf -x -o faulthandler_timeout=60 \
    tests/test_gpu_attention_flash3.py >"$OUT/pytest_attention_flash3.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed|Timeout" "$OUT/pytest_attention_flash3.log" | tail -8
t 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rf -o faulthandler_timeout=60 \
    tests/test_gpu_graphs.py tests/test_gpu_interop.py \
    "tests/test_gpu_ops.py::test_softmax_fast_path_repeats_and_rechecks_layout" \
    "tests/test_gpu_ops.py::test_norm_fast_path_repeats_and_rechecks_layout" >"$OUT/pytest_pending.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest_pending.log" | tail -15
t 120 python3 benchmarks/attention_sweep.py --rungs flash,flash3 --json "$OUT/attention_sweep.json" \
    >"$OUT/attention_sweep.txt" 2>&1; grep -E "flash|sdpa|WRONG" "$OUT/attention_sweep.txt" | tail -40
t 90 cupyops-bench --op scaled_matmul --suite full --json "$OUT/fp8_bench.json" --md "$OUT/fp8_bench.md" \
    2>"$OUT/fp8_bench_progress.log" | tail -12
t 100 python3 examples/notebooks.py --execute --out "$OUT" 2>&1 | tail -4
t 50 python3 -c "import torch; from cupyops.bench import host; r = host.per_op_us(2000, torch, print); print(*host.summary_lines(r), sep='\n')" 2>&1 | tee "$OUT/host_per_op.txt" | tail -6

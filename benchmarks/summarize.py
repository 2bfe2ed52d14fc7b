"""Summarise a cupyops-bench JSON file as the markdown tables of the README: for each case,
the `auto` rung (what a user gets) against the copy-bandwidth targets of the foundation
issue and against each baseline on the same inputs; for matmul, TFLOP/s and the ratios to
cupy.matmul (cuBLAS) that the GEMM issue sets.

    python benchmarks/summarize.py benchmarks/results/h200-full.json [more.json ...] > benchmarks/results/h200-summary.md
"""
import json
import sys

# ">= 0.90 of the copy bandwidth at 16384x8192 and 65536x1024, >= 0.60 at 1024x131072"
TARGET = {"16384x8192": 90.0, "65536x1024": 90.0, "1024x131072": 60.0}


def main(*paths):
    """Several JSON files (e.g. the memory-bound suite and the matmul suite, run one after
    the other on the same GPU) are summarised together; the header is the first file's."""
    d = json.load(open(paths[0]))
    rows = list(d["results"])
    for extra in paths[1:]:
        rows += json.load(open(extra))["results"]
    by_case = {}
    for r in rows:
        by_case.setdefault((r["op"], r["axis"], r["dtype"], r["shape"]), {})[r["impl"]] = r
    print(f"Device: {d['device']}; copy bandwidth {d['copy_bandwidth_GBps']:.0f} GB/s (read + write) "
          f"measured in the same run; {d.get('date', '')}.\n")
    print("| op | axis | dtype | shape | auto ms | auto GB/s | % copy BW | target | vs torch | vs cupy |")
    print("| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    misses = []
    for (op, axis, dt, shape), impls in by_case.items():
        if op == "matmul":
            continue
        a = impls.get("auto")
        if a is None or a["status"] != "ok":
            continue
        tgt = TARGET.get(shape) if op != "trace" else None
        ratios = []
        for b in ("torch", "cupy"):
            base = impls.get(b)
            ratios.append(f"{base['ms'] / a['ms']:.2f}x" if base and base["status"] == "ok" else "-")
        ax = "" if axis is None and op == "trace" else ("all" if axis is None else str(axis))
        ok = (tgt is None or a["pct_copy_bw"] >= tgt) and all(
            r == "-" or float(r[:-1]) >= 1.0 for r in ratios)
        flag = "" if ok else " **miss**"
        print(f"| {op} | {ax} | {dt} | {shape} | {a['ms']:.4f} | {a['gbps']:.0f} | {a['pct_copy_bw']:.1f}{flag} | "
              f"{'' if tgt is None else f'{tgt:.0f}'} | {ratios[0]} | {ratios[1]} |")
        if not ok:
            misses.append(f"{op} {ax} {dt} {shape}")
    misses += gemm_table(by_case)
    hov = d.get("host_overhead_us", {})
    if hov:
        print("\nHost overhead per call, (1, 1024) float32 softmax, steady state: " +
              ", ".join(f"{k} {v:.1f} us" for k, v in hov.items()))
    print(f"\n{len(misses)} case(s) miss a target or a baseline" + (": " + "; ".join(misses) if misses else "."))


# GEMM targets (issue 3), as ratios to cupy.matmul on the same shape: the rung they are set
# for, per dtype and shape; decode shapes hold for `auto` (what a user gets).
DECODE = ("1x4096x4096", "16x4096x4096", "1x11008x4096")
SQUARE = ("4096x4096x4096", "8192x8192x8192")


def gemm_target(dt, shape):
    if shape in SQUARE:
        return ("pipelined", 0.95) if dt == "float32" else ("mma", 0.60) if dt in ("float16", "bfloat16") else None
    if shape in DECODE and dt in ("float16", "bfloat16"):
        return ("auto", 0.80)
    return None


def gemm_table(by_case):
    """The matmul cases: auto and the targeted rung, TFLOP/s, ratio to cuBLAS and torch.
    Returns the misses."""
    cases = [(k, v) for k, v in by_case.items() if k[0] == "matmul"]
    if not cases:
        return []
    print("\n| dtype | MxNxK | auto ms | auto TFLOP/s | auto vs cupy | auto vs torch | rung | rung TFLOP/s | "
          "rung vs cupy | target |")
    print("| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |")
    misses = []
    fp16_mma = {}
    for (_, _, dt, shape), impls in cases:
        a = impls.get("auto")
        if a is None or a["status"] != "ok":
            continue
        cup, tor = impls.get("cupy"), impls.get("torch")
        ratio = lambda r, b: f"{b['ms'] / r['ms']:.2f}x" if b and b["status"] == "ok" else "-"  # noqa: E731
        tgt = gemm_target(dt, shape)
        rung = impls.get(tgt[0]) if tgt else None
        cell_rung = cell_tf = cell_ratio = cell_tgt = ""
        if tgt and rung and rung["status"] == "ok":
            cell_rung, cell_tf = tgt[0], f"{rung['tflops']:.1f}"
            cell_ratio = ratio(rung, cup)
            ok = cell_ratio != "-" and float(cell_ratio[:-1]) >= tgt[1]
            cell_tgt = f"{tgt[1]:.2f}" + ("" if ok else " **miss**")
            if not ok:
                misses.append(f"matmul {tgt[0]} {dt} {shape}")
        if shape == "8192x8192x8192" and impls.get("mma", {}).get("status") == "ok":
            fp16_mma[dt] = impls["mma"]["tflops"]
        print(f"| {dt} | {shape} | {a['ms']:.4f} | {a['tflops']:.1f} | {ratio(a, cup)} | {ratio(a, tor)} | "
              f"{cell_rung} | {cell_tf} | {cell_ratio} | {cell_tgt} |")
    if "int8" in fp16_mma and "float16" in fp16_mma:
        r = fp16_mma["int8"] / fp16_mma["float16"]
        flag = "" if r >= 1.5 else " **miss** (target 1.5x)"
        print(f"\nint8 mma at 8192^3: {fp16_mma['int8']:.0f} TOP/s = {r:.2f}x our float16 mma "
              f"({fp16_mma['float16']:.0f} TFLOP/s), matmul(a, b) layout{flag}")
        if r < 1.5:
            misses.append("matmul int8 mma vs float16 mma 8192^3")
    return misses


if __name__ == "__main__":
    main(*sys.argv[1:])

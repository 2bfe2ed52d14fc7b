"""Summarise a cupyops-bench JSON file as the markdown tables of the README: for each case,
the `auto` rung (what a user gets) against the copy-bandwidth targets of the foundation
issue and against each baseline on the same inputs.

    python benchmarks/summarize.py benchmarks/results/h200-full.json > benchmarks/results/h200-summary.md
"""
import json
import sys

# ">= 0.90 of the copy bandwidth at 16384x8192 and 65536x1024, >= 0.60 at 1024x131072"
TARGET = {"16384x8192": 90.0, "65536x1024": 90.0, "1024x131072": 60.0}


def main(path):
    d = json.load(open(path))
    rows = d["results"]
    by_case = {}
    for r in rows:
        by_case.setdefault((r["op"], r["axis"], r["dtype"], r["shape"]), {})[r["impl"]] = r
    print(f"Device: {d['device']}; copy bandwidth {d['copy_bandwidth_GBps']:.0f} GB/s (read + write) "
          f"measured in the same run; {d.get('date', '')}.\n")
    print("| op | axis | dtype | shape | auto ms | auto GB/s | % copy BW | target | vs torch | vs cupy |")
    print("| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    misses = []
    for (op, axis, dt, shape), impls in by_case.items():
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
    hov = d.get("host_overhead_us", {})
    if hov:
        print("\nHost overhead per call, (1, 1024) float32 softmax, steady state: " +
              ", ".join(f"{k} {v:.1f} us" for k, v in hov.items()))
    print(f"\n{len(misses)} case(s) miss a target or a baseline" + (": " + "; ".join(misses) if misses else "."))


if __name__ == "__main__":
    main(sys.argv[1])

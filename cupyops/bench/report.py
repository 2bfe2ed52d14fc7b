"""Turning result rows into numbers people compare: GB/s, % of the measured copy
bandwidth, speedup over the best baseline; and into a text table, markdown and JSON.

Pure Python (no CuPy): the CPU tests feed it fabricated rows.

A row is a dict with at least: op, axis (-1, or None for all / trace), impl, kind
("variant" | "auto" | "baseline"), dtype, shape ("16384x8192"; matmul "MxNxK"; attention
"B4xHq16xHkv16xSq4096xSkv4096xD128"), bytes, flops (matmul and attention, else None), ms
(None unless timed), rel_error, status ("ok" | "FAILED" | "skipped") and note (why, or
None). Attention rows also carry mask ("none" | "causal" | "causal_br"), which is part of
the case, and gbps_meaningful (False for prefill: no GB/s is shown). Matmul rows carry
layout ("nn" | "nt"), part of the case too and shown after the shape ("4096x4096x4096
nt"); a row without one (results written before layouts) is "nn".
"""
import json
import math

from .operators import LAYOUTS, OPERATORS

# (title, row key, alignment) of the table columns, text and markdown alike.
COLUMNS = (
    ("op", "op", "<"),
    ("axis/mask", "axis", "<"),
    ("impl", "impl", "<"),
    ("dtype", "dtype", "<"),
    ("shape", "shape", "<"),
    ("ms", "ms", ">"),
    ("GB/s", "gbps", ">"),
    ("% copy", "pct_copy_bw", ">"),
    ("% copy same B", "pct_copy_same", ">"),
    ("TFLOP/s", "tflops", ">"),
    ("vs best base", "speedup_vs_best_baseline", ">"),
    ("vs each base", "speedups", "<"),
    ("rel err", "rel_error", ">"),
    ("status", "status", "<"),
)


def _spec(row):
    """The description of the row's op; None for an op this version does not know."""
    return OPERATORS.get(row["op"])


def layout_of(row):
    """A GEMM row's operand layout ("nn" when a matmul row predates layouts); "" otherwise."""
    spec = _spec(row)
    if spec is None or not spec.layouts:
        return ""
    return row.get("layout") or LAYOUTS[0]


def case_key(row):
    return (row["op"], row.get("axis"), row["dtype"], row["shape"], row.get("mask"),
            layout_of(row))


def shape_label(row):
    """The shape column: the shape, and for matmul its layout ("4096x4096x4096 nt")."""
    layout = layout_of(row)
    return f"{row['shape']} {layout}" if layout else row["shape"]


def finalize(rows, copy_gbps):
    """New rows with gbps, pct_copy_bw, baseline (the fastest baseline of the same case),
    speedup_vs_best_baseline = baseline ms / this ms (> 1: this one is faster), and
    speedups = {baseline: its ms / this ms} for every other baseline of the case that ran."""
    best, timed_baselines = {}, {}
    for r in rows:
        if r.get("kind") == "baseline" and r.get("status") == "ok" and r.get("ms"):
            k = case_key(r)
            timed_baselines.setdefault(k, {})[r["impl"]] = r["ms"]
            if k not in best or r["ms"] < best[k]["ms"]:
                best[k] = r
    out = []
    for r in rows:
        r = dict(r)
        ms = r.get("ms")
        timed = r.get("status") == "ok" and ms
        bw = timed and r.get("gbps_meaningful", True)
        r["gbps"] = r["bytes"] / (ms * 1e-3) / 1e9 if bw else None
        r["pct_copy_bw"] = 100.0 * r["gbps"] / copy_gbps if bw and copy_gbps else None
        # against a copy moving the same bytes (timed in the same run): the measure
        r["pct_copy_same"] = 100.0 * r["copy_ms"] / ms if bw and r.get("copy_ms") else None
        r["tflops"] = r["flops"] / (ms * 1e-3) / 1e12 if timed and r.get("flops") else None
        b = best.get(case_key(r))
        r["baseline"] = b["impl"] if b else None
        r["speedup_vs_best_baseline"] = b["ms"] / ms if (b and timed) else None
        r["speedups"] = ({name: bms / ms for name, bms in timed_baselines.get(case_key(r), {}).items()
                          if name != r["impl"]} if timed else {})
        out.append(r)
    return out


def any_failed(rows):
    """True when a cupyops variant (or impl='auto') failed: the run's exit status 1."""
    return any(r.get("status") == "FAILED" and r.get("kind") != "baseline" for r in rows)


# ----------------------------------------------------------------------------------
# cells
# ----------------------------------------------------------------------------------
def axis_label(row):
    """The axis of a reduction ("all" for None), attention's mask, or nothing."""
    spec = _spec(row)
    if spec is not None and spec.family == "attention":
        return row.get("mask") or ""
    if spec is not None and not spec.has_axis:
        return ""
    return "all" if row.get("axis") is None else str(row["axis"])


def _num(v):
    """Three significant digits for small values (trace moves a few KB), whole numbers
    from 100 up."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return ""
    if abs(v) >= 100:
        return f"{v:.0f}"
    return f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"


def _ms(v):
    if v is None:
        return ""
    return f"{v:.4f}" if v < 10 else f"{v:.1f}"


def cells(row, note_width=60):
    """The display strings of one row, in COLUMNS order."""
    status = row.get("status", "")
    if status != "ok" and row.get("note"):
        note = " ".join(str(row["note"]).split())  # one line
        if note_width and len(note) > note_width:
            note = note[: note_width - 3] + "..."
        status = f"{status}: {note}"
    elif status == "ok" and row.get("note"):
        status = f"ok ({row['note']})"
    rel = row.get("rel_error")
    rel_s = "" if rel is None else ("inf" if rel == math.inf else f"{rel:.1e}")
    spd = row.get("speedup_vs_best_baseline")
    return [
        row["op"],
        axis_label(row),
        row["impl"],
        row["dtype"],
        shape_label(row),
        _ms(row.get("ms") if row.get("status") == "ok" else None),
        _num(row.get("gbps")),
        _num(row.get("pct_copy_bw")),
        _num(row.get("pct_copy_same")),
        _num(row.get("tflops")),
        "" if spd is None else f"{spd:.2f}x",
        speedups_cell(row.get("speedups")),
        rel_s,
        status,
    ]


def speedups_cell(speedups):
    """'flash 1.05x cudnn 0.61x': this row against each baseline (SDPA backends without
    their 'torch-' prefix)."""
    if not speedups:
        return ""
    return " ".join(f"{name.removeprefix('torch-')} {v:.2f}x" for name, v in speedups.items())


def format_table(rows, note_width=60):
    """Fixed-width text table, a blank line between cases, a summary line at the end."""
    titles = [c[0] for c in COLUMNS]
    body = [cells(r, note_width) for r in rows]
    widths = [max([len(t)] + [len(b[i]) for b in body]) for i, t in enumerate(titles)]
    widths[-1] = len(titles[-1])  # the last column is free text: no padding

    def line(vals):
        parts = [format(v, f"{al}{w}") for v, w, (_, _, al) in zip(vals, widths, COLUMNS)]
        return "  ".join(parts).rstrip()

    lines = [line(titles), line(["-" * w for w in widths])]
    prev = None
    for r, b in zip(rows, body):
        if prev is not None and case_key(r) != prev:
            lines.append("")
        prev = case_key(r)
        lines.append(line(b))
    lines.append(summary(rows))
    return "\n".join(lines)


def summary(rows):
    counts = {}
    for r in rows:
        counts[r.get("status")] = counts.get(r.get("status"), 0) + 1
    parts = [f"{counts[s]} {s}" for s in ("ok", "FAILED", "skipped") if counts.get(s)]
    return f"{len(rows)} rows: " + ", ".join(parts)


# ----------------------------------------------------------------------------------
# header, markdown, JSON
# ----------------------------------------------------------------------------------
# host_overhead_us keys -> who was measured
HOST_LABELS = {"softmax_1x1024": "cupyops", "cupy_softmax_1x1024": "cupyx",
               "torch_softmax_1x1024": "torch"}


def header_lines(meta):
    """What the numbers were measured on and how (printed above the table)."""
    s = meta.get("settings", {})
    l2 = meta.get("l2_bytes")
    l2_s = f", L2 {l2 / 2**20:.0f} MiB" if l2 else ""
    lines = [
        f"cupyops-bench on {meta.get('device')} (cc {meta.get('cc')}{l2_s}), {meta.get('date')}",
        f"cupy {meta.get('cupy')}, torch {meta.get('torch') or 'not available'}",
    ]
    bw = meta.get("copy_bandwidth_GBps")
    if bw:
        mib = s.get("copy_mib")
        size = f" of {mib} MiB" if mib else ""
        lines.append(f"copy bandwidth (device-to-device memcpy{size}, read + write): {bw:.0f} GB/s; "
                     "% copy = GB/s over it; % copy same B = time of a memcpy moving the case's "
                     "bytes (half read, half written; timed the same way) over this time")
    ho = meta.get("host_overhead_us") or {}
    if ho:
        parts = [f"{HOST_LABELS.get(k, k)} {'failed' if v is None else f'{v:.1f} us'}"
                 for k, v in ho.items()]
        lines.append("host overhead per call, 1x1024 float32 softmax (median of 5 rounds of 400 "
                     "calls): " + ", ".join(parts))
    if meta.get("host_per_op_us"):
        from .host import summary_lines

        lines += summary_lines(meta["host_per_op_us"])
    if s:
        lines.append(
            f"timing: CUDA events, median of up to {s.get('repeats')} repeats after "
            f"{s.get('warmup')} warm-up calls (fewer when a call is slow: "
            f"{s.get('time_budget_s')} s per impl), L2 flushed by a "
            f"{(s.get('flush_bytes') or 0) / 2**20:.0f} MiB read before each repeat"
        )
        lines.append(
            "validation: float64 cupyops.reference before timing; out= poisoned with NaN; "
            f"row-wise cases above {s.get('check_limit')} elements compare a row subset "
            f"(matmul: 64 rows above {16 * (s.get('check_limit') or 0)} multiply-adds)"
        )
    lines.append("bytes: each input read once, each output written once (trace: the diagonal "
                 "elements only); matmul shapes are MxNxK, TFLOP/s = 2MNK / time; "
                 "vs best base = best baseline ms / this ms (> 1: faster); vs each base: "
                 "the same against every baseline that ran")
    # each op that ran adds its own lines; results saved before the ops were recorded
    # were matmul runs
    ran = s.get("ops", ("matmul",))
    for op, spec in OPERATORS.items():
        if op in ran:
            lines += spec.header_lines
    return lines


def format_markdown(meta, rows):
    titles = [c[0] for c in COLUMNS]
    aligns = ["---:" if c[2] == ">" else "---" for c in COLUMNS]
    out = ["# cupyops-bench results", ""]
    out += [f"- {ln}" for ln in header_lines(meta)]
    out += ["", "| " + " | ".join(titles) + " |", "|" + "|".join(aligns) + "|"]
    for r in rows:
        vals = [c.replace("|", "\\|") for c in cells(r, note_width=0)]
        out.append("| " + " | ".join(vals) + " |")
    out += ["", summary(rows), ""]
    return "\n".join(out)


def _clean(v):
    """JSON has no NaN/Infinity: non-finite floats become null."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


def to_json(meta, rows):
    doc = dict(meta)
    doc["results"] = rows
    return json.dumps(_clean(doc), indent=1, allow_nan=False) + "\n"


def format_plan(plan):
    """The cases and impls a run would time (``--list``)."""
    lines = []
    for case, impls in plan:
        names = [f"{i.name} (skipped)" if i.skip else i.name for i in impls]
        lines.append(f"{case}: {', '.join(names)}")
    n = sum(len([i for i in impls if not i.skip]) for _, impls in plan)
    lines.append(f"{len(plan)} cases, {n} impl runs")
    return "\n".join(lines)

"""``cupyops-bench`` / ``python -m cupyops.bench``: validate every variant of each op against
the float64 reference, then time it next to CuPy and PyTorch on the same data.

Everything that does not need a GPU (options, the plan, bytes, formatting) happens before
CuPy is imported, so ``--help`` and bad options work on any machine. Progress goes to
stderr as the run goes; the header and the table come last on stdout.
"""
import argparse
import contextlib
import dataclasses
import datetime
import sys
import time
from pathlib import Path

from . import cases, operators, report

EPILOG = """\
examples:
  cupyops-bench                                  quick suite, every op (< 1 min)
  cupyops-bench --suite full --json r.json --md r.md
  cupyops-bench --op softmax --dtype bf16 --shape 16384x8192,65536x1024
  cupyops-bench --op sum --axis none --impl cupy,torch,auto
  cupyops-bench --op attention --json a.json --md a.md     attention acceptance set
  cupyops-bench --op attention --dtype bf16 --shape B4xHq16xHkv16xSq4096xSkv4096xD128
                --causal none,causal --impl flash,auto,torch-flash,torch-cudnn   (one line)
  cupyops-bench --op attention --shape B16xHq32xHkv8xSq1xSkv4096xD128   decode
  cupyops-bench --list                           show what would run
  cupyops-bench --op matmul --suite full --json m.json --md m.md    GEMM, nn and nt
  cupyops-bench --op matmul --dtype bf16 --shape 4096x4096x4096 --layout nn,nt
matmul: shapes are MxNxK; the layout is part of the case, shown after the shape
  ("4096x4096x4096 nt") and as "layout" in the JSON. nn: a @ b with b stored K x N
  (row-major); nt: x @ w.T with w stored N x K, as an LLM's linear layer keeps its weight,
  w.T a view (no copy). cupyops, cupy.matmul (cuBLAS) and torch.matmul (int8:
  torch._int_mm) get the same operands in the same layout. The full suite runs, in nn,
  1x4096x4096, 16x4096x4096, 1x11008x4096, 4096x4096x11008, 4096^3 and 8192^3 (float32,
  float16, bfloat16, int8) and, in float16+bfloat16 only,
  2048^3, 4096^3, 8192^3 in nn and nt, and Llama-3-8B prefill in nt at 4096 and
  512 tokens (MxNxK = Mx6144x4096 qkv, Mx4096x4096 o, Mx28672x4096 gate+up,
  Mx4096x14336 down). --layout keeps a suite's cases of those layouts.
attention: shapes name their dimensions, B batch, Hq/Hkv query/key-value heads (H sets
  both), Sq/Skv query/key-value lengths (S sets both), D head_dim; q is [B, Sq, Hq, D] and
  k, v [B, Skv, Hkv, D] ("bshd"). TFLOP/s = 4*B*Hq*D*(visible query-key pairs) / time,
  causal pairs counted exactly; decode cases (Sq <= 16) also report GB/s of Q+K+V+O.
  Baselines: torch SDPA per backend, torch-flash and torch-cudnn (decode also
  torch-efficient and torch-math; 'torch' in --impl means the case's set); "vs best base"
  is against the fastest that ran. The quick suite leaves attention out unless --op
  attention, which runs the acceptance set: fp16+bf16 B4 H16 S4096 D128 and B4 H32 S4096
  D64, causal and not; GQA B1 Hq32 Hkv8 S8192 D128 causal; bf16 decode Sq1, Skv 4096 and
  32768, B 16 and 64, Hq32 Hkv8 D128.
  Slow rungs, left out in every suite unless --no-skip-slow: naive when its B*Hq*Sq*Skv
  float32 scores exceed 2 GiB, naive/tiled/flash_v1 (CUDA cores) above 2^40 FLOP, decode
  above 16 query rows.
fused LLM operators: silu_and_mul, gelu_and_mul (shape: x's, tokens x 2d), add_rms_norm
  (tokens x hidden), rope (tokens x q_heads x kv_heads x head_dim, e.g. 16384x32x8x128; neox,
  cos/sin from base 10000, int64 positions). Baseline: the PyTorch eager composition each
  replaces ('torch'); "% copy same B" is against a device copy of the bytes they move.
  quick: 4096 tokens in float32+bfloat16; full: 16384 tokens (hidden 4096) in every dtype.
exit status: 0 when every cupyops variant passed validation, 1 if one FAILED, 2 on bad options.
"""


def build_parser():
    p = argparse.ArgumentParser(
        prog="cupyops-bench",
        description="Validate and time cupyops' kernel variants against CuPy and PyTorch.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sel = p.add_argument_group("what to run")
    sel.add_argument("--op", action="append", metavar="OPS",
                     help=f"ops, repeatable or comma list: {', '.join(cases.OPS)} (default "
                          f"every op of the suite; quick leaves attention out)")
    sel.add_argument("--impl", action="append", metavar="IMPLS",
                     help="impls, comma list: variant names, 'auto', 'cupy', 'torch', "
                          "attention's torch-flash, torch-cudnn, torch-efficient, torch-math "
                          "(default every variant plus the baselines)")
    sel.add_argument("--dtype", action="append", metavar="DTYPES",
                     help="float32,float16,bfloat16 (trace/sum/max also float64,int32,int64; "
                          "matmul also int8; scaled_matmul: float8_e4m3, alias fp8); "
                          "default from the suite")
    sel.add_argument("--shape", action="append", metavar="SHAPES",
                     help="e.g. 16384x8192 (matmul: MxNxK, e.g. 16x4096x4096, run in each "
                          "--layout, default nn; attention: named dimensions, e.g. "
                          "B4xHq16xHkv16xSq4096xSkv4096xD128), repeatable or comma list; "
                          "default from the suite")
    sel.add_argument("--axis", action="append", metavar="AXES",
                     help="sum/max reduction axes: -1 and/or none (default sum: -1,none; max: -1)")
    sel.add_argument("--layout", action="append", metavar="LAYOUTS",
                     help="matmul operand layouts, repeatable or comma list: nn (a @ b, "
                          "b stored K x N), nt (x @ w.T, w stored N x K, w.T a view: no "
                          "copy). On a suite, keeps its cases of these layouts (default "
                          "all: quick nn, full nn and nt, see below); with --shape, runs "
                          "each shape in them (default nn)")
    sel.add_argument("--causal", action="append", metavar="MASKS",
                     help="attention masks, comma list: none, causal (top_left: row i sees "
                          "keys j <= i, SDPA's is_causal), causal_br (bottom_right: j <= "
                          "i + Skv - Sq, the KV-cache alignment); default: the suite's, "
                          "none for --shape")
    sel.add_argument("--suite", choices=list(cases.SUITES),
                     help="quick (default): 4096x4096 float32+bfloat16, the LLM matmul "
                          "shapes in float16+bfloat16 and scaled_matmul at 4096^3 (~20 s once compiled; the first run also compiles, ~35-45 s in all on an H100); "
                          "attention only with --op attention (its acceptance set); "
                          "full: the acceptance shapes 16384x8192, 65536x1024, 1024x131072 "
                          "in float32, float16, bfloat16 (trace: 5977x7890 float32; matmul: "
                          "the LLM shapes and 4096^3, 8192^3 in every dtype, nn, and the "
                          "Hopper GEMM set in float16+bfloat16, see below; scaled_matmul: "
                          "e4m3 -> bfloat16 at 4096^3, 8192^3 and the 4096-token Llama-3-8B "
                          "shapes, nt, against torch._scaled_mm (on an H100/H200); "
                          "attention: its acceptance set, see below)")
    sel.add_argument("--no-baselines", action="store_true", help="time cupyops only")
    sel.add_argument("--skip-slow", action=argparse.BooleanOptionalAction, default=None,
                     help="skip textbook rungs on shapes above --slow-limit elements "
                          "(default: on for the full suite, off otherwise; matmul's naive "
                          "and tiled rungs are skipped above 2^31 multiply-adds in every "
                          "suite unless --no-skip-slow; so are "
                          f"{operators.ATTENTION_SLOW_RULE})")
    sel.add_argument("--slow-limit", type=int, default=cases.SLOW_LIMIT, metavar="N",
                     help="element count above which --skip-slow applies (default 2^24; "
                          "not used for matmul and attention, which have their own rules)")
    sel.add_argument("--list", action="store_true", help="print the plan and exit")

    tim = p.add_argument_group("how to measure")
    tim.add_argument("--repeats", type=int, default=50, metavar="N",
                     help="timed repeats per impl, median reported (default 50)")
    tim.add_argument("--warmup", type=int, default=5, metavar="N",
                     help="untimed calls before timing (default 5)")
    tim.add_argument("--time-budget", type=float, default=2.0, metavar="S",
                     help="seconds of timed calls per impl at most; slow rungs get fewer "
                          "repeats, never under 3 (default 2)")
    tim.add_argument("--sequential", action="store_true",
                     help="time each impl of a case in turn, not side by side (by default the "
                          "fast impls of a case, the ratios' two sides among them, are timed "
                          "with their calls interleaved, so that the GPU's drift falls on all alike)")
    tim.add_argument("--check-limit", type=int, default=cases.CHECK_LIMIT, metavar="N",
                     help="validate row-wise cases above N elements on a subset of rows; "
                          "0 checks every row (default 2^22; attention: 64 query rows of a "
                          "few batches and heads, 0: every query row of those)")
    tim.add_argument("--copy-mib", type=int, default=1024, metavar="MIB",
                     help="size of the device copy that measures bandwidth (default 1024)")
    tim.add_argument("--host-calls", type=int, default=2000, metavar="N",
                     help="back-to-back calls of the host-overhead measure (default 2000)")
    tim.add_argument("--seed", type=int, default=0, help="random input seed (default 0)")

    out = p.add_argument_group("output")
    out.add_argument("--json", metavar="PATH", help="write the results as JSON")
    out.add_argument("--md", metavar="PATH", help="write the results as a markdown table")
    return p


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def load_variants(ops):
    """{op: [impl names in ladder order]} from cupyops (no GPU needed)."""
    import cupyops

    return {op: list(cupyops.variants(op)) for op in ops}


def make_plan(args, parser, variants_loader=None):
    """Options -> (plan, settings). Every mistake is a usage error (exit status 2)."""
    try:
        suite = args.suite or "quick"
        ops = cases.parse_ops(args.op) if args.op else cases.suite_ops(suite)
        dtypes = cases.parse_dtypes(args.dtype, ops)
        shapes = cases.parse_shapes(args.shape)
        axes = cases.parse_axes(args.axis)
        specs = [operators.operator(op) for op in ops]
        masks = cases.parse_masks(args.causal)
        if masks and not any(spec.family == "attention" for spec in specs):
            raise ValueError("--causal: applies to attention only (add --op attention)")
        layouts = cases.parse_layouts(args.layout)
        if layouts and not any(spec.layouts for spec in specs):
            raise ValueError("--layout: applies to matmul and scaled_matmul only (add --op matmul)")
        case_list = cases.expand_cases(ops, suite, dtypes, shapes, axes, masks, layouts)
        requested = cases.split_list(args.impl)
        for name, v in (("--repeats", args.repeats), ("--copy-mib", args.copy_mib),
                        ("--host-calls", args.host_calls)):
            if v < 1:
                raise ValueError(f"{name}: must be at least 1, got {v}")
        if args.warmup < 0 or args.check_limit < 0:
            raise ValueError("--warmup and --check-limit must not be negative")
    except ValueError as exc:
        parser.error(str(exc))
    try:
        variants = (variants_loader or load_variants)(ops)
    except Exception as exc:  # cupyops itself broken or incomplete
        parser.exit(2, f"cupyops-bench: cannot read cupyops.variants(): {exc}\n")
    try:
        cases.check_impl_names(requested, variants, ops)
    except ValueError as exc:
        parser.error(str(exc))
    skip_slow = args.skip_slow if args.skip_slow is not None else suite == "full"
    plan = cases.build_plan(case_list, variants, requested, not args.no_baselines,
                            skip_slow, args.slow_limit, gemm_skip_slow=args.skip_slow is not False)
    if not plan:
        parser.error("nothing to run: no impl left for the selected ops (check --impl and "
                     "--no-baselines)")
    settings = {
        "suite": suite, "repeats": args.repeats, "warmup": args.warmup,
        "time_budget_s": args.time_budget, "timing": "sequential" if args.sequential else "interleaved",
        "check_limit": args.check_limit,
        "skip_slow": skip_slow, "slow_limit": args.slow_limit, "seed": args.seed,
        "copy_mib": args.copy_mib, "host_calls": args.host_calls, "ops": list(ops),
    }
    return plan, settings


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    plan, settings = make_plan(args, parser)
    if args.list:
        print(report.format_plan(plan))
        return 0
    from .._arrays import cupy_module

    try:  # CuPy and a usable GPU, or one line that says what is missing
        cupy_module()
    except RuntimeError as exc:
        print(f"cupyops-bench: {exc}", file=sys.stderr)
        return 2
    return run(args, plan, settings)


# ----------------------------------------------------------------------------------
# the GPU run
# ----------------------------------------------------------------------------------
def torch_cuda():
    """PyTorch when it imports and sees a GPU, else None (its baselines are then left out)."""
    try:
        import torch
    except Exception:
        return None
    return torch if torch.cuda.is_available() else None


def is_torch_baseline(impl):
    return impl.kind == "baseline" and (impl.name == "torch" or impl.name.startswith("torch-"))


def torch_on_stream(torch, stream):
    """Run PyTorch on CuPy's stream, so CuPy's events bracket PyTorch's kernels too."""
    if torch is None:
        return contextlib.nullcontext()
    return torch.cuda.stream(torch.cuda.ExternalStream(stream.ptr))


def run(args, plan, settings):
    import cupy

    from . import timing

    t_start = time.perf_counter()
    # Every kernel file the plan needs starts compiling now, in parallel threads (NVRTC runs
    # without the GIL); a case waits only for its own file, so the first operators are
    # timed while the GEMM files still compile: a cold quick suite is bounded by the slowest
    # file instead of the sum of all (waiting for all of them first measured 70 s against
    # 35-45 s on the H100).
    compiled = start_compiling(settings["ops"])
    torch = torch_cuda()
    if torch is not None:  # float32 matmul baselines in true float32 (TF32 off), as CuPy's
        torch.backends.cuda.matmul.allow_tf32 = False
    if torch is None:
        plan = [(c, [i for i in impls if not is_torch_baseline(i)]) for c, impls in plan]
        log("PyTorch with CUDA not available: no torch baselines")
    dev = cupy.cuda.Device()
    props = cupy.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)

    stream = cupy.cuda.Stream()
    rows = []
    with stream, torch_on_stream(torch, stream):
        flush = timing.L2Flusher()
        settings["flush_bytes"] = flush.nbytes
        log(f"{name}: measuring copy bandwidth ({args.copy_mib} MiB device-to-device)")
        copy_bw = timing.copy_bandwidth(args.copy_mib << 20, flush=flush)
        log(f"  copy bandwidth {copy_bw:.0f} GB/s (read + write)")
        n_runs = sum(1 for _, impls in plan for i in impls if not i.skip)
        log(f"{len(plan)} cases, {n_runs} impl runs")
        same_bytes_copy = {}  # bytes moved -> ms of a copy moving as many
        for k, (case, impls) in enumerate(plan, 1):
            fl = cases.flops(case)
            work = f"{fl / 1e9:.1f} GFLOP, " if fl else ""
            log(f"[{k}/{len(plan)}] {time.perf_counter() - t_start:6.1f} s  {case}  "
                f"({work}{cases.bytes_moved(case) / 1e6:.1f} MB to move)")
            case_rows = run_case(case, impls, args, flush, torch)
            cupy.get_default_memory_pool().free_all_blocks()
            if cases.reports_bandwidth(case) and any(r["status"] == "ok" for r in case_rows):
                nbytes = cases.bytes_moved(case)
                if nbytes not in same_bytes_copy:
                    same_bytes_copy[nbytes] = timing.copy_ms_for(nbytes, flush=flush)
                for r in case_rows:
                    r["copy_ms"] = same_bytes_copy[nbytes]
            rows += case_rows
            if torch is not None:
                torch.cuda.empty_cache()
        del flush
        compiled()
    # Host time per call, on the default stream, once no compile thread competes for the
    # CPU (measured during the compiles: 26 us for a call that takes 15 us alone; NOTES 34).
    host = host_overheads(args.host_calls, torch)
    from . import host as host_time

    try:
        per_op = host_time.per_op_us(args.host_calls, torch, log,
                                     ops=[op for op in settings["ops"] if op in host_time.OPS])
    except Exception as exc:  # noqa: BLE001 - a run's results are worth more than this figure
        per_op = {}
        log(f"  host time per operator: failed ({type(exc).__name__}: {exc})")

    rows = report.finalize(rows, copy_bw)
    meta = {
        "device": name,
        "cc": f"{props['major']}.{props['minor']}",
        "l2_bytes": int(props["l2CacheSize"]),
        "cupy": cupy.__version__,
        "torch": torch.__version__ if torch is not None else None,
        "copy_bandwidth_GBps": copy_bw,
        "host_overhead_us": host,
        "host_per_op_us": per_op,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "settings": settings,
    }
    write_outputs(args, meta, rows)
    log(f"done in {time.perf_counter() - t_start:.1f} s")
    print("\n".join(report.header_lines(meta)))
    print()
    print(report.format_table(rows), flush=True)
    return 1 if report.any_failed(rows) else 0


def start_compiling(ops):
    """Start compiling the kernel files behind ``ops`` in parallel threads (warmup_async);
    returns a wait() that never raises: a file that fails to compile fails its own cases,
    where the error is reported per impl."""
    try:
        from cupyops._kernels import warmup_async

        wait = warmup_async(list(ops),
                            on_compiled=lambda f, s: log(f"  compiled {f} in {s:.1f} s"))
    except Exception as exc:
        log(f"background compile not started ({type(exc).__name__}: {exc})")
        return lambda: None

    def settle():
        try:
            wait()
        except Exception:
            pass

    return settle


def write_outputs(args, meta, rows):
    for path, text in ((args.json, lambda: report.to_json(meta, rows)),
                       (args.md, lambda: report.format_markdown(meta, rows))):
        if path:
            p = Path(path)
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text())
            log(f"wrote {p}")


def host_overheads(calls, torch):
    """Microseconds of host time per softmax call on a 1x1024 float32 row (acceptance:
    cupyops <= 15 us). A library that fails here gets None, not a crashed run."""
    import cupy

    import cupyops

    from . import timing

    x = cupy.random.RandomState(0).standard_normal((1, 1024), dtype=cupy.float32)
    fns = {"softmax_1x1024": lambda: cupyops.softmax(x)}
    try:
        from cupyx.scipy.special import softmax as cupyx_softmax

        fns["cupy_softmax_1x1024"] = lambda: cupyx_softmax(x, axis=-1)
    except ImportError:
        pass
    if torch is not None:
        t = torch.from_dlpack(x)
        fns["torch_softmax_1x1024"] = lambda: torch.softmax(t, -1)
    out = {}
    for key, fn in fns.items():
        try:
            out[key] = timing.host_overhead_us(fn, calls=calls)
            log(f"  host overhead {key}: {out[key]:.1f} us/call")
        except Exception as exc:
            out[key] = None
            log(f"  host overhead {key}: failed ({type(exc).__name__}: {exc})")
    return out


def run_case(case, impls, args, flush, torch):
    """Rows for every impl of one case, in plan order."""
    from . import runners

    spec = case.spec
    base = {"op": case.op, "axis": case.axis if spec.has_axis else None,
            "dtype": case.dtype, "shape": case.shape_str, "bytes": cases.bytes_moved(case),
            "flops": cases.flops(case), "gbps_meaningful": cases.reports_bandwidth(case)}
    if spec.family == "attention":
        base.update(mask=case.mask, causal=case.causal, causal_align=case.causal_align,
                    decode=case.decode, **case.shape._asdict())
    if spec.layouts:
        base["layout"] = case.layout

    def row(impl, status="ok", note=None, **kw):
        r = {**base, "impl": impl.name, "kind": impl.kind, "ms": None, "ms_min": None,
             "repeats": None, "rel_error": None, "tolerance": None}
        r.update(kw, status=status, note=note)
        return r

    try:
        data = runners.prepare(case, seed=args.seed, check_limit=args.check_limit)
    except Exception as exc:  # no input or no reference: nothing of this case can pass
        note = f"setup: {type(exc).__name__}: {exc}"
        log(f"  FAILED {note}")
        return [row(i, "FAILED", note) for i in impls]

    # every impl validated first; those that passed are then timed side by side
    # (timing.time_side_by_side: the fast ones interleaved), or each in turn (--sequential)
    t0 = time.perf_counter()
    rows, pending = [], {}
    for impl in impls:
        if impl.skip:
            r = row(impl, "skipped", impl.skip)
        elif impl.kind == "baseline":
            r = run_baseline(data, impl, args, flush, torch, row)
        else:
            r = run_variant(data, impl, args, flush, row)
        if isinstance(r, Pending):
            pending[len(rows)] = r
        rows.append(r)
    timed = time_pending(pending, args, flush)
    for i, r in enumerate(rows):
        if i in pending:
            rows[i] = r = pending[i].finish(timed.get(i))
        log(progress_line(r, time.perf_counter() - t0))
    return rows


@dataclasses.dataclass
class Pending:
    """An impl that passed its checks, waiting to be timed: its call, and the row that a
    Timing (or the exception that timing raised) makes of it."""

    call: object
    make_row: object  # Timing -> row
    fail_row: object  # exception -> row

    def finish(self, t):
        return self.fail_row(t) if isinstance(t, Exception) else self.make_row(t)


def time_pending(pending, args, flush):
    """{index: Timing or the exception} of the pending impls: side by side (interleaved
    where they fit the budget), or each in turn under --sequential. One that fails to time
    fails alone: the others are then timed in turn."""
    from . import timing

    kw = dict(repeats=args.repeats, warmup=args.warmup, flush=flush, budget_s=args.time_budget)
    if not args.sequential and len(pending) > 1:
        try:
            return timing.time_side_by_side({i: p.call for i, p in pending.items()}, **kw)
        except Exception:  # noqa: BLE001 (which one failed is found below, each alone)
            pass
    out = {}
    for i, p in pending.items():
        try:
            out[i] = timing.time_gpu(p.call, **kw)
        except Exception as exc:  # noqa: BLE001 (reported in the impl's row)
            out[i] = exc
    return out


def run_variant(data, impl, args, flush, row):
    """Validate one cupyops impl: its row, or a Pending to time. An argument error raised
    by the first call means the variant does not take this dtype/shape: skipped, not
    FAILED."""
    from . import runners

    call = runners.cupyops_call(data, impl.name)
    try:
        call()  # the first call compiles
    except (TypeError, ValueError, NotImplementedError) as exc:
        return row(impl, "skipped", f"unsupported: {type(exc).__name__}: {exc}")
    except Exception as exc:
        return row(impl, "FAILED", f"{type(exc).__name__}: {exc}")
    try:
        err, failure = runners.validate_cupyops(data, call)
    except Exception as exc:
        return row(impl, "FAILED", f"validation: {type(exc).__name__}: {exc}", tolerance=data.tol)
    if failure:
        return row(impl, "FAILED", failure, rel_error=err, tolerance=data.tol)
    return Pending(call,
                   lambda t: row(impl, ms=t.median_ms, ms_min=t.min_ms, repeats=t.repeats, rel_error=err,
                                 tolerance=data.tol),
                   lambda exc: row(impl, "FAILED", f"timing: {type(exc).__name__}: {exc}", rel_error=err,
                                   tolerance=data.tol))


def run_baseline(data, impl, args, flush, torch, row):
    """Check a vendor baseline: a Pending to time (its error is reported, a miss only
    noted), or its skipped row."""
    from . import runners

    try:
        fn = runners.baseline_call(data, impl.name, torch)
        context = getattr(fn, "context", None)
        if context is None:
            call = fn
        else:  # SDPA's backend selection around each call (entered on the host, not timed)
            def call():
                with context():
                    return fn()
        err = runners.check(data, call())
    except Exception as exc:
        if impl.name in operators.SDPA_BACKENDS:  # one line: what refused it
            lines = [ln for ln in str(exc).splitlines() if ln.strip()]
            return row(impl, "skipped",
                       f"unavailable: {type(exc).__name__}: {lines[0] if lines else ''}")
        return row(impl, "skipped", f"unsupported: {type(exc).__name__}: {exc}")
    notes = [getattr(fn, "note", None), None if err <= data.tol else "rel_error above tolerance"]
    note = "; ".join(n for n in notes if n) or None
    return Pending(call,
                   lambda t: row(impl, note=note, ms=t.median_ms, ms_min=t.min_ms, repeats=t.repeats,
                                 rel_error=err, tolerance=data.tol),
                   lambda exc: row(impl, "skipped", f"unsupported: {type(exc).__name__}: {exc}"))


def progress_line(r, wall_s):
    head = f"    {r['impl']:<18}"
    if r["status"] == "ok":
        gbps = r["bytes"] / (r["ms"] * 1e-3) / 1e9
        rate = (f"{r['flops'] / (r['ms'] * 1e-3) / 1e12:8.1f} TFLOP/s" if r.get("flops")
                else f"{gbps:8.0f} GB/s")
        if r.get("flops") and r.get("decode"):  # attention decode: memory-bound too
            rate += f" {gbps:6.0f} GB/s"
        note = f"  ({r['note']})" if r.get("note") else ""
        return (f"{head}{r['ms']:10.4f} ms {rate}  rel_err {r['rel_error']:.1e}{note}  "
                f"[{wall_s:.1f} s]")
    return f"{head}{r['status']}: {r['note']}  [{wall_s:.1f} s]"

"""CPU tier: the benchmark CLI's parsing, plan, byte counts and reports. No GPU, no CuPy:
the reports are fed fabricated rows, the plan a fabricated variant table."""
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cupyops.bench import cases, cli, report

ROOT = Path(__file__).resolve().parents[1]

VARIANTS = {
    "trace": ["naive", "block", "unrolled"],
    "sum": ["naive", "block", "vector"],
    "max": ["naive", "block", "vector"],
    "softmax": ["naive", "online", "fused"],
    "layer_norm": ["twopass", "welford", "fused"],
    "rms_norm": ["twopass", "fused"],
    "matmul": ["naive", "tiled", "regblock", "pipelined", "wmma", "mma", "skinny"],
}


def fake_variants(ops):
    return {op: VARIANTS[op] for op in ops}


def plan_for(argv):
    parser = cli.build_parser()
    args = parser.parse_args(argv)
    return cli.make_plan(args, parser, fake_variants)


# ------------------------------------------------------------------------ parsing
def test_split_list_flattens_repeats_and_commas():
    assert cases.split_list(["a,b", " c ", "a", ""]) == ["a", "b", "c"]
    assert cases.split_list(None) is None


def test_parse_ops_default_aliases_and_error():
    assert cases.parse_ops(None) == cases.OPS
    assert cases.parse_ops(["softmax,amax", "rmsnorm"]) == ("softmax", "max", "rms_norm")
    with pytest.raises(ValueError, match=r"--op: unknown op 'conv'.*softmax"):
        cases.parse_ops(["conv"])


def test_parse_dtypes_aliases_and_errors():
    assert cases.parse_dtypes(["bf16,fp16", "float32"]) == ("bfloat16", "float16", "float32")
    assert cases.parse_dtypes(None) is None
    with pytest.raises(ValueError, match=r"--dtype: unknown dtype 'float8'"):
        cases.parse_dtypes(["float8"])
    with pytest.raises(ValueError, match=r"--dtype: int32 is not supported by softmax"):
        cases.parse_dtypes(["int32"], ops=("softmax",))
    assert cases.parse_dtypes(["int32"], ops=("softmax", "sum")) == ("int32",)


@pytest.mark.parametrize("text,shape", [("16384x8192", (16384, 8192)), ("5977X7890", (5977, 7890)),
                                        ("2*3*4", (2, 3, 4)), ("1024", (1024,))])
def test_parse_shape(text, shape):
    assert cases.parse_shape(text) == shape


@pytest.mark.parametrize("bad", ["", "16384by8192", "0x8", "-4x4", "4x", "axb"])
def test_parse_shape_errors(bad):
    with pytest.raises(ValueError, match="--shape: cannot parse"):
        cases.parse_shape(bad)


def test_parse_shapes_and_axes():
    assert cases.parse_shapes(["4x4,8x8", "4x4"]) == ((4, 4), (8, 8))
    assert cases.parse_axes(["-1,none", "all"]) == (-1, None)
    with pytest.raises(ValueError, match="--axis: unknown axis '0'"):
        cases.parse_axes(["0"])


# ------------------------------------------------------------------------ expansion
def test_quick_suite_covers_every_op():
    cs = cases.expand_cases(cases.OPS, "quick")
    assert {c.op for c in cs} == set(cases.OPS)
    sums = [c for c in cs if c.op == "sum"]
    assert {c.axis for c in sums} == {-1, None}
    assert [c for c in cs if c.op == "max"] and all(c.axis == -1 for c in cs if c.op == "max")
    trace = [c for c in cs if c.op == "trace"]
    assert [(c.shape, c.dtype) for c in trace] == [((5977, 7890), "float32")]


def test_full_suite_is_the_acceptance_set():
    cs = cases.expand_cases(cases.OPS, "full")
    big = {(16384, 8192), (65536, 1024), (1024, 131072)}
    for op in ("softmax", "layer_norm", "rms_norm", "sum", "max"):
        got = {(c.shape, c.dtype) for c in cs if c.op == op and c.axis == -1}
        assert got == {(s, d) for s in big for d in cases.FLOAT_DTYPES}, op
    assert len([c for c in cs if c.op == "sum" and c.axis is None]) == 9
    gemms = {(c.shape, c.dtype) for c in cs if c.op == "matmul"}
    assert {((4096, 4096, 4096), d) for d in ("float32", "float16", "bfloat16", "int8")} <= gemms
    assert {((8192, 8192, 8192), d) for d in ("float32", "float16", "bfloat16", "int8")} <= gemms
    assert len(cs) == 1 + 5 * 9 + 9 + 6 * 4


def test_default_suite_has_the_llm_gemm_shapes():
    cs = cases.expand_cases(cases.OPS, "quick")
    got = {(c.shape, c.dtype) for c in cs if c.op == "matmul"}
    llm = [(1, 4096, 4096), (16, 4096, 4096), (1, 11008, 4096), (4096, 4096, 11008), (8192, 8192, 8192)]
    assert got == {(s, d) for s in llm for d in ("float16", "bfloat16")}
    plan, _ = plan_for(["--op", "matmul", "--dtype", "fp16"])
    skipped = {(c.shape, i.name) for c, im in plan for i in im if i.skip}
    # the textbook rungs are left out of the big products in every suite, never of decode
    assert ((8192, 8192, 8192), "naive") in skipped and ((8192, 8192, 8192), "tiled") in skipped
    assert not any(s[0] == 1 for s, _ in skipped)
    plan, _ = plan_for(["--op", "matmul", "--dtype", "fp16", "--no-skip-slow"])
    assert not any(i.skip for _, im in plan for i in im)


def test_matmul_bytes_flops_and_tolerance():
    from cupyops import reference

    c = cases.Case("matmul", "float16", (16, 4096, 11008), None)
    assert cases.flops(c) == 2 * 16 * 4096 * 11008
    assert cases.bytes_moved(c) == (16 * 11008 + 11008 * 4096) * 2 + 16 * 4096 * 2
    i8 = cases.Case("matmul", "int8", (64, 32, 128), None)
    assert cases.bytes_moved(i8) == 64 * 128 + 128 * 32 + 64 * 32 * 4  # int32 out
    assert cases.tolerance(i8, reference.TOLERANCE) == 0.0
    f32 = cases.Case("matmul", "float32", (8192, 8192, 8192), None)
    assert cases.tolerance(f32, reference.TOLERANCE) == pytest.approx(2e-7 * math.sqrt(8192))
    assert cases.flops(cases.Case("softmax", "float32", (4, 4))) is None
    assert (c.rows, c.cols, c.axis_str) == (16, 4096, "")
    rows = cases.sample_rows(f32)
    assert len(rows) == 64 and rows[0] == 0 and rows[-1] == 8191
    assert cases.sample_rows(cases.Case("matmul", "float32", (256, 256, 256), None)) is None


def test_explicit_options_replace_the_suite():
    cs = cases.expand_cases(("softmax", "sum"), "full", dtypes=("int32", "float16"),
                            shapes=((8, 16),), axes=(None,))
    assert [(c.op, c.dtype, c.shape, c.axis) for c in cs] == [
        ("softmax", "float16", (8, 16), -1),  # softmax takes no int32 and has no --axis
        ("sum", "int32", (8, 16), None),
        ("sum", "float16", (8, 16), None),
    ]


def test_trace_needs_2d_shapes():
    with pytest.raises(ValueError, match="trace needs a 2-D shape"):
        cases.expand_cases(("trace",), "quick", shapes=((2, 3, 4),))


def test_case_properties():
    c = cases.Case("softmax", "bfloat16", (4, 8, 16))
    assert (c.numel, c.rows, c.cols, c.shape_str, c.row_wise) == (512, 32, 16, "4x8x16", True)
    assert str(c) == "softmax axis=-1 bfloat16 4x8x16"
    assert cases.Case("sum", "float32", (4, 4), None).axis_str == "all"
    assert not cases.Case("sum", "float32", (4, 4), None).row_wise
    assert cases.Case("trace", "float32", (4, 4), None).axis_str == ""


# ------------------------------------------------------------------------ impls and plan
def test_default_impls_are_the_ladder_then_auto_then_baselines():
    c = cases.Case("softmax", "float32", (64, 64))
    names = [(i.name, i.kind) for i in cases.impls_for(c, VARIANTS["softmax"])]
    assert names == [("naive", "variant"), ("online", "variant"), ("fused", "variant"),
                     ("auto", "auto"), ("cupy", "baseline"), ("torch", "baseline")]
    ln = cases.Case("layer_norm", "float32", (64, 64))
    assert [i.name for i in cases.impls_for(ln, VARIANTS["layer_norm"])][-1] == "torch"
    assert "cupy" not in [i.name for i in cases.impls_for(ln, VARIANTS["layer_norm"])]


def test_requested_impls_and_no_baselines():
    c = cases.Case("sum", "float32", (64, 64))
    got = cases.impls_for(c, VARIANTS["sum"], requested=["auto", "vector", "torch"], baselines=False)
    assert [(i.name, i.kind) for i in got] == [("vector", "variant"), ("auto", "auto")]


def test_unknown_impl_is_an_error():
    cases.check_impl_names(["fused", "cupy", "auto"], VARIANTS, ("softmax",))
    with pytest.raises(ValueError, match=r"--impl: unknown impl 'turbo'.*online"):
        cases.check_impl_names(["turbo"], VARIANTS, ("softmax",))
    with pytest.raises(ValueError, match="unknown impl 'welford'"):  # a layer_norm rung only
        cases.check_impl_names(["welford"], VARIANTS, ("softmax",))


def test_skip_slow_marks_textbook_rungs_on_big_shapes():
    big = cases.Case("softmax", "float32", (16384, 8192))
    small = cases.Case("softmax", "float32", (4096, 4096))
    skipped = [i.name for i in cases.impls_for(big, VARIANTS["softmax"], skip_slow=True) if i.skip]
    assert skipped == ["naive"]
    assert not [i for i in cases.impls_for(small, VARIANTS["softmax"], skip_slow=True) if i.skip]
    assert not [i for i in cases.impls_for(big, VARIANTS["softmax"], skip_slow=False) if i.skip]
    assert cases.is_slow_rung("twopass", VARIANTS["rms_norm"])
    assert not cases.is_slow_rung("fused", VARIANTS["rms_norm"])


def test_plan_from_the_command_line():
    plan, settings = plan_for(["--op", "softmax", "--dtype", "bf16", "--shape", "16384x8192",
                               "--suite", "full"])
    assert len(plan) == 1 and settings["skip_slow"] is True
    case, impls = plan[0]
    assert (case.op, case.dtype, case.shape) == ("softmax", "bfloat16", (16384, 8192))
    assert [i.name for i in impls if i.skip] == ["naive"]
    plan, settings = plan_for(["--op", "softmax", "--no-skip-slow", "--suite", "full"])
    assert settings["skip_slow"] is False and not any(i.skip for _, im in plan for i in im)
    plan, settings = plan_for([])
    assert settings["suite"] == "quick" and settings["skip_slow"] is False


@pytest.mark.parametrize("argv,msg", [
    (["--op", "conv"], "unknown op"),
    (["--dtype", "float8"], "unknown dtype"),
    (["--shape", "16384by8192"], "cannot parse"),
    (["--op", "softmax", "--impl", "turbo"], "unknown impl"),
    (["--op", "softmax", "--dtype", "int64"], "not supported"),
    (["--op", "layer_norm", "--impl", "cupy"], "nothing to run"),
    (["--repeats", "0"], "at least 1"),
])
def test_bad_options_exit_2_with_a_message(argv, msg, capsys):
    with pytest.raises(SystemExit) as exc:
        plan_for(argv)
    assert exc.value.code == 2
    assert msg in capsys.readouterr().err


def test_list_prints_the_plan_without_a_gpu(monkeypatch, capsys):
    monkeypatch.setattr(cli, "load_variants", fake_variants)
    assert cli.main(["--op", "rms_norm", "--suite", "full", "--list"]) == 0
    out = capsys.readouterr().out
    assert "rms_norm axis=-1 float32 16384x8192: twopass (skipped), fused, auto, torch" in out
    assert out.strip().endswith("9 cases, 27 impl runs")


def test_help_works_without_cupy():
    code = ("import sys\n"
            "from cupyops.bench import cli\n"
            "try:\n    cli.main(['--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
            "assert 'cupy' not in sys.modules and 'torch' not in sys.modules\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "--suite" in r.stdout and "--skip-slow" in r.stdout
    r = subprocess.run([sys.executable, "-m", "cupyops.bench", "--help"], capture_output=True,
                       text=True, cwd=ROOT)
    assert r.returncode == 0 and "cupyops-bench" in r.stdout


# ------------------------------------------------------------------------ the floor
def test_bytes_moved():
    f32, bf16 = 4, 2
    m, n = 16384, 8192
    assert cases.bytes_moved(cases.Case("softmax", "float32", (m, n))) == 2 * m * n * f32
    assert cases.bytes_moved(cases.Case("sum", "float32", (m, n))) == m * n * f32 + m * f32
    assert cases.bytes_moved(cases.Case("sum", "bfloat16", (m, n), None)) == m * n * bf16 + bf16
    assert cases.bytes_moved(cases.Case("sum", "int32", (m, n))) == m * n * 4 + m * 8  # int64 out
    assert cases.bytes_moved(cases.Case("max", "int32", (m, n))) == m * n * 4 + m * 4
    assert cases.bytes_moved(cases.Case("layer_norm", "float16", (m, n))) == (2 * m * n + 2 * n) * 2
    assert cases.bytes_moved(cases.Case("rms_norm", "float16", (m, n))) == (2 * m * n + n) * 2
    assert cases.bytes_moved(cases.Case("trace", "float32", (5977, 7890), None)) == 5977 * 4 + 4
    assert cases.bytes_moved(cases.Case("trace", "int32", (3, 5), None)) == 3 * 4 + 8


def test_sample_rows():
    small = cases.Case("softmax", "float32", (64, 64))
    assert cases.sample_rows(small, limit=2**22) is None
    big = cases.Case("softmax", "float32", (65536, 1024))
    rows = cases.sample_rows(big, limit=2**16)
    assert rows[0] == 0 and rows[-1] == 65535 and len(rows) == 64
    assert np.all(np.diff(rows) > 0)
    assert cases.sample_rows(big, limit=0) is None  # 0: check everything
    assert cases.sample_rows(cases.Case("sum", "float32", (65536, 1024), None), limit=16) is None
    few_long = cases.Case("rms_norm", "float32", (4, 2**20))
    assert list(cases.sample_rows(few_long, limit=2**20)) == [0, 3]


def test_tolerance_by_kind_and_dtype():
    table = {"reduce": {"float32": 1e-6}, "norm": {"float32": 1e-5}}
    assert cases.tolerance(cases.Case("sum", "float32", (2, 2)), table) == 1e-6
    assert cases.tolerance(cases.Case("softmax", "float32", (2, 2)), table) == 1e-5
    assert cases.tolerance(cases.Case("sum", "int64", (2, 2)), table) == 0.0


# ------------------------------------------------------------------------ reports
def fake_rows():
    base = {"op": "softmax", "axis": -1, "dtype": "float16", "shape": "16384x8192",
            "bytes": 2 * 16384 * 8192 * 2, "ms_min": None, "repeats": 50, "tolerance": 2e-3}
    rows = [
        dict(base, impl="naive", kind="variant", ms=None, rel_error=None, status="skipped",
             note="slow rung"),
        dict(base, impl="online", kind="variant", ms=0.5, rel_error=3e-4, status="ok", note=None),
        dict(base, impl="fused", kind="variant", ms=0.25, rel_error=2e-4, status="ok", note=None),
        dict(base, impl="bad", kind="variant", ms=None, rel_error=math.inf, status="FAILED",
             note="out=: 12 of 100 output elements left unwritten (NaN poison)"),
        dict(base, impl="cupy", kind="baseline", ms=1.0, rel_error=1e-3, status="ok", note=None),
        dict(base, impl="torch", kind="baseline", ms=0.5, rel_error=1e-4, status="ok", note=None),
        {"op": "sum", "axis": None, "dtype": "float32", "shape": "1024x131072",
         "bytes": 1024 * 131072 * 4 + 4, "impl": "vector", "kind": "variant", "ms": 0.2,
         "rel_error": 1e-7, "status": "ok", "note": None},
    ]
    return rows


def test_finalize_gbps_pct_and_speedup():
    rows = report.finalize(fake_rows(), copy_gbps=2000.0)
    by = {r["impl"]: r for r in rows}
    nbytes = 2 * 16384 * 8192 * 2
    assert by["fused"]["gbps"] == pytest.approx(nbytes / 0.25e-3 / 1e9)
    assert by["fused"]["pct_copy_bw"] == pytest.approx(100 * by["fused"]["gbps"] / 2000.0)
    assert by["fused"]["baseline"] == "torch"  # the faster of cupy and torch
    assert by["fused"]["speedup_vs_best_baseline"] == pytest.approx(2.0)
    assert by["online"]["speedup_vs_best_baseline"] == pytest.approx(1.0)
    assert by["cupy"]["speedup_vs_best_baseline"] == pytest.approx(0.5)
    for impl in ("naive", "bad"):
        assert by[impl]["gbps"] is None and by[impl]["speedup_vs_best_baseline"] is None
    assert by["vector"]["baseline"] is None and by["vector"]["speedup_vs_best_baseline"] is None
    assert report.any_failed(rows)
    assert not report.any_failed([r for r in rows if r["impl"] != "bad"])
    failed_baseline = dict(rows[4], status="FAILED")
    assert not report.any_failed([failed_baseline])  # only cupyops' own rows set the exit status


def test_text_table():
    rows = report.finalize(fake_rows(), copy_gbps=2000.0)
    text = report.format_table(rows)
    lines = text.splitlines()
    for title in ("op", "impl", "dtype", "shape", "ms", "GB/s", "% copy", "vs best base", "status"):
        assert title in lines[0]
    fused = next(ln for ln in lines if " fused " in ln)
    assert "0.2500" in fused and "2.00x" in fused and "2147" in fused and fused.endswith("ok")
    assert any("FAILED: out=: 12 of 100" in ln for ln in lines)
    assert any("skipped: slow rung" in ln for ln in lines)
    assert "" in lines  # blank line between the softmax and the sum case
    assert any(ln.startswith("sum") and " all " in ln for ln in lines)
    assert lines[-1] == "7 rows: 5 ok, 1 FAILED, 1 skipped"


def test_small_numbers_keep_three_digits():
    row = dict(fake_rows()[2], op="trace", axis=None, shape="5977x7890", bytes=5977 * 4 + 4)
    (r,) = report.finalize([row], copy_gbps=3000.0)
    c = dict(zip([col[0] for col in report.COLUMNS], report.cells(r)))
    assert c["GB/s"] == "0.0956" and c["% copy"] == "0.00319" and c["axis"] == ""


def meta():
    return {"device": "NVIDIA H100 80GB HBM3", "cc": "9.0", "l2_bytes": 50 * 2**20,
            "cupy": "14.2.0", "torch": None, "copy_bandwidth_GBps": 3000.0,
            "host_overhead_us": {"softmax_1x1024": 6.5, "torch_softmax_1x1024": None},
            "date": "2025-01-01T00:00:00+00:00",
            "settings": {"repeats": 50, "warmup": 5, "time_budget_s": 2.0,
                         "check_limit": 2**22, "flush_bytes": 200 * 2**20, "copy_mib": 1024}}


def test_header_names_the_measures():
    text = "\n".join(report.header_lines(meta()))
    assert "NVIDIA H100" in text and "cc 9.0" in text and "torch not available" in text
    assert "3000 GB/s" in text and "cupyops 6.5 us" in text and "torch failed" in text
    assert "median of up to 50 repeats" in text and "200 MiB" in text


def test_markdown_table():
    rows = report.finalize(fake_rows(), copy_gbps=2000.0)
    md = report.format_markdown(meta(), rows)
    lines = md.splitlines()
    table = [ln for ln in lines if ln.startswith("|")]
    assert len(table) == 2 + len(rows)
    assert table[1].startswith("|---|---|") and "---:" in table[1]
    assert all(ln.count(" | ") == len(report.COLUMNS) - 1 for ln in table if "---" not in ln)
    assert "- copy bandwidth" in md


def test_json_document():
    rows = report.finalize(fake_rows(), copy_gbps=2000.0)
    doc = json.loads(report.to_json(meta(), rows))
    for key in ("device", "cc", "cupy", "torch", "copy_bandwidth_GBps", "date", "results",
                "host_overhead_us"):
        assert key in doc
    assert doc["host_overhead_us"]["softmax_1x1024"] == 6.5
    r = doc["results"][3]
    for key in ("op", "impl", "dtype", "shape", "axis", "ms", "gbps", "pct_copy_bw",
                "speedup_vs_best_baseline", "baseline", "rel_error", "status"):
        assert key in r
    assert r["status"] == "FAILED" and r["rel_error"] is None  # inf is not JSON
    assert doc["results"][-1]["axis"] is None and doc["results"][2]["axis"] == -1


def test_format_plan():
    plan = cases.build_plan([cases.Case("sum", "float32", (8, 8))], VARIANTS, requested=["naive", "cupy"])
    assert report.format_plan(plan).splitlines() == ["sum axis=-1 float32 8x8: naive, cupy",
                                                     "1 cases, 2 impl runs"]


def test_bench_modules_do_not_import_cupy():
    assert "cupy" not in sys.modules
    assert "torch" not in sys.modules

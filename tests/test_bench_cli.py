"""CPU tier: the benchmark CLI's parsing, plan, byte counts and reports. No GPU, no CuPy:
the reports are fed fabricated rows, the plan a fabricated variant table."""
import json
import math
import importlib.util
import itertools
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cupyops import reference
from cupyops.bench import cases, cli, report
from host_cupy import HostArray, host_normal

ROOT = Path(__file__).resolve().parents[1]

VARIANTS = {
    "trace": ["naive", "block", "unrolled"],
    "sum": ["naive", "block", "vector"],
    "max": ["naive", "block", "vector"],
    "softmax": ["naive", "online", "fused"],
    "layer_norm": ["twopass", "welford", "fused"],
    "rms_norm": ["twopass", "fused"],
    "matmul": ["naive", "tiled", "regblock", "pipelined", "wmma", "mma", "skinny"],
    "scaled_matmul": ["wgmma_ws"],
    "attention": ["naive", "tiled", "flash_v1", "flash", "decode"],
    "silu_and_mul": ["naive", "vector"],
    "gelu_and_mul": ["naive", "vector"],
    "add_rms_norm": ["twopass", "fused", "staged"],
    "rope": ["naive", "fused"],
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
    with pytest.raises(ValueError, match=r"--dtype: unknown dtype 'float4'"):
        cases.parse_dtypes(["float4"])
    assert cases.parse_dtypes(["e4m3,fp8,float8"]) == ("float8_e4m3",)
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
    cs = cases.expand_cases(cases.suite_ops("quick"), "quick")
    assert {c.op for c in cs} == set(cases.OPS) - {"attention"}  # attention: --op attention
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
    # matmul: the GEMM issue's 6 shapes x 4 dtypes in nn, and 22 Hopper cases (see
    # test_full_suite_matmul_cases); scaled_matmul: 5 (test_scaled_matmul_cases); + the
    # attention acceptance set; + the 4 fused LLM operators in 3 dtypes (test_fused_op_cases)
    assert len(cs) == 1 + 5 * 9 + 9 + 6 * 4 + 22 + 5 + ATTN_CASES + 4 * 3
    assert cases.suite_ops("full") == cases.OPS


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
    (["--dtype", "float4"], "unknown dtype"),
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


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is installed here")
def test_a_run_without_cupy_says_what_is_missing_in_one_line():
    # a first run on a machine with no CuPy (or no GPU): one line naming the install
    # command, exit status 2, no traceback
    r = subprocess.run([sys.executable, "-m", "cupyops.bench", "--op", "softmax"], capture_output=True,
                       text=True, cwd=ROOT)
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith("cupyops-bench: cupyops needs CuPy") and 'pip install ".[cuda13]"' in lines[0]


def test_a_run_on_a_machine_without_a_gpu_stops_before_the_plan_runs(monkeypatch, capsys):
    from cupyops import _arrays

    def no_gpu():
        raise RuntimeError("cupyops needs a CUDA GPU; none is visible")

    monkeypatch.setattr(cli, "load_variants", fake_variants)
    monkeypatch.setattr(_arrays, "cupy_module", no_gpu)
    monkeypatch.setattr(cli, "run", lambda *a: pytest.fail("ran without a GPU"))
    assert cli.main(["--op", "rms_norm"]) == 2
    assert capsys.readouterr().err == "cupyops-bench: cupyops needs a CUDA GPU; none is visible\n"


def test_help_works_without_cupy():
    code = ("import sys\n"
            "from cupyops.bench import cli\n"
            "try:\n    cli.main(['--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
            "assert 'cupy' not in sys.modules and 'torch' not in sys.modules\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "--suite" in r.stdout and "--skip-slow" in r.stdout
    for text in ("attention", "--causal", "B4xHq16xHkv16xSq4096xSkv4096xD128", "torch-flash",
                 "torch-cudnn", "2^40 FLOP", "2 GiB", "above 16 query rows"):
        assert text in r.stdout, text
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
    assert by["fused"]["pct_copy_same"] is None  # no same-bytes copy timed for the case
    (same,) = report.finalize([dict(fake_rows()[2], copy_ms=0.2)], copy_gbps=2000.0)
    assert same["pct_copy_same"] == pytest.approx(100 * 0.2 / same["ms"])
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
    assert c["GB/s"] == "0.0956" and c["% copy"] == "0.00319" and c["axis/mask"] == ""


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


# ------------------------------------------------------------------------ attention
ATTN_PREFILL = [cases.AttnShape(4, 16, 16, 4096, 4096, 128), cases.AttnShape(4, 32, 32, 4096, 4096, 64)]
ATTN_GQA = cases.AttnShape(1, 32, 8, 8192, 8192, 128)
ATTN_DECODE = [cases.AttnShape(b, 32, 8, 1, s, 128) for b in (16, 64) for s in (4096, 32768)]
# the Hopper attention issue's: head_dim 256 both masks, D128 short and very long non-causal,
# chunked prefill (bottom-right causal)
ATTN_D256 = cases.AttnShape(2, 8, 8, 4096, 4096, 256)
ATTN_SHORT, ATTN_LONG = cases.AttnShape(16, 16, 16, 1024, 1024, 128), cases.AttnShape(1, 16, 16, 16384, 16384, 128)
ATTN_CHUNK = cases.AttnShape(4, 16, 16, 1024, 8192, 128)
ATTN_CASES = 14 + 4 + 2 + 2 + 2


@pytest.mark.parametrize("text,shape", [
    ("B4xHq16xHkv16xSq4096xSkv4096xD128", (4, 16, 16, 4096, 4096, 128)),
    ("b1xhq32xhkv8xsq8192xskv8192xd128", (1, 32, 8, 8192, 8192, 128)),
    ("B4xH16xS4096xD128", (4, 16, 16, 4096, 4096, 128)),  # H and S set both
    ("D64xS512xB2xHq8", (2, 8, 8, 512, 512, 64)),  # any order; Hkv defaults to Hq
    ("B16xHq32xHkv8xSq1xSkv32768xD128", (16, 32, 8, 1, 32768, 128)),
    ("B1*Hq4*Hkv1*Sq3*Skv5*D16", (1, 4, 1, 3, 5, 16)),  # MQA, '*' separates too
])
def test_parse_attention_shape(text, shape):
    got = cases.parse_shape(text)
    assert isinstance(got, cases.AttnShape) and tuple(got) == shape
    assert cases.parse_shape(str(got)) == got  # the report's spelling parses back


@pytest.mark.parametrize("bad,msg", [
    ("B4xHq16xSq4096xSkv4096", "missing D"),
    ("B4xH16xS4096", "missing D"),
    ("Hq16xS4096xD128", "missing B"),
    ("B4xHq16xSq4096xD128", "missing Skv"),
    ("B4xH16xHq16xS4096xD128", "Hq is given twice"),
    ("B4xHq16xHkv16xSq4096xSkv4096xD128xB2", "B is given twice"),
    ("B4xHq12xHkv8xS64xD64", "must be a multiple of Hkv"),
    ("B0xH16xS4096xD128", "must be positive"),
    ("B4xN16xS4096xD128", "cannot parse attention shape"),
    ("B4xHq16xS4096xD", "cannot parse attention shape"),
])
def test_parse_attention_shape_errors(bad, msg):
    with pytest.raises(ValueError, match=msg) as exc:
        cases.parse_shape(bad)
    assert str(exc.value).startswith("--shape:")


def test_parse_masks():
    assert cases.parse_masks(None) is None
    assert cases.parse_masks(["none,causal", "top_left", "bottom_right", "br"]) == (
        "none", "causal", "causal_br")
    assert cases.parse_masks(["off,yes"]) == ("none", "causal")
    with pytest.raises(ValueError, match="--causal: unknown mask 'diagonal'"):
        cases.parse_masks(["diagonal"])
    assert cases.MASKS["causal_br"] == (True, "bottom_right")


def test_attention_case_properties():
    c = cases.Case("attention", "bfloat16", (4, 16, 16, 4096, 4096, 128), None, True)
    assert isinstance(c.shape, cases.AttnShape)
    assert c.shape_str == "B4xHq16xHkv16xSq4096xSkv4096xD128"
    assert str(c) == "attention causal bfloat16 B4xHq16xHkv16xSq4096xSkv4096xD128"
    assert (c.mask, c.causal_offset, c.decode, c.axis_str, c.row_wise) == ("causal", 0, False, "", False)
    assert c.key == ("attention", "", "bfloat16", "B4xHq16xHkv16xSq4096xSkv4096xD128", "causal", "")
    br = cases.Case("attention", "float16", cases.AttnShape(2, 8, 2, 16, 100, 64), None, True,
                    "bottom_right")
    assert (br.mask, br.causal_offset, br.decode) == ("causal_br", 84, True)
    # an unmasked case has one spelling whatever the alignment
    assert cases.Case("attention", "float16", br.shape, None, False, "bottom_right") == \
        cases.Case("attention", "float16", br.shape, None)
    assert cases.Case("attention", "float16", br.shape).mask == "none"
    assert cases.Case("softmax", "float32", (4, 4)).mask == ""


def brute_pairs(Sq, Skv, causal, offset):
    return sum(1 for i in range(Sq) for j in range(Skv) if not causal or j <= i + offset)


@pytest.mark.parametrize("Sq,Skv", [(1, 1), (1, 9), (5, 5), (7, 3), (3, 11), (16, 16), (13, 40)])
def test_visible_pairs_are_counted_exactly(Sq, Skv):
    assert cases.visible_pairs(Sq, Skv) == Sq * Skv
    for offset in (0, Skv - Sq, -3, 5):
        assert cases.visible_pairs(Sq, Skv, True, offset) == brute_pairs(Sq, Skv, True, offset), offset
    # with sliding windows: the reference's mask, summed
    for causal, offset, window in itertools.product((False, True), (0, Skv - Sq, -3, 5),
                                                    ((2, None), (None, 1), (0, 0), (3, 2), (None, -1), (40, 40))):
        want = int(reference.attention_mask(Sq, Skv, causal, offset, window).sum())
        assert cases.visible_pairs(Sq, Skv, causal, offset, window) == want, (causal, offset, window)


def test_attention_flops_and_bytes():
    tl = cases.Case("attention", "float16", (2, 8, 2, 7, 3, 64), None, True)
    br = cases.Case("attention", "float16", (2, 8, 2, 3, 11, 64), None, True, "bottom_right")
    full = cases.Case("attention", "float16", (2, 8, 2, 7, 3, 64), None)
    assert cases.flops(tl) == 4 * 2 * 8 * 64 * brute_pairs(7, 3, True, 0)
    assert cases.flops(br) == 4 * 2 * 8 * 64 * brute_pairs(3, 11, True, 8)
    assert cases.flops(full) == 4 * 2 * 8 * 64 * 21
    big = cases.Case("attention", "bfloat16", ATTN_PREFILL[0], None, True)
    S = 4096
    assert cases.flops(big) == 4 * 4 * 16 * 128 * (S * (S + 1) // 2)
    assert cases.flops(cases.Case("attention", "bfloat16", ATTN_PREFILL[0])) == 4 * 4 * 16 * 128 * S * S
    # Q and O [B, Sq, Hq, D], K and V [B, Skv, Hkv, D], each moved once
    dec = cases.Case("attention", "bfloat16", ATTN_DECODE[-1])
    assert cases.bytes_moved(dec) == (2 * 64 * 1 * 32 * 128 + 2 * 64 * 32768 * 8 * 128) * 2
    assert cases.reports_bandwidth(dec) and not cases.reports_bandwidth(big)
    assert cases.reports_bandwidth(cases.Case("softmax", "float32", (4, 4)))


def test_attention_tolerance():
    from cupyops import reference

    c16 = cases.Case("attention", "float16", (1, 2, 2, 4, 4, 16))
    c32 = cases.Case("attention", "float32", (1, 2, 2, 4, 4, 16))
    assert cases.tolerance(c16, reference.TOLERANCE) == reference.TOLERANCE["attention"]["float16"]
    assert cases.tolerance(c32, reference.TOLERANCE) == reference.TOLERANCE["attention"]["float32"]
    assert cases.tolerance(c16, {"attention": {"float16": 5e-3}}) == 5e-3


def attention_cases(cs):
    return {(tuple(c.shape), c.mask, c.dtype) for c in cs if c.op == "attention"}


def test_attention_acceptance_set_in_full_suite_and_op_attention():
    want = set()
    for shape in ATTN_PREFILL:
        want |= {(tuple(shape), m, d) for m in ("none", "causal") for d in ("float16", "bfloat16")}
    want |= {(tuple(ATTN_GQA), "causal", d) for d in ("float16", "bfloat16")}
    want |= {(tuple(s), "none", "bfloat16") for s in ATTN_DECODE}
    want |= {(tuple(ATTN_D256), m, d) for m in ("none", "causal") for d in ("float16", "bfloat16")}
    want |= {(tuple(s), "none", d) for s in (ATTN_SHORT, ATTN_LONG) for d in ("float16", "bfloat16")}
    want |= {(tuple(ATTN_CHUNK), "causal_br", d) for d in ("float16", "bfloat16")}
    assert len(want) == ATTN_CASES
    assert attention_cases(cases.expand_cases(cases.OPS, "full")) == want
    # the default (quick) run has no attention; --op attention is the acceptance set
    assert not attention_cases(cases.expand_cases(cases.suite_ops("quick"), "quick"))
    plan, settings = plan_for([])
    assert not [c for c, _ in plan if c.op == "attention"] and "attention" not in settings["ops"]
    plan, settings = plan_for(["--op", "attention"])
    assert attention_cases([c for c, _ in plan]) == want and settings["ops"] == ["attention"]
    plan, _ = plan_for(["--suite", "full"])
    assert attention_cases([c for c, _ in plan]) == want
    plan, _ = plan_for(["--op", "attn", "--suite", "full"])
    assert attention_cases([c for c, _ in plan]) == want


def test_attention_selection_options():
    cs = cases.expand_cases(("attention",), "quick", masks=("causal",))
    assert {c.mask for c in cs} == {"causal"} and len(cs) == 8
    cs = cases.expand_cases(("attention",), "quick", dtypes=("float16",))
    assert {c.dtype for c in cs} == {"float16"} and len(cs) == 5 + 4 + 5  # decode in fp16 too
    shape = cases.parse_shape("B2xHq8xHkv2xSq3xSkv11xD64")
    cs = cases.expand_cases(("attention",), "full", shapes=(shape,))
    assert [(c.mask, c.dtype) for c in cs] == [("none", "float16"), ("none", "bfloat16")]
    cs = cases.expand_cases(("attention",), "full", shapes=(shape,), dtypes=("float32",),
                            masks=("causal_br", "none"))
    assert [(c.mask, c.causal, c.causal_align) for c in cs] == [
        ("causal_br", True, "bottom_right"), ("none", False, "top_left")]
    # shapes go to the ops of their kind
    cs = cases.expand_cases(("softmax", "attention"), "full", dtypes=("float16",),
                            shapes=((64, 64), shape))
    assert [(c.op, c.shape_str) for c in cs] == [("softmax", "64x64"),
                                                 ("attention", "B2xHq8xHkv2xSq3xSkv11xD64")]
    assert [c.op for c in cases.expand_cases(("softmax", "attention"), "full", shapes=((64, 64),))] \
        == ["softmax"] * 3
    with pytest.raises(ValueError, match="attention takes named dimensions"):
        cases.expand_cases(("attention",), "full", shapes=((4, 16, 16, 64, 64, 128),))
    with pytest.raises(ValueError, match="softmax takes plain dimensions"):
        cases.expand_cases(("softmax",), "full", shapes=(shape,))


@pytest.mark.parametrize("argv,msg", [
    (["--op", "softmax", "--causal", "causal"], "--causal: applies to attention only"),
    (["--op", "attention", "--causal", "sideways"], "unknown mask"),
    (["--op", "attention", "--shape", "B4xH16xS4096"], "missing D"),
    (["--op", "attention", "--dtype", "int8"], "not supported"),
    (["--op", "attention", "--impl", "torch-fast"], "unknown impl"),
])
def test_bad_attention_options_exit_2(argv, msg, capsys):
    with pytest.raises(SystemExit) as exc:
        plan_for(argv)
    assert exc.value.code == 2
    assert msg in capsys.readouterr().err


def test_attention_slow_rungs_and_baselines():
    plan, _ = plan_for(["--op", "attention"])
    by = {(c.shape_str, c.mask, c.dtype): {i.name: i for i in im} for c, im in plan}
    prefill = by[(str(ATTN_PREFILL[0]), "none", "float16")]
    assert list(prefill) == ["naive", "tiled", "flash_v1", "flash", "decode", "auto",
                             "torch-flash", "torch-cudnn"]
    # naive's 4 GiB of scores: skipped; the CUDA-core rungs run on every acceptance case;
    # decode is not timed on 4096 query rows
    assert "GiB of float32 scores" in prefill["naive"].skip
    assert prefill["tiled"].skip is None and prefill["flash_v1"].skip is None
    assert "4096 query rows > 16" in prefill["decode"].skip
    assert [n for n, i in prefill.items() if i.kind == "baseline"] == ["torch-flash", "torch-cudnn"]
    for (shape, _, _), impls in by.items():
        assert impls["flash"].skip is None and impls["auto"].skip is None
        # the CUDA-core rungs run on every case but the 2.2 TFLOP one at 16384 tokens
        slow = shape == str(ATTN_LONG)
        assert (impls["tiled"].skip is None) != slow and (impls["flash_v1"].skip is None) != slow
    decode = by[(str(ATTN_DECODE[-1]), "none", "bfloat16")]
    assert not any(i.skip for i in decode.values())  # naive: 0.25 GiB of scores
    assert [n for n, i in decode.items() if i.kind == "baseline"] == [
        "torch-flash", "torch-cudnn", "torch-efficient", "torch-math"]
    # above 2^40 FLOP the CUDA-core rungs are left out too
    plan, _ = plan_for(["--op", "attention", "--shape", "B8xH32xS16384xD128"])
    skipped = {i.name: i.skip for i in plan[0][1] if i.skip}
    assert set(skipped) == {"naive", "tiled", "flash_v1", "decode"}
    assert "TFLOP > 2^40 FLOP" in skipped["tiled"]
    plan, _ = plan_for(["--op", "attention", "--no-skip-slow"])
    assert not any(i.skip for _, im in plan for i in im)
    # --skip-slow's element rule is not the attention rule
    plan, _ = plan_for(["--op", "attention", "--skip-slow", "--slow-limit", "1",
                        "--shape", "B1xH2xS64xD64"])
    assert [i.name for _, im in plan for i in im if i.skip] == ["decode", "decode"]  # fp16, bf16


def test_attention_requested_baselines():
    pre = cases.Case("attention", "float16", ATTN_PREFILL[0])
    dec = cases.Case("attention", "bfloat16", ATTN_DECODE[0])
    names = lambda c, req: [i.name for i in cases.impls_for(c, VARIANTS["attention"], req)]  # noqa: E731
    assert names(pre, ["flash", "torch"]) == ["flash", "torch-flash", "torch-cudnn"]
    assert names(dec, ["torch"]) == ["torch-flash", "torch-cudnn", "torch-efficient", "torch-math"]
    assert names(pre, ["torch-math", "auto"]) == ["auto", "torch-math"]
    assert names(pre, ["flash"]) == ["flash"]
    assert [i.name for i in cases.impls_for(pre, VARIANTS["attention"], baselines=False)][-1] == "auto"
    cases.check_impl_names(["torch-cudnn", "flash_v1"], VARIANTS, ("attention",))


def test_list_shows_attention_plan(monkeypatch, capsys):
    monkeypatch.setattr(cli, "load_variants", fake_variants)
    assert cli.main(["--op", "attention", "--list"]) == 0
    out = capsys.readouterr().out
    assert ("attention causal bfloat16 B1xHq32xHkv8xSq8192xSkv8192xD128: naive (skipped), tiled, "
            "flash_v1, flash, decode (skipped), auto, torch-flash, torch-cudnn") in out
    assert out.strip().endswith(f"{ATTN_CASES} cases, 164 impl runs")


# --- the sampled reference
def brute_attention(q, k, v, causal=False, offset=0, scale=None):
    """O[b, i, h] by loops over keys, in float64: q [B, Sq, H, D], k/v [B, Skv, Hk, D]."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    B, Sq, H, D = q.shape
    Skv, Hk = k.shape[1], k.shape[2]
    scale = 1 / math.sqrt(D) if scale is None else scale
    out = np.zeros((B, Sq, H, D))
    for b in range(B):
        for h in range(H):
            kh = h // (H // Hk)
            for i in range(Sq):
                keys = [j for j in range(Skv) if not causal or j <= i + offset]
                if not keys:
                    continue
                s = [scale * float(q[b, i, h] @ k[b, j, kh]) for j in keys]
                m = max(s)
                w = [math.exp(x - m) for x in s]
                out[b, i, h] = sum(wj * v[b, j, kh] for wj, j in zip(w, keys)) / sum(w)
    return out


def rand_attention(rng, B, Sq, Skv, H, Hk, D):
    return (rng.standard_normal((B, Sq, H, D)), rng.standard_normal((B, Skv, Hk, D)),
            rng.standard_normal((B, Skv, Hk, D)))


@pytest.mark.parametrize("Sq,Skv,causal,align", [
    (5, 5, False, "top_left"), (5, 5, True, "top_left"), (4, 9, True, "top_left"),
    (4, 9, True, "bottom_right"), (9, 4, True, "bottom_right"),  # rows 0-4 see no key
    (9, 4, True, "top_left"), (1, 13, False, "top_left"), (1, 13, True, "bottom_right"),
])
def test_reference_rows_matches_brute_force(Sq, Skv, causal, align):
    from cupyops.bench import runners

    rng = np.random.default_rng(Sq * 100 + Skv)
    q, k, v = rand_attention(rng, 2, Sq, Skv, 4, 2, 8)  # GQA 4:2
    offset = 0 if align == "top_left" else Skv - Sq
    want = brute_attention(q, k, v, causal, offset)
    rows = np.arange(Sq)
    got = runners.reference_rows(q, k, v, rows, causal=causal, causal_align=align)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    # a subset of rows keeps each row's place in the mask (q_len: the whole problem's)
    sub = np.array([0, Sq - 1]) if Sq > 1 else np.array([0])
    got = runners.reference_rows(q[:, sub], k, v, sub, q_len=Sq, causal=causal, causal_align=align)
    np.testing.assert_allclose(got, want[:, sub], rtol=1e-12, atol=1e-12)
    if causal and align == "bottom_right" and Sq > Skv:
        assert not np.any(want[:, : Sq - Skv]) and not np.any(got[:, 0])  # no key seen: zeros


def test_reference_rows_on_a_gathered_sample_and_bf16():
    import ml_dtypes

    from cupyops.bench import runners

    rng = np.random.default_rng(7)
    shape = cases.AttnShape(3, 8, 2, 70, 90, 16)  # GQA 8:2, more rows than the sample
    c = cases.Case("attention", "bfloat16", shape, None, True, "bottom_right")
    q, k, v = (a.astype(ml_dtypes.bfloat16) for a in rand_attention(rng, 3, 70, 90, 8, 2, 16))
    smp = cases.attention_sample(c, max_rows=16)
    assert list(smp.batches) == [0, 2] and list(smp.heads) == [0, 1, 5, 7]
    assert smp.rows[0] == 0 and smp.rows[-1] == 69 and len(smp.rows) == 16
    assert list(smp.kv_heads[smp.kv_index]) == list(smp.heads // 4)
    # what prepare() gathers on the GPU, gathered here with NumPy
    qs = q[smp.batches][:, smp.rows][:, :, smp.heads]
    ks = k[smp.batches][:, :, smp.kv_heads]
    vs = v[smp.batches][:, :, smp.kv_heads]
    got = runners.reference_rows(qs, ks, vs, smp.rows, q_len=70, kv_index=smp.kv_index,
                                 causal=True, causal_align="bottom_right", scale=0.3)
    want = brute_attention(q, k, v, True, 90 - 70, scale=0.3)
    np.testing.assert_allclose(got, want[smp.batches][:, smp.rows][:, :, smp.heads],
                               rtol=1e-12, atol=1e-12)


def test_attention_sample_shapes():
    dec = cases.Case("attention", "bfloat16", ATTN_DECODE[-1])
    smp = cases.attention_sample(dec)
    assert list(smp.batches) == [0, 21, 42, 63] and list(smp.rows) == [0]
    assert list(smp.heads) == [0, 1, 17, 31] and list(smp.kv_heads) == [0, 4, 7]
    # head 17 reads key/value head 4 (17 // 4), not 17 % 8 = 1
    assert list(smp.kv_heads[smp.kv_index]) == [0, 0, 4, 7]
    pre = cases.Case("attention", "float16", ATTN_PREFILL[0], None, True)
    smp = cases.attention_sample(pre)
    assert list(smp.batches) == [0, 3] and len(smp.rows) == cases.ATTN_CHECK_ROWS
    assert smp.rows[0] == 0 and smp.rows[-1] == 4095 and np.all(np.diff(smp.rows) > 0)
    assert len(cases.attention_sample(pre, max_rows=0).rows) == 4096  # --check-limit 0
    tiny = cases.Case("attention", "float32", (1, 1, 1, 3, 3, 8))
    smp = cases.attention_sample(tiny)
    assert list(smp.heads) == [0] and list(smp.rows) == [0, 1, 2] and list(smp.batches) == [0]


def test_reference_rows_agrees_with_cupyops_reference():
    from cupyops import reference
    from cupyops.bench import runners

    if not hasattr(reference, "attention"):
        pytest.skip("cupyops.reference.attention is not there yet")
    rng = np.random.default_rng(3)
    q, k, v = rand_attention(rng, 2, 6, 10, 4, 2, 8)
    for causal, align in ((False, "top_left"), (True, "top_left"), (True, "bottom_right")):
        want = np.asarray(reference.attention(q, k, v, causal=causal, causal_align=align))
        got = runners.reference_rows(q, k, v, np.arange(6), causal=causal, causal_align=align)
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


# --- the SDPA baselines, against a fake torch (which forms a refusing backend falls back to)
class FakeTensor:
    def __init__(self, a):
        self.a = np.asarray(a)

    @property
    def shape(self):
        return self.a.shape

    def transpose(self, i, j):
        return FakeTensor(np.swapaxes(self.a, i, j))

    def contiguous(self):
        return FakeTensor(np.ascontiguousarray(self.a))

    def repeat_interleave(self, n, dim):
        return FakeTensor(np.repeat(self.a, n, axis=dim))


def fake_torch(refuse):
    """A torch module tree just deep enough for runners.sdpa_call. ``refuse``: backend name
    -> set of "strided" (non-contiguous inputs), "gqa" (enable_gqa) or "all"."""
    import enum
    import types
    import warnings

    Backend = enum.Enum("SDPBackend", "FLASH_ATTENTION CUDNN_ATTENTION EFFICIENT_ATTENTION MATH")
    state = {"backend": None, "calls": []}

    class sdpa_kernel:  # noqa: N801
        def __init__(self, backend):
            self.backend = backend

        def __enter__(self):
            state["backend"] = self.backend

        def __exit__(self, *exc):
            state["backend"] = None

    class LowerRight:
        def __init__(self, sq, skv):
            self.offset = skv - sq

    def sdpa(q, k, v, attn_mask=None, is_causal=False, enable_gqa=False):
        name = state["backend"].name
        bad = refuse.get(name, set())
        strided = any(not t.a.flags.c_contiguous for t in (q, k, v))
        if "all" in bad or (strided and "strided" in bad) or (enable_gqa and "gqa" in bad):
            where = " (Triggered internally at /pytorch/aten/src/sdp_utils.cpp:986.)"
            warnings.warn(f"{name} kernel not used because:{where}")
            warnings.warn(f"Memory Efficient attention has been runtime disabled.{where}")
            warnings.warn(f"{name} refuses this input{where}\nsecond line")
            raise RuntimeError("No available kernel. Aborting execution.\nmore detail")
        state["calls"].append((name, strided, enable_gqa))
        H, Hk = q.shape[1], k.shape[1]
        if H != Hk and not enable_gqa:
            raise RuntimeError("head counts differ")
        offset = attn_mask.offset if attn_mask is not None else 0
        from cupyops.bench import runners

        o = runners.reference_rows(
            q.a.transpose(0, 2, 1, 3), k.a.transpose(0, 2, 1, 3), v.a.transpose(0, 2, 1, 3),
            np.arange(q.shape[2]), causal=is_causal or attn_mask is not None,
            causal_align="bottom_right" if offset else "top_left")
        return FakeTensor(o.transpose(0, 2, 1, 3))  # SDPA's [B, H, S, D]

    torch = types.ModuleType("torch")
    torch.from_dlpack = FakeTensor
    torch.nn = types.ModuleType("torch.nn")
    torch.nn.functional = types.SimpleNamespace(scaled_dot_product_attention=sdpa)
    torch.nn.attention = types.ModuleType("torch.nn.attention")
    torch.nn.attention.SDPBackend = Backend
    torch.nn.attention.sdpa_kernel = sdpa_kernel
    torch.nn.attention.bias = types.ModuleType("torch.nn.attention.bias")
    torch.nn.attention.bias.causal_lower_right = LowerRight
    torch.cuda = types.SimpleNamespace(current_stream=lambda: types.SimpleNamespace(
        synchronize=lambda: None))
    modules = {"torch": torch, "torch.nn": torch.nn, "torch.nn.attention": torch.nn.attention,
               "torch.nn.attention.bias": torch.nn.attention.bias}
    return torch, modules, state


def attention_data(shape, causal=False, align="top_left", seed=0):
    from cupyops.bench import runners

    c = cases.Case("attention", "float32", shape, None, causal, align)
    B, Hq, Hkv, Sq, Skv, D = c.shape
    rng = np.random.default_rng(seed)
    q, k, v = rand_attention(rng, B, Sq, Skv, Hq, Hkv, D)
    return runners.CaseData(c, q, k=k, v=v), brute_attention(q, k, v, causal, c.causal_offset)


@pytest.mark.parametrize("refuse,note", [
    ({}, None),
    ({"FLASH_ATTENTION": {"strided"}}, "contiguous copies (made before timing)"),
    ({"FLASH_ATTENTION": {"gqa"}}, "K/V heads repeated for GQA (made before timing)"),
    ({"FLASH_ATTENTION": {"gqa", "strided"}},
     "contiguous copies, K/V heads repeated for GQA (made before timing)"),
])
def test_sdpa_call_falls_back_outside_the_timed_call(monkeypatch, refuse, note):
    from cupyops.bench import runners

    torch, modules, state = fake_torch(refuse)
    for name, mod in modules.items():
        monkeypatch.setitem(sys.modules, name, mod)
    data, want = attention_data(cases.AttnShape(2, 4, 2, 5, 7, 8), True, "bottom_right")
    call = runners.baseline_call(data, "torch-flash", torch)
    assert call.note == note
    with call.context():
        y = call()
    assert state["calls"][-1][0] == "FLASH_ATTENTION"
    np.testing.assert_allclose(y.a.transpose(0, 2, 1, 3), want, rtol=1e-12, atol=1e-12)


def test_sdpa_refusal_is_reported_in_one_line(monkeypatch):
    from cupyops.bench import runners, timing

    torch, modules, _ = fake_torch({"CUDNN_ATTENTION": {"all"}})
    for name, mod in modules.items():
        monkeypatch.setitem(sys.modules, name, mod)
    data, _ = attention_data(cases.AttnShape(1, 2, 2, 3, 3, 8))
    with pytest.raises(RuntimeError, match="SDPA CUDNN_ATTENTION refused the case") as exc:
        runners.baseline_call(data, "torch-cudnn", torch)
    assert "No available kernel. Aborting execution." in str(exc.value)
    assert "(CUDNN_ATTENTION refuses this input; second line)" in str(exc.value)
    for noise in ("because:", "Triggered", "runtime disabled", "more detail"):
        assert noise not in str(exc.value), noise

    # in the run: a skipped row naming why, never a crash; a backend that runs is timed
    monkeypatch.setattr(runners, "check", lambda data, y: 1e-7)
    args = cli.build_parser().parse_args([])
    row = lambda impl, status="ok", note=None, **kw: dict(impl=impl.name, status=status, note=note, **kw)  # noqa: E731
    data.tol = 1e-4
    r = cli.run_baseline(data, cases.Impl("torch-cudnn", "baseline"), args, None, torch, row)
    assert r["status"] == "skipped" and "\n" not in r["note"]
    assert r["note"].startswith("unavailable: RuntimeError: SDPA CUDNN_ATTENTION refused")
    r = cli.run_baseline(data, cases.Impl("torch-flash", "baseline"), args, None, torch, row)
    assert isinstance(r, cli.Pending)  # checked; timed with the case's other impls
    r = r.finish(timing.Timing(2.0, 1.5, 3))
    assert (r["status"], r["note"], r["ms"]) == ("ok", None, 2.0)
    r = cli.run_baseline(data, cases.Impl("torch-math", "baseline"), args, None, None, row)
    assert r["status"] == "skipped" and "PyTorch with CUDA is not available" in r["note"]


def test_cupyops_attention_call(monkeypatch):
    import cupyops
    from cupyops.bench import runners

    seen = {}

    def fake_attention(q, k, v, **kw):
        seen.update(kw, qkv=(q, k, v))
        return "O"

    monkeypatch.setattr(cupyops, "attention", fake_attention, raising=False)
    data, _ = attention_data(cases.AttnShape(1, 2, 2, 3, 3, 8), True, "bottom_right")
    assert runners.cupyops_call(data, "flash")(out="buf") == "O"
    assert seen["qkv"] == (data.x, data.k, data.v)
    assert {k: seen[k] for k in ("causal", "causal_align", "out", "impl")} == {
        "causal": True, "causal_align": "bottom_right", "out": "buf", "impl": "flash"}


def test_run_case_rows_for_attention(monkeypatch):
    """The row plumbing of one attention case, with the GPU parts faked: the rows carry
    the mask and the dimensions, and finalize turns them into the report's numbers."""
    from cupyops.bench import runners, timing

    torch, modules, _ = fake_torch({"CUDNN_ATTENTION": {"all"}})
    for name, mod in modules.items():
        monkeypatch.setitem(sys.modules, name, mod)
    shape = cases.AttnShape(2, 4, 2, 1, 64, 8)
    case = cases.Case("attention", "float32", shape, None)
    data, _ = attention_data(shape)
    data.tol = 1e-4
    monkeypatch.setattr(runners, "prepare", lambda case, seed, check_limit: data)
    monkeypatch.setattr(runners, "cupyops_call", lambda data, impl: lambda out=None: None)
    monkeypatch.setattr(runners, "validate_cupyops", lambda data, call: (1e-6, None))
    monkeypatch.setattr(runners, "check", lambda data, y: 1e-7)
    side = []
    monkeypatch.setattr(timing, "time_side_by_side",
                        lambda fns, **kw: side.append(len(fns)) or {i: timing.Timing(0.5, 0.4, 3) for i in fns})
    args = cli.build_parser().parse_args(["--op", "attention"])
    impls = cases.impls_for(case, VARIANTS["attention"], skip_slow=True)
    rows = report.finalize(cli.run_case(case, impls, args, None, torch), copy_gbps=3000.0)
    by = {r["impl"]: r for r in rows}
    assert list(by) == ["naive", "tiled", "flash_v1", "flash", "decode", "auto", "torch-flash",
                        "torch-cudnn", "torch-efficient", "torch-math"]
    r = by["decode"]
    assert (r["mask"], r["decode"], r["Skv"], r["Hkv"], r["shape"]) == ("none", True, 64, 2,
                                                                        "B2xHq4xHkv2xSq1xSkv64xD8")
    assert r["flops"] == cases.flops(case) and r["bytes"] == cases.bytes_moved(case)
    assert r["gbps"] == pytest.approx(cases.bytes_moved(case) / 0.5e-3 / 1e9)
    assert by["torch-cudnn"]["status"] == "skipped" and by["torch-flash"]["status"] == "ok"
    assert r["speedups"] == {"torch-flash": 1.0, "torch-efficient": 1.0, "torch-math": 1.0}
    assert side == [len(by) - 1]  # every impl that passed its checks (not torch-cudnn), timed together


# --- reporting attention
def attention_rows():
    def base(shape, mask, decode, flops, nbytes):
        return {"op": "attention", "axis": None, "dtype": "bfloat16", "shape": shape, "mask": mask,
                "decode": decode, "bytes": nbytes, "flops": flops, "gbps_meaningful": decode,
                "ms_min": None, "repeats": 20, "tolerance": 2e-2, "rel_error": 3e-3, "note": None}

    pre = "B4xHq16xHkv16xSq4096xSkv4096xD128"
    dec = "B16xHq32xHkv8xSq1xSkv4096xD128"
    rows = []
    for mask, fl in (("none", 5.5e11), ("causal", 2.75e11)):
        b = base(pre, mask, False, fl, 2.7e8)
        rows += [dict(b, impl="naive", kind="variant", ms=None, rel_error=None, status="skipped",
                      note="slow rung: 4.0 GiB of float32 scores > 2 GiB"),
                 dict(b, impl="flash", kind="variant", ms=1.0, status="ok"),
                 dict(b, impl="auto", kind="auto", ms=1.0, status="ok"),
                 dict(b, impl="torch-flash", kind="baseline", ms=1.6, status="ok"),
                 dict(b, impl="torch-cudnn", kind="baseline", ms=0.8 if mask == "none" else 2.0,
                      status="ok")]
    b = base(dec, "none", True, 1.07e9, 2.7e8)
    rows += [dict(b, impl="decode", kind="variant", ms=0.1, status="ok"),
             dict(b, impl="auto", kind="auto", ms=0.1, status="ok"),
             dict(b, impl="torch-flash", kind="baseline", ms=0.12, status="ok",
                  note="K/V heads repeated for GQA (made before timing)"),
             dict(b, impl="torch-cudnn", kind="baseline", ms=None, status="skipped",
                  note="unavailable: RuntimeError: SDPA CUDNN_ATTENTION refused the case"),
             dict(b, impl="torch-efficient", kind="baseline", ms=0.09, status="ok"),
             dict(b, impl="torch-math", kind="baseline", ms=0.5, status="ok")]
    return rows


def test_attention_report_rows():
    rows = report.finalize(attention_rows(), copy_gbps=3000.0)
    by = {(r["mask"], r["shape"][:3], r["impl"]): r for r in rows}
    flash = by[("none", "B4x", "flash")]
    assert flash["tflops"] == pytest.approx(5.5e11 / 1e-3 / 1e12)
    assert flash["gbps"] is None and flash["pct_copy_bw"] is None  # prefill: compute-bound
    # best baseline per case and mask: cuDNN unmasked, flash causal
    assert flash["baseline"] == "torch-cudnn" and flash["speedup_vs_best_baseline"] == pytest.approx(0.8)
    assert flash["speedups"] == pytest.approx({"torch-flash": 1.6, "torch-cudnn": 0.8})
    causal = by[("causal", "B4x", "flash")]
    assert causal["baseline"] == "torch-flash" and causal["speedups"]["torch-cudnn"] == pytest.approx(2.0)
    dec = by[("none", "B16", "decode")]
    assert dec["gbps"] == pytest.approx(2.7e8 / 1e-4 / 1e9) and dec["pct_copy_bw"] == pytest.approx(90.0)
    assert dec["baseline"] == "torch-efficient" and dec["speedup_vs_best_baseline"] == pytest.approx(0.9)
    assert set(dec["speedups"]) == {"torch-flash", "torch-efficient", "torch-math"}
    assert "torch-flash" not in by[("none", "B4x", "torch-flash")]["speedups"]

    text = report.format_table(rows)
    lines = text.splitlines()
    assert "axis/mask" in lines[0] and "vs each base" in lines[0]
    line = next(ln for ln in lines if " flash " in ln and " causal " in ln)
    assert "flash 1.60x cudnn 2.00x" in line and "1.60x" in line
    assert any("ok (K/V heads repeated for GQA" in ln for ln in lines)
    assert any("skipped: unavailable: RuntimeError: SDPA CUDNN" in ln for ln in lines)
    # a blank line between the three cases (the masks are different cases)
    assert lines.count("") == 2
    md = report.format_markdown(dict(meta(), settings=dict(meta()["settings"], ops=["attention"])), rows)
    assert "| attention | causal | flash | bfloat16 | B4xHq16xHkv16xSq4096xSkv4096xD128 |" in md
    assert "- attention: q [B, Sq, Hq, D]" in md and "torch-cudnn" in md and "2^40 FLOP" in md
    assert "attention" not in "\n".join(report.header_lines(meta()))
    doc = json.loads(report.to_json(meta(), rows))
    assert doc["results"][1]["speedups"]["torch-cudnn"] == pytest.approx(0.8)
    assert doc["results"][1]["mask"] == "none"


def test_summarize_attention_tables(tmp_path):
    rows = report.finalize(attention_rows(), copy_gbps=3000.0)
    doc = dict(meta(), results=rows)
    path = tmp_path / "attention.json"
    path.write_text(report.to_json(doc, rows))
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "summarize.py"), str(path)],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "| op | axis |" not in out  # no memory-bound case, no memory-bound table
    assert ("| dtype | shape | mask | flash TFLOP/s | flash vs torch-flash | flash target | flash3 ms | "
            "flash3 TFLOP/s | flash3 vs torch-flash | flash3 vs torch-cudnn | auto vs torch-cudnn |") in out
    # no flash3 row (a GPU other than sm_90): its cells are "-", not a miss
    assert ("| bfloat16 | B4xHq16xHkv16xSq4096xSkv4096xD128 | none | 550.0 | 1.60x | 1.00 | - | - | - | - "
            "| 0.80x | - |") in out
    assert ("| bfloat16 | B16xHq32xHkv8xSq1xSkv4096xD128 | none | 0.1000 | 2700 | 90.0 | 10.70 | "
            "torch-efficient | 0.90x | 0.90x | 1.00 **miss** |") in out
    assert out.strip().endswith("1 case(s) miss a target or a baseline: attention decode bfloat16 "
                                "B16xHq32xHkv8xSq1xSkv4096xD128 vs best SDPA")


def test_summarize_flash3_and_chunked_prefill(tmp_path):
    rows = attention_rows()
    pre = [r for r in rows if r["shape"].startswith("B4x")]
    # flash3 beats cuDNN unmasked (0.8 ms) but not causal... cuDNN causal is 2.0 ms: both meet
    pre += [dict(r, impl="flash3", kind="variant", ms=0.75) for r in pre if r["impl"] == "flash"]
    rows += pre[-2:]
    # a chunk of 1024 queries against 8192 keys at 0.8x the square causal case's TFLOP/s
    chunk = "B4xHq16xHkv16xSq1024xSkv8192xD128"
    rows += [dict(r, shape=chunk, mask="causal_br", flops=2.75e11 * 0.8, ms=r["ms"])
             for r in pre if r["mask"] == "causal" and r["impl"] != "naive"]
    rows = report.finalize(rows, copy_gbps=3000.0)
    path = tmp_path / "attention.json"
    path.write_text(report.to_json(dict(meta(), results=rows), rows))
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "summarize.py"), str(path)],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert ("| bfloat16 | B4xHq16xHkv16xSq4096xSkv4096xD128 | none | 550.0 | 1.60x | 1.00 | 0.7500 | 733.3 | "
            "2.13x | 1.07x | 0.80x | 1.00 **miss** |") in out  # flash3 meets it, auto does not
    assert "chunked prefill flash3 bfloat16 B4xHq16xHkv16xSq1024xSkv8192xD128: 293.3 TFLOP/s, 0.80x the 366.7" in out
    assert "(target 0.9) **miss**" in out
    assert "attention chunked prefill flash3 bfloat16" in out and "attention bfloat16 " in out
    # a rung the benchmark skipped (it refused the case: flash at head_dim 256) is not a miss
    d256 = "B2xHq8xHkv8xSq4096xSkv4096xD256"
    rows = [dict(r, shape=d256, ms=None if r["impl"] == "flash" else r["ms"],
                 status="skipped" if r["impl"] == "flash" else r["status"])
            for r in report.finalize(attention_rows(), copy_gbps=3000.0) if r["shape"].startswith("B4x")]
    path.write_text(report.to_json(dict(meta(), results=rows), rows))
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "summarize.py"), str(path)],
                         capture_output=True, text=True, cwd=ROOT).stdout
    assert f"| bfloat16 | {d256} | none | - | - | 1.00 n/a (flash: skipped) |" in out
    assert "flash bfloat16" not in out.splitlines()[-1]


# ------------------------------------------------------------------------ matmul layouts
# The GEMM issue's full-suite shapes, in the order earlier sessions ran them (nn only)
GEMM_ISSUE = [(1, 4096, 4096), (16, 4096, 4096), (1, 11008, 4096), (4096, 4096, 11008),
              (8192, 8192, 8192), (4096, 4096, 4096)]
HOPPER_SQUARES = [(2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192)]
LLAMA3_8B_PREFILL = [(4096, 6144, 4096), (4096, 4096, 4096), (4096, 28672, 4096), (4096, 4096, 14336),
                     (512, 6144, 4096), (512, 4096, 4096), (512, 28672, 4096), (512, 4096, 14336)]
HALF = ("float16", "bfloat16")


def test_parse_layouts():
    assert cases.parse_layouts(None) is None
    assert cases.parse_layouts(["nt,NN", "nt"]) == ("nt", "nn")
    for bad in ("tn", "t", "nn nt", "linear"):
        with pytest.raises(ValueError, match=f"--layout: unknown layout '{bad}'; expected nn"):
            cases.parse_layouts([bad])


@pytest.mark.parametrize("argv,msg", [
    (["--op", "matmul", "--layout", "tn"], "--layout: unknown layout 'tn'"),
    (["--op", "matmul", "--layout", "nt,bogus"], "--layout: unknown layout 'bogus'"),
    (["--op", "softmax", "--layout", "nt"], "--layout: applies to matmul and scaled_matmul only"),
    (["--op", "matmul", "--layout", "nt"], "--layout: the quick suite runs matmul in nn only, not nt"),
    (["--layout", "nt"], "--layout: the quick suite runs matmul in nn only"),
    (["--op", "matmul", "--shape", "64x64", "--layout", "nt"], "--shape: matmul takes MxNxK"),
])
def test_bad_layout_options_exit_2(argv, msg, capsys):
    with pytest.raises(SystemExit) as exc:
        plan_for(argv)
    assert exc.value.code == 2
    assert msg in capsys.readouterr().err


def test_matmul_case_layout():
    nn = cases.Case("matmul", "bfloat16", (4096, 4096, 4096), None)
    nt = cases.Case("matmul", "bfloat16", (4096, 4096, 4096), None, layout="nt")
    assert (nn.layout, nt.layout) == ("nn", "nt") and nn != nt and nn.key != nt.key
    assert str(nt) == "matmul bfloat16 4096x4096x4096 nt"
    assert str(nn) == "matmul bfloat16 4096x4096x4096 nn"
    assert nt.shape_str == "4096x4096x4096"  # the JSON's shape; the layout has its own key
    # the same work and the same bytes to move in either layout
    assert (cases.flops(nt), cases.bytes_moved(nt)) == (cases.flops(nn), cases.bytes_moved(nn))
    assert cases.Case("softmax", "float32", (4, 4), layout="nt").layout == ""
    assert str(cases.Case("softmax", "float32", (4, 4))) == "softmax axis=-1 float32 4x4"
    with pytest.raises(ValueError, match="matmul layout 'tn'"):
        cases.Case("matmul", "float16", (4, 4, 4), None, layout="tn")


def test_quick_suite_matmul_is_unchanged():
    cs = [c for c in cases.expand_cases(cases.suite_ops("quick"), "quick") if c.op == "matmul"]
    assert [(c.shape, c.layout, c.dtype) for c in cs] == [
        (s, "nn", d) for s in GEMM_ISSUE[:5] for d in HALF]


def test_full_suite_matmul_cases():
    cs = [c for c in cases.expand_cases(cases.OPS, "full") if c.op == "matmul"]
    got = [(c.shape, c.layout, c.dtype) for c in cs]
    assert len(got) == len(set(got)) == 46  # no case twice
    issue = [(s, "nn", d) for s in GEMM_ISSUE for d in ("float32", "float16", "bfloat16", "int8")]
    want = set(issue)
    want |= {(s, lay, d) for s in HOPPER_SQUARES for lay in ("nn", "nt") for d in HALF}
    want |= {(s, "nt", d) for s in LLAMA3_8B_PREFILL for d in HALF}
    assert set(got) == want
    assert got[:24] == issue  # compared across sessions: first, as they always ran
    layouts = [lay for _, lay, _ in got]
    assert layouts == sorted(layouts) and layouts.index("nt") == 26  # every nn case, then nt
    # float32 and int8 stay on the GEMM issue's shapes (in nn)
    assert {(s, lay) for s, lay, d in got if d in ("float32", "int8")} == {(s, "nn") for s in GEMM_ISSUE}
    # 4096^3 nt is a square and Llama's o projection: once
    assert got.count(((4096, 4096, 4096), "nt", "bfloat16")) == 1
    assert (got.index(((4096, 4096, 4096), "nt", "float16"))
            < got.index(((4096, 6144, 4096), "nt", "float16")))  # kept among the squares


def test_layout_option_on_suites_and_shapes():
    def got(argv):
        plan, _ = plan_for(["--op", "matmul", *argv])
        return [(c.shape, c.layout, c.dtype) for c, _ in plan]

    nt = got(["--suite", "full", "--layout", "nt"])  # the suite's nt cases only
    assert nt == [(s, "nt", d) for s in HOPPER_SQUARES + [LLAMA3_8B_PREFILL[0]] + LLAMA3_8B_PREFILL[2:]
                  for d in HALF]
    nn = got(["--suite", "full", "--layout", "NN"])
    assert {lay for _, lay, _ in nn} == {"nn"} and len(nn) == 24 + 2
    assert got(["--suite", "full", "--layout", "nt,nn"]) == got(["--suite", "full"])
    # an explicit shape: nn unless --layout, then in each layout given, in its order
    assert got(["--shape", "64x32x128", "--dtype", "bf16"]) == [((64, 32, 128), "nn", "bfloat16")]
    assert got(["--shape", "64x32x128,128x64x32", "--dtype", "bf16", "--layout", "nt,nn"]) == [
        ((64, 32, 128), "nt", "bfloat16"), ((128, 64, 32), "nt", "bfloat16"),
        ((64, 32, 128), "nn", "bfloat16"), ((128, 64, 32), "nn", "bfloat16")]
    # without --dtype, the dtypes of the suite's matmul cases
    assert got(["--suite", "full", "--shape", "64x32x128", "--layout", "nt"]) == [
        ((64, 32, 128), "nt", d) for d in ("float32", "float16", "bfloat16", "int8")]
    assert got(["--shape", "64x32x128", "--layout", "nt"]) == [((64, 32, 128), "nt", d) for d in HALF]
    # with other ops the 3-D shapes are matmul's, and --layout reaches them
    plan, _ = plan_for(["--op", "rms_norm,matmul", "--shape", "64x64,64x32x128", "--layout", "nt",
                        "--dtype", "fp16"])
    assert [(c.shape, c.layout) for c, _ in plan if c.op == "matmul"] == [((64, 32, 128), "nt")]


def test_list_shows_the_layout(monkeypatch, capsys):
    monkeypatch.setattr(cli, "load_variants", fake_variants)
    assert cli.main(["--op", "matmul", "--suite", "full", "--dtype", "bf16", "--list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert ("matmul bfloat16 4096x28672x4096 nt: naive (skipped), tiled (skipped), regblock, "
            "pipelined, wmma, mma, skinny, auto, cupy, torch") in out
    assert "matmul bfloat16 4096x4096x4096 nn: naive (skipped), tiled (skipped), regblock, " \
           "pipelined, wmma, mma, skinny, auto, cupy, torch" in out
    # 6 + 1 nn, 3 + 7 nt; naive and tiled left out of the 14 products above 2^31 MACs
    assert out[-1] == "17 cases, 142 impl runs"


def test_help_names_the_layouts(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for text in ("--layout LAYOUTS", "x @ w.T, w stored N x K", "--layout nn,nt", "Llama-3-8B",
                 "Mx28672x4096 gate+up", "2048^3, 4096^3, 8192^3 in nn and nt",
                 '"4096x4096x4096 nt"'):
        assert text in out, text


def matmul_rows():
    """4096^3 bf16 in both layouts, and a decode row written before rows had a layout."""
    fl = 2 * 4096 ** 3

    def base(shape, layout, flops, **kw):
        r = {"op": "matmul", "axis": None, "dtype": "bfloat16", "shape": shape, "bytes": 10**8,
             "flops": flops, "gbps_meaningful": True, "ms_min": None, "repeats": 20,
             "tolerance": 1e-2, "rel_error": 2e-3, "status": "ok", "note": None, **kw}
        if layout:
            r["layout"] = layout
        return r

    rows = []
    for layout, ms, cupy_ms in (("nn", 0.30, 0.195), ("nt", 0.28, 0.20)):
        rows += [base("4096x4096x4096", layout, fl, impl="mma", kind="variant", ms=ms),
                 base("4096x4096x4096", layout, fl, impl="auto", kind="auto", ms=ms),
                 base("4096x4096x4096", layout, fl, impl="cupy", kind="baseline", ms=cupy_ms),
                 base("4096x4096x4096", layout, fl, impl="torch", kind="baseline", ms=0.21)]
    fl = 2 * 4096 * 4096
    rows += [base("1x4096x4096", None, fl, impl="auto", kind="auto", ms=0.02),
             base("1x4096x4096", None, fl, impl="cupy", kind="baseline", ms=0.018)]
    return rows


def test_matmul_report_keeps_the_layouts_apart():
    rows = report.finalize(matmul_rows(), copy_gbps=3000.0)
    by = {(report.layout_of(r), r["shape"], r["impl"]): r for r in rows}
    assert len(by) == len(rows)
    nn, nt = by[("nn", "4096x4096x4096", "mma")], by[("nt", "4096x4096x4096", "mma")]
    # each layout against the baselines of its own layout
    assert nn["baseline"] == "cupy" and nn["speedup_vs_best_baseline"] == pytest.approx(0.195 / 0.30)
    assert nt["speedups"] == pytest.approx({"cupy": 0.20 / 0.28, "torch": 0.21 / 0.28})
    assert by[("nn", "1x4096x4096", "auto")]["speedup_vs_best_baseline"] == pytest.approx(0.9)

    lines = report.format_table(rows).splitlines()
    line = next(ln for ln in lines if " mma " in ln and " nt " in ln)
    assert " 4096x4096x4096 nt " in line and "0.2800" in line and "0.71x" in line
    assert any(" auto " in ln and " 1x4096x4096 nn " in ln for ln in lines)  # no layout: nn
    assert lines.count("") == 2  # three cases: 4096^3 nn, 4096^3 nt, 1x4096x4096
    md = report.format_markdown(meta(), rows)
    assert "| matmul |  | mma | bfloat16 | 4096x4096x4096 nt | 0.2800 |" in md
    assert "| matmul |  | mma | bfloat16 | 4096x4096x4096 nn | 0.3000 |" in md
    assert "- matmul layouts, after the shape: nn = a @ b, b stored K x N" in md
    attn_meta = dict(meta(), settings=dict(meta()["settings"], ops=["attention"]))
    assert "matmul layouts" not in "\n".join(report.header_lines(attn_meta))
    doc = json.loads(report.to_json(meta(), rows))
    assert [(r.get("layout"), r["shape"]) for r in doc["results"] if r["impl"] == "mma"] == [
        ("nn", "4096x4096x4096"), ("nt", "4096x4096x4096")]


def test_summarize_matmul_layouts(tmp_path):
    rows = report.finalize(matmul_rows(), copy_gbps=3000.0)
    path = tmp_path / "matmul.json"
    path.write_text(report.to_json(meta(), rows))
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "summarize.py"), str(path)],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "| dtype | MxNxK | layout | auto ms | auto TFLOP/s | auto vs cupy |" in out
    # the GEMM issue's targets hold for nn; nt is reported beside it, without one
    assert ("| bfloat16 | 4096x4096x4096 | nn | 0.3000 | 458.1 | 0.65x | 0.70x | mma | 458.1 | "
            "0.65x | 0.60 |") in out
    assert "| bfloat16 | 4096x4096x4096 | nt | 0.2800 | 490.9 | 0.71x | 0.75x |  |  |  |  |" in out
    # a row from before layouts is nn, and keeps its decode target
    assert "| bfloat16 | 1x4096x4096 | nn | 0.0200 | 1.7 | 0.90x | - | auto | 1.7 | 0.90x | 0.80 |" in out
    assert out.strip().endswith("0 case(s) miss a target or a baseline.")


# --- the operands each impl gets, on the host: NumPy arrays stand in for CuPy's
def fake_matmul_gpu(monkeypatch):
    """runners' matmul path on the host: inputs from host_normal, a fake cupy module, and
    cupyops.matmul, cupy.matmul, torch.matmul and torch._int_mm that record their operands
    in ``seen`` and multiply with NumPy (int8 into int32, as _int_mm)."""
    import types

    import cupyops
    from cupyops.bench import runners

    seen = {}

    def product(who, a, b, unwrap=lambda t: t):
        seen[who] = (a, b)
        a, b = np.asarray(unwrap(a)), np.asarray(unwrap(b))
        if a.dtype == np.int8:
            a, b = a.astype(np.int32), b.astype(np.int32)
        return np.matmul(a, b).view(HostArray)

    cupy = types.ModuleType("cupy")
    cupy.asarray = lambda a, dtype=None: np.asarray(a, dtype=dtype).view(HostArray)
    cupy.matmul = lambda a, b: product("cupy", a, b)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setattr(runners, "random_normal", host_normal)
    monkeypatch.setattr(cupyops, "matmul", lambda a, b, out=None, impl=None: product("cupyops", a, b),
                        raising=False)
    torch = types.ModuleType("torch")
    torch.from_dlpack = FakeTensor
    torch.nn = types.SimpleNamespace(functional=None)
    torch.matmul = lambda a, b: product("torch", a, b, lambda t: t.a)
    torch._int_mm = lambda a, b: product("torch._int_mm", a, b, lambda t: t.a)
    return torch, seen


@pytest.mark.parametrize("check_limit", [cases.CHECK_LIMIT, 1])  # every row; 64 sampled rows
def test_nt_case_hands_every_impl_the_same_transposed_view(monkeypatch, check_limit):
    from cupyops.bench import runners

    torch, seen = fake_matmul_gpu(monkeypatch)
    M, N, K = 80, 24, 40
    data = runners.prepare(cases.Case("matmul", "float32", (M, N, K), None, layout="nt"), seed=3,
                           check_limit=check_limit)
    b = data.weight
    # the logical K x N operand is the transpose of an N x K allocation: a view, no copy
    assert b.shape == (K, N) and b.strides == (4, 4 * K)
    assert b.flags.f_contiguous and not b.flags.c_contiguous
    w = b.base
    assert w.shape == (N, K) and w.flags.c_contiguous
    assert data.x.shape == (M, K) and data.x.flags.c_contiguous
    # the reference is x @ w.T, on every row or on the 64 sampled ones
    rows = np.arange(M) if data.rows is None else np.asarray(data.rows)
    assert len(rows) == (M if check_limit == cases.CHECK_LIMIT else 64)
    want = np.asarray(data.x, dtype=np.float64) @ np.asarray(w, dtype=np.float64).T
    np.testing.assert_allclose(data.ref, want[rows], rtol=1e-12)

    results = [runners.cupyops_call(data, "mma")(), runners.baseline_call(data, "cupy")(),
               runners.baseline_call(data, "torch", torch)()]
    assert seen["cupyops"][0] is data.x and seen["cupyops"][1] is b
    assert seen["cupy"][0] is data.x and seen["cupy"][1] is b
    tx, tb = seen["torch"]  # DLPack views of the same memory, strides and all
    assert tx.a.strides == data.x.strides and np.shares_memory(tx.a, data.x)
    assert tb.a.shape == (K, N) and tb.a.strides == b.strides and np.shares_memory(tb.a, w)
    for y in results:
        assert runners.check(data, y) < 1e-6


def test_nn_case_keeps_b_row_major(monkeypatch):
    from cupyops.bench import runners

    torch, seen = fake_matmul_gpu(monkeypatch)
    data = runners.prepare(cases.Case("matmul", "float16", (32, 24, 40), None), seed=0)
    assert data.weight.shape == (40, 24) and data.weight.flags.c_contiguous
    runners.baseline_call(data, "torch", torch)()
    assert seen["torch"][1].a.strides == (2 * 24, 2)
    want = np.asarray(data.x, dtype=np.float64) @ np.asarray(data.weight, dtype=np.float64)
    np.testing.assert_allclose(data.ref, want, rtol=1e-12)


def test_int8_nt_torch_baseline_gets_the_transposed_view(monkeypatch):
    from cupyops.bench import runners

    torch, seen = fake_matmul_gpu(monkeypatch)
    data = runners.prepare(cases.Case("matmul", "int8", (32, 24, 40), None, layout="nt"), seed=1)
    y = runners.baseline_call(data, "torch", torch)()
    tb = seen["torch._int_mm"][1]
    assert tb.a.shape == (40, 24) and tb.a.strides == (1, 40) and np.shares_memory(tb.a, data.weight)
    assert runners.check(data, y) == 0.0
    with pytest.raises(TypeError, match="cupy.matmul of int8"):
        runners.baseline_call(data, "cupy")


def test_run_case_rows_for_an_nt_matmul(monkeypatch):
    """One nt case through run_case with the GPU parts faked: every impl validated against
    the same reference, and every row carrying the layout beside the plain shape."""
    from cupyops.bench import runners, timing

    torch, seen = fake_matmul_gpu(monkeypatch)
    monkeypatch.setattr(runners, "validate_cupyops",
                        lambda data, call: (runners.check(data, call()), None))
    monkeypatch.setattr(timing, "time_side_by_side", lambda fns, **kw: {i: timing.Timing(0.5, 0.4, 3) for i in fns})
    case = cases.Case("matmul", "float32", (64, 32, 48), None, layout="nt")
    args = cli.build_parser().parse_args(["--op", "matmul", "--layout", "nt"])
    impls = cases.impls_for(case, ["naive", "mma"])
    rows = report.finalize(cli.run_case(case, impls, args, None, torch), copy_gbps=3000.0)
    assert [(r["impl"], r["status"], r["layout"], r["shape"]) for r in rows] == [
        (name, "ok", "nt", "64x32x48") for name in ("naive", "mma", "auto", "cupy", "torch")]
    assert all(r["rel_error"] < 1e-6 for r in rows)
    assert seen["torch"][1].a.strides == (4, 4 * 48)
    doc = json.loads(report.to_json(meta(), rows))
    assert {r["layout"] for r in doc["results"]} == {"nt"}


def test_bench_modules_do_not_import_cupy():
    assert "cupy" not in sys.modules
    assert "torch" not in sys.modules


def test_scaled_matmul_cases():
    from cupyops import reference

    # the FP8 issue's acceptance set, as torch._scaled_mm takes it (x @ w.T): the squares and
    # the 4096-token Llama-3-8B projections, e4m3 -> bfloat16
    full = [c for c in cases.expand_cases(["scaled_matmul"], "full")]
    assert {c.shape for c in full} == {(4096, 4096, 4096), (8192, 8192, 8192), (4096, 6144, 4096),
                                        (4096, 28672, 4096), (4096, 4096, 14336)}
    assert len(full) == 5 and all(c.dtype == "float8_e4m3" and c.layout == "nt" for c in full)
    c = full[0]
    M, N, K = c.shape
    assert cases.bytes_moved(c) == M * K + K * N + 2 * M * N and cases.flops(c) == 2 * M * N * K
    assert cases.tolerance(c, reference.TOLERANCE) == reference.TOLERANCE["scaled_matmul"]["bfloat16"]
    assert [c.shape for c in cases.expand_cases(cases.parse_ops(["fp8"]), "quick")] == [(4096, 4096, 4096)]
    assert [str(c) for c in cases.expand_cases(["scaled_matmul"], "quick", shapes=[(64, 128, 256)])] == [
        "scaled_matmul float8_e4m3 64x128x256 nt"]
    with pytest.raises(ValueError, match="nt only"):
        cases.Case("scaled_matmul", "float8_e4m3", (64, 128, 256), None, layout="nn")
    plan, _ = plan_for(["--op", "scaled_matmul"])
    (case, impls), = plan
    assert [(i.name, i.kind) for i in impls] == [("wgmma_ws", "variant"), ("auto", "auto"), ("torch", "baseline")]
    # --dtype of the 16-bit GEMMs leaves the float8 op out
    assert not cases.expand_cases(["scaled_matmul"], "full", dtypes=("float16",))


def test_header_reports_host_time_per_operator():
    # issue 18's measure: cupyops (CuPy arrays, torch tensors) against torch per operator at
    # decode size; a cupyops figure above torch's is marked
    from cupyops.bench import host

    m = dict(meta(), host_per_op_us={
        "rms_norm": {"shape": "8x4096", "cupyops": 11.0, "cupyops_torch_in": 19.5, "torch": 16.0},
        "matmul": {"shape": "8x4096 @ (4096x4096).T", "cupyops": None, "cupyops_torch_in": 20.0, "torch": None}})
    text = "\n".join(report.header_lines(m))
    assert ("host time per call, rms_norm 8x4096: cupyops 11.0 us, with torch tensors 19.5 us **over**, "
            "torch 16.0 us") in text
    assert "matmul 8x4096 @ (4096x4096).T: cupyops -, with torch tensors 20.0 us, torch -" in text
    assert set(host.OPS) == {"softmax", "rms_norm", "layer_norm", "sum", "matmul", "attention", "add_rms_norm",
                             "silu_and_mul"}
    assert set(host.decode_ops(None)) == set(host.OPS) and all(t is None for _, _, t in host.decode_ops(None).values())


def test_header_reports_graph_replay_time_per_operator():
    m = dict(meta(), host_per_op_us={
        "softmax": {"shape": "8x4096", "cupyops": 6.0, "cupyops_torch_in": 7.5, "torch": 9.0,
                    "cupyops_graph": 2.25, "torch_graph": None}})
    assert ("host time per call, softmax 8x4096: cupyops 6.0 us, with torch tensors 7.5 us, torch 9.0 us; "
            "replayed from a CUDA graph: cupyops 2.2 us, torch -") in "\n".join(report.header_lines(m))


# ------------------------------------------------------------------------ fused LLM operators
def test_fused_op_cases():
    # the issue's acceptance size in every float dtype: 16384 tokens of hidden 4096 (x of
    # silu/gelu_and_mul holds [a | b], 2 x 4096), rope with Llama-3-8B's 32 / 8 heads of 128
    full = cases.expand_cases(cases.FUSED_OPS, "full")
    got = {(c.op, c.shape) for c in full}
    assert got == {("silu_and_mul", (16384, 8192)), ("gelu_and_mul", (16384, 8192)),
                   ("add_rms_norm", (16384, 4096)), ("rope", (16384, 32, 8, 128))}
    assert {c.dtype for c in full} == set(cases.FLOAT_DTYPES) and len(full) == 12
    quick = cases.expand_cases(cases.FUSED_OPS, "quick")
    assert {(c.op, c.shape[0]) for c in quick} == {(op, 4096) for op in cases.FUSED_OPS}
    assert cases.parse_ops(["swiglu,fused_add_rms_norm", "rotary", "geglu"]) == (
        "silu_and_mul", "add_rms_norm", "rope", "gelu_and_mul")


def test_fused_op_bytes_rows_and_baselines():
    bf16 = 2
    silu = cases.Case("silu_and_mul", "bfloat16", (16384, 8192))
    assert cases.bytes_moved(silu) == 16384 * 8192 * bf16 + 16384 * 4096 * bf16  # x read, y written
    add = cases.Case("add_rms_norm", "bfloat16", (16384, 4096))
    assert cases.bytes_moved(add) == 4 * 16384 * 4096 * bf16 + 4096 * bf16  # 2 in, 2 out, weight
    rope = cases.Case("rope", "bfloat16", (16384, 32, 8, 128))
    assert rope.rows == 16384 and rope.cols == 40 * 128 and rope.numel == 16384 * 40 * 128
    assert cases.bytes_moved(rope) == 2 * 16384 * 40 * 128 * bf16 + 16384 * 8  # q, k in and out; positions
    assert all(c.row_wise for c in (silu, add, rope))
    rows = cases.sample_rows(rope, limit=2**20)
    assert rows[0] == 0 and rows[-1] == 16383 and len(rows) == 2**20 // (40 * 128)
    for c in (silu, add, rope):
        assert [i.name for i in cases.impls_for(c, VARIANTS[c.op])][-2:] == ["auto", "torch"]


def test_fused_op_shape_options():
    plan, _ = plan_for(["--op", "rope,silu_and_mul", "--shape", "64x8,16x4x2x64", "--dtype", "bf16"])
    assert {(c.op, c.shape) for c, _ in plan} == {("rope", (16, 4, 2, 64)), ("silu_and_mul", (64, 8))}
    with pytest.raises(ValueError, match="--shape: rope takes tokens x q_heads x kv_heads x head_dim"):
        cases.expand_cases(("rope",), "quick", shapes=((64, 8),))
    with pytest.raises(ValueError, match="--shape: gelu_and_mul takes x \\[..., 2d\\], an even last"):
        cases.expand_cases(("gelu_and_mul",), "quick", shapes=((64, 7),))


def test_host_time_side_by_side_interleaves_the_rounds(monkeypatch):
    from cupyops.bench import timing

    monkeypatch.setattr(timing, "_sync", lambda: None)
    seen = []
    fns = {"a": lambda: seen.append("a"), "b": lambda: seen.append("b")}
    out = timing.host_overhead_side_by_side_us(fns, calls=6, warmup=1, rounds=3)
    assert sorted(out) == ["a", "b"] and all(v > 0 for v in out.values())
    # one warm-up call each, then rounds of 2 calls: a a b b, three times
    assert "".join(seen) == "ab" + "aabb" * 3


def test_run_case_times_side_by_side_or_in_turn(monkeypatch):
    """The impls of a case that passed their checks are timed together (time_side_by_side),
    or each in turn under --sequential; where timing them together fails, each is timed
    alone, and the one that fails is reported FAILED while the others keep their times."""
    from cupyops.bench import runners, timing

    torch, _ = fake_matmul_gpu(monkeypatch)
    monkeypatch.setattr(runners, "validate_cupyops", lambda data, call: (1e-7, None))
    case = cases.Case("matmul", "float32", (64, 32, 48), None, layout="nt")
    impls = cases.impls_for(case, ["naive", "mma"])
    calls = []

    def in_turn(fn, **kw):
        calls.append("alone")
        if fn is broken[0]:
            raise RuntimeError("out of memory")
        return timing.Timing(0.25, 0.2, 5)

    def together(fns, **kw):
        calls.append(("together", len(fns)))
        broken[0] = list(fns.values())[1]  # (the second impl's call)
        raise RuntimeError("out of memory")

    broken = [None]
    monkeypatch.setattr(timing, "time_gpu", in_turn)
    monkeypatch.setattr(timing, "time_side_by_side", together)
    args = cli.build_parser().parse_args(["--op", "matmul", "--layout", "nt"])
    rows = cli.run_case(case, impls, args, None, torch)
    assert calls == [("together", 5)] + ["alone"] * 5
    assert [r["status"] for r in rows] == ["ok", "FAILED", "ok", "ok", "ok"]
    assert "timing: RuntimeError: out of memory" in rows[1]["note"] and rows[0]["ms"] == 0.25
    calls.clear()
    broken[0] = None
    args = cli.build_parser().parse_args(["--op", "matmul", "--layout", "nt", "--sequential"])
    rows = cli.run_case(case, impls, args, None, torch)
    assert calls == ["alone"] * 5 and all(r["status"] == "ok" for r in rows)


def test_time_side_by_side_interleaves_what_fits_the_budget(monkeypatch):
    from cupyops.bench import timing

    est = {"fast": 1.0, "cublas": 1.2, "slow": 500.0}  # ms a call
    seen = {}
    monkeypatch.setattr(timing, "time_one", lambda fn: est[fn()])
    monkeypatch.setattr(timing, "time_gpu_interleaved",
                        lambda fns, **kw: seen.setdefault("inter", (sorted(fns), kw["repeats"])) and
                        {n: timing.Timing(est[n], est[n], kw["repeats"]) for n in fns})
    monkeypatch.setattr(timing, "time_gpu",
                        lambda fn, **kw: seen.setdefault("alone", []).append(fn()) or timing.Timing(9.0, 9.0, 3))
    fns = {n: (lambda n=n: n) for n in est}
    out = timing.time_side_by_side(fns, repeats=50, budget_s=2.0)
    assert seen == {"inter": (["cublas", "fast"], 50), "alone": ["slow"]}
    assert out["fast"].median_ms == 1.0 and out["slow"].median_ms == 9.0


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 6, 7])
def test_round_order_balances_places_and_predecessors(k):
    # a Williams design: over its rounds every callable runs in every place equally often
    # and right after every other callable equally often
    rounds = k if k % 2 == 0 else 2 * k
    orders = [timing_mod().round_order(k, i) for i in range(rounds)]
    assert all(sorted(o) == list(range(k)) for o in orders)
    assert orders == [timing_mod().round_order(k, i + rounds) for i in range(rounds)]
    places = {(o[p], p) for o in orders for p in range(k)}
    assert len(places) == k * k and all(sum(o[p] == c for o in orders) == rounds // k for c in range(k) for p in range(k))
    after = {}
    for o in orders:
        for a, b in zip(o, o[1:]):
            after[a, b] = after.get((a, b), 0) + 1
    assert set(after) == {(a, b) for a in range(k) for b in range(k) if a != b}
    assert len(set(after.values())) <= 1


def timing_mod():
    from cupyops.bench import timing

    return timing

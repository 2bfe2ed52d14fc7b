"""CPU tier: every kernel file compiles with NVRTC, no GPU needed, for every dtype each
operator claims, for sm_80 and sm_90 (the Hopper files for sm_90a alone), with no register
spills and no warnings (ptxas verbose log)."""
import pytest

from cupyops import CompileError, _dtypes, _kernels, _nvrtc
from cupyops.bench import timing
from cupyops.ops import OPS, _attention_flash3, kernel_files

try:
    _nvrtc.find_libnvrtc()
    _nvrtc.find_cuda_include()
    _missing = None
except _nvrtc.NvrtcUnavailable as exc:  # pragma: no cover - the test extra installs both
    _missing = str(exc)

pytestmark = pytest.mark.skipif(_missing is not None, reason=f"NVRTC unavailable: {_missing}")

FILES = {kf.filename: kf for kf in kernel_files()}
FILES[timing.HOLD.filename] = timing.HOLD  # the benchmark's own kernel compiles here too
# a rung written but not yet in the ladder (its GPU tests call the launcher) compiles here too
FILES[_attention_flash3.KERNELS.filename] = _attention_flash3.KERNELS


@pytest.fixture(scope="module", params=[(f, a) for f in FILES for a in FILES[f].archs],
                ids=lambda p: f"{p[0]}-{p[1]}")
def compiled(request):
    filename, arch = request.param
    kf = FILES[filename]
    return kf, _nvrtc.compile_file(filename, kf.name_expressions, arch, kf.extra_options)


def test_compiles_clean(compiled):
    # one test a (file, arch) compile, so that a parallel run (pytest -n) compiles each once
    kf, res = compiled
    # every instantiation is in the cubin
    assert res.cubin_size > 0
    assert set(res.lowered) == set(kf.name_expressions)
    missing = [ne for ne in kf.name_expressions if res.lowered[ne] not in res.resources]
    assert not missing, f"ptxas reported nothing for {missing[:3]}"
    # no spills
    spilled = {
        ne: res.resources_of(ne)
        for ne in kf.name_expressions
        if res.resources_of(ne).spill_stores or res.resources_of(ne).spill_loads
        or res.resources_of(ne).stack_bytes
    }
    assert not spilled, f"{kf.filename} {res.arch}: spills in {spilled}"
    # no warnings
    warnings = [ln for ln in res.log.splitlines() if "warning" in ln.lower()]
    assert not warnings, "\n".join(warnings)
    # no wgmma serialisation: ptxas reports, as an info line (not a warning), when it must
    # wait for wgmmas in flight because their accumulators are touched before
    # wgmma.wait_group (C7515 ... C7517): the kernels would run serialised
    assert "(C75" not in res.log, [ln for ln in res.log.splitlines() if "(C75" in ln]


@pytest.mark.parametrize("dtype", _dtypes.FLOAT_TYPES)
@pytest.mark.parametrize("op", ["softmax", "layer_norm", "rms_norm", "silu_and_mul", "gelu_and_mul",
                                "add_rms_norm", "rope", "sample"])
def test_float_ops_instantiate_every_float_dtype(op, dtype):
    exprs = " ".join(ne for kf in kernel_files(op) for ne in kf.name_expressions)
    assert _dtypes.cuda_type(dtype) in exprs


@pytest.mark.parametrize("dtype", _dtypes.REDUCE_TYPES)
def test_reductions_instantiate_every_dtype(dtype):
    exprs = kernel_files("sum")[0].name_expressions
    t = _dtypes.cuda_type(dtype)
    for k in ("reduce_rows_naive", "reduce_rows_block", "reduce_rows_vector", "reduce_strided", "trace_unrolled"):
        assert any(ne.startswith(f"{k}<{t},") for ne in exprs), (k, t)


def test_compile_error_names_file_and_line(tmp_path, monkeypatch):
    (tmp_path / "broken.cu").write_text('#include "common.cuh"\n__global__ void k() { undefined_name(); }\n')
    (tmp_path / "common.cuh").write_text((_kernels.kernel_dir() / "common.cuh").read_text())
    monkeypatch.setattr(_kernels, "kernel_dir", lambda: tmp_path)
    _kernels.kernel_source.cache_clear()
    try:
        with pytest.raises(CompileError) as info:
            _nvrtc.compile_file("broken.cu", ["k"], "sm_90")
    finally:
        _kernels.kernel_source.cache_clear()
    assert info.value.filename == "broken.cu"
    assert "broken.cu(2)" in info.value.log and "undefined_name" in info.value.log


def test_all_ops_have_kernel_files():
    for op in OPS:
        assert kernel_files(op)


HOPPER_FILES = [f for f, kf in FILES.items() if kf.arch == "sm_90a"]


def test_hopper_files_exist():
    assert "gemm_wgmma.cu" in HOPPER_FILES


@pytest.mark.parametrize("filename", HOPPER_FILES)
def test_hopper_code_fails_to_compile_for_plain_sm_90(filename):
    # wgmma / setmaxnreg must be refused at compile time off sm_90a (sm90.cuh's #error),
    # never reach a GPU as a run-time trap
    kf = FILES[filename]
    with pytest.raises(CompileError) as info:
        _nvrtc.compile_file(filename, kf.name_expressions[:1], "sm_90", kf.extra_options)
    assert "sm_90a" in info.value.log


def test_setmaxnreg_is_kept():
    # ptxas drops setmaxnreg without a register cap at entry, saying so with warning
    # C7508; the warp-specialised GEMM must keep it (and have no other warning)
    kf = FILES["gemm_wgmma.cu"]
    names = [ne for ne in kf.name_expressions if ne.startswith("gemm_wgmma_ws<")]
    assert names
    res = _nvrtc.compile_file("gemm_wgmma.cu", names[:2], "sm_90a", kf.extra_options)
    assert "C7508" not in res.log and "setmaxnreg" not in res.log.lower(), res.log
    assert not [ln for ln in res.log.splitlines() if "warning" in ln.lower()], res.log

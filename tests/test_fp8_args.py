"""CPU tier for float8 (scaled_matmul, quantize_fp8): bad input raises TypeError/ValueError
naming the argument before anything touches a GPU (NumPy operands: no CuPy needed), ``out``
untouched; the accepted scale forms; the registration of the ops and their kernel files;
the launch plans, the tensor-map specs and the kernels' argument lists (checked against
the .cu signatures); and the float64 / ml_dtypes references themselves, against an
independent table-driven e4m3 rounding."""
import ctypes
import re
import types

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cupyops
from cupyops import _dtypes, _kernels, _launch, _tma, reference
from cupyops.ops import _fp8_gemm as G8
from cupyops.ops import _fp8_quantize as Q8
from cupyops.ops import fp8

F8 = ml_dtypes.float8_e4m3fn
SMEM_OPTIN = 232448  # H100 / H200 MaxSharedMemoryPerBlockOptin
H100_SMS = 132


def bits(shape, seed=0):
    """Random finite e4m3 bit patterns (0x7F / 0xFF are NaN)."""
    q = np.random.default_rng(seed).integers(0, 256, size=shape).astype(np.uint8)
    q[(q & 0x7F) == 0x7F] = 0x38  # 1.0
    return q


A = bits((4, 32))
B = bits((32, 8), 1)


def mm(a=A, b=B, sa=1.0, sb=1.0, **kw):
    return fp8.scaled_matmul(a, b, sa, sb, **kw)


# ------------------------------------------------------------------ scaled_matmul: checks
@pytest.mark.parametrize("dtype", [np.int8, np.float16, np.float32, ml_dtypes.float8_e5m2, np.bool_])
def test_scaled_matmul_rejects_operand_dtypes(dtype):
    with pytest.raises(TypeError, match=r"^a: dtype \w+ is not supported; expected uint8 \(float8 e4m3 bits\) "
                                        r"or float8_e4m3fn"):
        mm(a=np.zeros((4, 32), dtype))
    with pytest.raises(TypeError, match=r"^b: dtype \w+ is not supported; expected uint8"):
        mm(b=np.zeros((32, 8), dtype))


def test_float8_e4m3fn_arrays_are_read_as_their_bits():
    x = np.array([[1.0, -2.0, 448.0, 0.015625]], dtype=F8)
    got = fp8._fp8_bits(x, "a")
    assert got.dtype == np.uint8 and np.shares_memory(got, x)
    assert np.array_equal(got, x.view(np.uint8))
    assert np.array_equal(fp8._fp8_bits(got, "a"), got)  # uint8 passes as it is
    # and the references read either form alike
    assert np.array_equal(reference.e4m3_to_float(x), reference.e4m3_to_float(got))


def test_scaled_matmul_shapes():
    with pytest.raises(ValueError, match=r"^a: expected a 2-D array, got 1-D"):
        mm(a=np.zeros(32, np.uint8))
    with pytest.raises(ValueError, match=r"^b: expected a 2-D array, got 3-D"):
        mm(b=np.zeros((2, 32, 8), np.uint8))
    with pytest.raises(ValueError, match=r"^b: inner dimensions do not match: a is 4x32 and b is 16x8"):
        mm(b=np.zeros((16, 8), np.uint8))
    with pytest.raises(ValueError, match=r"^a: K = 24 is not a multiple of 16"):
        mm(a=np.zeros((4, 24), np.uint8), b=np.zeros((24, 8), np.uint8))


def test_scaled_matmul_placement():
    fake = type("FakeCupy", (), {"__module__": "cupy.fake", "dtype": np.dtype(np.uint8), "ndim": 2,
                                 "shape": (32, 8)})()
    with pytest.raises(TypeError, match="^b: must live where a does"):
        mm(b=fake)


@pytest.mark.parametrize("which,bad,exc,msg", [
    ("scale_a", np.ones(5, np.float32), ValueError,
     r"^scale_a: expected one float32 scale or one a row of a \(shape \(4,\) or \(4, 1\)\), got shape \(5,\)"),
    ("scale_a", np.ones((1, 4), np.float32), ValueError, r"^scale_a: expected .* got shape \(1, 4\)"),
    ("scale_b", np.ones((8, 1), np.float32), ValueError,
     r"^scale_b: expected one float32 scale or one a column of b \(shape \(8,\) or \(1, 8\)\)"),
    ("scale_a", np.ones(4, np.float64), TypeError, r"^scale_a: dtype float64 is not supported; expected one of "
                                                   r"float32"),
    ("scale_b", np.ones(8, np.float16), TypeError, r"^scale_b: dtype float16 is not supported"),
    ("scale_a", float("inf"), ValueError, r"^scale_a: must be a finite float32 value"),
    ("scale_b", float("nan"), ValueError, r"^scale_b: must be a finite float32 value"),
    ("scale_a", 1e39, ValueError, r"^scale_a: must be a finite float32 value"),
    ("scale_a", True, TypeError, r"^scale_a: expected a number"),
    ("scale_b", np.array([True]), TypeError, r"^scale_b: expected a real scale, got dtype bool"),
    ("scale_a", "2", TypeError, r"^scale_a: dtype <U1 is not supported|^scale_a: expected"),
])
def test_scaled_matmul_scale_errors(which, bad, exc, msg):
    with pytest.raises(exc, match=msg):
        mm(**{"sa" if which == "scale_a" else "sb": bad})


def test_scale_forms():
    a = np.zeros((4, 32), np.uint8)
    vec = ((4,), (4, 1))
    # host numbers and one-element host arrays are kernel scalars (no device copy)
    for s in (0.5, 2, np.float32(0.25), np.float64(3.0), np.array(1.5, np.float32), np.array([[0.5]], np.float32),
              np.array([2.0]), np.array(1.0, ml_dtypes.bfloat16)):
        kind, v = fp8._scale(s, "scale_a", a, 4, vec)
        assert kind == "scalar" and isinstance(v, float) and v == float(np.asarray(s, np.float64).reshape(()))
    # a vector: one a row, read at index m (step 1)
    for shape in vec:
        arr, step = fp8._scale(np.ones(shape, np.float32), "scale_a", a, 4, vec)
        assert step == 1 and arr.shape == shape
    # M == 1: a vector of one is the per-tensor scale (same product either way)
    kind, _ = fp8._scale(np.ones(1, np.float32), "scale_a", np.zeros((1, 32), np.uint8), 1, ((1,), (1, 1)))
    assert kind == "scalar"


def test_scaled_matmul_out_dtype_and_bias():
    with pytest.raises(TypeError, match=r"^out_dtype: 'float64' is not supported; expected one of bfloat16, "
                                        r"float16, float32"):
        mm(out_dtype="float64")
    with pytest.raises(TypeError, match=r"^out_dtype: 'int32' is not supported"):
        mm(out_dtype=np.int32)
    with pytest.raises(TypeError, match=r"^out_dtype: expected a dtype or its name"):
        mm(out_dtype=object())
    assert fp8._out_dtype(np.float16) == "float16"
    assert fp8._out_dtype(ml_dtypes.bfloat16) == "bfloat16"
    assert fp8._out_dtype(np.dtype("float32")) == "float32"
    with pytest.raises(ValueError, match=r"^bias: expected shape \(8,\), got \(7,\)"):
        mm(bias=np.zeros(7, np.float32))
    with pytest.raises(TypeError, match=r"^bias: dtype float16 is not supported; expected one of bfloat16, "
                                        r"float32"):
        mm(bias=np.zeros(8, np.float16))
    with pytest.raises(TypeError, match=r"^bias: dtype bfloat16 is not supported; expected one of float32$"):
        mm(bias=np.zeros(8, ml_dtypes.bfloat16), out_dtype="float32")


def test_scaled_matmul_impl_and_out_leave_out_untouched():
    with pytest.raises(ValueError, match=r"^impl: unknown variant 'fast' for scaled_matmul; expected one of "
                                         r"auto, wgmma_ws"):
        mm(impl="fast")
    for out, kw, exc, msg in [
        (np.full((4, 9), 7, ml_dtypes.bfloat16), {}, ValueError, r"^out: expected shape \(4, 8\)"),
        (np.full((4, 8), 7, np.float32), {}, TypeError, r"^out: expected dtype bfloat16, got float32"),
        (np.full((4, 8), 7, np.float16), {"out_dtype": "float32"}, TypeError, r"^out: expected dtype float32"),
        (np.full((8, 4), 7, np.float32).T, {"out_dtype": "float32"}, ValueError, r"^out: must be C-contiguous"),
    ]:
        before = out.copy()
        with pytest.raises(exc, match=msg):
            mm(out=out, **kw)
        assert np.array_equal(out.astype(np.float32), before.astype(np.float32))


# ------------------------------------------------------------------ quantize_fp8: checks
X = np.ones((3, 40), np.float32)


@pytest.mark.parametrize("dtype", [np.int32, np.float64, np.uint8, np.bool_])
def test_quantize_rejects_dtypes(dtype):
    with pytest.raises(TypeError, match=r"^x: dtype \w+ is not supported; expected one of float32, float16, "
                                        r"bfloat16"):
        cupyops.quantize_fp8(np.ones((2, 3), dtype))


def test_quantize_axis():
    with pytest.raises(ValueError, match=r"^axis: only the last axis \(-1\) or None is supported, got 0 for a 2-D x"):
        cupyops.quantize_fp8(X, axis=0)
    with pytest.raises(ValueError, match=r"^axis: 5 is out of bounds"):  # (numpy's AxisError is a ValueError)
        cupyops.quantize_fp8(X, axis=5)
    for bad in (1.0, "x", True, (1,)):
        with pytest.raises(TypeError, match=r"^axis: expected None or an integer"):
            cupyops.quantize_fp8(X, axis=bad)
    with pytest.raises(ValueError, match=r"^axis: a 0-d x has no axis"):
        cupyops.quantize_fp8(np.float32(1), axis=-1)
    assert fp8._row_axis(None, 2) is False
    assert fp8._row_axis(-1, 2) is fp8._row_axis(1, 2) is fp8._row_axis(np.int64(2), 3) is True
    assert fp8._row_axis(0, 1) is True  # the only axis of a 1-D x is its last


@pytest.mark.parametrize("kw,exc,msg", [
    ({"scale": 0.5, "axis": -1}, ValueError, r"^scale: axis=-1 takes one scale a row, a float32 array of shape \(3,\)"),
    ({"scale": np.ones(4, np.float32), "axis": -1}, ValueError,
     r"^scale: axis=-1 takes one scale a row, shape \(3,\) or \(3, 1\), got \(4,\)"),
    ({"scale": np.ones(3, np.float32)}, ValueError, r"^scale: axis=None takes one scale \(an array of one "
                                                    r"element\), got shape \(3,\)"),
    ({"scale": 0.0}, ValueError, r"^scale: must be positive"),
    ({"scale": -1.0}, ValueError, r"^scale: must be positive"),
    ({"scale": 1e-50}, ValueError, r"^scale: must be positive \(as a float32\)"),
    ({"scale": float("inf")}, ValueError, r"^scale: must be a finite float32 value"),
    ({"scale": float("nan")}, ValueError, r"^scale: must be a finite float32 value"),
    ({"scale": True}, TypeError, r"^scale: expected a number"),
    ({"scale": np.ones(1, np.float64)}, TypeError, r"^scale: dtype float64 is not supported; expected one of "
                                                   r"float32"),
    ({"impl": "naive"}, ValueError, r"^impl: unknown variant 'naive' for quantize_fp8; expected one of auto, "
                                    r"vector"),
])
def test_quantize_scale_and_impl_errors(kw, exc, msg):
    with pytest.raises(exc, match=msg):
        cupyops.quantize_fp8(X, **kw)


def test_quantize_given_scale_forms():
    assert fp8._given_scale(None, X, False, ()) is None
    assert fp8._given_scale(2, X, False, ()) == 2.0
    assert fp8._given_scale(np.float32(0.5), X, False, ()) == 0.5
    for shape in ((), (1,), (1, 1)):
        assert fp8._given_scale(np.ones(shape, np.float32), X, False, ()).shape == shape
    for shape in ((3,), (3, 1)):
        assert fp8._given_scale(np.ones(shape, np.float32), X, True, (3,)).shape == shape


# ------------------------------------------------------------------ registration
def test_fp8_ops_are_registered_but_not_in_the_ladders():
    assert set(cupyops.ops.FP8_OPS) == {"scaled_matmul", "quantize_fp8"}
    assert not set(cupyops.ops.FP8_OPS) & set(cupyops.OPS)
    assert list(cupyops.variants("scaled_matmul")) == ["wgmma_ws"]
    assert list(cupyops.variants("quantize_fp8")) == ["vector"]
    names = [kf.filename for kf in cupyops.ops.kernel_files()]
    assert "gemm_fp8.cu" in names and "quantize.cu" in names
    assert [kf.filename for kf in cupyops.ops.kernel_files("scaled_matmul")] == ["quantize.cu", "gemm_fp8.cu"]
    assert cupyops.scaled_matmul is fp8.scaled_matmul and cupyops.quantize_fp8 is fp8.quantize_fp8
    with pytest.raises(ValueError, match="op: unknown operator 'fp8'; expected one of .*scaled_matmul"):
        cupyops.variants("fp8")


def test_kernel_files_and_archs():
    assert G8.KERNELS.arch == "sm_90a" and G8.KERNELS.archs == ("sm_90a",)
    assert G8.KERNELS.runs_on(90) and not any(G8.KERNELS.runs_on(cc) for cc in (80, 86, 89, 100))
    assert Q8.KERNELS.arch is None and Q8.KERNELS.archs == _kernels.PORTABLE_ARCHS
    assert len(Q8.KERNELS.name_expressions) == 9 and len(G8.KERNELS.name_expressions) == 9  # 3 outs x 3 tiles


def _props(cc, name="NVIDIA H100 80GB HBM3"):
    return _launch.DeviceProps(name, cc, 132, 2048, SMEM_OPTIN, 233472, 50 << 20)


def test_gpu_error_names_the_gpu(monkeypatch):
    why = G8.gpu_error(_props(80, "NVIDIA A100-SXM4-80GB"))
    assert "NVIDIA A100-SXM4-80GB (sm_80)" in why and "compute capability 9.0" in why and "no fallback" in why
    assert "sm_89" in G8.gpu_error(_props(89, "NVIDIA L4"))
    monkeypatch.setattr(_tma, "available", lambda: True)
    assert G8.gpu_error(_props(90)) is None
    monkeypatch.setattr(_tma, "available", lambda: False)
    assert "cuTensorMapEncodeTiled" in G8.gpu_error(_props(90))


# ------------------------------------------------------------------ GEMM plan and maps
# tiles of (1, 1), (128, 256), (129, 257), (600, 600), (4096, 4096), (8192, 8192)
_FP8_TILES = {"128x256": (256, 4, (1, 1, 4, 15, 512, 2048)),
              "128x192": (192, 4, (1, 2, 4, 20, 704, 2752)),
              "128x128": (128, 6, (1, 2, 6, 25, 1024, 4096))}


@pytest.mark.parametrize("config", _FP8_TILES)
@pytest.mark.parametrize("dout", G8.OUT_TYPES)
def test_gemm_plan(config, dout):
    bn, stages, counts = _FP8_TILES[config]
    for (M, N), tiles in zip([(1, 1), (128, 256), (129, 257), (600, 600), (4096, 4096), (8192, 8192)], counts):
        pl = G8.plan(M, N, dout, H100_SMS, config)
        assert pl.name in G8.KERNELS.name_expressions
        assert pl.name == f"scaled_matmul_wgmma_ws<{_dtypes.cuda_type(dout)}, {bn}, {stages}>"
        assert pl.grid == (min(tiles, H100_SMS), 1, 1) and pl.block == (384,) and pl.cluster == 1
        assert pl.smem == stages * (128 + bn) * 128 + 32768 + 1024 + 16 * stages <= SMEM_OPTIN
    with pytest.raises(TypeError, match="out_dtype"):
        G8.plan(1, 1, "float64")
    with pytest.raises(ValueError, match="config"):
        G8.plan(1, 1, dout, H100_SMS, "256x128")


@pytest.mark.parametrize("M,N,config", [(4096, 4096, "128x256"), (8192, 8192, "128x192"), (4096, 6144, "128x192"),
                                        (4096, 28672, "128x192"), (1, 1, "128x128"), (300, 520, "128x128")])
def test_gemm_pick(M, N, config):
    # the wave model against the sweep on an H100 (132 SMs): 4096^3 fills 4 waves of 256-wide
    # tiles; 8192^2 and 4096 x 28672 fill the waves of either tile alike, and the 192-wide
    # one runs faster; a problem of one wave takes the narrowest tile
    assert G8.pick_config(M, N, H100_SMS) == config
    assert G8.plan(M, N, "bfloat16", H100_SMS).name == G8.plan(M, N, "bfloat16", H100_SMS, config).name


def test_map_specs():
    (da, sa, ba), (db, sb, bb) = G8.map_specs(300, 520, 704, 704, 720, "128x192")
    assert (da, sa, ba) == ((704, 300, 1), (704, 704 * 300), (128, 128, 1))
    assert (db, sb, bb) == ((704, 520, 1), (720, 720 * 520), (128, 192, 1))
    assert G8.map_specs(300, 520, 704, 704, 720, "128x256")[1][2] == (128, 256, 1)
    for dims, strides, box in G8.map_specs(1, 1, 16, 16, 16, "128x128"):
        assert box[0] * 1 == 128  # the inner box is one 128-byte swizzle row of 1-byte elements
        assert all(s % 16 == 0 for s in strides) and all(b <= 256 for b in box)


def test_tensor_maps_encode_uint8_with_the_128b_swizzle(monkeypatch):
    calls = []
    monkeypatch.setattr(_tma, "encode_tiled", lambda *a: calls.append(a) or bytes(128))
    arr = lambda ptr: types.SimpleNamespace(data=types.SimpleNamespace(ptr=ptr))  # noqa: E731
    p = G8.Fp8Problem(300, 520, 704, arr(1 << 20), arr(2 << 20), 704, 720, arr(3 << 20), "bfloat16")
    assert G8.tensor_maps(p, "128x256") == (bytes(128), bytes(128))
    (pa, *ra), (pb, *rb) = calls
    assert (pa, pb) == (1 << 20, 2 << 20)
    assert ra[3:] == [_tma.SWIZZLE_128B, _tma.DATA_UINT8] == rb[3:] and _tma.DATA_UINT8 == 0
    assert (ra[0], rb[0]) == ((704, 300, 1), (704, 520, 1))
    monkeypatch.setattr(_tma, "encode_tiled", lambda *a: None)  # the driver refuses
    with pytest.raises(RuntimeError, match="refused the tensor map of a"):
        G8.tensor_maps(p, "128x256")


@pytest.mark.parametrize("shape,strides,ptr,ld", [
    ((300, 704), (704, 1), 1 << 20, 704),        # C-contiguous a
    ((300, 704), (720, 1), 1 << 20, 720),        # padded rows: read in place
    ((300, 704), (704, 1), (1 << 20) + 1, None),  # misaligned start
    ((520, 704), (1, 520), 1 << 20, None),       # b row-major K x N seen as b.T: K is not contiguous
    ((300, 704), (712, 1), 1 << 20, None),       # rows 712 bytes apart
    ((300, 704), (16, 1), 1 << 20, None),        # overlapping rows
    ((300, 704), (-704, 1), 1 << 20, None),      # reversed rows
    ((1, 704), (1, 1), 1 << 20, 704),            # one row: no row stride needed
    ((1, 704), (0, 1), 1 << 20, 704),
])
def test_k_major_ld(shape, strides, ptr, ld):
    assert G8.k_major_ld(shape, strides, ptr) == ld


def _kernel_params(filename, kernel):
    """The C types of a kernel's parameters, from its .cu source."""
    src = (_kernels.kernel_dir() / filename).read_text()
    m = re.search(r"\b" + kernel + r"\(([^)]*)\)\s*\{", src)
    assert m, kernel
    params = []
    for p in m.group(1).split(","):
        p = " ".join(p.replace("__restrict__", "").replace("__grid_constant__", "").split())
        params.append(p.rsplit(" ", 1)[0].replace("const ", ""))
    return params


# C type -> what the launcher must pass (an array / NULL_PTR for a pointer)
_ARG_TYPES = {"int": np.int32, "i64": np.int64, "float": np.float32, "TmaMap": bytes}


def _check_args(params, args, what):
    assert len(params) == len(args), (what, params, args)
    for c, a in zip(params, args):
        if c.endswith("*"):
            assert (isinstance(a, np.uint64) and a == 0) or hasattr(a, "data"), (what, c, a)
        else:
            assert type(a) is _ARG_TYPES[c], (what, c, type(a))


class _Dev:
    """A stand-in for a CuPy array (address, size, dtype)."""

    def __init__(self, ptr=1 << 20, size=1000, dtype=np.float32):
        self.data = types.SimpleNamespace(ptr=ptr)
        self.size = size
        self.dtype = np.dtype(dtype)


def test_gemm_arguments_match_the_kernel_signature():
    params = _kernel_params("gemm_fp8.cu", "scaled_matmul_wgmma_ws")
    assert params[-5:] == ["TmaMap", "TmaMap", "TmaMap", "int", "int"]  # A, B, D, store_by_tma, group_rows
    d_map, by_tma = G8.output_map(G8.Fp8Problem(7, 9, 32, _Dev(), _Dev(), 32, 32, _Dev(), "float32"))
    maps = (bytes(128), bytes(128), d_map, np.int32(by_tma), np.int32(G8.GROUP_ROWS))  # as launch() passes them
    p = G8.Fp8Problem(7, 9, 32, _Dev(), _Dev(), 32, 32, _Dev(), "float16")
    args = p.args()
    _check_args(params, args + maps, "no scales, no bias")
    assert args[4] == 9 and args[5] == 0 and args[7] == np.float32(1) and args[12] == G8.BIAS_NONE
    p = G8.Fp8Problem(7, 9, 32, _Dev(), _Dev(), 32, 32, _Dev(), "float16", _Dev(), 1, 1.0, None, 0, 0.5,
                      _Dev(), G8.BIAS_F32)
    args = p.args()
    _check_args(params, args + maps, "row scales, a scalar b scale, a bias")
    assert args[6] == 1 and args[8] == 0 and args[10] == np.float32(0.5) and args[12] == 1


def test_output_map(monkeypatch):
    # the tensor-store epilogue takes a 16-bit D a map describes, with no bias and one scale
    # for B; float32 D, a bias, per-column scales, and rows whose bytes are not a multiple of
    # 16 are stored directly (map never read, flag 0)
    calls = []
    monkeypatch.setattr(_tma, "encode_tiled", lambda *a, **k: calls.append((a, k)) or bytes(range(128)))

    def problem(M, N, dout, ptr=1 << 20):
        return G8.Fp8Problem(M, N, 32, _Dev(), _Dev(), 32, 32, _Dev(ptr), dout)

    assert G8.output_map(problem(300, 520, "float32")) == (_tma.NO_MAP, 0)
    assert G8.output_map(problem(300, 9, "bfloat16")) == (_tma.NO_MAP, 0)  # 18-byte rows
    assert G8.output_map(problem(300, 520, "float16", ptr=(1 << 20) + 8)) == (_tma.NO_MAP, 0)  # misaligned D
    col_scales = problem(300, 520, "bfloat16")
    col_scales.scale_b, col_scales.sb_step = _Dev(), 1
    assert G8.output_map(col_scales) == (_tma.NO_MAP, 0)
    biased = problem(300, 520, "bfloat16")
    biased.bias, biased.bias_kind = _Dev(), G8.BIAS_OUT
    assert G8.output_map(biased) == (_tma.NO_MAP, 0)
    assert not calls
    flag = G8.output_map(problem(300, 520, "bfloat16"))
    assert flag == (bytes(range(128)), 1) and type(flag[1]) is int
    (args, kwargs), = calls
    assert args == (1 << 20, (520, 300, 1), (1040, 1040 * 300), (64, 64, 1)) and not kwargs


def test_gemm_arguments_pack_for_the_driver():
    # what launch_with_structs hands cuLaunchKernel: 15 slots, the maps by value
    seen = []

    def driver_launch(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        slots = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
        seen.append((gx, bx, smem, [slots[i] for i in range(15)],
                     ctypes.string_at(slots[13], 128), ctypes.cast(slots[7], ctypes.POINTER(ctypes.c_float))[0]))

    p = G8.Fp8Problem(7, 9, 32, _Dev(), _Dev(), 32, 32, _Dev(), "bfloat16", None, 0, 0.25)
    mapA = bytes(range(128))
    _launch.launch_with_structs(types.SimpleNamespace(ptr=0xF00D), (132,), (384,), G8.smem("128x256"),
                                p.args() + (mapA, bytes(128)), driver_launch=driver_launch,
                                current_stream=lambda: types.SimpleNamespace(ptr=0))
    (gx, bx, smem, slots, m, sa0), = seen
    assert (gx, bx, smem, m, sa0) == (132, 384, G8.smem("128x256"), mapA, 0.25) and all(slots)


# ------------------------------------------------------------------ quantize plans
@pytest.mark.parametrize("n", [1, 15, 16, 17, 4096, 1 << 20, (1 << 30) + 3])
def test_quantize_tensor_plan(n):
    P, grid = Q8.tensor_plan(n, H100_SMS)
    chunks = -(-n // 16)
    assert P == max(1, min(-(-chunks // (256 * 4)), 8 * H100_SMS))
    assert grid == max(1, min(-(-chunks // 256), 6 * H100_SMS))


@settings(max_examples=300, deadline=None)
@given(rows=st.integers(1, 10**7), n=st.integers(1, 10**7))
def test_quantize_rows_plan_covers_every_row(rows, n):
    G, block, grid = Q8.rows_plan(rows, n)
    assert G & (G - 1) == 0 and 4 <= G <= 512
    assert block % G == 0 and block <= 512  # the kernel's launch bounds
    assert grid * (block // G) >= rows > (grid - 1) * (block // G)
    assert G == 512 or G >= min(-(-n // 32), 4) and G < max(2 * -(-n // 32), 8)  # ~2 chunks a thread


def test_quantize_launches_match_the_kernel_signatures():
    sigs = {k: _kernel_params("quantize.cu", f"quantize_fp8_{k}") for k in ("amax", "tensor", "rows")}
    for dt in Q8.DTYPES:
        x, q, s = _Dev(size=5000, dtype=dt), _Dev(2 << 20, 5000, np.uint8), _Dev(3 << 20, 1)
        for compute in (True, False):
            ls = Q8.tensor_launches(dt, x, q, s, compute, H100_SMS, lambda P: _Dev(4 << 20, P))
            assert [n.split("<")[0] for n, *_ in ls] == (["quantize_fp8_amax"] if compute else []) + [
                "quantize_fp8_tensor"]
            for name, grid, block, args in ls:
                assert name in Q8.KERNELS.name_expressions and block == (256,)
                _check_args(sigs[name.split("<")[0][len("quantize_fp8_"):]], args, name)
            assert ls[-1][3][5] == (ls[0][1][0] if compute else 0)  # P partials, or none
            (name, grid, block, args), = Q8.rows_launches(dt, x, q, s, 50, 100, compute)
            _check_args(sigs["rows"], args, name)
            assert args[-1] == int(compute) and args[5] == 0  # 100 % 16: one element at a time
        assert Q8.tensor_launches(dt, _Dev(8, 5000, dt), q, s, True, 1, lambda P: _Dev())[0][3][2] == 0  # misaligned


# ------------------------------------------------------------------ the references
def _e4m3_table():
    """The 127 non-negative finite e4m3 values by bit pattern, from the format's definition
    (4 exponent bits, bias 7, 3 mantissa bits, subnormals at exponent 0, no infinities,
    S.1111.111 NaN): independent of ml_dtypes."""
    vals = []
    for code in range(127):
        e, m = code >> 3, code & 7
        vals.append(m / 8 * 2.0**-6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    return np.array(vals)


def _e4m3_by_table(v):
    """Saturating round-to-nearest-even of float64 values to e4m3 bits, by table search."""
    table = _e4m3_table()
    out = np.empty(v.shape, np.uint8)
    for i, x in np.ndenumerate(v):
        if np.isnan(x):
            out[i] = 0x7F
            continue
        a = min(abs(x), 448.0)
        j = int(np.searchsorted(table, a))  # table[j - 1] < a <= table[j]
        if j < len(table) and table[j] == a:
            code = j
        else:
            lo, hi = j - 1, j
            d_lo, d_hi = a - table[lo], table[hi] - a
            code = lo if d_lo < d_hi or (d_lo == d_hi and lo % 2 == 0) else hi
        out[i] = code | (0x80 if np.signbit(x) else 0)
    return out


def test_e4m3_decoding_matches_the_format():
    codes = np.arange(256, dtype=np.uint8)
    v = reference.e4m3_to_float(codes)
    assert np.isnan(v[0x7F]) and np.isnan(v[0xFF]) and np.isnan(v).sum() == 2
    assert np.array_equal(v[:127], _e4m3_table()) and np.array_equal(v[128:255], -_e4m3_table())
    assert v[0x7E] == 448.0 and v[0x01] == 2.0**-9 and v[0x08] == 2.0**-6 and v[0x38] == 1.0


def test_reference_rounding_against_the_table():
    # every float16 value (as float32: exact), scale 1 and scale 2^-3: the reference's
    # ml_dtypes cast after the clamp is the saturating round-to-nearest-even of the table
    h = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    h = h[np.isfinite(h) | np.isnan(h)]
    for s in (1.0, 0.125):
        q, scale = reference.quantize_fp8(h, scale=np.float32(s))
        with np.errstate(invalid="ignore"):  # (float16's signalling NaNs)
            want = _e4m3_by_table(h.astype(np.float64) / s)
        nan = np.isnan(h)
        assert np.array_equal(np.isnan(reference.e4m3_to_float(q)), nan)
        assert np.array_equal(q[~nan], want[~nan]), np.argwhere(q[~nan] != want[~nan])[:5]
        assert scale.dtype == np.float32 and scale.shape == () and scale == np.float32(s)


def test_reference_ties_saturation_nan():
    x = np.array([1.0625, 1.1875, 17, 19, 2.0**-10, 1.5 * 2.0**-9, 447, 448, 449, 464, 465, 1e9, -1e9, np.inf,
                  -np.inf, np.nan, 0.0, -0.0], np.float32)
    q, _ = reference.quantize_fp8(x, scale=1.0)
    v = reference.e4m3_to_float(q)
    want = [1.0, 1.25, 16, 20, 0.0, 2.0**-8, 448, 448, 448, 448, 448, 448, -448, 448, -448, np.nan, 0.0, -0.0]
    assert np.array_equal(v, want, equal_nan=True)
    assert np.signbit(v[-1]) and not np.signbit(v[-2])


@settings(max_examples=50, deadline=None)
@given(rows=st.integers(1, 8), n=st.integers(1, 300), mag=st.sampled_from([1e-3, 1.0, 300.0, 1e5]),
       seed=st.integers(0, 2**31 - 1), axis=st.sampled_from([None, -1]))
def test_reference_round_trip_within_e4m3_precision(rows, n, mag, seed, axis):
    x = (np.random.default_rng(seed).standard_normal((rows, n)) * mag).astype(np.float32)
    q, s = reference.quantize_fp8(x, axis=axis)
    assert q.dtype == np.uint8 and q.shape == x.shape and s.dtype == np.float32
    assert s.shape == ((rows,) if axis is not None else ())
    back = reference.dequantize_fp8(q, s, axis)
    sc = s.astype(np.float64)[:, None] if axis is not None else np.float64(s)
    # 3 mantissa bits: half an ulp is 2^-4 of the value in the normal range, 2^-10 of the
    # scale below it (the subnormal spacing is 2^-9); float32 division adds 2^-24
    bound = np.maximum(np.abs(x) * 2.0**-4, sc * 2.0**-10) * (1 + 1e-6)
    assert np.all(np.abs(back - x) <= bound)
    # the amax lands on +-448 exactly (per row or for the whole tensor)
    mags = np.abs(reference.e4m3_to_float(q))
    assert np.all(mags.max(axis=-1) == 448) if axis is not None else mags.max() == 448


def test_reference_amax_ignores_nan_and_zero_gives_one():
    x = np.array([[np.nan, 1.0, -3.0], [0.0, 0.0, 0.0], [np.nan] * 3], np.float32)
    q, s = reference.quantize_fp8(x, axis=-1)
    assert np.array_equal(s, np.array([3.0 / 448, 1.0, 1.0], np.float32))
    v = reference.e4m3_to_float(q)
    assert np.isnan(v[0, 0]) and v[0, 2] == -448 and np.all(v[1] == 0) and np.all(np.isnan(v[2]))
    q, s = reference.quantize_fp8(x)
    assert s == np.float32(3.0) / np.float32(448)
    assert reference.quantize_fp8(np.zeros((2, 0), np.float32), axis=-1)[1].tolist() == [1.0, 1.0]


def test_scaled_matmul_reference():
    rng = np.random.default_rng(0)
    a, b = bits((5, 32), 2), bits((32, 7), 3)
    sa, sb = rng.random(5).astype(np.float32), rng.random(7).astype(np.float32)
    bias = rng.standard_normal(7).astype(np.float32)
    A, B = reference.e4m3_to_float(a), reference.e4m3_to_float(b)
    want = np.array([[sum(A[m, k] * sa[m] * B[k, n] * sb[n] for k in range(32)) + bias[n] for n in range(7)]
                     for m in range(5)])
    for fa, fb in ((sa, sb), (sa[:, None], sb[None, :])):
        got = reference.scaled_matmul(a, b, fa, fb, bias)
        assert np.allclose(got, want, rtol=1e-12, atol=1e-9)
    got = reference.scaled_matmul(a, b, 0.5, np.float32(2.0))
    assert np.allclose(got, A @ B, rtol=1e-12)
    assert set(reference.TOLERANCE["scaled_matmul"]) == set(G8.OUT_TYPES)


def test_scale_args_of_a_one_value_device_array(monkeypatch):
    # a 0-d (or one-element) scale array stays an array with step 0; it must never be
    # compared with the "scalar" tag (a device array's == with a str raised TypeError on
    # the GPU)
    from cupyops.ops import fp8

    class Wary(np.ndarray):  # an array whose == with anything fails, as CuPy's does with a str
        def __eq__(self, other):
            raise TypeError("compared")

    s = np.asarray(np.float32(0.5)).view(Wary)
    monkeypatch.setattr(fp8._arrays, "to_device", lambda x, call: x)  # (no CuPy here)
    fake_cp = types.SimpleNamespace(ascontiguousarray=np.ascontiguousarray)
    arr, step, scalar = fp8._scale_args((s, 0), None, fake_cp)
    assert step == 0 and scalar == 1.0 and np.asarray(arr).reshape(-1)[0] == np.float32(0.5)
    assert fp8._scale_args(("scalar", 2.0), None, fake_cp) == (None, 0, 2.0)

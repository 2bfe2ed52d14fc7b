"""CPU tier: launch geometry, register-row plans, split plans, shared-memory sizing."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cupyops import _launch
from cupyops.ops import reduce

H100 = _launch.DeviceProps("H100", 90, 132, 2048, 227 * 1024, 228 * 1024, 50 * 2**20)


@given(n=st.integers(1, 1 << 16), dtype=st.sampled_from(["float32", "float16", "bfloat16"]))
@settings(max_examples=300, deadline=None)
def test_fused_row_plan_covers_the_row(n, dtype):
    plan = _launch.fused_row_plan(n, dtype)
    vec = 4 if dtype == "float32" else 8
    if plan is None:
        assert n > 512 * 32  # the largest register row: 512 threads x 32 floats
        return
    vecs, g = plan
    assert vecs in _launch.ROW_VECS[dtype]
    assert g & (g - 1) == 0 and 4 <= g <= min(512, _launch.row_max_threads(vecs, dtype))
    assert g * vecs * vec >= n
    assert g == 4 or g * vecs * vec < 2 * n  # no group twice the row


@given(n=st.integers(1, 1 << 20), itemsize=st.sampled_from([2, 4]),
       op=st.sampled_from(["softmax", "layer_norm", "rms_norm"]), cc=st.sampled_from([80, 90]))
@settings(max_examples=400, deadline=None)
def test_staged_row_plan(n, itemsize, op, cc):
    props = _launch.DeviceProps("GPU", cc, 132, 2048, 227 * 1024, 228 * 1024, 50 * 2**20)
    p = _launch.staged_row_plan(n, itemsize, op, props)
    if p is None:
        assert n * itemsize > 32 * 1024
        return
    assert p.smem <= props.smem_per_block_optin
    assert p.block & (p.block - 1) == 0 and 64 <= p.block <= 1024
    if p.cluster == 1:
        assert p.rows_per_block * p.group == p.block and p.group >= 4
        assert p.params in (0, _launch.STAGED_PARAM_ROWS[op])
        assert p.params == 0 or (p.rows_per_block > 1 and n * itemsize <= _launch.SHORT_ROW_BYTES)
        assert p.smem == (p.rows_per_block + p.params) * n * itemsize
    else:
        assert cc >= 90 and p.cluster in _launch.CLUSTER_SIZES and p.group == p.block
        assert p.cluster * p.chunk >= n and p.chunk * itemsize % 16 == 0 and p.smem == p.chunk * itemsize


@given(n=st.integers(16385, 1 << 20), dtype=st.sampled_from(["float32", "float16", "bfloat16"]))
@settings(max_examples=300, deadline=None)
def test_cluster_row_plan_covers_the_row(n, dtype):
    plan = _launch.cluster_row_plan(n, dtype)
    vec = 4 if dtype == "float32" else 8
    if plan is None:
        assert n > 8 * 512 * 32
        return
    vecs, cl, g, chunk = plan
    assert cl in _launch.CLUSTER_SIZES and chunk % vec == 0
    assert cl * chunk >= n and (cl - 1) * chunk < n + cl * vec
    assert g * vecs * vec >= chunk and g <= _launch.row_max_threads(vecs, dtype)


def test_long_rows_of_the_acceptance_shapes_fit_a_cluster():
    for dtype in ("float32", "float16", "bfloat16"):
        assert _launch.fused_row_plan(131072, dtype) is None
        assert _launch.cluster_row_plan(131072, dtype) is not None
        assert _launch.fused_row_plan(8192, dtype) is not None


@given(R=st.integers(1, 100000), n=st.integers(1, 1 << 26), impl=st.sampled_from(["naive", "block", "vector"]))
@settings(max_examples=300, deadline=None)
def test_split_plan_covers_rows(R, n, impl):
    S, L = reduce.split_plan(R, n, 132, impl, 4)
    assert S >= 1 and L >= 1
    assert S * L >= n and (S - 1) * L < n  # every segment non-empty
    if S > 1:
        assert L % 4 == 0


@given(R=st.integers(1, 64), n=st.integers(32768, 1 << 31), sms=st.sampled_from([1, 108, 132]))
@settings(max_examples=200, deadline=None)
def test_flat_plan_stays_resident(R, n, sms):
    # reduce_rows_flat's blocks must all be resident at once (FLAT_BLOCKS_PER_SM an SM,
    # the kernel's launch bounds) and each must have work
    P = reduce.flat_plan(R, n, sms)
    assert P >= 1
    assert R * P <= max(R, reduce.FLAT_BLOCKS_PER_SM * sms)
    assert P <= -(-n // reduce.FLAT_MIN_BLOCK_ELEMS)


def test_flat_plan_of_a_whole_array():
    assert reduce.flat_plan(1, 1 << 26, 132) == 3 * 132
    assert reduce.flat_plan(1, 65536, 132) == 8  # at least 8192 elements a block
    assert reduce.flat_plan(3, 200000, 132) == 25
    assert reduce.flat_plan(2, 1 << 26, 132, per_sm=4) == 2 * 132


def test_vector_group():
    assert reduce.vector_group(17, 4) == 4
    assert reduce.vector_group(8192, 4) == 256  # 8 vectors a thread: 2 batches of 4
    assert reduce.vector_group(1024, 2) == 32  # a 2 KB row: one batch of 4 vectors a thread
    assert reduce.vector_group(1024, 2, batches=2) == 16
    assert reduce.vector_group(2048, 2) == 32  # 4 KB: two batches
    assert reduce.vector_group(16384, 4) == 256  # capped: 16 vectors a thread
    assert reduce.vector_group(1 << 20, 2) == 256


@pytest.mark.parametrize("itemsize,n,impl", [(2, 1 << 20, "vector"), (4, 1 << 20, "vector"),
                                             (4, 1024, "vector"), (8, 8192, "block"),
                                             (8, 1024, "vector")])
def test_sum_auto_impl(itemsize, n, impl):
    assert reduce.auto_impl(itemsize, n) == impl


def test_check_smem():
    _launch.check_smem(227 * 1024, H100, "k")
    with pytest.raises(ValueError, match="needs 300000 bytes of shared memory per block; H100 allows at most"):
        _launch.check_smem(300000, H100, "k")


def test_cdiv_and_pow2():
    assert _launch.cdiv(10, 3) == 4 and _launch.cdiv(9, 3) == 3
    assert [_launch.pow2_ceil(v) for v in (1, 2, 3, 33, 1024)] == [1, 2, 4, 64, 1024]


class _FakeFunction:
    ptr = 0xF00D


class _FakeStream:
    ptr = 0x5EA


def test_direct_launch_packs_the_parameter_block():
    # what cuLaunchKernel would read: one pointer a parameter, each pointing at the
    # argument's bytes in its C type; the geometry padded to 3-D; the addresses of a call
    # written into the block before the launch
    import ctypes

    calls = []

    def driver_launch(*args):
        f, gx, gy, gz, bx, by, bz, smem, stream, params, extra = args
        slots = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
        read = [ctypes.cast(slots[0], ctypes.POINTER(ctypes.c_uint64)).contents.value,
                ctypes.cast(slots[1], ctypes.POINTER(ctypes.c_uint64)).contents.value,
                ctypes.cast(slots[2], ctypes.POINTER(ctypes.c_int64)).contents.value,
                ctypes.cast(slots[3], ctypes.POINTER(ctypes.c_int32)).contents.value,
                ctypes.cast(slots[4], ctypes.POINTER(ctypes.c_float)).contents.value]
        calls.append(((f, gx, gy, gz, bx, by, bz, smem, stream, extra), read))

    A = _launch.ADDRESS
    launch = _launch.DirectLaunch(_FakeFunction(), (7,), (256, 2), 4096,
                                  (A, A, np.int64(-(2**40)), np.int32(1000), np.float32(0.5)),
                                  driver_launch=driver_launch)
    launch(0x5EA, (0x7000_0000_1000, 0x7000_0000_2010))
    with pytest.raises(ValueError):  # one address short: nothing launched ...
        launch(0x5EA, (0x30,))
    launch(0x5EB, [0x10, 0x20])  # ... and the next call launches; the stream is the call's
    head = (0xF00D, 7, 1, 1, 256, 2, 1, 4096)
    assert calls == [(head + (0x5EA, 0), [0x7000_0000_1000, 0x7000_0000_2010, -(2**40), 1000, 0.5]),
                     (head + (0x5EB, 0), [0x10, 0x20, -(2**40), 1000, 0.5])]


def test_direct_launch_takes_addresses_between_scalars():
    # (the decode attention's arguments: pointers, scalars, then workspace pointers)
    import ctypes

    read = []

    def driver_launch(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        slots = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
        u64 = lambda i: ctypes.cast(slots[i], ctypes.POINTER(ctypes.c_uint64)).contents.value  # noqa: E731
        read.append((u64(0), ctypes.cast(slots[1], ctypes.POINTER(ctypes.c_int32)).contents.value, u64(2), u64(3)))

    A = _launch.ADDRESS
    launch = _launch.DirectLaunch(_FakeFunction(), (1,), (32,), 0, (A, np.int32(-3), np.uint64(0), A),
                                  driver_launch=driver_launch)
    launch(0, (0x1000, 0x2000))
    assert read == [(0x1000, -3, 0, 0x2000)]


def test_direct_launch_rejects_bad_geometry_and_scalar_types():
    fake = dict(driver_launch=lambda *a: None)
    with pytest.raises(ValueError, match="grid"):
        _launch.DirectLaunch(_FakeFunction(), (), (32,), 0, (_launch.ADDRESS,), **fake)
    with pytest.raises(TypeError, match="float16"):
        _launch.DirectLaunch(_FakeFunction(), (1,), (32,), 0, (np.float16(1),), **fake)


def test_launch_with_structs_passes_bytes_by_value():
    # a TMA tensor map goes as its 128 bytes, next to an array's address and C scalars
    import ctypes

    class _Array:
        data = type("Ptr", (), {"ptr": 0x7000_0000_0400})()

    calls = []

    def driver_launch(*args):
        f, gx, gy, gz, bx, by, bz, smem, stream, params, extra = args
        slots = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
        calls.append(((f, gx, gy, gz, bx, by, bz, smem, stream, extra),
                      ctypes.cast(slots[0], ctypes.POINTER(ctypes.c_uint64)).contents.value,
                      ctypes.cast(slots[1], ctypes.POINTER(ctypes.c_int32)).contents.value,
                      ctypes.cast(slots[2], ctypes.POINTER(ctypes.c_float)).contents.value,
                      ctypes.string_at(slots[3], 128)))

    struct = bytes(range(128))
    _launch.launch_with_structs(_FakeFunction(), (5, 2), (256,), 1024,
                                (_Array(), np.int32(-7), np.float32(1.5), struct),
                                driver_launch=driver_launch, current_stream=_FakeStream)
    assert calls == [((0xF00D, 5, 2, 1, 256, 1, 1, 1024, 0x5EA, 0), 0x7000_0000_0400, -7, 1.5, struct)]
    with pytest.raises(TypeError, match="float16"):
        _launch.launch_with_structs(_FakeFunction(), (1,), (32,), 0, (np.float16(1),),
                                    driver_launch=driver_launch, current_stream=_FakeStream)

"""The Hopper FlashAttention rung of kernels/attention_flash3.cu (sm_90a: wgmma + TMA, a
producer and two consumer warpgroups), and its launcher (the launcher-module interface is
described in _attention_problem.py).

``attention_flash3<T, D, BC, STAGES, SCHED>``: one block per (128 query rows, query head,
batch element), K and V tiles of BC keys through STAGES-deep rings, the consumers'
schedule SCHED (0 serial, 1 FlashAttention-3's intra-warpgroup overlap of softmax and
GEMMs, 2 that and pingpong between the two consumer warpgroups). ``config`` (see
``CONFIGS``) forces one; ``None`` takes the head_dim's first.

Q, K and V are read through 4-D tensor maps (head_dim, rows, heads, batch) of their own
strides, so any layout whose head_dim axis is contiguous runs without a copy, as long as
a map can describe it: 16-byte aligned tensors with strides that are multiples of 16
bytes (``supports`` says so otherwise).

It runs on compute capability 9.0 alone (``runs_here``): ``auto`` takes it there and
falls back to ``flash`` elsewhere.
"""
from .. import _dtypes, _launch, _tma
from .._kernels import SPLIT_COMPILE, KernelFile, template_name
from ._attention_problem import tensor_core_reason, tile_config

VARIANTS = {
    "flash3": "FlashAttention-3 on Hopper (sm_90a): a TMA producer warpgroup and two wgmma consumer "
    "warpgroups of 64 query rows, K and V tiles through mbarrier rings, S = Q K^T from shared memory, "
    "P V with P in registers, the softmax of one tile overlapping the GEMMs of the next and the two "
    "consumers taking turns on the tensor cores (float16, bfloat16; head_dim 64, 128, 256)",
}
DTYPES = {"flash3": ("float16", "bfloat16")}
ARCH = "sm_90a"
BR = 128  # query rows of a block
THREADS = 384
SERIAL, OVERLAP, PINGPONG = 0, 1, 2  # the consumers' schedule (the kernel's SCHED)
# head_dim -> {config: (BC, STAGES, SCHED)}; the first is the default. Names: c<BC>s<STAGES>
# and the schedule's letter (none: serial, o: overlap, p: pingpong). A stage holds K and V
# tiles of BC keys (2 * BC * D * 2 bytes) beside Q (128 * D * 2); 227 KB in all. The serial
# and overlap schedules stay as the ladder inside the rung (benchmarks/attention_sweep.py
# times each).
CONFIGS = {
    64: {"c128s2p": (128, 2, PINGPONG), "c128s2o": (128, 2, OVERLAP), "c128s2": (128, 2, SERIAL),
         "c128s4p": (128, 4, PINGPONG)},
    128: {"c128s2p": (128, 2, PINGPONG), "c128s2o": (128, 2, OVERLAP), "c128s2": (128, 2, SERIAL),
          "c128s3p": (128, 3, PINGPONG)},
    256: {"c64s2p": (64, 2, PINGPONG), "c64s2o": (64, 2, OVERLAP)},
}
HEAD_DIMS = tuple(CONFIGS)


def _name(dtype, hd, cfg):
    bc, stages, sched = CONFIGS[hd][cfg]
    return template_name("attention_flash3", _dtypes.cuda_type(dtype), hd, bc, stages, sched)


KERNELS = KernelFile("attention_flash3.cu", [_name(dt, hd, c) for dt in DTYPES["flash3"] for hd in CONFIGS
                                            for c in CONFIGS[hd]], options=SPLIT_COMPILE, arch=ARCH)
KERNEL_FILES = [KERNELS]


def smem_bytes(hd, cfg):
    """Q, the rings of K and V tiles, the 1024-byte alignment, the rings' barriers and Q's."""
    bc, stages, _ = CONFIGS[hd][cfg]
    return BR * hd * 2 + stages * 2 * bc * hd * 2 + _tma.SWIZZLE_ATOM_BYTES + 32 * stages + 8


def map_spec(arr_ptr, strides, rows, heads, batch, hd, box_rows):
    """(dims, byte strides, box) of the 4-D tensor map of one operand of element
    ``strides`` (batch, row, head), or None where a map cannot describe it. An axis of
    extent 1 is never stepped: its stride is replaced by a describable one."""
    sb, ss, sh = strides
    dims = (hd, rows, heads, batch)
    byte = [2 * ss, 2 * sh, 2 * sb]
    fill = 16 * -(-(2 * hd * max(rows, 1)) // 16)  # any multiple of 16 bytes will do for an unstepped axis
    for i, extent in enumerate(dims[1:]):
        if extent == 1:
            byte[i] = fill
    if not _tma.describable(arr_ptr, *byte):
        return None
    return dims, tuple(byte), (64, box_rows, 1, 1)


def _specs(p, cfg):
    bc = CONFIGS[p.D][cfg][0]
    return [map_spec(p.Q.data.ptr, p.q_strides, p.Sq, p.Hq, p.B, p.D, 64),
            map_spec(p.K.data.ptr, p.k_strides, p.Skv, p.Hkv, p.B, p.D, bc),
            map_spec(p.V.data.ptr, p.v_strides, p.Skv, p.Hkv, p.B, p.D, 64)]


def supports(impl, p, config=None):
    """None when ``flash3`` can run ``p``, else the reason (naming the argument)."""
    if impl != "flash3":
        return f"impl: unknown attention_flash3 rung {impl!r}; expected flash3"
    reason = _shape_reason(p)
    if reason is None and not p.aligned16():
        reason = "q: flash3 needs 16-byte aligned rows in q, k, v and out (pointers and strides)"
    if reason is None and None in _specs(p, config or next(iter(CONFIGS[p.D]))):
        reason = "q: flash3 needs q, k and v describable by tensor maps (strides multiples of 16 bytes)"
    return reason


def _shape_reason(p):
    return tensor_core_reason(p, "flash3", DTYPES["flash3"], HEAD_DIMS)


def plan(p, config=None):
    """The ``_launch.Launch`` for ``p`` (a plain function of numbers: the CPU tier checks
    it)."""
    cfg = tile_config(p, "flash3", CONFIGS, config, _shape_reason(p))
    grid = (_launch.cdiv(p.Sq, BR), p.Hq, p.B)
    return _launch.Launch(KERNELS, _name(p.dtype, p.D, cfg), grid, (THREADS,), smem_bytes(p.D, cfg),
                          "attention impl='flash3'")


def runs_here(props):
    return KERNELS.runs_on(props.cc) and _tma.available()


def launch(impl, p, config=None):
    """Run ``flash3`` on problem ``p`` on CuPy's current stream."""
    if p.B == 0 or p.Hq == 0 or p.Sq == 0:
        return
    props = _launch.device_props()
    if not runs_here(props):
        raise ValueError(f"impl: 'flash3' needs a compute-capability 9.0 GPU (H100, H200) and a driver with "
                         f"tensor maps; this is {props.name} (sm_{props.cc})")
    reason = supports(impl, p, config)
    if reason:
        raise ValueError(reason)
    cfg = config or next(iter(CONFIGS[p.D]))
    maps = []
    for arr, name, (dims, strides, box) in zip((p.Q, p.K, p.V), "qkv", _specs(p, cfg)):
        m = _tma.encode_tiled(arr.data.ptr, dims, strides, box)
        if m is None:
            raise RuntimeError(f"attention: the driver refused the tensor map of {name} (dims {dims}, byte strides "
                               f"{strides}, box {box})")
        maps.append(m)
    plan(p, cfg)(p.args() + tuple(maps))

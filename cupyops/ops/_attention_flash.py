"""The tensor-core FlashAttention rung of kernels/attention_flash.cu, and its launcher
(the launcher-module interface is described in _attention_problem.py).

``attention_flash<T, HD, MT, BC, SUB, WARPS, STAGES, QREG>``: one block per (BR query
rows, query head, batch element), WARPS warps of 16 * MT rows each (BR = 16 * MT *
WARPS), a STAGES-deep ring of KV tiles of BC keys. ``config`` (see ``CONFIGS``) forces
one; ``None`` takes the head_dim's default, the fastest in benchmarks/attention_sweep.py
on an H200 (results/h200-attention-sweep.txt): 32 rows a warp (two m16 tiles share every
K and V fragment), 64-key tiles, two blocks an SM. The configurations that need more
registers than 255 (Q in registers at head_dim 128, 128-key tiles) are left out: the CPU
tier fails on any spill.
"""
from .. import _dtypes, _launch
from .._kernels import KernelFile, template_name
from ._attention_problem import tensor_core_reason, tile_config

VARIANTS = {
    "flash": "FlashAttention-2 on tensor cores: mma.sync for Q K^T and P V with P kept in "
    "registers, ldmatrix from swizzled shared memory, cp.async double-buffered K/V tiles, "
    "causal tiles skipped (float16, bfloat16; head_dim 64, 128)",
}
DTYPES = {"flash": ("float16", "bfloat16")}

# head_dim -> {config name: (MT, BC, SUB, WARPS, STAGES, QREG)}; the first entry is the
# default. Spelled m<MT>c<BC>[x<SUB>]w<WARPS>s<STAGES>[q]: SUB keys of S live at a time
# (when less than the tile), q: Q fragments held in registers for the whole KV sweep.
def _cfg(mt, bc, sub, warps, stages, qreg):
    name = f"m{mt}c{bc}{f'x{sub}' if sub != bc else ''}w{warps}s{stages}{'q' if qreg else ''}"
    return name, (mt, bc, sub, warps, stages, qreg)


CONFIGS = {
    64: dict(_cfg(*c) for c in [(2, 64, 64, 4, 3, True), (2, 64, 64, 4, 2, True), (1, 64, 64, 4, 2, True)]),
    128: dict(_cfg(*c) for c in [(2, 64, 64, 4, 2, False), (2, 32, 32, 4, 4, False), (1, 64, 64, 8, 2, True)]),
}
HEAD_DIMS = tuple(CONFIGS)


def _name(dtype, hd, cfg):
    mt, bc, sub, warps, stages, qreg = CONFIGS[hd][cfg]
    return template_name("attention_flash", _dtypes.cuda_type(dtype), hd, mt, bc, sub, warps, stages,
                         "true" if qreg else "false")


def _expressions():
    return [_name(dt, hd, cfg) for dt in DTYPES["flash"] for hd in CONFIGS for cfg in CONFIGS[hd]]


KERNELS = KernelFile("attention_flash.cu", _expressions())
KERNEL_FILES = [KERNELS]


def supports(impl, p):
    """None when ``flash`` can run ``p``, else the reason (naming the argument)."""
    if impl != "flash":
        return f"impl: unknown attention_flash rung {impl!r}; expected flash"
    reason = _shape_reason(p)
    if reason is None and not p.aligned16():
        reason = "q: flash needs 16-byte aligned rows in q, k, v and out (pointers and strides)"
    if reason is None:
        reason = _launch.smem_reason(smem_bytes(p.D, next(iter(CONFIGS[p.D]))), f"head_dim: flash at head_dim {p.D}")
    return reason


def _shape_reason(p):
    return tensor_core_reason(p, "flash", DTYPES["flash"], HEAD_DIMS)


def smem_bytes(hd, cfg):
    """Q tile plus the STAGES-deep ring of K and V tiles, 2-byte elements."""
    mt, bc, _, warps, stages, _ = CONFIGS[hd][cfg]
    return 16 * mt * warps * hd * 2 + stages * 2 * bc * hd * 2


def plan(p, config=None):
    """(kernel name, grid, block, dynamic shared memory bytes) for ``p``: a plain function
    of numbers so the CPU tier can check it."""
    cfg = tile_config(p, "flash", CONFIGS, config, _shape_reason(p))
    cfgs = CONFIGS[p.D]
    mt, _, _, warps = cfgs[cfg][:4]
    br = 16 * mt * warps
    grid = (_launch.cdiv(p.Sq, br), p.Hq, p.B)
    return _name(p.dtype, p.D, cfg), grid, (32 * warps,), smem_bytes(p.D, cfg)


_PLANS = {}  # memoized plans (shape_key, config)


def launch(impl, p, config=None):
    """Run ``flash`` on problem ``p`` on CuPy's current stream."""
    if p.B == 0 or p.Hq == 0 or p.Sq == 0:
        return
    key = (p.shape_key(), config)
    if key not in _PLANS or not p.aligned16():  # plans are memoized on shapes; alignment is per call
        reason = supports(impl, p)
        if reason:
            raise ValueError(reason)
    pl = _launch.memo(_PLANS, key, lambda: plan(p, config))
    name, grid, block, smem = pl
    fn = KERNELS.function(name)
    _launch.request_smem(fn, smem, _launch.device_props(), "attention_flash")
    fn(grid, block, p.args(), shared_mem=smem)

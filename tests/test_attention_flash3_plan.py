"""CPU tier for the Hopper attention launcher (cupyops/ops/_attention_flash3.py): what it
refuses and why, the tensor maps it describes for each layout, and that every plan names
a compiled kernel with a legal grid and shared memory that fits."""
import dataclasses

import pytest

from cupyops.ops import _attention_flash3 as W
from attention_stubs import problem

SMEM_OPTIN = 227 * 1024  # H100/H200 per-block opt-in


_problem = problem


@pytest.mark.parametrize("kw, prefix", [
    ({"dtype": "float32"}, "q: flash3 supports float16, bfloat16"),
    ({"D": 80}, "head_dim: flash3 supports 64, 96, 128, 256"),
    ({"D": 160}, "head_dim: flash3 supports 64, 96, 128, 256"),
    ({"scale": 0.0}, "scale: flash3 needs a positive scale"),
    ({"B": 70000}, "q: flash3 supports at most 65535"),
    ({"ptr": 8}, "q: flash3 needs 16-byte aligned rows"),
    ({"stride": (1000, 132, 4)}, "q: flash3 needs 16-byte aligned rows"),
])
def test_supports_names_the_argument(kw, prefix):
    reason = W.supports("flash3", _problem(**kw))
    assert reason is not None and reason.startswith(prefix), reason
    assert W.supports("flash3", _problem()) is None
    assert W.supports("flash", _problem()).startswith("impl: unknown attention_flash3 rung")


@pytest.mark.parametrize("D", W.HEAD_DIMS)
def test_plans(D):
    p = _problem(D=D, Sq=300, Hq=8, B=2)  # 3 x 8 x 2 = 48 work tiles of 128 rows, 32 of 192
    assert W.work_tiles(p) == 48 and W.work_tiles(p, 192) == 32
    for cfg, c in W.CONFIGS[D].items():
        pl = W.plan(p, cfg)
        tiles = -(-300 // c.rows) * 8 * 2
        assert pl.name in W.KERNELS.name_expressions
        assert pl.name == f"attention_flash3<__nv_bfloat16, {D}, {c.bc}, {c.stages}, {c.sched}, {c.consumers}, 0>"
        windowed = W.plan(dataclasses.replace(p, window_left=64), cfg).name
        assert windowed == pl.name.replace(", 0>", ", 1>") and windowed in W.KERNELS.name_expressions
        assert cfg == ("" if c.rows == 128 else f"m{c.rows}") + f"c{c.bc}s{c.stages}" + \
            {W.SERIAL: "", W.OVERLAP: "o", W.PINGPONG: "p"}[c.sched] + ("_pg" if c.persistent else "")
        assert pl.grid == (tiles,) and pl.block == (128 * (c.consumers + 1),) and pl.cluster == 1
        assert W.plan(p, cfg, sm_count=20).grid == ((20,) if c.persistent else (tiles,))
        dpad = {96: 128}.get(D, D)  # head_dim 96 is held as 128
        q, kv = c.rows * dpad * 2, c.stages * 2 * c.bc * dpad * 2
        # two Q buffers where they fit in 227 KB beside the rings, else one (a full and an
        # empty barrier each)
        qs = 2 if 2 * q + kv + 1024 + 32 * c.stages + 32 <= 227 * 1024 else 1
        assert W.q_stages(D, cfg) == qs
        assert pl.smem == qs * q + kv + 1024 + 32 * c.stages + 16 * qs <= SMEM_OPTIN
    # the defaults: the full schedule, on a persistent grid without a mask; under a causal
    # one (the stub problem is causal) one block a work tile, but for head_dim 64's
    # three-consumer tiles (NOTES 81)
    assert W.CONFIGS[D][next(iter(W.CONFIGS[D]))][2:4] == (W.PINGPONG, True)
    assert W.CONFIGS[D][W.CAUSAL_CONFIG[D]][2:4] == (W.PINGPONG, D == 64)
    assert W.default_config(p) == W.CAUSAL_CONFIG[D]
    assert W.plan(p).name == W.plan(p, W.CAUSAL_CONFIG[D]).name
    p.causal = False
    assert W.default_config(p) == next(iter(W.CONFIGS[D]))  # (700 keys)
    assert W.plan(p, sm_count=20).grid == (20,)
    p.Skv = 16384  # (long sequences take the same tiles: NOTES 117)
    assert W.default_config(p) == next(iter(W.CONFIGS[D]))
    assert W.CONFIGS[D][W.default_config(p)][2:4] == (W.PINGPONG, True)
    with pytest.raises(ValueError, match="config"):
        W.plan(p, "c64s9")
    assert W.KERNELS.arch == "sm_90a" and W.KERNELS.runs_on(90) and not W.KERNELS.runs_on(80)
    assert len(set(W.KERNELS.name_expressions)) == len(W.KERNELS.name_expressions)


def test_head_groups_keep_k_and_v_in_l2():
    l2 = 50 * 2**20
    # S 8192, D 128: 4 MiB of K and V a KV head; 25 MiB hold 6 of them
    assert W.head_group(_problem(D=128, Sq=8192, Skv=8192, Hq=32, Hkv=8, B=1), l2) == 6 * 4
    assert W.head_group(_problem(D=128, Sq=8192, Skv=8192, Hq=16, Hkv=16, B=4), l2) == 6
    # short sequences: every head in one group; a KV head larger than the share: one
    assert W.head_group(_problem(D=64, Sq=1024, Skv=1024, Hq=8, Hkv=8, B=2), l2) == 16
    assert W.head_group(_problem(D=256, Sq=64, Skv=65536, Hq=4, Hkv=1, B=1), l2) == 4
    assert W.head_group(_problem(D=256, Sq=64, Skv=65536, Hq=4, Hkv=4, B=1), l2) == 1
    # without a mask (and with share 0) a group is one KV head's query heads
    p = _problem(D=128, Sq=8192, Skv=8192, Hq=32, Hkv=8, B=1)
    p.causal = False
    assert W.head_group(p, l2) == 4
    assert W.head_group(_problem(D=128, Sq=8192, Skv=8192, Hq=32, Hkv=8, B=1), l2, share=0) == 4


def test_tensor_maps_describe_both_layouts():
    B, S, H, D = 2, 300, 8, 128
    # bshd: element strides (batch, seq, head) = (S*H*D, H*D, D)
    dims, strides, box = W.map_spec(1 << 20, (S * H * D, H * D, D), S, H, B, D, 64)
    assert dims == (D, S, H, B) and strides == (2 * H * D, 2 * D, 2 * S * H * D) and box == (64, 64, 1, 1)
    # bhsd: (H*S*D, D, S*D)
    dims, strides, box = W.map_spec(1 << 20, (H * S * D, D, S * D), S, H, B, D, 128)
    assert strides == (2 * D, 2 * S * D, 2 * H * S * D) and box == (64, 128, 1, 1)
    # extent-1 axes are never stepped: their strides (0 in the problem) become describable ones
    dims, strides, _ = W.map_spec(1 << 20, (0, H * D, 0), S, 1, 1, D, 64)
    assert all(s > 0 and s % 16 == 0 for s in strides)
    assert W.map_spec((1 << 20) + 2, (S * H * D, H * D, D), S, H, B, D, 64) is None  # misaligned start
    assert W.map_spec(1 << 20, (S * H * D, H * D + 4, D), S, H, B, D, 64) is None  # row stride of 8 bytes more


def test_refusal_off_sm90_names_the_gpu(monkeypatch):
    import types

    from cupyops import _tma

    a100 = types.SimpleNamespace(cc=80, name="NVIDIA A100-SXM4-80GB")
    why = _tma.sm90a_reason(W.KERNELS, a100, "'flash3'")
    assert why == "'flash3' runs on compute capability 9.0 GPUs (H100, H200) alone; this is NVIDIA A100-SXM4-80GB (sm_80)"
    assert not W.runs_here(a100)
    h100 = types.SimpleNamespace(cc=90, name="NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(_tma, "available", lambda: False)  # a driver without the tensor-map encoder
    assert "cuTensorMapEncodeTiled" in _tma.sm90a_reason(W.KERNELS, h100, "'flash3'")
    monkeypatch.setattr(_tma, "available", lambda: True)
    assert _tma.sm90a_reason(W.KERNELS, h100, "'flash3'") is None and W.runs_here(h100)


@pytest.mark.parametrize("D", W.HEAD_DIMS)
def test_packed_sequences_take_one_block_a_tile_and_the_packed_rows_in_their_maps(D):
    import dataclasses

    p = dataclasses.replace(_problem(D=D, Sq=4096, Skv=4096, B=8), causal=False, cu_q=object(), cu_k=object(),
                            total_q=9000, total_k=9100)
    cfg = W.default_config(p)
    assert not W.CONFIGS[D][cfg].persistent
    assert cfg + "_pg" == W.default_config(dataclasses.replace(p, cu_q=None))
    dims = [spec[0] for spec in W._specs(p, cfg)]
    assert dims[0][1:] == (9000, p.Hq, 1) and dims[1][1:] == dims[2][1:] == (9100, p.Hkv, 1)
    assert dims[3] == dims[0]  # out: the packed query rows (the tensor-store epilogue)


def test_the_output_map_is_out_s_own():
    # out in bhsd beside a bshd q (the epilogue stores through a map of out's strides), and
    # an out whose strides no map describes makes flash3 refuse the problem, naming out
    import dataclasses

    from attention_stubs import array

    p = _problem(D=128, Sq=300, Skv=300, Hq=8, Hkv=8, B=2)
    S, H, D = 300, 8, 128
    p = dataclasses.replace(p, O=array(1 << 21), o_strides=(H * S * D, D, S * D))
    specs = W._specs(p, W.default_config(p))
    assert specs[0][1] == (2 * H * D, 2 * D, 2 * S * H * D)  # q: bshd
    assert specs[3] == ((D, S, H, 2), (2 * D, 2 * S * D, 2 * H * S * D), (64, 64, 1, 1))  # out: bhsd
    bad = dataclasses.replace(p, o_strides=(H * S * D, D, -S * D))  # heads reversed: no map steps back
    assert bad.aligned16()
    assert W.supports("flash3", bad) == ("q: flash3 needs q, k, v and out describable by tensor maps "
                                         "(strides multiples of 16 bytes)")

"""CPU tier for flash3's sliding windows and soft caps (cupyops/ops/_attention_flash3.py):
that it takes them (each in the instantiation of its own that the plan names), the keys a
row sees that its plan is made for, and a model of the kernel's K/V tile range (kv_range
in kernels/attention_flash3.cu) checked against the mask it must cover, row by row."""
import dataclasses

import numpy as np
import pytest

from cupyops import reference
from cupyops.ops import _attention_flash3 as W
from cupyops.ops._attention_decode import first_key, key_end
from attention_stubs import problem


def test_takes_windows_and_caps_each_in_its_own_instantiation():
    p = problem()
    cases = [({}, 0), ({"window_left": 100}, W.WINDOW), ({"window_right": 3, "causal": False}, W.WINDOW),
             ({"window_left": 0, "window_right": 0}, W.WINDOW), ({"softcap": 30.0}, W.WINDOW | W.CAP),
             ({"softcap": 30.0, "window_left": 7}, W.WINDOW | W.CAP)]
    for kw, mask in cases:
        q = dataclasses.replace(p, **kw)
        assert W.supports("flash3", q) is None, kw
        assert W.masks(q) == mask, kw
        name = W.plan(q).name
        assert name.endswith(f", {mask}>"), (kw, name)
        assert name in W.KERNELS.name_expressions, (kw, name)  # compiled by the CPU tier's compile test


@pytest.mark.parametrize("causal, left, right, keys", [
    (True, -1, -1, 700), (False, -1, -1, 700),
    (True, 100, -1, 101), (True, 100, 5, 101),  # (a causal mask ends the right side)
    (False, 100, 5, 106), (False, -1, 5, 700), (False, 0, 0, 1), (False, 2000, 2000, 700),
])
def test_row_keys(causal, left, right, keys):
    p = dataclasses.replace(problem(Skv=700), causal=causal, window_left=left, window_right=right)
    assert W.row_keys(p) == keys


def test_windows_choose_groups_by_the_keys_a_row_sees():
    p = dataclasses.replace(problem(D=128, Sq=16384, Skv=16384), causal=False)
    for left, right in ((-1, -1), (2048, 0), (8192, 8192)):  # (the tiles do not depend on the keys)
        assert W.default_config(dataclasses.replace(p, window_left=left, window_right=right)) == "c128s2p_pg"
    l2 = 50 * 2**20
    p = dataclasses.replace(problem(D=128, Sq=8192, Skv=8192, Hq=32, Hkv=8, B=1), causal=True)
    assert W.head_group(p, l2) == 6 * 4  # 4 MiB of K and V a KV head
    # a window of 1024 keys: a work tile reads (1024 + 128) keys of a KV head, 576 KiB: all
    # 8 KV heads' fit in the share
    assert W.head_group(dataclasses.replace(p, window_left=1023), l2) == 32


# A model of kv_range (kernels/attention_flash3.cu), on the models of the attention_common.cuh
# helpers it calls (_attention_decode's, checked against the definition in
# tests/test_decode_masks_plan.py), in the kernel's int arithmetic.
def _kv_range(q0, br, bc, sq, skv, causal, off, wl, wr):
    if q0 >= sq:
        return 0, 0
    end = key_end(min(q0 + br, sq) - 1, skv, causal, off, wr)
    first = first_key(q0, wl, off)
    if end <= first:
        return 0, 0
    j0 = first // bc
    return j0, -(-end // bc) - j0


@pytest.mark.parametrize("sq, skv", [(1, 1), (17, 300), (300, 17), (513, 1000), (1000, 513)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("wl, wr", [(-1, -1), (0, 0), (5, -1), (-1, 7), (100, 3), (200, 0), (1, 300)])
@pytest.mark.parametrize("br, bc", [(128, 128), (192, 128), (128, 176), (128, 80)])
def test_the_tile_range_covers_every_visible_key_and_no_tile_beyond(sq, skv, causal, wl, wr, br, bc):
    for off in {0, skv - sq}:
        j = np.arange(skv)[None, :]
        mask = reference.attention_mask(sq, skv, causal, off, (wl, wr))
        for q0 in range(0, sq, br):
            rows = mask[q0:q0 + br]
            j0, n = _kv_range(q0, br, bc, sq, skv, causal, off, wl, wr)
            seen = np.flatnonzero(rows.any(axis=0))
            if seen.size == 0:
                # nothing to see: no tile (or only tiles no row sees: all masked)
                assert n == 0 or not rows[:, j0 * bc:(j0 + n) * bc].any()
                continue
            # every visible key lies in the range; its first and last tiles hold visible keys
            assert j0 * bc <= seen[0] and seen[-1] < (j0 + n) * bc
            assert seen[0] // bc == j0 and seen[-1] // bc == j0 + n - 1
            # each row's [first_key, key_end) is its mask row, as the consumers mask it
            for r in range(rows.shape[0]):
                lo, hi = first_key(q0 + r, wl, off), key_end(q0 + r, skv, causal, off, wr)
                assert np.array_equal(rows[r], (j[0] >= lo) & (j[0] < hi))

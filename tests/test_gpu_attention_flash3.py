"""GPU tier for the Hopper attention rung (cupyops/ops/_attention_flash3.py) beyond what
test_gpu_attention.py draws for every rung: fixed cases at its own tile sizes (more than
one K/V tile, more than one query tile, the ring wrapping), every tile configuration,
strided views and large scores, each against the float64 reference as the ladder's tests
do (test_gpu_attention.run_case: out= poisoned with NaN, LSE, rows that see no key, both
layouts, GQA, both causal alignments, edges in both lengths)."""
import pytest

from cupyops import _launch
from cupyops.ops import _attention_flash3

pytestmark = pytest.mark.gpu


@pytest.fixture
def rung():
    if not _attention_flash3.runs_here(_launch.device_props()):
        pytest.skip("flash3 runs on sm_90")
    return "flash3"


CASES = [  # (B, Sq, Skv, Hq, Hkv, D, causal, align, layout)
    (1, 1, 1, 1, 1, 64, False, "top_left", "bshd"),
    (2, 77, 130, 4, 2, 64, False, "top_left", "bshd"),
    (2, 130, 77, 4, 1, 128, True, "top_left", "bshd"),
    (1, 300, 300, 8, 2, 128, True, "bottom_right", "bhsd"),
    (1, 129, 600, 2, 2, 64, True, "bottom_right", "bshd"),
    (1, 600, 129, 2, 2, 128, True, "bottom_right", "bhsd"),  # rows that see no key
    (2, 256, 256, 2, 2, 128, False, "top_left", "bhsd"),
    (1, 1024, 1024, 4, 4, 128, True, "top_left", "bshd"),
    (1, 200, 333, 4, 2, 256, True, "bottom_right", "bshd"),
    (2, 130, 130, 2, 2, 256, False, "top_left", "bhsd"),
    (1, 700, 700, 2, 1, 64, True, "top_left", "bhsd"),  # many tiles: the rings wrap several times
    (2, 1100, 300, 8, 2, 128, True, "bottom_right", "bshd"),  # 144 work tiles: blocks of a persistent grid take several
    (1, 200, 333, 4, 2, 96, True, "bottom_right", "bshd"),  # head_dim 96: held as 128
    (2, 130, 77, 2, 1, 96, False, "top_left", "bhsd"),
]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}xSq{}xSkv{}xH{}/{}xD{}{}".format(
    *c[:6], f"-causal-{c[7]}" if c[6] else ""))
def test_matches_reference(rung, dtype, case):
    from test_gpu_attention import run_case

    B, Sq, Skv, Hq, Hkv, D, causal, align, layout = case
    assert run_case(rung, dtype, B, Sq, Skv, Hq, Hkv, D, causal=causal, align=align, layout=layout)


@pytest.mark.parametrize("D", _attention_flash3.HEAD_DIMS)
def test_every_config(rung, D, monkeypatch):
    from test_gpu_attention import run_case

    for cfg in _attention_flash3.CONFIGS[D]:
        real = _attention_flash3.launch
        monkeypatch.setattr(_attention_flash3, "launch", lambda impl, p, config=None, _c=cfg: real(impl, p, _c))
        assert run_case(rung, "bfloat16", 1, 200, 333, 4, 2, D, causal=True, align="bottom_right", big=True)
        # more work tiles than SMs (a persistent block takes several), several K/V tiles
        assert run_case(rung, "float16", 2, 1100, 300, 16, 4, D, layout="bhsd")
        monkeypatch.setattr(_attention_flash3, "launch", real)


def test_strided_views_and_large_scores(rung):
    from test_gpu_attention import run_case

    for view in ("padded", "heads"):  # rows or heads further apart: the tensor maps take the strides
        assert run_case(rung, "float16", 2, 100, 200, 4, 2, 64, view=view)
    assert not run_case(rung, "float16", 1, 100, 200, 2, 1, 64, view="offset")  # misaligned: refused
    assert run_case(rung, "float16", 1, 100, 200, 2, 1, 128, big=True)  # scores of magnitude ~300

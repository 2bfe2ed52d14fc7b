"""CPU tier: cupyops.models.llama's config checks, safetensors reader and rope frequencies
(no GPU: the parts that are plain Python and NumPy)."""
import json
import struct

import numpy as np
import pytest

from cupyops.models import llama

BASE = dict(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)


def test_config_defaults_follow_transformers():
    cfg = llama.LlamaConfig.from_dict(BASE)
    assert cfg.num_key_value_heads == 4 and cfg.head_dim == 16 and cfg.rope_theta == 10000.0
    assert cfg.dtype == "bfloat16" and not cfg.tie_word_embeddings
    assert llama.LlamaConfig.from_dict({**BASE, "num_key_value_heads": 1, "head_dim": 32}).head_dim == 32


def test_config_reads_transformers_5_rope_parameters():
    # transformers 5 writes rope_theta and the scaling together as rope_parameters
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192, "rope_theta": 500000.0}
    cfg = llama.LlamaConfig.from_dict({**BASE, "rope_parameters": scaling})
    assert cfg.rope_theta == 500000.0 and cfg.rope_scaling["rope_type"] == "llama3"
    plain = llama.LlamaConfig.from_dict({**BASE, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}})
    assert plain.rope_theta == 1e6 and plain.rope_scaling is None


def test_config_reads_a_sliding_window():
    # Mistral's: each token sees itself and the sliding_window - 1 tokens before it
    cfg = llama.LlamaConfig.from_dict({**BASE, "sliding_window": 4096})
    assert cfg.sliding_window == 4096 and cfg.window == (4095, 0)
    for off in ({}, {"sliding_window": None}, {"sliding_window": 4096, "use_sliding_window": False}):
        cfg = llama.LlamaConfig.from_dict({**BASE, **off})
        assert cfg.sliding_window is None and cfg.window is None


@pytest.mark.parametrize("extra, match", [
    ({"attention_bias": True}, "attention_bias"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"sliding_window": 0}, "sliding_window must be a positive int"),
    ({"sliding_window": 4096.0}, "sliding_window must be a positive int"),
    ({"sliding_window": 4096, "max_window_layers": 28}, "max_window_layers"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling"),
    ({"torch_dtype": "int8"}, "torch_dtype"),
])
def test_config_refuses_what_the_runner_does_not_compute(extra, match):
    with pytest.raises(ValueError, match=match):
        llama.LlamaConfig.from_dict({**BASE, **extra})


def _write_safetensors(path, tensors):
    header, blobs, at = {}, [], 0
    for name, (kind, arr) in tensors.items():
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": kind, "shape": list(arr.shape), "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    head = json.dumps({**header, "__metadata__": {"format": "pt"}}).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def test_safetensors_reader_gives_every_tensor_and_bf16_bits(tmp_path):
    f32 = np.arange(6, dtype=np.float32).reshape(2, 3)
    bf16_bits = np.array([0x3F80, 0x4000, 0xC040], np.uint16)  # 1.0, 2.0, -3.0
    f16 = np.array([[0.5, -1.5]], np.float16)
    path = tmp_path / "m.safetensors"
    _write_safetensors(path, {"a": ("F32", f32), "b": ("BF16", bf16_bits), "c": ("F16", f16)})
    got = llama.read_safetensors(str(path))
    assert sorted(got) == ["a", "b", "c"]
    np.testing.assert_array_equal(got["a"][0], f32)
    assert got["b"][1] == "BF16" and got["b"][0].dtype == np.uint16
    np.testing.assert_array_equal(got["b"][0], bf16_bits)
    np.testing.assert_array_equal(got["c"][0], f16)


def test_safetensors_reader_refuses_other_dtypes(tmp_path):
    path = tmp_path / "m.safetensors"
    _write_safetensors(path, {"i": ("I64", np.arange(3, dtype=np.int64))})
    with pytest.raises(ValueError, match="I64"):
        llama.read_safetensors(str(path))


def test_rope_frequencies_and_llama3_scaling():
    cfg = llama.LlamaConfig.from_dict({**BASE, "head_dim": 128, "rope_theta": 500000.0})
    inv = llama._rope_inv_freq(cfg)
    np.testing.assert_allclose(inv, 500000.0 ** (-np.arange(0, 128, 2) / 128), rtol=1e-7)
    scaled = llama._rope_inv_freq(llama.LlamaConfig.from_dict({**BASE, "head_dim": 128, "rope_theta": 500000.0,
                                                                "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                                                                                 "low_freq_factor": 1.0,
                                                                                 "high_freq_factor": 4.0,
                                                                                 "original_max_position_embeddings": 8192}}))
    wavelen = 2 * np.pi / inv
    short, long_ = wavelen < 8192 / 4, wavelen > 8192 / 1
    # Llama 3: wavelengths shorter than old_context / high_freq_factor keep their frequency,
    # longer than old_context / low_freq_factor are slowed by the factor, between: a blend
    np.testing.assert_array_equal(scaled[short], inv[short])
    np.testing.assert_allclose(scaled[long_], inv[long_] / 8.0, rtol=1e-6)
    mid = ~short & ~long_
    assert mid.any() and np.all(scaled[mid] <= inv[mid]) and np.all(scaled[mid] >= inv[mid] / 8.0)
    lin = llama._rope_inv_freq(llama.LlamaConfig.from_dict({**BASE, "rope_scaling": {"type": "linear", "factor": 2.0}}))
    np.testing.assert_allclose(lin, llama._rope_inv_freq(llama.LlamaConfig.from_dict(BASE)) / 2.0, rtol=1e-7)

"""CPU tier: how the operators sort their arguments into native (CuPy, NumPy, Python) and
foreign arrays (cupyops/_interop.py), and that a foreign host array's bad input is named
before anything runs. Torch and JAX are not needed: stand-ins export DLPack or the CUDA
array interface as those libraries do."""
import numpy as np
import pytest

import cupyops
from cupyops import _interop


class HostProducer:
    """A DLPack producer of a host array (as a CPU torch tensor or JAX array is)."""

    def __init__(self, a):
        self.a = np.asarray(a)

    def __dlpack__(self, **kwargs):
        return self.a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


class CaiProducer:
    __cuda_array_interface__ = {"shape": (1,), "typestr": "<f4", "data": (0, False), "version": 3}


def test_kinds():
    assert _interop.kind_of(np.zeros(3)) == "plain"
    for v in (1, 2.0, None, "s", (1, 2), [1], np.float32(1)):
        assert _interop.kind_of(v) == "plain", v
    assert _interop.kind_of(HostProducer([1.0])) == "dlpack"
    assert _interop.kind_of(CaiProducer()) == "cai"
    fake_torch = type("Tensor", (), {"__module__": "torch", "__dlpack__": lambda s: None})
    fake_jax = type("ArrayImpl", (), {"__module__": "jaxlib.xla_extension", "__dlpack__": lambda s: None})
    assert _interop.kind_of(fake_torch()) == "torch" and _interop.kind_of(fake_jax()) == "jax"
    # a subclass of torch.Tensor from another package (nn.Parameter's kind, torchao's)
    sub = type("QuantTensor", (fake_torch,), {"__module__": "torchao.dtypes"})
    assert _interop.kind_of(sub()) == "torch"
    assert _interop.kind_of(object()) == "plain"  # not an array at all: the operator says so


def test_foreign_host_arrays_are_checked_as_numpy_before_anything_runs():
    # no GPU needed: the checks fail before CuPy is asked for
    with pytest.raises(TypeError, match="x: dtype bool is not supported"):
        cupyops.softmax(HostProducer(np.zeros((2, 3), bool)))
    with pytest.raises(ValueError, match="weight: expected shape"):
        cupyops.rms_norm(HostProducer(np.zeros((2, 8), np.float32)), HostProducer(np.ones(4, np.float32)))
    with pytest.raises(ValueError, match="axis"):
        cupyops.sum(HostProducer(np.zeros((2, 3), np.float32)), axis=5)


def test_every_operator_is_wrapped():
    for name in ("softmax", "layer_norm", "rms_norm", "sum", "max", "amax", "trace", "matmul", "gemm",
                 "attention", "scaled_matmul", "quantize_fp8"):
        fn = getattr(cupyops, name)
        assert hasattr(fn, "__wrapped__") and fn.__doc__ == fn.__wrapped__.__doc__, name

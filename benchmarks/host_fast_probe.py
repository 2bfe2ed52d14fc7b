"""Host time of a remembered (fast-path) call on (8, 4096) bfloat16, us a call, and its
pieces, all measured side by side (``timing.host_overhead_side_by_side_us``: rounds
interleaved, so that the host's drift falls on every line alike), ``--passes`` times.

First table: softmax, sum(axis=-1) and rms_norm, cupyops on torch tensors, cupyops on CuPy
arrays, and torch's own call. Then the pieces of a torch call: the output forms torch
offers, the stream, address and signature queries, the device query (CuPy's getDevice, and
cuCtxGetDevice as _cfast calls it), the key lookup (a flat key against one holding a
torch.Size), the dispatch alone (the operator's wrapper and Finder reaching a stand-in
FastCall), the Replay alone (torch: output, addresses, stream, launch; CuPy: the kept output
and the launch) and a bare DirectLaunch through CuPy's driver wrapper. Every cupyops call
timed must take the fast path: the checked path's runs during the measure are counted.

    python benchmarks/host_fast_probe.py                      # the C fast path (default)
    CUPYOPS_FAST_C=0 python benchmarks/host_fast_probe.py     # the Python steps
    [--passes 2] [--calls 4000]
"""
import argparse
import types

import cupy as cp
import torch
import torch.nn.functional as F

import cupyops
from cupyops import _fast, _interop, _launch
from cupyops.bench.timing import host_overhead_side_by_side_us
from cupyops.ops import norm, reduce, softmax
from cupyops.ops import _rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--calls", type=int, default=4000)
    args = ap.parse_args()

    shape, n = (8, 4096), 4096
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(shape, generator=g).to("cuda", torch.bfloat16)
    w = torch.randn((n,), generator=g).to("cuda", torch.bfloat16)
    xc, wc = cp.from_dlpack(x), cp.from_dlpack(w)
    dev, bf16 = x.get_device(), torch.bfloat16

    ops = {  # op -> (cupyops on torch, cupyops on CuPy, torch's own)
        "softmax": (lambda: cupyops.softmax(x), lambda: cupyops.softmax(xc), lambda: torch.softmax(x, -1)),
        "sum": (lambda: cupyops.sum(x, axis=-1), lambda: cupyops.sum(xc, axis=-1), lambda: torch.sum(x, -1)),
        "rms_norm": (lambda: cupyops.rms_norm(x, w), lambda: cupyops.rms_norm(xc, wc),
                     lambda: F.rms_norm(x, (n,), w, eps=1e-6)),
    }
    fasts = {"softmax": softmax._FAST, "sum": reduce._FAST["sum"], "rms_norm": norm._FAST["rms_norm"]}
    for calls in ops.values():
        for f in calls:
            f(), f()  # checked (remembered), then fast
    checked = []
    for name, fast in fasts.items():  # count the checked path's runs from here on
        fast.checked = (lambda f, nm: lambda *a, **k: checked.append(nm) or f(*a, **k))(fast.checked, name)

    # the softmax FastCall the calls above remembered, and a stand-in one that does nothing
    tkey = softmax._FAST.spec(_fast.torch_sig, x)[0]
    fc = softmax._FAST.torch[tkey]
    stand_in = types.SimpleNamespace(torch=id, cupy=id)  # (a builtin: a FastCall that returns at once)
    bare = _fast.FastCalls(_fast.Declared(arrays=("x",), options={"axis": int, "impl": str}, fixed=("out",)))
    bare_op = _interop.foreign_arrays(fast=bare)(cupyops.softmax.__wrapped__)
    bare.torch[tkey] = stand_in
    bare.cupy[(bare.spec(_fast.cupy_sig, xc)[0], cp.cuda.runtime.getDevice())] = stand_in
    nested = (((x.shape, x.stride(), x.dtype, dev), -1, "auto"))  # the key before: torch.Size in it
    tables = {tkey: fc}, {nested: fc}

    plan = softmax._plan("auto", n, "bfloat16")
    yc = cp.empty_like(xc)
    fn, grid, block, smem, kargs = plan.launch_spec(8, (xc, yc, *_rows.shape_args(8, n)), aligned=True)
    direct = _launch.DirectLaunch(fn, grid, block, smem, (_launch.ADDRESS, _launch.ADDRESS, *kargs[2:]))
    raw_stream = torch._C._cuda_getCurrentRawStream
    ctx_device = _fast._cfast.ctx_device if _fast._cfast is not None else None
    stride, dptr = x.stride(), (xc.data.ptr, yc.data.ptr)

    def replay(fc, kind, inputs):  # the C Replay's own method where the FastCall is one
        run = getattr(_fast._cfast.Replay, kind) if fc._replay is not None else getattr(type(fc), kind)
        return lambda: run(fc, inputs)

    pieces = {
        "torch.empty_like(x)": lambda: torch.empty_like(x),
        "x.new_empty(shape)": lambda: x.new_empty(shape),
        "torch.empty(shape, dtype=, device=int)": lambda: torch.empty(shape, dtype=bf16, device=dev),
        "torch.empty_strided(shape, stride, ...)": lambda: torch.empty_strided(shape, stride, dtype=bf16, device=dev),
        "raw stream query": lambda: raw_stream(dev),
        "x.data_ptr()": x.data_ptr,
        "x.shape": lambda: x.shape,
        "x.stride()": x.stride,
        "x.get_device()": x.get_device,
        "torch_sig(x) (Python)": lambda: _fast.torch_sig(x),
        "torch_sig(x) (C)": (lambda: _fast._cfast.torch_sig(x)) if _fast._cfast is not None else None,
        "cp.cuda.runtime.getDevice()": cp.cuda.runtime.getDevice,
        "cuCtxGetDevice (_cfast.ctx_device)": ctx_device,
        "key lookup, flat key": lambda: tables[0].get(tkey),
        "key lookup, torch.Size key": lambda: tables[1].get(nested),
        "dispatch only, torch (stand-in FastCall)": lambda: bare_op(x),
        "dispatch only, CuPy (stand-in FastCall)": lambda: bare_op(xc),
        "Replay alone, torch (FastCall.torch)": replay(fc, "torch", (x,)),
        "Replay alone, CuPy (FastCall.cupy)": replay(fc, "cupy", (xc,)),
        "bare DirectLaunch (CuPy's driver call)": lambda: direct(0, dptr),
    }
    pieces = {k: v for k, v in pieces.items() if v is not None}
    fns = {f"{op} {who}": f for op, calls in ops.items() for who, f in zip(("torch in", "cupy in", "torch"), calls)}
    fns.update(pieces)
    print(f"# {torch.cuda.get_device_name(dev)}; C fast path: {_fast.USE_C}; "
          f"softmax is a {type(cupyops.softmax).__name__}; us a call, {args.passes} pass(es)")
    runs = [host_overhead_side_by_side_us(fns, calls=args.calls) for _ in range(args.passes)]

    width = 7 * args.passes

    def cols(name):
        return f'{" ".join(f"{r[name]:6.2f}" for r in runs):>{width}s}'

    print(f"{'':10s} {'torch in':>{width}s}  {'cupy in':>{width}s}  {'torch':>{width}s}  {'torch in - torch':>{width}s}")
    for op in ops:
        diff = " ".join(f"{r[op + ' torch in'] - r[op + ' torch']:+6.2f}" for r in runs)  # (us)
        print(f"{op:10s} {cols(op + ' torch in')}  {cols(op + ' cupy in')}  {cols(op + ' torch')}  {diff}")
    print("pieces")
    for name in pieces:
        print(f"  {name:44s} {cols(name)}")
    print(f"checked-path runs while timing: {len(checked)} ({sorted(set(checked)) or 'none'})")


if __name__ == "__main__":
    main()

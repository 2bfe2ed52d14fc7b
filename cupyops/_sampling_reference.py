"""The float64 reference of ``cupyops.sample`` (re-exported by ``cupyops.reference``).

It reproduces every step of the operator: the same Philox4x32-10 uniform a row (bit for
bit), the same keep rules (top-k by the k-th largest logit, ties kept; top-p as the largest
logit value whose kept tokens at or above it reach p of the top-k set's mass, ties kept),
the inverse CDF in vocabulary order. The weights ``exp((v - max) / T)`` are float64 here
and float32 in the kernels, so a kernel's token differs from this one only where the
uniform, or top-p's cut, lies within rounding (~1e-6) of a step of the cumulative mass:
``sample_accepts`` says which tokens are that close, with the tolerance the caller gives.
"""
import numpy as np

LOG2E_F32 = np.float32(1.4426950408889634)  # the kernel's log2(e), a float32
_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)  # Philox4x32 multipliers
_W0, _W1 = np.uint64(0x9E3779B9), np.uint64(0xBB67AE85)  # Weyl key increments
_LOW32 = np.uint64(0xFFFFFFFF)
_32 = np.uint64(32)


def _host(a):
    if type(a).__module__.startswith("cupy"):
        a = a.get()
    return np.asarray(a)


def philox4x32_10(counter, key):
    """Philox4x32-10 (Salmon et al., SC 2011; Random123's philox4x32 with 10 rounds):
    ``counter`` [..., 4] and ``key`` [..., 2] 32-bit words -> [..., 4] uint32."""
    c = np.asarray(counter, dtype=np.uint64) & _LOW32
    k = np.asarray(key, dtype=np.uint64) & _LOW32
    c0, c1, c2, c3 = (c[..., i] for i in range(4))
    k0, k1 = k[..., 0], k[..., 1]
    for r in range(10):
        if r:
            k0, k1 = (k0 + _W0) & _LOW32, (k1 + _W1) & _LOW32
        p0, p1 = _M0 * c0, _M1 * c2  # 32 x 32 -> 64 bits: exact in uint64
        c0, c1, c2, c3 = (p1 >> _32) ^ c1 ^ k0, p1 & _LOW32, (p0 >> _32) ^ c3 ^ k1, p0 & _LOW32
    return np.stack([c0, c1, c2, c3], axis=-1).astype(np.uint32)


def _seeds(seed, batch):
    """(the 64-bit seed of each row, whether they were given a row) for an int or an
    integer array of shape () or [batch] (int64 read as its uint64 bits, as the kernel reads
    them; other integer types converted modulo 2**64)."""
    if isinstance(seed, (int, np.integer)):
        return np.full(batch, int(seed) % 2**64, dtype=np.uint64), False
    a = _host(seed)
    a = a.view(np.uint64) if a.dtype == np.int64 else a.astype(np.uint64)
    if a.ndim == 0:
        return np.full(batch, a, dtype=np.uint64), False
    return a.reshape(batch), True


def sample_uniforms(batch, seed):
    """The uniform of each row, float64 (exact: 24 bits): u = (Philox4x32-10(counter=(c, c >> 32,
    0, 0), key=(seed & 0xffffffff, seed >> 32))[0] >> 8) * 2**-24, c = the row for one seed a
    call, 0 for a seed a row."""
    seeds, per_row = _seeds(seed, batch)
    c = np.zeros(batch, np.uint64) if per_row else np.arange(batch, dtype=np.uint64)
    zero = np.zeros(batch, np.uint64)
    out = philox4x32_10(np.stack([c & _LOW32, c >> _32, zero, zero], axis=-1),
                        np.stack([seeds & _LOW32, seeds >> _32], axis=-1))
    return (out[:, 0] >> 8).astype(np.float64) * 2.0**-24


def _per_row(v, batch, dtype, default):
    if v is None:
        return np.full(batch, default, dtype)
    a = _host(v)
    return np.full(batch, a.item(), dtype) if a.ndim == 0 else a.astype(dtype).reshape(batch)


def _largest_finite(dtype):
    if np.dtype(dtype).name == "bfloat16":
        return float.fromhex("0x1.fep+127")  # bfloat16 0x7f7f
    return float(np.finfo(dtype).max)


def _logits(logits):
    """float64 values as the kernels read them: NaN -> -inf, +inf -> the dtype's largest
    finite value (-0 and +0 compare equal here as there)."""
    a = _host(logits)
    v = a.astype(np.float64)
    v[np.isnan(v)] = -np.inf
    v[v == np.inf] = _largest_finite(a.dtype)
    return v


def _greedy(t):
    """The kernels' test on the float32 temperature: !(T > 0), or log2(e) / T overflows."""
    t = np.float32(t)
    if not t > 0:
        return True
    with np.errstate(over="ignore"):
        return bool(np.isinf(LOG2E_F32 / t))


class _Row:
    """One row's draw: ``token``, and what ``accepts`` needs: the weights, the uniform, the
    top-k mask and top-p's candidate cuts (the exact one first)."""

    def __init__(self, v, t, k, p, u, tol):
        n = v.size
        self.u = u
        self.greedy = _greedy(t) or v.max() == -np.inf
        if self.greedy:
            self.token = int(np.argmax(v))  # the first largest
            return
        with np.errstate(invalid="ignore", over="ignore", under="ignore"):
            self.e = np.where(v == -np.inf, 0.0, np.exp((v - v.max()) / np.float64(np.float32(t))))
        keep = np.ones(n, bool)
        if 0 < k < n:
            keep = v >= np.partition(v, n - k)[n - k]  # the k-th largest value, ties kept
        self.sets = [keep]
        if np.float32(p) < 1:  # (NaN: no cut)
            self.sets = [keep & (v >= cut) for cut in self._top_p_cuts(v, keep, float(np.float32(p)), tol)]
        w = np.where(self.sets[0], self.e, 0.0)
        cdf = np.cumsum(w)
        self.token = min(int(np.searchsorted(cdf, u * cdf[-1], side="right")), n - 1)

    def _top_p_cuts(self, v, keep, p, tol):
        """The logit values at which top-p may cut: the exact cut (the largest value whose kept
        tokens at or above it hold >= p of the mass; p <= 0: the largest), then, with tol > 0,
        every other value whose cut the float32 masses could take instead (its mass fraction
        within tol of p on the right side)."""
        vals, e = v[keep], self.e[keep]
        order = np.argsort(-vals, kind="stable")
        sv, cum = vals[order], np.cumsum(e[order])
        ends = np.flatnonzero(np.r_[sv[1:] != sv[:-1], True])  # each run of equal values' last index
        frac, cuts = cum[ends] / cum[-1], sv[ends]  # the mass at or above each distinct value
        exact = min(int(np.searchsorted(frac, p, side="left")), len(cuts) - 1)
        out = [cuts[exact]]
        if tol > 0:
            above = np.r_[0.0, frac[:-1]]  # the mass strictly above each value
            near = np.flatnonzero((above < p + tol) & (frac >= p - tol))
            out += [cuts[g] for g in near if g != exact]
        return out

    def accepts(self, token, tol):
        """Whether ``token`` is this row's draw with the cumulative masses (or top-p's cut)
        moved by at most ``tol``: exact for greedy rows and for top-k membership."""
        if self.greedy or token == self.token:
            return token == self.token
        if not 0 <= token < self.e.size:
            return False
        for keep in self.sets:
            if not keep[token] or self.e[token] == 0:
                continue
            w = np.where(keep, self.e, 0.0)
            z = w.sum()
            lo = w[:token].sum() / z
            if lo - tol <= self.u <= lo + w[token] / z + tol:
                return True
        return False


def _rows(logits, temperature, top_k, top_p, seed, tol):
    v = _logits(logits)
    if v.ndim != 2:
        raise ValueError(f"logits: expected [batch, vocab], got shape {v.shape}")
    batch = v.shape[0]
    t = _per_row(temperature, batch, np.float32, 1.0)
    k = _per_row(top_k, batch, np.int64, 0)
    p = _per_row(top_p, batch, np.float32, 1.0)
    u = sample_uniforms(batch, seed)
    return [_Row(v[i], t[i], k[i], p[i], u[i], tol) for i in range(batch)]


def sample(logits, temperature=1.0, top_k=None, top_p=None, seed=0):
    """cupyops.sample's tokens in float64 (int64 [batch]), the same seed semantics; per-row
    options as numbers or arrays, with the device-array readings (temperature <= 0 or NaN:
    greedy; top_k <= 0 or >= vocab, top_p >= 1 or NaN: no limit; top_p <= 0: the top logit)."""
    return np.array([r.token for r in _rows(logits, temperature, top_k, top_p, seed, 0.0)], np.int64)


def sample_accepts(logits, tokens, temperature=1.0, top_k=None, top_p=None, seed=0, tol=1e-5):
    """(accepted, exact), bool [batch]: ``exact`` where ``tokens`` is the reference's draw,
    ``accepted`` also where it is the draw of a cumulative mass (or a top-p cut) within
    ``tol`` of the reference's: a float32 kernel on the other side of a boundary that close."""
    tokens = _host(tokens).reshape(-1)
    rows = _rows(logits, temperature, top_k, top_p, seed, tol)
    exact = np.array([int(t) == r.token for t, r in zip(tokens, rows)], bool)
    accepted = np.array([r.accepts(int(t), tol) for t, r in zip(tokens, rows)], bool)
    return accepted, exact

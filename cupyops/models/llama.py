"""A Llama-architecture model (Llama 2/3, TinyLlama, Mistral with its sliding window) run
on cupyops operators: prefill and decode over a paged KV cache, greedy and sampled
generation.

    from cupyops.models import llama
    model = llama.Llama.from_pretrained("path/to/checkpoint")      # config.json + *.safetensors
    out = model.generate([[1, 15043, 29892], [1, 450]], max_new_tokens=32)   # token ids

What runs where: the embedding lookup is a CuPy gather (``take``); everything else is a
cupyops operator, one decoder layer being

    h, residual = add_rms_norm(x, residual, input_layernorm)   (rms_norm for the first layer)
    q, k, v     = views of matmul(h, W_qkv.T)                   (one GEMM for the three)
    q, k        = rope(q, k, positions, cos_sin_cache=...)      (in place, on the views)
    kv_cache_append(k_cache, v_cache, k, v, block_table, ...)   (the new tokens' pages)
    a           = attention_varlen(q, k, v, cu_seqlens, ...)   (prefill, the prompts packed)
                  attention_paged(q, k_cache, v_cache, ...)     (decode)
                  (with window=(sliding_window - 1, 0) where the config has one: each
                  token sees itself and the sliding_window - 1 before it, as transformers'
                  Mistral; the cache keeps every token)
    x, residual = add_rms_norm(matmul(a, W_o.T), residual, post_attention_layernorm)
    x           = matmul(silu_and_mul(matmul(x, W_gate_up.T)), W_down.T)

and the last ``add_rms_norm`` with the final norm, the LM head's matmul and ``sample``
(``argmax`` at temperature 0). Hugging Face's LlamaDecoderLayer computes the same: the
residual sums are rounded to the model's dtype before each norm, as there.

Prefill packs every prompt's tokens into one batch of rows for the GEMMs, norms, rope and
MLP (no padding); attention runs per prompt, each its own causal square. Decode runs one
token per sequence against the paged cache.

Weights are read from the safetensors files directly (an 8-byte header length, a JSON
header, the raw tensors: the format is documented and small), so loading needs neither
torch nor the safetensors package (whose NumPy reader has no bfloat16).
"""
import dataclasses
import glob
import json
import numbers
import os
import struct

import numpy as np

import cupyops
from .. import _arrays, _dtypes, _launch
from ..ops import _attention_flash3


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """The fields of a Hugging Face ``LlamaConfig`` (config.json) this runner uses."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    dtype: str = "bfloat16"
    sliding_window: int = None  # keys a token sees, itself included (Mistral); None: all

    @classmethod
    def from_dict(cls, d):
        """From config.json's dict; refuses what this runner does not compute (biases in
        the projections, an activation other than SiLU, a rope scaling it does not know)."""
        if d.get("attention_bias") or d.get("mlp_bias"):
            raise ValueError("config: attention_bias / mlp_bias are not supported (Llama has none)")
        act = d.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"config: hidden_act {act!r} is not supported (Llama uses 'silu')")
        window = d.get("sliding_window") if d.get("use_sliding_window", True) else None  # (Qwen2's switch)
        if window is not None and (isinstance(window, bool) or not isinstance(window, numbers.Integral)
                                   or window < 1):
            raise ValueError(f"config: sliding_window must be a positive int or null, got {window!r}")
        if d.get("max_window_layers") is not None and window is not None:
            raise ValueError("config: max_window_layers (a window on some layers only) is not supported")
        # (transformers 5 writes rope_theta and the scaling together as rope_parameters)
        params = d.get("rope_parameters") or {}
        theta = d.get("rope_theta", params.get("rope_theta", 10000.0))
        scaling = d.get("rope_scaling")
        if scaling is None and params.get("rope_type", params.get("type", "default")) != "default":
            scaling = params
        if scaling is not None:
            kind = scaling.get("rope_type", scaling.get("type"))
            if kind not in ("llama3", "linear", "default"):
                raise ValueError(f"config: rope_scaling type {kind!r} is not supported ('llama3', 'linear')")
        heads = d["num_attention_heads"]
        dtype = d.get("torch_dtype") or d.get("dtype") or "bfloat16"
        if dtype not in ("bfloat16", "float16", "float32"):
            raise ValueError(f"config: torch_dtype {dtype!r} is not supported")
        return cls(
            vocab_size=d["vocab_size"], hidden_size=d["hidden_size"], intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"], num_attention_heads=heads,
            num_key_value_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads, rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta), rope_scaling=scaling,
            max_position_embeddings=int(d.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)), dtype=dtype,
            sliding_window=None if window is None else int(window))

    @property
    def window(self):
        """The attention operators' window=: (sliding_window - 1, 0), or None."""
        return None if self.sliding_window is None else (self.sliding_window - 1, 0)


# ------------------------------------------------------------------------- weights
_ST_DTYPES = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32}  # (bf16 as its bits)


def read_safetensors(path):
    """{name: (NumPy array memory-mapped from the file, its safetensors dtype)}; bfloat16
    tensors come as their uint16 bits."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        kind = meta["dtype"]
        if kind not in _ST_DTYPES:
            raise ValueError(f"{path}: tensor {name} has dtype {kind}, not one of {sorted(_ST_DTYPES)}")
        begin, end = meta["data_offsets"]
        out[name] = (data[begin:end].view(_ST_DTYPES[kind]).reshape(meta["shape"]), kind)
    return out


def _to_device(array, kind, dtype):
    """A weight on the GPU in the model's dtype (bf16 bits reinterpreted, others cast)."""
    cp = _arrays.cupy_module()
    dt = _dtypes.to_dtype(dtype)
    if kind == "BF16":
        bits = cp.asarray(np.ascontiguousarray(array))
        if dtype == "bfloat16":
            return bits.view(dt)
        return bits.view(_dtypes.to_dtype("bfloat16")).astype(cp.float32).astype(dt)
    return cp.asarray(np.ascontiguousarray(array)).astype(dt)


def _rope_inv_freq(cfg):
    """Hugging Face's inverse frequencies (float64 here, rounded to float32 once), with its
    'llama3' and 'linear' rope scaling."""
    dim = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    s = cfg.rope_scaling or {}
    kind = s.get("rope_type", s.get("type"))
    if kind == "linear":
        inv = inv / float(s["factor"])
    elif kind == "llama3":
        factor, low, high = float(s["factor"]), float(s["low_freq_factor"]), float(s["high_freq_factor"])
        old = float(s["original_max_position_embeddings"])
        wavelen = 2 * np.pi / inv
        smooth = (old / wavelen - low) / (high - low)
        scaled = np.where(wavelen > old / low, inv / factor, inv)  # long wavelengths: scaled
        mid = (wavelen <= old / low) & (wavelen >= old / high)
        inv = np.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled)
    return inv.astype(np.float32)


def cos_sin_cache(cfg, max_pos):
    """rope's cos/sin table [max_pos, head_dim] (cos then sin), float32, computed as
    Hugging Face's LlamaRotaryEmbedding does (float32 angles position * inv_freq)."""
    inv = _rope_inv_freq(cfg)
    angles = np.arange(max_pos, dtype=np.float32)[:, None] * inv[None, :]
    table = np.concatenate([np.cos(angles), np.sin(angles)], axis=1).astype(np.float32)
    return _arrays.cupy_module().asarray(table)


# ------------------------------------------------------------------------- the KV cache
class PagedKVCache:
    """Each layer's K and V pages, ``[num_pages, page_size, kv_heads, head_dim]`` (the NHD
    layout of vLLM/FlashInfer), and the pages of each sequence: a free list on the host,
    the block table on the GPU (rebuilt when a sequence takes a new page)."""

    def __init__(self, cfg, num_pages, page_size=16, dtype=None):
        if page_size < 16 or page_size > 256 or page_size & (page_size - 1):
            raise ValueError(f"page_size: a power of two in 16..256, got {page_size}")
        cp = _arrays.cupy_module()
        dt = _dtypes.to_dtype(dtype or cfg.dtype)
        shape = (num_pages, page_size, cfg.num_key_value_heads, cfg.head_dim)
        self.k = [cp.zeros(shape, dt) for _ in range(cfg.num_hidden_layers)]
        self.v = [cp.zeros(shape, dt) for _ in range(cfg.num_hidden_layers)]
        self.page_size, self.num_pages = page_size, num_pages
        self._free = list(range(num_pages - 1, -1, -1))
        self.pages = []  # per sequence: its page ids
        self.lens = []  # per sequence: tokens in the cache
        self._table = None

    def add_sequences(self, n):
        self.pages += [[] for _ in range(n)]
        self.lens += [0] * n
        self._table = None

    def reserve(self, seq, new_tokens):
        """Make room for ``new_tokens`` more tokens of sequence ``seq``."""
        need = -(-(self.lens[seq] + new_tokens) // self.page_size) - len(self.pages[seq])
        if need > len(self._free):
            raise MemoryError(f"the KV cache is full ({self.num_pages} pages of {self.page_size} tokens)")
        for _ in range(need):
            self.pages[seq].append(self._free.pop())
            self._table = None

    def block_table(self):
        """int32 [sequences, max pages] on the GPU (unused slots 0)."""
        if self._table is None:
            width = max(1, max(len(p) for p in self.pages))
            host = np.zeros((len(self.pages), width), np.int32)
            for i, p in enumerate(self.pages):
                host[i, :len(p)] = p
            self._table = _arrays.cupy_module().asarray(host)
        return self._table


# ------------------------------------------------------------------------- the model
class Llama:
    """A Llama-architecture causal LM on cupyops operators (see the module docstring)."""

    def __init__(self, cfg, weights):
        self.cfg = cfg
        self.w = weights
        self._rope = cos_sin_cache(cfg, cfg.max_position_embeddings)

    @classmethod
    def from_pretrained(cls, path, *, dtype=None):
        """Load a Hugging Face checkpoint directory (config.json and *.safetensors)."""
        with open(os.path.join(path, "config.json")) as f:
            cfg = LlamaConfig.from_dict(json.load(f))
        if dtype is not None:
            cfg = dataclasses.replace(cfg, dtype=_dtypes.dtype_name(_dtypes.to_dtype(dtype)))
        files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
        if not files:
            raise FileNotFoundError(f"{path}: no *.safetensors files")
        raw = {}
        for f in files:
            raw.update(read_safetensors(f))
        return cls(cfg, _pack_weights(cfg, raw))

    # -- one decoder layer's attention-free parts, on packed token rows [tokens, hidden]
    def _qkv(self, layer, h, positions):
        """q [tokens, Hq, D], k and v [tokens, Hkv, D]: views of one GEMM's output, q and k
        rotated in place."""
        cfg, w = self.cfg, self.w["layers"][layer]
        qkv = cupyops.matmul(h, w["qkv"].T)
        hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        t = qkv.shape[0]
        q = qkv[:, :hq * d].reshape(t, hq, d)
        k = qkv[:, hq * d:(hq + hkv) * d].reshape(t, hkv, d)
        v = qkv[:, (hq + hkv) * d:].reshape(t, hkv, d)
        cupyops.rope(q, k, positions, cos_sin_cache=self._rope, inplace=True)
        return q, k, v

    def _mlp(self, layer, h):
        w = self.w["layers"][layer]
        return cupyops.matmul(cupyops.silu_and_mul(cupyops.matmul(h, w["gate_up"].T)), w["down"].T)

    def _layers(self, x, positions, attend):
        """Run every decoder layer on token rows ``x``; ``attend(layer, q, k, v)`` gives the
        attention output rows [tokens, Hq * D]. Returns the final-normed rows."""
        cfg, layers = self.cfg, self.w["layers"]
        residual = x
        h = cupyops.rms_norm(x, layers[0]["input_norm"], cfg.rms_norm_eps)
        for i in range(cfg.num_hidden_layers):
            q, k, v = self._qkv(i, h, positions)
            a = attend(i, q, k, v)
            o = cupyops.matmul(a, layers[i]["o"].T)
            h, residual = cupyops.add_rms_norm(o, residual, layers[i]["post_norm"], cfg.rms_norm_eps)
            m = self._mlp(i, h)
            nxt = layers[i + 1]["input_norm"] if i + 1 < cfg.num_hidden_layers else self.w["norm"]
            h, residual = cupyops.add_rms_norm(m, residual, nxt, cfg.rms_norm_eps)
        return h

    def _logits(self, h):
        return cupyops.matmul(h, self.w["lm_head"].T)

    def _embed(self, ids):
        return self.w["embed"].take(ids, axis=0)

    def prefill(self, prompts, cache, *, all_logits=False):
        """Run the prompts (lists of token ids) through the model, appending their K and V
        to ``cache`` as new sequences. Returns the last token's logits of each prompt,
        [prompts, vocab] (``all_logits``: every token's, [total tokens, vocab], prompt
        after prompt)."""
        cp = _arrays.cupy_module()
        lens = [len(p) for p in prompts]
        if not lens or min(lens) < 1:
            raise ValueError("prompts: one or more non-empty lists of token ids")
        self._check_positions(max(lens))
        first = len(cache.pages)
        cache.add_sequences(len(prompts))
        for i, n in enumerate(lens):
            cache.reserve(first + i, n)
        table = cache.block_table()
        ids = cp.asarray(np.concatenate([np.asarray(p, np.int64) for p in prompts]))
        positions = cp.asarray(np.concatenate([np.arange(n, dtype=np.int32) for n in lens]))
        starts = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        # each token its own row of the append (its prompt's pages, its position): one
        # kv_cache_append a layer for every prompt
        token_table = table[cp.asarray(np.repeat(np.arange(first, first + len(lens)), lens))]
        # the offsets on the GPU where attention_varlen runs its flash3 kernel (which reads them
        # there), else on the host, where its per_sequence rung reads them: no read back a layer
        flash3 = self.cfg.dtype != "float32" and self.cfg.head_dim in _attention_flash3.HEAD_DIMS and \
            _attention_flash3.runs_here(_launch.device_props())
        cu = cp.asarray(starts) if flash3 else starts
        longest = max(lens)
        a = cp.empty((len(ids), self.cfg.num_attention_heads, self.cfg.head_dim), self.w["embed"].dtype)

        def attend(layer, q, k, v):
            cupyops.kv_cache_append(cache.k[layer], cache.v[layer], k[:, None], v[:, None], token_table, positions)
            # every prompt in one call, packed (each sees only its own tokens); out= a buffer
            # every row of which is written (no zero fill)
            cupyops.attention_varlen(q, k, v, cu, cu, max_seqlen_q=longest, max_seqlen_k=longest, causal=True,
                                     window=self.cfg.window, out=a)
            return a.reshape(q.shape[0], -1)

        h = self._layers(self._embed(ids), positions, attend)
        for i, n in enumerate(lens):
            cache.lens[first + i] += n
        if all_logits:
            return self._logits(h)
        return self._logits(h[cp.asarray(starts[1:] - 1)])

    def decode(self, tokens, cache, seqs=None):
        """One step: ``tokens`` (one id per sequence of ``seqs``, default all of the cache's,
        in order) at the next position of each. Returns logits [len(tokens), vocab]."""
        cp = _arrays.cupy_module()
        seqs = list(range(len(cache.pages))) if seqs is None else list(seqs)
        if len(tokens) != len(seqs):
            raise ValueError(f"tokens: one per sequence ({len(seqs)}), got {len(tokens)}")
        self._check_positions(max(cache.lens[s] for s in seqs) + 1)
        for s in seqs:
            cache.reserve(s, 1)
        table = cache.block_table()
        if seqs != list(range(len(cache.pages))):  # (all sequences in order: the table itself)
            table = table[cp.asarray(np.asarray(seqs, np.int64))]
        pos_host = np.asarray([cache.lens[s] for s in seqs], np.int32)
        positions = cp.asarray(pos_host)
        seq_lens = cp.asarray(pos_host + 1)
        ids = cp.asarray(np.asarray(tokens, np.int64))
        cfg = self.cfg
        b = len(seqs)

        def attend(layer, q, k, v):
            cupyops.kv_cache_append(cache.k[layer], cache.v[layer], k[:, None], v[:, None], table, positions)
            a = cupyops.attention_paged(q[:, None], cache.k[layer], cache.v[layer], table, seq_lens,
                                        window=cfg.window)
            return a.reshape(b, cfg.num_attention_heads * cfg.head_dim)

        h = self._layers(self._embed(ids), positions, attend)
        for s in seqs:
            cache.lens[s] += 1
        return self._logits(h)

    def _check_positions(self, n):
        """Sequences of up to ``n`` tokens have rope angles: the cos/sin table covers
        max_position_embeddings positions (past it rope would give NaN)."""
        if n > self._rope.shape[0]:
            raise ValueError(f"a sequence of {n} tokens is longer than the model's max_position_embeddings "
                             f"({self._rope.shape[0]})")

    def new_cache(self, max_tokens, page_size=16):
        """A PagedKVCache with room for ``max_tokens`` tokens in all (whole pages)."""
        return PagedKVCache(self.cfg, -(-max_tokens // page_size) + 8, page_size)

    def generate(self, prompts, max_new_tokens, *, temperature=0.0, top_k=None, top_p=None, seed=None,
                 page_size=16, eos_token_id=None):
        """Greedy (temperature 0) or sampled continuations of ``prompts`` (lists of token
        ids): a list of ``max_new_tokens`` new ids per prompt (fewer where ``eos_token_id``
        came first; that id included). Sampling is ``cupyops.sample`` with ``seed`` (a
        step's seed is ``seed + step``, so a run is reproducible). ``eos_token_id``: an id or
        a collection of ids (Llama 3 configs give several)."""
        stop = set() if eos_token_id is None else (
            {int(eos_token_id)} if isinstance(eos_token_id, numbers.Integral) else {int(t) for t in eos_token_id})
        total = sum(len(p) + max_new_tokens for p in prompts)
        cache = self.new_cache(total + len(prompts) * page_size, page_size)
        logits = self.prefill(prompts, cache)
        out = [[] for _ in prompts]
        live = list(range(len(prompts)))
        for step in range(max_new_tokens):
            tok = self._pick(logits, temperature, top_k, top_p, None if seed is None else seed + step)
            tok = [int(t) for t in _arrays.cupy_module().asnumpy(tok)]
            for s, t in zip(live, tok):
                out[s].append(t)
            live_tok = [(s, t) for s, t in zip(live, tok) if t not in stop]
            if not live_tok or step + 1 == max_new_tokens:
                break
            live = [s for s, _ in live_tok]
            logits = self.decode([t for _, t in live_tok], cache, live)
        return out

    @staticmethod
    def _pick(logits, temperature, top_k, top_p, seed):
        return cupyops.sample(logits, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)


def _pack_weights(cfg, raw):
    """The checkpoint's tensors on the GPU in the runner's layout: q, k, v projections as
    one [(Hq + 2 Hkv) * D, hidden] matrix, gate and up as one [2 * intermediate, hidden]."""
    cp = _arrays.cupy_module()

    def get(name):
        if name not in raw:
            raise KeyError(f"checkpoint: tensor {name!r} is missing")
        a, kind = raw[name]
        return _to_device(a, kind, cfg.dtype)

    layers = []
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        layers.append({
            "input_norm": get(p + "input_layernorm.weight"),
            "post_norm": get(p + "post_attention_layernorm.weight"),
            "qkv": cp.concatenate([get(p + f"self_attn.{n}_proj.weight") for n in "qkv"], axis=0),
            "o": get(p + "self_attn.o_proj.weight"),
            "gate_up": cp.concatenate([get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")], axis=0),
            "down": get(p + "mlp.down_proj.weight"),
        })
    embed = get("model.embed_tokens.weight")
    head = embed if cfg.tie_word_embeddings or "lm_head.weight" not in raw else get("lm_head.weight")
    return {"embed": embed, "layers": layers, "norm": get("model.norm.weight"), "lm_head": head}

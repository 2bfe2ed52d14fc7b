"""GPU tier: cupyops.models.llama against Hugging Face transformers on the same random
weights (a LlamaForCausalLM built from a small config, saved with save_pretrained, loaded
by both; and a MistralForCausalLM with a sliding window shorter than the prompts): prefill
logits, 32 greedy decode steps over the paged KV cache, a batch of prompts of different
lengths, page sizes 16 and 128. Skipped where transformers or a GPU is absent."""
import numpy as np
import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from cupyops.models import llama  # noqa: E402

CONFIGS = {
    # the small config: 4 layers, hidden 1024, 16 query / 4 KV heads of 64
    "d64": dict(hidden_size=1024, num_attention_heads=16, num_key_value_heads=4, head_dim=64),
    # and one with head_dim 128 (8 query / 2 KV heads), with Llama 3's rope scaling
    "d128": dict(hidden_size=1024, num_attention_heads=8, num_key_value_heads=2, head_dim=128,
                 rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
                 rope_theta=500000.0),
    # Mistral: a sliding window of 8 keys, shorter than three of the four prompts and than
    # the decode steps, so that every prefill and decode call masks
    "mistral_w8": dict(hidden_size=1024, num_attention_heads=16, num_key_value_heads=4, head_dim=64,
                       sliding_window=8),
}
PROMPT_LENS = (5, 17, 64, 33)  # four prompts of different lengths, one batch
STEPS = 32


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def checkpoint(request, tmp_path_factory):
    """(transformers' model loaded from the checkpoint on the GPU in bfloat16, the
    checkpoint's directory): random weights, made in bfloat16 as from_pretrained makes
    them (not by .to(bfloat16), which would also round the rotary inverse frequencies,
    a buffer, to bfloat16: 0.1 rad off by position 300), with a larger init than the
    default so that the logits are further from ties."""
    torch.manual_seed(0)
    mistral = request.param.startswith("mistral")
    config_cls = transformers.MistralConfig if mistral else transformers.LlamaConfig
    model_cls = transformers.MistralForCausalLM if mistral else transformers.LlamaForCausalLM
    cfg = config_cls(vocab_size=2048, intermediate_size=2816, num_hidden_layers=4, max_position_embeddings=512,
                     initializer_range=0.06, rms_norm_eps=1e-5, torch_dtype="bfloat16", **CONFIGS[request.param])
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        model = model_cls(cfg)
    finally:
        torch.set_default_dtype(old)
    path = tmp_path_factory.mktemp(f"llama_{request.param}")
    model.save_pretrained(path, safe_serialization=True)
    hf = model_cls.from_pretrained(path, dtype=torch.bfloat16)
    assert hf.model.rotary_emb.inv_freq.dtype == torch.float32
    assert getattr(hf.config, "sliding_window", None) == CONFIGS[request.param].get("sliding_window")
    # the referee: the same (bf16-valued) weights computed in float32
    exact = model_cls.from_pretrained(path, dtype=torch.float32)
    return hf.cuda().eval(), str(path), exact.cuda().eval()


def _prompts(n_vocab):
    rs = np.random.RandomState(1)
    return [list(rs.randint(0, n_vocab, size=n)) for n in PROMPT_LENS]


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def _logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids], device="cuda")).logits[0].float().cpu().numpy()


def _no_worse_than_transformers(got, hf, exact, what):
    """bf16 tolerance, measured: our logits' error against the float32 computation of the
    same weights is at most 1.5x transformers' own bf16 error (two bf16 implementations
    round differently: fused norms and activations, GEMM orders), and both are small."""
    ours_err, hf_err = _rel(got, exact), _rel(hf, exact)
    assert np.isfinite(got).all(), what
    assert ours_err <= max(1.5 * hf_err, 5e-3), (what, ours_err, hf_err)
    assert hf_err < 5e-2, (what, hf_err)


@pytest.mark.parametrize("page_size", [16, 128])
def test_prefill_logits_match_transformers(checkpoint, page_size):
    hf, path, exact = checkpoint
    model = llama.Llama.from_pretrained(path)
    prompts = _prompts(hf.config.vocab_size)
    cache = model.new_cache(sum(PROMPT_LENS), page_size)
    ours = model.prefill(prompts, cache, all_logits=True)
    ours = torch.from_dlpack(ours).float().cpu().numpy()
    at = 0
    for p in prompts:
        got = ours[at:at + len(p)]
        at += len(p)
        _no_worse_than_transformers(got, _logits(hf, p), _logits(exact, p), ("prefill", len(p)))


@pytest.mark.parametrize("page_size", [16, 128])
def test_greedy_decode_matches_transformers(checkpoint, page_size):
    # the same tokens, step after step; two bf16 implementations (different GEMM orders,
    # fused norms) may part only where transformers' own two best logits are closer than
    # their rounding differences (2 % of the logits' rms: the size of those differences,
    # test_prefill_logits_match_transformers), and from there on the sequences differ by right
    hf, path, _ = checkpoint
    model = llama.Llama.from_pretrained(path)
    prompts = _prompts(hf.config.vocab_size)
    ours = model.generate(prompts, STEPS, page_size=page_size)
    for p, got in zip(prompts, ours):
        with torch.no_grad():
            res = hf.generate(torch.tensor([p], device="cuda"), max_new_tokens=STEPS, do_sample=False,
                              min_new_tokens=STEPS, pad_token_id=0, output_scores=True,
                              return_dict_in_generate=True)
        ref = res.sequences[0, len(p):].tolist()
        assert len(got) == STEPS
        if got == ref:
            continue
        i = next(j for j, (a, b) in enumerate(zip(got, ref)) if a != b)
        scores = res.scores[i][0].float()
        margin = float(scores[ref[i]] - scores[got[i]])
        rms = float(scores.pow(2).mean().sqrt())
        assert 0 <= margin <= 0.02 * rms, (len(p), i, margin, rms, got, ref)


def test_decode_logits_match_transformers_step_by_step(checkpoint):
    # teacher-forced: each decode step's logits (paged cache) against transformers' on the
    # same prefix, judged against the float32 computation as the prefill's are
    hf, path, exact = checkpoint
    model = llama.Llama.from_pretrained(path)
    prompts = _prompts(hf.config.vocab_size)[:2]
    cache = model.new_cache(200, 16)
    logits = model.prefill(prompts, cache)
    seqs = [list(p) for p in prompts]
    for step in range(8):
        got = torch.from_dlpack(logits).float().cpu().numpy()
        for g, s in zip(got, seqs):
            _no_worse_than_transformers(g, _logits(hf, s)[-1], _logits(exact, s)[-1], ("decode", step, len(s)))
        nxt = [int(_logits(exact, s)[-1].argmax()) for s in seqs]
        for s, t in zip(seqs, nxt):
            s.append(t)
        logits = model.decode(nxt, cache)


def test_sampled_generation_is_reproducible_and_in_vocab(checkpoint):
    hf, path, _ = checkpoint
    model = llama.Llama.from_pretrained(path)
    prompts = _prompts(hf.config.vocab_size)[:2]
    a = model.generate(prompts, 8, temperature=0.8, top_k=50, top_p=0.9, seed=123)
    b = model.generate(prompts, 8, temperature=0.8, top_k=50, top_p=0.9, seed=123)
    assert a == b
    assert all(0 <= t < hf.config.vocab_size for seq in a for t in seq)


def test_rope_tables_match_transformers(checkpoint):
    hf, path, _ = checkpoint
    model = llama.Llama.from_pretrained(path)
    pos = torch.arange(300, device="cuda")[None]
    x = torch.zeros(1, 300, 8, device="cuda")
    cos, sin = hf.model.rotary_emb(x, pos)
    ours = torch.from_dlpack(model._rope[:300]).float()
    half = model.cfg.head_dim // 2
    # (inverse frequencies here in float64 rounded once, there in float32 arithmetic: an ulp
    # apart, times positions up to 300)
    torch.testing.assert_close(ours[:, :half], cos[0, :, :half].float(), rtol=0, atol=1e-4)
    torch.testing.assert_close(ours[:, half:], sin[0, :, :half].float(), rtol=0, atol=1e-4)

"""Decode speed of cupyops.models.llama against Hugging Face transformers' eager generate
on the same GPU and the same random weights (a LlamaForCausalLM built from a config, saved,
loaded by both): tokens per second of greedy decoding at each batch size, prefill excluded
(each side's time for a 1-token generation is subtracted from its time for N + 1).

    python benchmarks/llama_decode.py [--layers 16 --hidden 2048 --heads 32 --kv-heads 8 ...]

The default model is TinyLlama-1.1B's shape (22 layers, hidden 2048, 32/4 heads of 64,
intermediate 5632, vocab 32000) in bfloat16.
"""
import argparse
import json
import tempfile
import time

import numpy as np
import torch
import transformers

from cupyops.models import llama


def timed(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=22)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--intermediate", type=int, default=5632)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
                                   num_hidden_layers=args.layers, num_attention_heads=args.heads,
                                   num_key_value_heads=args.kv_heads, max_position_embeddings=2048,
                                   torch_dtype="bfloat16")
    with torch.device("cuda"):
        hf = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d, safe_serialization=True)
        ours = llama.Llama.from_pretrained(d)
        print(f"{torch.cuda.get_device_name()}: {args.layers} layers, hidden {args.hidden}, "
              f"{args.heads}/{args.kv_heads} heads, bf16; prompts of {args.prompt_len} tokens, "
              f"{args.new_tokens} new tokens, greedy")
        for b in (int(x) for x in args.batches.split(",")):
            rs = np.random.RandomState(b)
            prompts = [list(rs.randint(0, args.vocab, args.prompt_len)) for _ in range(b)]
            ids = torch.tensor(prompts, device="cuda")

            def hf_gen(n):
                with torch.no_grad():
                    hf.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)

            def ours_gen(n):
                ours.generate(prompts, n)

            for fn in (hf_gen, ours_gen):
                fn(2)  # warm up (compiles, plans)
            t = {}
            for name, fn in (("transformers", hf_gen), ("cupyops", ours_gen)):
                full = min(timed(lambda: fn(args.new_tokens + 1)) for _ in range(2))
                first = min(timed(lambda: fn(1)) for _ in range(2))
                t[name] = b * args.new_tokens / (full - first)
            rows.append({"batch": b, **{f"{k}_tok_s": v for k, v in t.items()},
                         "ratio": t["cupyops"] / t["transformers"]})
            print(f"batch {b:3d}: cupyops {t['cupyops']:8.1f} tok/s, transformers {t['transformers']:8.1f} tok/s, "
                  f"{t['cupyops'] / t['transformers']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

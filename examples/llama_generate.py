"""Generate text with a Llama-architecture checkpoint on cupyops operators.

    python examples/llama_generate.py /path/to/checkpoint --prompt "The capital of France is"
    python examples/llama_generate.py /path/to/checkpoint --ids 1,450,7483 --max-new-tokens 32

The directory holds config.json and *.safetensors (any Hugging Face Llama 2/3 or TinyLlama
checkpoint). A text prompt needs the checkpoint's tokenizer and the transformers package to
encode and decode it; token ids work without either. Greedy by default; --temperature,
--top-k, --top-p and --seed sample (cupyops.sample).
"""
import argparse
import time

from cupyops.models import llama


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--prompt", action="append", help="a text prompt (repeat for a batch)")
    ap.add_argument("--ids", action="append", help="a prompt as comma-separated token ids (repeatable)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-k", type=int, default=None)
    ap.add_argument("--top-p", type=float, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--page-size", type=int, default=16)
    args = ap.parse_args()

    tok = None
    prompts = [[int(t) for t in s.split(",")] for s in args.ids or []]
    if args.prompt:
        from transformers import AutoTokenizer  # only to turn text into ids and back

        tok = AutoTokenizer.from_pretrained(args.checkpoint)
        prompts += [tok(p)["input_ids"] for p in args.prompt]
    if not prompts:
        ap.error("give --prompt or --ids")
    model = llama.Llama.from_pretrained(args.checkpoint)
    t0 = time.perf_counter()
    out = model.generate(prompts, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                         top_p=args.top_p, seed=args.seed, page_size=args.page_size,
                         eos_token_id=tok.eos_token_id if tok is not None else None)
    dt = time.perf_counter() - t0
    for p, o in zip(prompts, out):
        print(tok.decode(p + o) if tok is not None else f"{p} -> {o}")
    n = sum(len(o) for o in out)
    print(f"{n} tokens in {dt:.2f} s ({n / dt:.1f} tokens/s, batch {len(prompts)}, prefill included)")


if __name__ == "__main__":
    main()

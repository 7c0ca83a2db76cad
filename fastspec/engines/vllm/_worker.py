"""Runs vLLM's offline engine for one configuration; executed by path with the Python of vLLM's environment.

    VLLM_PYTHON /abs/path/fastspec/engines/vllm/_worker.py JOB.json OUT.json

This file imports only the standard library and vllm (never fastspec: vLLM usually lives in its own environment,
whose numpy / numba / transformers pins differ from fastspec's).  Run by path, its folder is ``sys.path[0]``; the
folder holds no module named ``vllm``, so ``import vllm`` is vLLM itself.  JOB.json (written by
:mod:`fastspec.engines.vllm.runner`):
``model``, ``speculative_config`` (a dict or null), ``prompts`` (lists of token ids), ``sampling`` (temperature,
top_k, top_p, min_p), ``seed``, ``max_tokens``, ``ignore_eos``, ``max_model_len``, ``warmup`` (one request generated and
discarded before the clock starts), ``record_tokens`` (if set: first every prompt with this token budget, untimed,
returned as ``record`` -- the recorded continuations a prediction teacher-forces along; it is the warm-up then).
Every prompt is then generated alone (batch 1), seed ``seed + prompt index``.  OUT.json: ``outputs`` (per prompt
``prompt_token_ids`` and ``token_ids``), ``counters`` (per prompt, vLLM's ``vllm:spec_decode_*`` metrics read
after its request minus those read before it), ``wall_s`` (per prompt, its own ``generate`` call), ``load_s``,
``record``, ``vllm_version``.  Written atomically; on failure OUT.json is not written and the exit status is
non-zero with one line on stderr.
"""
import json
import os
import sys
import time


def _counters(llm):
    out = {}
    for m in llm.get_metrics():
        if not m.name.startswith("vllm:spec_decode"):
            continue
        if hasattr(m, "values"):
            out[m.name] = list(m.values)
        elif hasattr(m, "value"):
            out[m.name] = m.value
    return out


def _minus(after, before):
    out = {}
    for name, v in after.items():
        b = before.get(name)
        if isinstance(v, list):
            b = b or [0] * len(v)
            out[name] = [x - y for x, y in zip(v, b, strict=False)]
        else:
            out[name] = v - (b or 0)
    return out


def run(job):
    t0 = time.perf_counter()
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    import vllm

    kwargs = dict(model=job["model"], enforce_eager=True, seed=job["seed"], max_model_len=job["max_model_len"],
                  disable_log_stats=False, dtype=job.get("dtype", "float32"))
    if job.get("speculative_config"):
        kwargs["speculative_config"] = job["speculative_config"]
    llm = LLM(**kwargs)
    load_s = time.perf_counter() - t0
    s = job["sampling"]

    def params(i, max_tokens=None):
        return SamplingParams(temperature=s["temperature"], top_k=s["top_k"] or 0, top_p=s["top_p"],
                              min_p=s["min_p"], seed=job["seed"] + i, max_tokens=max_tokens or job["max_tokens"],
                              ignore_eos=job["ignore_eos"])

    prompts = [TokensPrompt(prompt_token_ids=list(p)) for p in job["prompts"]]
    record = None
    if job.get("record_tokens"):  # the recorded continuations (untimed; the engine's warm-up too)
        long = [params(i, job["record_tokens"]) for i in range(len(prompts))]
        record = [list(r.outputs[0].token_ids) for r in llm.generate(prompts, long, use_tqdm=False)]
    elif job.get("warmup"):
        llm.generate(prompts[:1], [params(0)], use_tqdm=False)
    results, wall_s, per_prompt = [], [], []
    for i, p in enumerate(prompts):  # one request at a time (batch 1), each timed and counted alone
        before = _counters(llm)
        t1 = time.perf_counter()
        results += llm.generate([p], [params(i)], use_tqdm=False)
        wall_s.append(time.perf_counter() - t1)
        per_prompt.append(_minus(_counters(llm), before))
    outputs = [{"prompt_token_ids": list(r.prompt_token_ids), "token_ids": list(r.outputs[0].token_ids)}
               for r in results]
    return {"outputs": outputs, "counters": per_prompt, "wall_s": wall_s, "load_s": load_s, "record": record,
            "vllm_version": getattr(vllm, "__version__", "unknown")}


def main():
    job_path, out_path = sys.argv[1], sys.argv[2]
    with open(job_path) as f:
        job = json.load(f)
    try:
        result = run(job)
    except Exception as exc:  # one line for the caller, which names the engine and the configuration
        print(f"vllm failed: {type(exc).__name__}: {' '.join(str(exc).split())[:2000]}", file=sys.stderr)
        sys.exit(3)
    tmp = out_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, out_path)


if __name__ == "__main__":
    main()

"""A long-lived vLLM offline engine that answers batch jobs; executed by path with the Python of vLLM's environment.

    VLLM_PYTHON benchmarks/vllm_batch/_worker.py JOB.json

Imports only the standard library and vllm (never fastspec; this folder holds no module named vllm, so the real
one is imported).  JOB.json (written by ``benchmarks/vllm_batch/driver.py``): ``model``, ``speculative_config`` (a
dict or null), ``seed``, ``max_model_len``, ``max_num_seqs``, ``block_size``, ``dtype``, ``counters_from`` (the
path of fastspec's one-configuration worker, ``fastspec/engines/vllm/_worker.py``, whose functions read vLLM's
spec-decode counters; loaded by path).  The engine runs in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set by the caller), so an engine step is one synchronous call and an idle
worker costs no CPU: it blocks on its stdin.

Protocol: the worker writes one JSON line to its *original* stdout when the engine is loaded
(``{"ready": true, "load_s", "vllm_version", "block_size"}``), then reads one JSON command per stdin line and
answers each with one JSON line; everything vLLM prints goes to stderr (stdout is moved there at start).  A
command that fails is answered ``{"error": "..."}``; the worker keeps serving.  Commands:

* ``{"op": "run", "prompts": [[ids]...], "max_tokens": M, "concurrency": B}``: every prompt generated at T = 0
  with ``ignore_eos``, at most B requests in flight (a finished request is replaced at once by the next prompt,
  as a server with B busy clients sees it); answers ``wall_s`` (first request added to last finished),
  ``outputs`` (token ids per prompt), ``counters`` (the ``vllm:spec_decode_*`` metrics read after minus before),
  ``steps`` (engine steps) and ``busy`` (requests in flight at each step).
* ``{"op": "time", "requests": [[ids]...], "max_tokens": M}``: the same with every request in flight at once
  (B = len(requests)); answers ``wall_s`` and ``steps``.  The cost table is built from such calls.
* ``{"op": "quit"}``.
"""
import json
import os
import sys
import time


def _load(path):
    """A module loaded by path (standard library only: it is fastspec's vLLM worker, which never imports fastspec)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("_fastspec_vllm_worker", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Engine:
    def __init__(self, job):
        t0 = time.perf_counter()
        self.counters = _load(job["counters_from"])  # vLLM's spec-decode counters and their differences
        import vllm
        from vllm import LLM

        kwargs = dict(model=job["model"], enforce_eager=True, seed=job["seed"], max_model_len=job["max_model_len"],
                      disable_log_stats=False, dtype=job.get("dtype", "float32"), max_num_seqs=job["max_num_seqs"],
                      enable_prefix_caching=True)
        if job.get("block_size"):
            kwargs["block_size"] = job["block_size"]
        if job.get("speculative_config"):
            kwargs["speculative_config"] = job["speculative_config"]
        self.llm = LLM(**kwargs)
        self.load_s = time.perf_counter() - t0
        self.version = getattr(vllm, "__version__", "unknown")
        self.block_size = self.llm.llm_engine.vllm_config.cache_config.block_size
        self.seed = job["seed"]
        self.uid = 0

    def _params(self, i, max_tokens):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(temperature=0.0, seed=self.seed + i, max_tokens=max_tokens, ignore_eos=True,
                              output_kind=RequestOutputKind.FINAL_ONLY)

    def _loop(self, prompts, max_tokens, concurrency):
        from vllm.inputs import TokensPrompt

        eng = self.llm.llm_engine
        self.uid += 1
        tag = f"j{self.uid}x"
        todo = list(range(len(prompts)))[::-1]
        outs, busy = {}, []
        inflight = 0

        def add(i):
            eng.add_request(f"{tag}{i}", TokensPrompt(prompt_token_ids=list(prompts[i])), self._params(i, max_tokens))

        t0 = time.perf_counter()
        while todo and inflight < concurrency:
            add(todo.pop())
            inflight += 1
        while inflight:
            busy.append(inflight)
            for o in eng.step():
                if not o.finished:
                    continue
                rid = str(o.request_id)
                i = int(rid[len(tag):].split("-")[0]) if rid.startswith(tag) else None
                if i is None or i in outs:
                    raise RuntimeError(f"unexpected request id {rid!r} in the engine's output")
                outs[i] = list(o.outputs[0].token_ids)
                inflight -= 1
                if todo:
                    add(todo.pop())
                    inflight += 1
        wall = time.perf_counter() - t0
        return wall, [outs[i] for i in range(len(prompts))], busy

    def run(self, cmd):
        read, minus = self.counters._counters, self.counters._minus
        before = read(self.llm)
        wall, outs, busy = self._loop(cmd["prompts"], int(cmd["max_tokens"]), int(cmd["concurrency"]))
        return {"wall_s": wall, "outputs": outs, "counters": minus(read(self.llm), before),
                "steps": len(busy), "busy": busy}

    def time(self, cmd):
        reqs = cmd["requests"]
        wall, _, busy = self._loop(reqs, int(cmd["max_tokens"]), len(reqs))
        return {"wall_s": wall, "steps": len(busy)}


def main():
    with open(sys.argv[1]) as f:
        job = json.load(f)
    reply = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)          # whatever vLLM prints goes to stderr; replies alone use the original stdout
    sys.stdout = sys.stderr

    def say(obj):
        reply.write(json.dumps(obj) + "\n")
        reply.flush()

    try:
        engine = Engine(job)
    except Exception as exc:  # one line for the caller
        say({"error": f"vllm failed: {type(exc).__name__}: {' '.join(str(exc).split())[:2000]}"})
        sys.exit(3)
    say({"ready": True, "load_s": engine.load_s, "vllm_version": engine.version, "block_size": engine.block_size})
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            cmd = json.loads(line)
            if cmd.get("op") == "quit":
                say({"bye": True})
                break
            if cmd.get("op") not in ("run", "time"):
                raise ValueError(f"unknown op {cmd.get('op')!r}")
            say(getattr(engine, cmd["op"])(cmd))
        except Exception as exc:  # the caller decides; the engine keeps serving
            say({"error": f"vllm failed: {type(exc).__name__}: {' '.join(str(exc).split())[:2000]}"})


if __name__ == "__main__":
    main()

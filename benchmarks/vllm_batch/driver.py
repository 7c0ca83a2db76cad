"""vLLM's throughput with and without its ``ngram`` speculator at several concurrencies, and a batch cost table
measured in vLLM itself (schema v2), in one run, interleaved.

An experiment, not part of the library: it serves ``benchmarks/bench_vllm_batch.py`` only.

**Engines.**  Two vLLM offline engines (``benchmarks/vllm_batch/_worker.py``, vLLM's own Python, the engine
core in the worker's process), loaded side by side and kept alive: ``plain`` (no speculation) and ``spec``
(``speculative_config = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min/max"}``), both
``max_num_seqs = max(batches)``, float32, prefix caching on.  Each answers jobs on its stdin, so the caller
alternates them; an idle engine blocks on its pipe and costs no CPU.  The offline engine rather than an OpenAI
server: on this 2-core machine a server's API process (HTTP, detokenization) competes with the engine core for the
same cores, so its throughput would measure the front end as much as the batch; the driver loop here does what a
server with B busy clients does to the engine -- at most B requests in flight, a finished one replaced at once
by the next prompt (continuous batching) -- and nothing else.

**Throughput** (concurrency B): every prompt generated at T = 0 with ``ignore_eos`` and the same ``max_tokens``;
tokens/s = generated tokens / wall clock from the first request added to the last one finished (prefill
included: every request of both engines pays the same prefill).  Rounds: in round r the concurrencies are taken
in an order rotated by r and, per concurrency, plain and spec alternate which goes first; a "prefill" run follows
each pair (every prompt with ``max_tokens = 1`` at the same B in the plain engine: ``prefill_s``, the median wall
per B), so that a decode-only prediction can be compared end to end.  The spec engine's
``vllm:spec_decode_*`` counters are read around every run: mean acceptance length = 1 + accepted / drafts.
Every run's tokens are compared with the record (the plain engine's outputs at the largest concurrency, with
``max_tokens + k`` tokens: untimed, the warm-up): at T = 0 neither batching nor speculation may change them.

**Exact counters**: :func:`exact_counters` predicts the spec engine's counters from the record under vLLM's rules
(:mod:`fastspec.engines.vllm.conventions`, vLLM's n-gram rule: earliest occurrence of the longest match); the sum over
prompts must equal every run's counters, whatever B (a request's trajectory does not depend on its neighbours).

**Batch cost table** (schema v2, measured in the plain engine in the same run; one cost round after every
throughput round, its cells in a rotated order): a shared prefix of C tokens (C = one KV block, 128 on the CPU
backend) is cached once; then, per cell,

* ``T_pref(B, n)``: B requests in flight together, each the cached prefix + n distinct uncached tokens,
  ``max_tokens = 1``: one engine step whose forward covers B sequences x n new tokens (the shape of a verify
  forward of k = n - 1 drafts), plus the requests' admission and retirement;
* ``T_dec(B)``: the same with n = 1 and ``max_tokens = 1 + D``: D more plain decode steps at batch B.

``target.batch_forward_s[B][1] = (T_dec(B) - T_pref(B, 1)) / D`` (a steady decode step, admission and retirement
cancel) and ``target.batch_forward_s[B][n] = batch_forward_s[B][1] + T_pref(B, n) - T_pref(B, 1)`` for n > 1.
Per round the cells give one value each; the table holds their median over rounds and its distribution-free
standard error (the rule of :func:`fastspec.hf.costs.median_se`).  ``batch_overhead_s[B]["0"]`` is 1e-9 (vLLM's
per-step work is inside each cell), ``batch_overhead_s[B][k]`` the n-gram engine's extra per-step work, which this
method does not isolate: also 1e-9 (see the caveats).  The ``ngram`` draft: ``forward_s["1"] = 1e-9``,
``one_call_per_step``.  ``target.forward_s`` / ``overhead_s`` (the v1 fields) are the B = 1 entries.

Caveats (the comparison reports them): (1) a prefill step computes logits for each sequence's last position only,
a verify step for all k + 1 (the LM head of SmolLM2-135M is about a fifth of a token's compute), and the
rejection sampler and the n-gram lookup are not in the cells: the table prices a spec step low, so the
prediction over-states speculation, more at large B; (2) the shared prefix is one cached block, the real runs'
contexts are 105-148 prompt tokens + up to max_tokens generated; (3) the machine is shared: timings of a loaded
2-core machine, the same load for both engines only on average (rounds, rotation).  On an oversubscribed machine
vLLM's OpenMP threads spin while they wait for each other and throughput collapses (1-4 tokens/s instead of ~35
for SmolLM2-135M at B = 1, measured here); ``env={"OMP_WAIT_POLICY": "PASSIVE"}`` (the benchmark's default) lets
waiting threads sleep.
"""
from __future__ import annotations

import json
import os
import select
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from fastspec.engines.conventions import Counters, expected_counters
from fastspec.engines.errors import EngineError
from fastspec.engines.vllm.conventions import VLLM
from fastspec.engines.vllm.runner import INSTALL_HINT
from fastspec.engines.vllm.runner import WORKER as ONE_CONFIG_WORKER
from fastspec.costs.batch import break_even
from fastspec.errors import InvalidInput
from fastspec.stats import median_se

from .schedule import break_even_line, say_break_even

__all__ = ["BatchWorker", "VllmBatchResult", "measure_vllm_batch", "exact_counters", "cost_table_v2",
           "median_se", "forward_cells", "BATCH_WORKER", "CONFIGS"]

BATCH_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_worker.py")
CONFIGS = ("plain", "spec")
TINY_S = 1e-9  # the smallest time a cost table holds: "inside another entry"



class BatchWorker:
    """One vLLM engine in its own process (``_worker.py``, run by path: its folder holds no module named vllm),
    answering JSON jobs one at a time.  :meth:`close` asks it to quit and waits ``quit_wait_s`` seconds before it
    terminates (then kills) the process."""

    quit_wait_s = 30.0

    def __init__(self, python: str, job: dict, *, name: str, log_path: str, env: dict | None = None):
        self.name = name
        self._tmp = tempfile.TemporaryDirectory(prefix="fastspec-vllm-batch-")
        job_path = os.path.join(self._tmp.name, "job.json")
        with open(job_path, "w") as f:  # the worker reads vLLM's counters with the one-configuration worker's code
            json.dump({**job, "counters_from": ONE_CONFIG_WORKER}, f)
        full = dict(os.environ)
        full.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        full["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        full.update(env or {})
        self._log = open(log_path, "w")  # noqa: SIM115 - closed with the process
        try:
            self.proc = subprocess.Popen([python, BATCH_WORKER, job_path], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=self._log, env=full, text=True,
                                         start_new_session=True)
        except OSError as exc:
            self._log.close()
            raise EngineError(f"vllm ({name}): cannot start {python} ({exc.strerror}); {INSTALL_HINT}") from None
        self.log_path = log_path
        self.ready: dict | None = None

    def _read(self, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise EngineError(f"vllm ({self.name}): no answer within {timeout_s:.0f} s; see {self.log_path}")
            ready, _, _ = select.select([self.proc.stdout], [], [], min(left, 5.0))
            if ready:
                line = self.proc.stdout.readline()
                if not line:
                    raise EngineError(f"vllm ({self.name}) exited with {self.proc.wait()}; see {self.log_path}")
                msg = json.loads(line)
                if "error" in msg:
                    raise EngineError(f"vllm ({self.name}): {msg['error'][:500]}")
                return msg
            if self.proc.poll() is not None:
                raise EngineError(f"vllm ({self.name}) exited with {self.proc.returncode}; see {self.log_path}")

    def wait_ready(self, timeout_s: float = 600.0) -> dict:
        if self.ready is None:
            self.ready = self._read(timeout_s)
        return self.ready

    def call(self, cmd: dict, timeout_s: float = 600.0) -> dict:
        try:
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise EngineError(f"vllm ({self.name}) is gone; see {self.log_path}") from None
        return self._read(timeout_s)

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                try:
                    self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                    self.proc.stdin.flush()
                    self.proc.wait(self.quit_wait_s)
                except (BrokenPipeError, subprocess.TimeoutExpired, OSError):
                    self.proc.terminate()
                    try:
                        self.proc.wait(30)
                    except subprocess.TimeoutExpired:
                        self.proc.kill()
                        self.proc.wait(30)
        finally:
            self._log.close()
            self._tmp.cleanup()


def exact_counters(prompts: Sequence[Sequence[int]], records: Sequence[Sequence[int]], *, k: int, min_n: int,
                   max_n: int, max_tokens: int) -> list[Counters]:
    """vLLM's spec-decode counters per prompt at T = 0, exactly (:func:`expected_counters` under vLLM's rules and
    its n-gram rule) along ``records`` (the greedy continuations, at least ``max_tokens + k - 1`` tokens)."""
    from fastspec.ngram import proposals_along

    out = []
    for i, (p, r) in enumerate(zip(prompts, records, strict=True)):
        rec = np.asarray(r, np.int64)
        if len(rec) < max_tokens + k - 1:
            raise InvalidInput(f"records[{i}] holds {len(rec)} tokens; the counters of a {max_tokens}-token run "
                               f"with k = {k} need {max_tokens + k - 1}")
        ctx = np.concatenate([np.asarray(p, np.int64), rec])
        props = proposals_along(ctx, len(p), k, min_n=min_n, max_n=max_n, occurrence="earliest")

        def accept(s, props=props, rec=rec):
            n = int(props.num_draft[s])
            return (props.draft_tokens[s, :n] == rec[s:s + n]).astype(np.float64)
        out.append(expected_counters(accept, max_tokens, k, first_step=VLLM.first_step))
    return out


def sum_counters(cs: Sequence[Counters], k: int) -> dict:
    """Totals of per-prompt counters, vLLM's names (without the ``vllm:spec_decode_`` prefix)."""
    per_pos = [0.0] * k
    for c in cs:
        for j, v in enumerate(c.num_accepted_tokens_per_pos[:k]):
            per_pos[j] += v
    return {"num_drafts": float(sum(c.num_drafts for c in cs)),
            "num_draft_tokens": float(sum(c.num_draft_tokens for c in cs)),
            "num_accepted_tokens": float(sum(c.num_accepted_tokens for c in cs)),
            "num_accepted_tokens_per_pos": [float(v) for v in per_pos]}


def forward_cells(batches: Sequence[int], ns: Sequence[int]) -> list[tuple]:
    """The cells of one cost round: ("pref", B, n) for every B and n, ("dec", B, 1) for every B."""
    return [("pref", b, n) for b in batches for n in ns] + [("dec", b, 1) for b in batches]


def cost_table_v2(rounds: Sequence[dict], batches: Sequence[int], ns: Sequence[int], decode_steps: int, *,
                  k: int, draft: str, machine: str, context_length: int, note: str = "") -> dict:
    """The schema-v2 cost table from the cost rounds: each round maps a cell ``"pref B n"`` / ``"dec B 1"`` to the
    seconds it took (module docstring for the arithmetic).  A cell whose per-round value is not positive in more
    than half the rounds (noise larger than the difference) is refused: the table would be meaningless."""
    fwd, fwd_se = {}, {}
    for b in batches:
        step = [(r[f"dec {b} 1"] - r[f"pref {b} 1"]) / decode_steps for r in rounds]
        per_n = {1: step}
        for n in ns:
            if n != 1:
                per_n[n] = [s + r[f"pref {b} {n}"] - r[f"pref {b} 1"] for s, r in zip(step, rounds, strict=True)]
        fwd[str(b)], fwd_se[str(b)] = {}, {}
        for n, vals in sorted(per_n.items()):
            med, se = median_se(vals)
            if not med > 0:
                raise InvalidInput(f"batch {b}, n = {n}: the median forward time is {med:.3g} s (not positive): the "
                                   "machine's noise exceeds the differences; use more cost rounds or decode steps")
            fwd[str(b)][str(n)] = med
            fwd_se[str(b)][str(n)] = max(se, 0.0)
    ovh = {str(b): {"0": TINY_S, str(k): TINY_S} for b in batches}
    b1 = str(min(batches))
    return {
        "version": 2, "machine": machine, "context_length": int(context_length), "repeats": len(rounds),
        "note": note,
        "target": {"forward_s": dict(fwd[b1]), "forward_s_se": dict(fwd_se[b1]),
                   "batch_forward_s": fwd, "batch_forward_s_se": fwd_se},
        "drafts": {draft: {"forward_s": {"1": TINY_S}, "one_call_per_step": True,
                           "batch_forward_s": {str(b): {"1": TINY_S} for b in batches}}},
        "overhead_s": {"0": TINY_S, str(k): TINY_S},
        "batch_overhead_s": ovh,
    }


@dataclass
class VllmBatchResult:
    """What :func:`measure_vllm_batch` returns; ``as_dict()`` is its JSON."""

    engine_version: str
    target: str
    k: int
    prompt_lookup: list            # [min_n, max_n]
    batches: list
    max_tokens: int
    prompts: int
    rounds: int
    runs: list                     # one dict per (round, config, batch): wall_s, tokens, counters, same_as_record
    throughput: dict               # {config: {B: {"tokens_per_s", "runs", "spread"}}}
    speedup: dict                  # {B: measured spec / plain tokens/s}
    acceptance: dict               # {B: measured counters summed over the rounds' runs, mean acceptance length}
    exact: dict                    # the exact counters (sum over prompts) predicted from the record
    counters_exact_match: bool     # every spec run's counters equal the exact prediction
    outputs_match_record: bool     # every run's tokens equal the record's first max_tokens
    cost_table: dict
    cost_rounds: list
    load_s: dict
    wall_s: float
    prefill_s: dict = field(default_factory=dict)  # {B: median wall of every prompt with max_tokens = 1 at B}
    records: list = field(default_factory=list)
    warnings: list = field(default_factory=list)

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def _check(batches, max_tokens, k, prompts):
    if not prompts:
        raise InvalidInput("prompts is empty: give at least one prompt")
    for i, b in enumerate(batches):
        if not isinstance(b, int) or not 1 <= b <= 4096:
            raise InvalidInput(f"batches[{i}] = {b!r}: a batch size is an integer in 1..4096")
    if not 1 <= int(k) <= 64:
        raise InvalidInput(f"k = {k}: num_speculative_tokens is an integer in 1..64")
    if not 2 <= int(max_tokens) <= 1 << 20:
        raise InvalidInput(f"max_tokens = {max_tokens}: give 2..2**20 tokens")


def measure_vllm_batch(python: str, model: str, prompts: Sequence[Sequence[int]], *, k: int = 4, min_n: int = 1,
                       max_n: int = 3, batches: Sequence[int] = (1, 2, 4, 8, 16), max_tokens: int = 64,
                       rounds: int = 2, cost_rounds_per_round: int = 2, decode_steps: int = 8, seed: int = 0,
                       log_dir: str | None = None, machine: str = "", timeout_s: float = 600.0,
                       env: dict | None = None, progress: Callable[[str], None] | None = None) -> VllmBatchResult:
    """Measure (module docstring): ``rounds`` throughput rounds, each followed by ``cost_rounds_per_round`` cost
    rounds.  ``python``: vLLM's Python; ``log_dir``: where the engines' logs go (a temporary folder otherwise);
    ``env``: extra environment of both engines (e.g. ``VLLM_CPU_OMP_THREADS_BIND``)."""
    batches = sorted({int(b) for b in batches})
    _check(batches, max_tokens, k, prompts)
    say = progress or (lambda _m: None)
    t_start = time.perf_counter()
    prompts = [[int(t) for t in p] for p in prompts]
    longest = max(len(p) for p in prompts)
    max_model_len = max(longest + max_tokens + k + 8, 512)
    spec_cfg = {"method": "ngram", "num_speculative_tokens": int(k), "prompt_lookup_min": int(min_n),
                "prompt_lookup_max": int(max_n)}
    base = {"model": os.path.abspath(model), "seed": int(seed), "max_model_len": max_model_len,
            "max_num_seqs": max(batches), "block_size": None, "dtype": "float32"}
    tmp = None
    if log_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="fastspec-vllm-batch-logs-")
        log_dir = tmp.name
    os.makedirs(log_dir, exist_ok=True)
    workers = {}
    try:
        for cfg, spec in (("plain", None), ("spec", spec_cfg)):
            workers[cfg] = BatchWorker(python, dict(base, speculative_config=spec), name=cfg,
                                       log_path=os.path.join(log_dir, f"vllm_batch_{cfg}.log"), env=env)
        load = {cfg: w.wait_ready(timeout_s) for cfg, w in workers.items()}
        say("vllm: both engines loaded (" + ", ".join(f"{c} {v['load_s']:.0f} s" for c, v in load.items()) + ")")
        plain, spec = workers["plain"], workers["spec"]
        # the record (and the plain engine's warm-up): every prompt with max_tokens + k tokens, all in flight
        rec = plain.call({"op": "run", "prompts": prompts, "max_tokens": max_tokens + k,
                          "concurrency": max(batches)}, timeout_s)
        records = rec["outputs"]
        spec.call({"op": "run", "prompts": prompts[:2], "max_tokens": 8, "concurrency": 2}, timeout_s)  # warm-up
        exact = sum_counters(exact_counters(prompts, records, k=k, min_n=min_n, max_n=max_n,
                                            max_tokens=max_tokens), k)
        # the cost cells: a shared prefix of one KV block, cached once
        block = int(load["plain"]["block_size"])
        pool = [t for p in prompts for t in p]
        if len(pool) < block + 7 * max(batches) + k + 1:
            raise InvalidInput(f"the prompts hold {len(pool)} tokens in all; the cost cells need at least "
                               f"{block + 7 * max(batches) + k + 1} (one {block}-token KV block + the tails)")
        prefix = pool[:block]
        ns = list(range(1, k + 2))
        cells = forward_cells(batches, ns)
        tails = [pool[block + 7 * j: block + 7 * j + k + 1] for j in range(max(batches))]
        plain.call({"op": "time", "requests": [prefix + tails[0][:1]], "max_tokens": 1}, timeout_s)
        for c in cells[:len(ns)]:  # the smallest batch's cells once, untimed (the record warmed the rest)
            plain.call({"op": "time", "requests": [prefix + t[:c[2]] for t in tails[:c[1]]], "max_tokens": 1})
        runs, cost_rounds = [], []
        for r in range(rounds):
            order = batches[r % len(batches):] + batches[:r % len(batches)]
            for i, b in enumerate(order):
                pair = CONFIGS if (r + i) % 2 == 0 else CONFIGS[::-1]
                for cfg in pair:
                    out = workers[cfg].call({"op": "run", "prompts": prompts, "max_tokens": max_tokens,
                                             "concurrency": b}, timeout_s)
                    tokens = sum(len(o) for o in out["outputs"])
                    same = all(o == rr[:max_tokens] for o, rr in zip(out["outputs"], records, strict=True))
                    c = {n.removeprefix("vllm:spec_decode_"): v for n, v in out["counters"].items()}
                    runs.append({"round": r, "config": cfg, "batch": b, "wall_s": out["wall_s"], "tokens": tokens,
                                 "steps": out["steps"],
                                 "request_steps": sum(out["busy"]), "counters": c if cfg == "spec" else None,
                                 "same_as_record": same})
                    say(f"vllm: round {r + 1}/{rounds} B = {b} {cfg}: {tokens / out['wall_s']:.1f} tokens/s")
                # the prefill share: every prompt with max_tokens = 1 at the same concurrency (plain engine)
                out = plain.call({"op": "run", "prompts": prompts, "max_tokens": 1, "concurrency": b}, timeout_s)
                runs.append({"round": r, "config": "prefill", "batch": b, "wall_s": out["wall_s"],
                             "tokens": len(prompts), "steps": out["steps"], "request_steps": sum(out["busy"]),
                             "counters": None, "same_as_record": all(
                                 o == rr[:1] for o, rr in zip(out["outputs"], records, strict=True))})
            for cr in range(cost_rounds_per_round):
                idx = (r * cost_rounds_per_round + cr) % len(cells)
                got = {}
                for kind, b, n in cells[idx:] + cells[:idx]:
                    mt = 1 + decode_steps if kind == "dec" else 1
                    out = plain.call({"op": "time", "requests": [prefix + t[:n] for t in tails[:b]],
                                      "max_tokens": mt}, timeout_s)
                    got[f"{kind} {b} {n}"] = out["wall_s"]
                cost_rounds.append(got)
            say(f"vllm: cost rounds {len(cost_rounds)} done")
    finally:
        for w in workers.values():
            w.close()
        if tmp is not None:
            tmp.cleanup()
    table = cost_table_v2(cost_rounds, batches, ns, decode_steps, k=k, draft=f"ngram.vllm{min_n}-{max_n}",
                          machine=machine or "vllm-cpu", context_length=len(prefix),
                          note="measured in vLLM (benchmarks/vllm_batch): prefill-shaped forwards over a "
                               "cached prefix; a shared, loaded machine")
    return summarize(runs, records, exact, table, cost_rounds, batches=batches, k=k, min_n=min_n, max_n=max_n,
                     max_tokens=max_tokens, prompts=len(prompts), rounds=rounds, target=model,
                     version=load["plain"]["vllm_version"], load_s={c: v["load_s"] for c, v in load.items()},
                     wall_s=time.perf_counter() - t_start)


def summarize(runs, records, exact, table, cost_rounds, *, batches, k, min_n, max_n, max_tokens, prompts, rounds,
              target, version, load_s, wall_s) -> VllmBatchResult:
    """Aggregate the runs: tokens/s per (config, B) as a ratio of totals over rounds, the spread (min, max) of
    the rounds' values, the speed-up, the counters summed over the rounds and their agreement with ``exact``."""
    thr, acc, speed = {c: {} for c in CONFIGS}, {}, {}
    warnings = []
    prefill = {str(b): statistics.median(x["wall_s"] for x in runs if x["config"] == "prefill" and x["batch"] == b)
               for b in batches if any(x["config"] == "prefill" and x["batch"] == b for x in runs)}
    for cfg in CONFIGS:
        for b in batches:
            rs = [x for x in runs if x["config"] == cfg and x["batch"] == b]
            if not rs:
                continue
            each = [x["tokens"] / x["wall_s"] for x in rs]
            thr[cfg][str(b)] = {"tokens_per_s": sum(x["tokens"] for x in rs) / sum(x["wall_s"] for x in rs),
                                "runs": len(rs), "spread": [min(each), max(each)]}
    match = True
    for b in batches:
        if str(b) in thr["plain"] and str(b) in thr["spec"]:
            speed[str(b)] = thr["spec"][str(b)]["tokens_per_s"] / thr["plain"][str(b)]["tokens_per_s"]
        rs = [x for x in runs if x["config"] == "spec" and x["batch"] == b]
        if not rs:
            continue
        drafts = sum(x["counters"].get("num_drafts", 0) for x in rs)
        accepted = sum(x["counters"].get("num_accepted_tokens", 0) for x in rs)
        acc[str(b)] = {"num_drafts": drafts, "num_accepted_tokens": accepted,
                       "mean_acceptance_length": 1 + accepted / drafts if drafts else 1.0,
                       "tokens_per_request_step": sum(x["tokens"] for x in rs) / sum(x["request_steps"] for x in rs)}
        for x in rs:
            c = x["counters"]
            got = (c.get("num_drafts", 0), c.get("num_draft_tokens", 0), c.get("num_accepted_tokens", 0),
                   list(c.get("num_accepted_tokens_per_pos") or [0] * k)[:k])
            want = (exact["num_drafts"], exact["num_draft_tokens"], exact["num_accepted_tokens"],
                    exact["num_accepted_tokens_per_pos"])
            if not (all(abs(a - w) < 1e-9 for a, w in zip(got[:3], want[:3], strict=True))
                    and all(abs(a - w) < 1e-9 for a, w in zip(got[3], want[3], strict=True))):
                match = False
                warnings.append(f"round {x['round']} B = {b}: vLLM's counters {got} differ from the exact "
                                f"prediction {want}")
    same = all(x["same_as_record"] for x in runs)
    if not same:
        bad = sorted({(x["config"], x["batch"]) for x in runs if not x["same_as_record"]})
        warnings.append(f"T = 0 outputs differ from the record for {bad}: batching or speculation changed greedy "
                        "tokens (float rounding of near ties)")
    ex = dict(exact, mean_acceptance_length=1 + exact["num_accepted_tokens"] / exact["num_drafts"]
              if exact["num_drafts"] else 1.0)
    return VllmBatchResult(version, os.path.abspath(target), k, [min_n, max_n], list(batches), max_tokens, prompts,
                           rounds, runs, thr, speed, acc, ex, match, same, table, cost_rounds, load_s, wall_s,
                           prefill, records, warnings)


def _rel(pred, meas):
    return pred / meas - 1.0 if pred is not None and meas else None


def compare_with_prediction(measured: dict, prediction: dict, draft: str, k: int) -> dict:
    """Predicted against measured, per batch size: ``measured`` is :meth:`VllmBatchResult.as_dict`, ``prediction``
    the ``as_dict()`` of :func:`fastspec.simulation.batch.batch_predictions` (``plain`` and ``rows``).  Returns
    ``rows`` (per B: tokens/s of plain and spec decoding and the speed-up, measured and predicted, and the
    relative errors predicted / measured - 1), ``break_even`` (measured and predicted, :func:`break_even`) and
    ``break_even_matches`` (same ``pays_up_to`` and ``stops_at``)."""
    plain = {int(p["batch"]): p for p in prediction["plain"]}
    spec = {int(r["batch"]): r for r in prediction["rows"] if r["draft"] == draft and int(r["k"]) == int(k)}
    n_req, m_tok = measured.get("prompts"), measured.get("max_tokens")

    def with_prefill(b, tps, m):
        """End-to-end tokens/s: the measured prefill wall at B plus the predicted decoding of the other tokens
        (each request's prefill step emits m of its tokens: one without speculation, the tokens per step with)."""
        w1 = (measured.get("prefill_s") or {}).get(str(b))
        if w1 is None or tps is None or not n_req or not m_tok:
            return None
        return n_req * m_tok / (w1 + n_req * max(m_tok - m, 0.0) / tps)

    rows = []
    for b in measured["batches"]:
        mp = measured["throughput"]["plain"].get(str(b), {}).get("tokens_per_s")
        ms = measured["throughput"]["spec"].get(str(b), {}).get("tokens_per_s")
        msp = measured["speedup"].get(str(b))
        pp = plain[b]["tokens_per_s"] if b in plain else None
        ps = spec[b]["tokens_per_s"] if b in spec else None
        psp = spec[b]["speedup"] if b in spec else None
        pp_e = with_prefill(b, pp, 1.0)
        ps_e = with_prefill(b, ps, spec[b]["tokens_per_step"]) if b in spec else None
        psp_e = ps_e / pp_e if ps_e is not None and pp_e else None
        rows.append({"batch": b, "plain_measured": mp, "plain_predicted": pp, "plain_rel_error": _rel(pp, mp),
                     "plain_predicted_e2e": pp_e, "plain_rel_error_e2e": _rel(pp_e, mp),
                     "spec_predicted_e2e": ps_e, "spec_rel_error_e2e": _rel(ps_e, ms),
                     "speedup_predicted_e2e": psp_e, "speedup_rel_error_e2e": _rel(psp_e, msp),
                     "spec_measured": ms, "spec_predicted": ps, "spec_rel_error": _rel(ps, ms),
                     "speedup_measured": msp, "speedup_predicted": psp,
                     "speedup_ci95_predicted": spec[b].get("speedup_ci95") if b in spec else None,
                     "speedup_rel_error": _rel(psp, msp),
                     "mean_acceptance_length_measured": measured["acceptance"].get(str(b), {}).get(
                         "mean_acceptance_length"),
                     "tokens_per_step_measured": measured["acceptance"].get(str(b), {}).get(
                         "tokens_per_request_step"),
                     "tokens_per_step_predicted": spec[b]["tokens_per_step"] if b in spec else None})
    m_be = break_even([(r["batch"], r["speedup_measured"]) for r in rows if r["speedup_measured"] is not None])
    p_be = break_even([(r["batch"], r["speedup_predicted"]) for r in rows if r["speedup_predicted"] is not None])
    e_pts = [(r["batch"], r["speedup_predicted_e2e"]) for r in rows if r["speedup_predicted_e2e"] is not None]
    e_be = break_even(e_pts) if e_pts else None

    def same(x):
        return x is not None and all(m_be[key] == x[key] for key in ("status", "pays_up_to", "stops_at"))
    return {"draft": draft, "k": int(k), "rows": rows,
            "break_even": {"measured": m_be, "predicted": p_be, "predicted_e2e": e_be},
            "break_even_matches": same(p_be), "break_even_matches_e2e": same(e_be) if e_be else None}


def comparison_table(comparison: dict) -> str:
    """The comparison as a Markdown table (one row per batch size) and a line on the break-even batch size."""
    def f(v, fmt="{:.1f}"):
        return "-" if v is None else fmt.format(v)

    pc = "{:+.0%}"
    lines = ["| B | plain tok/s: measured / predicted (err) / + prefill (err) | ngram tok/s: measured / predicted "
             "(err) / + prefill (err) | speed-up: measured / predicted [95% CI] (err) / + prefill (err) | "
             "tokens/step vLLM / predicted |", "|---|---|---|---|---|"]
    for r in comparison["rows"]:
        ci = r["speedup_ci95_predicted"]
        lines.append(
            f"| {r['batch']} | {f(r['plain_measured'])} / {f(r['plain_predicted'])} ({f(r['plain_rel_error'], pc)})"
            f" / {f(r.get('plain_predicted_e2e'))} ({f(r.get('plain_rel_error_e2e'), pc)}) | "
            f"{f(r['spec_measured'])} / {f(r['spec_predicted'])} ({f(r['spec_rel_error'], pc)}) / "
            f"{f(r.get('spec_predicted_e2e'))} ({f(r.get('spec_rel_error_e2e'), pc)}) | "
            f"{f(r['speedup_measured'], '{:.2f}')} / {f(r['speedup_predicted'], '{:.2f}')}"
            + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "") + f" ({f(r['speedup_rel_error'], pc)}) / "
            f"{f(r.get('speedup_predicted_e2e'), '{:.2f}')} ({f(r.get('speedup_rel_error_e2e'), pc)}) | "
            f"{f(r['tokens_per_step_measured'], '{:.2f}')} / {f(r['tokens_per_step_predicted'], '{:.2f}')} |")
    lines.append("")
    be = comparison["break_even"]
    lines.append(break_even_line(be, comparison["break_even_matches"]))
    if be.get("predicted_e2e"):
        lines.append(f"break-even with the measured prefill added: predicted {say_break_even(be['predicted_e2e'])} -- "
                     + ("matches" if comparison["break_even_matches_e2e"] else "does NOT match"))
    return "\n".join(lines)

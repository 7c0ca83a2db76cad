"""llama.cpp's ngram-simple speculator on the clock: predicted counters and speed-up against llama-server's own.

    python benchmarks/bench_llamacpp_ngram.py [--model GGUF] [--configs 3:4,2:8,5:5] [--rounds 3]
                                              [--n-predict 96] [--threads 2] [--out RESULT.json]

Needs the llama.cpp build (``scripts/llamacpp_build.sh``; ``FASTSPEC_LLAMACPP_BIN`` or ``--bin``) and a GGUF
target (default: the F32 SmolLM2-135M-Instruct of ``scripts/llamacpp_models.sh``).  It starts, on free loopback
ports, one plain ``llama-server`` and one per ngram-simple configuration (``-np 1 -c 2048 -t THREADS``), then:

1. **The record.**  Each prompt of ``data/prompts_lookup.jsonl`` (its chat template applied by the server) is
   generated at T = 0 by the plain server.  The prediction of every configuration's counters and steps comes from
   this record alone (:func:`fastspec.engines.llamacpp.ngram.ngram_simple_counters`).
2. **The cost table**, measured through the plain server at the same thread count: ``target.forward_s[n]`` is
   a forward over n new tokens after a cached prefix (``/completion`` with ``cache_prompt``: ``timings.prompt_ms``
   with ``prompt_n = n``), n = 1 .. size_m + 1.  Such a forward computes the logits of its last position only,
   while a decoding or verification step computes (and samples) all n: that is a cost ``c`` per verified
   position.  A step that verified a draft also pays a constant ``e`` of its own (the draft's batch, the KV
   cache's rollback of rejected positions), so ``overhead_s[0] = c`` and ``overhead_s[k] = (k + 1) c + e``;
   ``c`` and ``e`` are fitted on the **calibration** prompts (the first half) by least squares of (measured -
   forwards) against (verified positions, speculative steps), plain and speculative runs together.
3. **The clock.**  ``--rounds`` rounds; in each, every prompt goes to every server, the server order rotated
   per prompt, so machine drift hits all alike.  Speed-up measured = plain ``predicted_ms`` / speculative
   ``predicted_ms`` (llama-server's own generation time, after the first token), medians over rounds, summed
   over the **test** prompts (the second half); predicted = ((n - 1) (forward_s[1] + overhead_s[0])) / sum over
   the predicted steps of (forward_s[d + 1] + overhead_s[d]).  ``--out`` keeps every request's timings, so the
   fit can be redone from the file.

Prints one row per configuration: counters measured / predicted (test and calibration prompts), same text or
not, speed-up measured / predicted and the error, and the verdict (pays / does not pay) of each.  ``--out``
writes the whole result as JSON, ``--costs-out`` the cost table (version 1 schema, ``fastspec.costs``).
Wall-clock figures are valid on a quiet machine only: the script prints the load average before and after.
"""
from __future__ import annotations

import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from _llamacpp_bench import (EOG, Forwards, OverheadFit, cost_table, parser,  # noqa: E402
                              Server, counters, interleaved_rounds, measured, print_report, prompt_ids,
                              row, seconds, stop_all, timings_json)
from fastspec.engines.llamacpp.ngram import NgramSimple, ngram_simple_counters, ngram_simple_time  # noqa: E402


def write_record(path, args, configs, names, prompts, records, runs):
    out = {"what": f"llama-server (llama.cpp 11434) at T = 0, {os.path.basename(args.model)}, -t {args.threads} "
                   "-c 2048 -np 1, /completion with token-id prompts (the chat template of data/prompts_lookup.jsonl), "
                   f"n_predict {args.n_predict}, cache_prompt false: the plain server's output, then each ngram-simple "
                   f"configuration's counters; written by benchmarks/bench_llamacpp_ngram.py --record on "
                   f"{time.strftime('%Y-%m-%d')}",
           "n_predict": args.n_predict, "n_ctx": 2048, "eog": list(EOG), "prompts": prompts, "plain": records,
           "runs": []}
    for c, name in zip(configs, names[1:], strict=True):
        for i in range(len(prompts)):
            first = runs[name][i][0]
            out["runs"].append({"size_n": c.size_n, "size_m": c.size_m, "prompt": i,
                                "draft_n": measured(first)[0], "draft_n_accepted": measured(first)[1],
                                "tokens": None if first["tokens"] == records[i] else first["tokens"]})
    with open(path, "w") as f:
        f.write(json.dumps(out, separators=(",", ":")) + "\n")


def main(argv=None):
    ap = parser(__doc__, "3:4,2:8,5:5")
    ap.add_argument("--record", help="write the first round's requests (prompt ids, the plain output, each "
                    "configuration's counters and output where it differs) as the JSON that "
                    "tests/test_llamacpp_ngram.py replays")
    args = ap.parse_args(argv)
    configs = [NgramSimple(*map(int, c.split(":"))) for c in args.configs.split(",")]
    load0 = os.getloadavg()

    plain = Server(args.bin, args.model, args.threads)
    servers = [plain]
    try:
        servers += [Server(args.bin, args.model, args.threads, c.server_args()) for c in configs]
        prompts = prompt_ids(plain, args.prompts)
        half = len(prompts) // 2
        names = ["plain"] + [f"ngram-simple {c.size_n}:{c.size_m}" for c in configs]
        fwd = Forwards(plain, max(c.size_m for c in configs) + 1)
        runs, records = interleaved_rounds(servers, names, prompts, args.rounds, args.n_predict,
                                           fwd.measure)
        load1 = os.getloadavg()
    finally:
        stop_all(servers)

    plain_tok = [len(rs[0]["tokens"]) for rs in runs["plain"]]
    forward = fwd.table()
    forward_of = fwd.seconds()

    def steps_of(c, i, output):
        return ngram_simple_counters(prompts[i], output, c, n_predict=args.n_predict, n_ctx=2048, eog=EOG)

    fit, pred_steps = OverheadFit(), {}
    for c, name in zip(configs, names[1:], strict=True):
        for i in range(len(prompts)):
            pred_steps[name, i] = steps = steps_of(c, i, records[i])
            if i < half:
                fit.add(steps, seconds(runs[name][i]), ngram_simple_time(steps, forward_of))
    for i in range(half):
        fit.add_plain(plain_tok[i], seconds(runs["plain"][i]), forward_of(1))
    c_fit, e_fit = fit.fit()

    rows = []
    for c, name in zip(configs, names[1:], strict=True):
        for part, idx in (("calibration", range(half)), ("test", range(half, len(prompts)))):
            own = sum(counters(steps_of(c, i, r["tokens"])) == measured(r) for i in idx for r in runs[name][i])
            p_spec = sum(ngram_simple_time(pred_steps[name, i], forward_of, fit.overhead) for i in idx)
            p_plain = sum((plain_tok[i] - 1) * (forward_of(1) + fit.overhead(0)) for i in idx)
            rows.append(row(name, part, idx, runs, records, runs["plain"], args.rounds,
                            [counters(pred_steps[name, i]) for i in idx], own, p_spec, p_plain))

    print_report(load0, load1, args.threads, len(prompts), half, args.rounds, args.n_predict,
                 {"target": forward}, fit, rows)
    table = cost_table(args.threads, "benchmarks/bench_llamacpp_ngram.py", forward, {}, fit)
    if args.costs_out:
        table.save(args.costs_out)
    if args.record:
        write_record(args.record, args, configs, names, prompts, records, runs)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"load_before": load0, "load_after": load1, "threads": args.threads, "rounds": args.rounds,
                       "n_predict": args.n_predict, "model": os.path.basename(args.model),
                       "cost_table": table.as_dict(), "fit": {"c_s": c_fit, "e_s": e_fit}, "rows": rows,
                       "forward_ms": {str(n): v for n, v in sorted(fwd.ms.items())},
                       "timings": timings_json(runs, names)}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()

"""llama.cpp's model drafts on the clock: predicted counters and speed-up against llama-server's own.

    python benchmarks/bench_llamacpp_draft.py [--model GGUF] [--configs q8_0:2,q4_0:3,q2_k:3,q4_0:5]
                                              [--rounds 3] [--n-predict 96] [--threads 2] [--out RESULT.json]

Needs the llama.cpp build (``scripts/llamacpp_build.sh``; ``FASTSPEC_LLAMACPP_BIN`` or ``--bin``) and the GGUF
models of ``scripts/llamacpp_models.sh`` (default target: the F32 SmolLM2-135M-Instruct; a configuration
``NAME:K`` is the draft ``draft-NAME.gguf`` of ``--drafts-dir`` with ``--spec-draft-n-max K``).  It starts, on free
loopback ports, one plain ``llama-server`` of the target, one of each draft, and one per configuration (``-md
DRAFT --spec-type draft-simple``, p_min 0, n_min 0, greedy drafting; ``-np 1 -c 2048 -t/-td THREADS``), then, as
``bench_llamacpp_ngram.py`` does:

1. **The record.**  Each prompt of ``data/prompts_lookup.jsonl`` (its chat template applied by the server) is
   generated at T = 0 with ``ignore_eos`` (exactly ``n_predict`` tokens) by the plain server.  The prediction of
   every configuration's steps comes from this record and the draft's own greedy continuations, asked of the
   draft's plain server (:func:`fastspec.engines.llamacpp.measure.greedy_steps`, the rollout of
   :class:`~fastspec.engines.llamacpp.measure.TeacherForcing`), after the timed rounds.
2. **The cost table**, through the plain servers at the same thread count: ``forward_s[n]`` of the target and of
   each draft, a forward over n new tokens after a cached prefix (``cache_prompt``, ``prompt_n = n``), n = 1 ..
   k + 1.  A step that drafts d tokens costs d single-token draft forwards, the target's forward over d + 1
   tokens and the draft's forward over the same d + 1 tokens (llama.cpp re-evaluates the verified batch on the
   draft: :func:`~fastspec.engines.llamacpp.measure.model_draft_time`, which cites the source), plus the
   overheads ``c`` per verified position and ``e`` per speculative step fitted on the **calibration** prompts
   (the first half), plain and speculative requests together.
3. **The clock.**  ``--rounds`` interleaved rounds (the server order rotated per prompt).  Speed-up measured =
   plain ``predicted_ms`` / speculative ``predicted_ms`` (medians over rounds, summed over the **test** prompts);
   predicted = (n - 1) (forward_s[1] + c) / the predicted steps' seconds.

Prints the cost tables, the fit, one row per configuration (counters measured / predicted, same text, the
prediction from each request's own output, speed-up measured / predicted, error, verdict) and why each pays or
not: the tokens a step yields against what it costs, in units of the plain step.  ``--out`` writes it all as JSON,
``--costs-out`` the cost table (version 1 schema, ``fastspec.costs``).  Valid on a quiet machine only: the load
average before and after is printed.
"""
from __future__ import annotations

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from _llamacpp_bench import (MODELS, Forwards, OverheadFit, Server, cost_table, parser,  # noqa: E402
                              counters, interleaved_rounds, measured, print_report, prompt_ids, row, seconds,
                              stop_all, timings_json)
from fastspec.engines.llamacpp.measure import TeacherForcing, greedy_steps, model_draft_time  # noqa: E402

NO_EOS = {"ignore_eos": True}


class _Body:
    """A bench server as :class:`TeacherForcing` asks it: ``complete(body)``."""

    def __init__(self, server):
        self.server, self.name = server, server.name

    def complete(self, body):
        return self.server.post("/completion", body)


def _spec_flags(path, k, threads):
    return ["-md", path, "-td", str(threads), "-tbd", str(threads), "--spec-type", "draft-simple",
            "--spec-draft-n-max", str(k), "--spec-draft-n-min", "0", "--spec-draft-p-min", "0.0",
            "--spec-draft-sampling", "greedy"]


def main(argv=None):
    ap = parser(__doc__, "q8_0:2,q4_0:3,q2_k:3,q4_0:5")
    ap.add_argument("--drafts-dir", default=MODELS)
    args = ap.parse_args(argv)
    configs = [(c.split(":")[0], int(c.split(":")[1])) for c in args.configs.split(",")]
    drafts = sorted({d for d, _ in configs})
    k_max = {d: max(k for e, k in configs if e == d) for d in drafts}
    path = {d: os.path.join(args.drafts_dir, f"draft-{d}.gguf") for d in drafts}
    n_max = max(k_max.values()) + 1
    load0 = os.getloadavg()

    plain = Server(args.bin, args.model, args.threads, body=NO_EOS, name="target")
    servers, dservers = [plain], {}
    try:
        dservers = {d: Server(args.bin, path[d], args.threads, body=NO_EOS, name=d) for d in drafts}
        servers += [Server(args.bin, args.model, args.threads, _spec_flags(path[d], k, args.threads), body=NO_EOS)
                    for d, k in configs]
        prompts = prompt_ids(plain, args.prompts)
        half = len(prompts) // 2
        names = ["plain"] + [f"{d} k={k}" for d, k in configs]
        fwd = {"target": Forwards(plain, n_max)} | {d: Forwards(dservers[d], k_max[d] + 1) for d in drafts}

        def after(ids, record):
            for f in fwd.values():
                f.measure(ids, record)
        runs, records = interleaved_rounds(servers, names, prompts, args.rounds, args.n_predict, after)
        load1 = os.getloadavg()
        if any(len(r) != args.n_predict for r in records):
            raise SystemExit(f"a plain output is not {args.n_predict} tokens long (context full?)")

        tf = {d: TeacherForcing(_Body(dservers[d])) for d in drafts}

        def steps_of(d, k, i, output):
            def roll(context, n):  # one rollout per context, as long as the draft's longest k: its prefixes
                toks, tops = tf[d].rollout(context, k_max[d])
                return toks[:n], tops[:n]
            return greedy_steps(prompts[i], output, args.n_predict, k, roll)

        pred = {(name, i): steps_of(d, k, i, records[i])
                for (d, k), name in zip(configs, names[1:], strict=True) for i in range(len(prompts))}
        own = {name: [sum(counters(steps_of(d, k, i, r["tokens"])) == measured(r) for r in runs[name][i])
                      for i in range(len(prompts))] for (d, k), name in zip(configs, names[1:], strict=True)}
    finally:
        stop_all([*servers, *dservers.values()])

    t_s = fwd["target"].seconds()
    d_s = {d: fwd[d].seconds() for d in drafts}
    fit = OverheadFit()
    for (d, _k), name in zip(configs, names[1:], strict=True):
        for i in range(half):
            fit.add(pred[name, i], seconds(runs[name][i]), model_draft_time(pred[name, i], t_s, d_s[d]))
    for i in range(half):
        fit.add_plain(args.n_predict, seconds(runs["plain"][i]), t_s(1))
    c_fit, e_fit = fit.fit()

    rows, why = [], []
    for (d, k), name in zip(configs, names[1:], strict=True):
        for part, idx in (("calibration", range(half)), ("test", range(half, len(prompts)))):
            p_spec = sum(model_draft_time(pred[name, i], t_s, d_s[d], fit.overhead) for i in idx)
            p_plain = len(idx) * (args.n_predict - 1) * (t_s(1) + fit.overhead(0))
            rows.append(row(name, part, idx, runs, records, runs["plain"], args.rounds,
                            [counters(pred[name, i]) for i in idx], sum(own[name][i] for i in idx), p_spec, p_plain))
        why.append(explain(name, k, [pred[name, i] for i in range(half, len(prompts))], t_s, d_s[d], fit))

    tables = {"target": fwd["target"].table()} | {f"draft {d}": fwd[d].table() for d in drafts}
    print_report(load0, load1, args.threads, len(prompts), half, args.rounds, args.n_predict, tables, fit, rows)
    for w in why:
        print(w["line"])
    forward = tables["target"]
    table = cost_table(args.threads, "benchmarks/bench_llamacpp_draft.py", forward,
                       {d: fwd[d].table() for d in drafts}, fit)
    if args.costs_out:
        table.save(args.costs_out)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"load_before": load0, "load_after": load1, "threads": args.threads, "rounds": args.rounds,
                       "n_predict": args.n_predict, "model": os.path.basename(args.model), "configs": args.configs,
                       "cost_table": table.as_dict(), "fit": {"c_s": c_fit, "e_s": e_fit}, "rows": rows,
                       "why": why, "forward_ms": {m: {str(n): v for n, v in sorted(f.ms.items())}
                                                  for m, f in fwd.items()},
                       "eos_divergences": {d: tf[d].eos_divergences for d in drafts},
                       "steps": {name: [list(map(list, pred[name, i].steps)) for i in range(len(prompts))]
                                 for name in names[1:]},
                       "timings": timings_json(runs, names)}, f, indent=1)
    return rows


def explain(name, k, steps, t_s, d_s, fit):
    """Why a configuration pays or not, on the test prompts' predicted steps: tokens per step against the step's
    cost in plain steps (a plain step: one target forward + c), split into target, draft and overhead."""
    n_steps = sum(len(s.steps) for s in steps)
    tokens = sum(s.tokens - 1 for s in steps)
    plain = t_s(1) + fit.overhead(0)
    target = sum(t_s(d + 1) for s in steps for d, _ in s.steps)
    draft = sum(model_draft_time(s, lambda _n: 0.0, d_s) for s in steps)
    over = sum(fit.overhead(d) for s in steps for d, _ in s.steps)
    cost = (target + draft + over) / n_steps / plain
    per_step = tokens / n_steps
    line = (f"{name}: {per_step:.2f} tokens per step for {cost:.2f} plain steps (target {target / n_steps / plain:.2f}"
            f", draft {draft / n_steps / plain:.2f}, overhead {over / n_steps / plain:.2f}; draft forward[1] / target "
            f"forward[1] = {d_s(1) / t_s(1):.2f}, draft forward[{k + 1}] / target = {d_s(k + 1) / t_s(1):.2f}): "
            f"{'pays' if per_step > cost else 'does not pay'} ({per_step / cost:.2f}x)")
    return {"config": name, "tokens_per_step": per_step, "step_cost_in_plain_steps": cost,
            "target": target / n_steps / plain, "draft": draft / n_steps / plain, "overhead": over / n_steps / plain,
            "line": line}


if __name__ == "__main__":
    main()

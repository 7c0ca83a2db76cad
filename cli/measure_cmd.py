"""``fastspec measure``: real speculative decoding on the CPU, timed against plain decoding, vs ``simulate``'s
offline prediction (needs fastspec[hf])."""
from __future__ import annotations

import os
from typing import List, Optional

import typer
from rich.table import Table

from fastspec.engines.registry import check_engine_flags, engines_help

from ._common import fail, print_json, stage_progress, stderr_console, stdout_console
from ._hf import check_drafts, check_options, ignore_eos_option, import_hf, set_threads
from ._options import (REPEATS_HELP, SEED_HELP, THREADS_HELP, TOKENS_HELP, config_from_flags,
                       flag_errors, json_option, k_option, min_p_option, parse_k, sampling_params, seed_option,
                       target_option, temperature_option, top_k_option, top_p_option)
from ._app import app
from ._engine_vllm import measure_engine
from ._engine_hf import POLICY_HELP, render_policy_rows

DRAFT_HELP = ("NAME=MODEL (repeatable); MODEL: directory, .gguf file, exitL (the target's first L layers), or an "
              "n-gram prompt-lookup draft: ngram (n-grams of 1 to 3 tokens) or ngramMIN-MAX (also ngram:MIN-MAX), "
              "fastspec's rule (latest occurrence); ngram.vllm / ngram.vllmN / ngram.vllmMIN-MAX (vLLM's rule: "
              "earliest occurrence, n 5-5 by default); ngram.hf / ngram.hfMAX (Hugging Face prompt lookup: earliest, "
              "n 1-2 by default); a bare one is named by its rule and bounds (ngram.vllm5-5).  With --engine llamacpp: "
              "NAME=DRAFT.gguf, or ngram-simple / ngram-simple:N (llama.cpp's n-gram speculator, lookup n-grams of "
              "N tokens, default 12, drafts of at most k).")


def _fmt_ci(d: Optional[dict], digits: int = 2) -> str:
    if not d:
        return "-"
    lo, hi = d["ci95"]
    return f"{d['estimate']:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


@app.command("measure")
def measure_command(
    target: str = target_option(),
    draft: List[str] = typer.Option(..., "--draft", metavar="NAME=MODEL", help=DRAFT_HELP),
    prompts: str = typer.Option(..., "--prompts", help="Prompts file (text, one per line, or .jsonl chat messages)."),
    k: str = k_option("1,2,4"),
    temperature: float = temperature_option(1.0, "Sampling temperature of the real loop and of the prediction "
                                                 "(0 = greedy)."),
    top_k: int = top_k_option(0, "Top-k of the real loop and of the prediction (0 disables)."),
    top_p: float = top_p_option(1.0, "Top-p of the real loop and of the prediction, in (0, 1]."),
    min_p: float = min_p_option(0.0, "Min-p of the real loop and of the prediction, in [0, 1)."),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", metavar="N", help="Tokens generated per prompt "
                                        f"(stops early at EOS unless --ignore-eos); {TOKENS_HELP}, and the longest "
                                        "prompt + N - 1 within every model's max_position_embeddings (checked "
                                        "before any generation)."),
    ignore_eos: bool = ignore_eos_option(),
    seed: int = seed_option(f"Seed (the real loop and the dump it makes derive their seeds from it); {SEED_HELP} "
                            "(--engine vllm / llamacpp: seed + prompt index below 2**32 - 1, the engines' 32-bit "
                            "seeds)."),
    repeats: int = typer.Option(1, "--repeats", help=f"Real-loop runs per prompt and configuration ({REPEATS_HELP})."),
    max_prompts: Optional[int] = typer.Option(None, "--max-prompts", help="Use only the first N prompts of the file "
                                              "(N >= 1; more than the file holds: all of them)."),
    dump: Optional[str] = typer.Option(None, "--dump", help="Predict from this existing dump of the same prompts "
                                       "(default: make one now, dense, from the same prompts)."),
    top_k_save: Optional[int] = typer.Option(None, "--top-k-save", help="Make the prediction dump sparse top-K "
                                             "(1..2**24)."),
    save_dump: Optional[str] = typer.Option(None, "--save-dump", metavar="PATH", help="Keep the prediction dump it "
                                             "makes at this path."),
    costs: Optional[str] = typer.Option(None, "--costs", metavar="FILE", help="Cost table (JSON, see "
                                        "fastspec.costs) for the predicted speed-ups (default: measured now by "
                                        "fastspec.hf.measure_costs, with these models, prompts and threads)."),
    cost_repeats: int = typer.Option(20, "--cost-repeats", metavar="N", help="Interleaved rounds of the cost "
                                     f"measurement (medians; {REPEATS_HELP})."),
    hf_generate: bool = typer.Option(True, "--hf-generate/--no-hf-generate", help="Also time Hugging Face generate "
                                     "(plain decoding, same model, prompts and threads) next to fastspec's runner."),
    trials: Optional[int] = typer.Option(None, "--trials", help="simulate's Monte-Carlo replays per sequence "
                                         "(simulate's bounds)."),
    threads: Optional[int] = typer.Option(None, "--threads", help=f"torch threads, {THREADS_HELP} (default "
                                          "min(2, cores))."),
    engine: str = typer.Option("fastspec", "--engine", help=engines_help()),
    policy: Optional[List[str]] = typer.Option(None, "--policy", metavar="SPEC", help=POLICY_HELP),
    vllm_python: Optional[str] = typer.Option(None, "--vllm-python", metavar="PYTHON", help="The Python of vLLM's "
                                              "environment (default $FASTSPEC_VLLM_PYTHON; scripts/vllm_env.sh "
                                              "makes one)."),
    draft_sample_method: Optional[str] = typer.Option(None, "--draft-sample-method", metavar="HOW", help="vLLM's "
                                                      "draft_sample_method / llama.cpp's --spec-draft-sampling: greedy "
                                                      "(the default: argmax drafts) or probabilistic (drafts sampled "
                                                      "from q, judged with min(1, p/q))."),
    runs_dir: Optional[str] = typer.Option(None, "--runs-dir", metavar="DIR", help="With --engine vllm: keep each "
                                           "run's token ids and counters there (JSON; audit them with "
                                           "fastspec audit-output)."),
    llamacpp_bin: Optional[str] = typer.Option(None, "--llamacpp-bin", metavar="PATH", help="llama.cpp's "
                                               "llama-server or its directory (default $FASTSPEC_LLAMACPP_BIN, else "
                                               "the directory scripts/llamacpp_build.sh fills)."),
    p_min: Optional[float] = typer.Option(None, "--p-min", metavar="P", help="With --engine llamacpp: llama.cpp's "
                                          "--spec-draft-p-min (a draft stops before a token whose top-10 "
                                          "probability is below P; default 0)."),
    n_min: Optional[int] = typer.Option(None, "--n-min", metavar="N", help="With --engine llamacpp: llama.cpp's "
                                        "--spec-draft-n-min (a shorter draft is dropped; default 0)."),
    audit: bool = typer.Option(True, "--audit/--no-audit", help="With --engine vllm or llamacpp: audit every run's "
                               "tokens against the target's distribution (fastspec.audit)."),
    as_json: bool = json_option(),
) -> None:
    """Measured tokens per verify step and wall-clock speed-up over plain decoding (95% CIs over prompts) per
    (draft, k), next to the prediction from a dump and a cost table, with relative errors and z.  With --engine vllm:
    vLLM's own counters against fastspec's exact prediction under vLLM's conventions, and the audit of its tokens.
    With --engine llamacpp: llama-server's draft_n / draft_n_accepted per prompt against fastspec's prediction
    (exact at T = 0), and the audit of its tokens."""
    ks = parse_k(k)
    entry = check_engine_flags(engine, {  # a flag the engine does not take is refused by name (the registry)
        "--policy": bool(policy), "--no-hf-generate": not hf_generate,
        "--draft-sample-method": draft_sample_method is not None, "--vllm-python": vllm_python is not None,
        "--runs-dir": runs_dir is not None, "--no-audit": not audit, "--dump": dump is not None,
        "--save-dump": save_dump is not None,
        "--top-k-save": top_k_save is not None, "--costs": costs is not None, "--repeats": repeats != 1,
        "--trials": trials is not None, "--threads": threads is not None, "--cost-repeats": cost_repeats != 20,
        "--llamacpp-bin": llamacpp_bin is not None, "--p-min": p_min is not None, "--n-min": n_min is not None},
        ignore_eos=ignore_eos)
    if entry.pipeline == "counters":
        params = sampling_params(temperature, top_k, top_p, min_p)
        if not os.path.isfile(prompts):
            fail(f"--prompts {prompts}: no such file (one prompt per line, or .jsonl with chat messages)")
        if entry.name == "llamacpp":
            from ._engine_llamacpp import measure_llamacpp_engine

            measure_llamacpp_engine(entry, target=target, draft=draft, prompts=prompts, ks=ks, params=params,
                                    max_new_tokens=max_new_tokens, seed=seed, max_prompts=max_prompts,
                                    draft_sample_method=draft_sample_method, binary=llamacpp_bin, threads=threads,
                                    p_min=p_min, n_min=n_min, audit=audit, as_json=as_json,
                                    progress=lambda msg: stderr_console().print(msg))
            return
        measure_engine(entry, target=target, draft=draft, prompts=prompts, ks=ks, params=params,
                       max_new_tokens=max_new_tokens, seed=seed, max_prompts=max_prompts,
                       draft_sample_method=draft_sample_method, vllm_python=vllm_python, runs_dir=runs_dir,
                       audit=audit, as_json=as_json, progress=lambda msg: stderr_console().print(msg))
        return
    from fastspec.runs import MeasureConfig

    # the one table: each flag, the MeasureConfig field it sets and its value (checked once, by the library,
    # before torch is imported; --k's text read by the one parser of draft lengths above)
    flags = {"--k": ("ks", ks), "--policy": ("policies", policy or ()), "--temperature": ("temperature", temperature),
             "--top-k": ("top_k", top_k), "--top-p": ("top_p", top_p), "--min-p": ("min_p", min_p),
             "--dump": ("dump", dump), "--save-dump": ("save_dump", save_dump),
             "--top-k-save": ("top_k_save", top_k_save),
             "--max-prompts": ("max_prompts", max_prompts), "--trials": ("trials", trials),
             "--repeats": ("repeats", repeats), "--cost-repeats": ("cost_repeats", cost_repeats),
             "--max-new-tokens": ("max_new_tokens", max_new_tokens), "--seed": ("seed", seed),
             "--ignore-eos": ("ignore_eos", ignore_eos), "--costs": ("costs", costs),
             "--hf-generate": ("hf_generate", hf_generate)}
    conflicts = {("dump", "save_dump", "top_k_save"): "--dump uses an existing dump; --save-dump and --top-k-save "
                                                      "only apply to the dump measure makes"}
    config = config_from_flags(MeasureConfig, flags, conflicts)
    check_options(prompts=prompts, threads=threads)
    hf = import_hf()
    set_threads(hf, threads)
    specs = check_drafts(hf, draft)  # a malformed n-gram specification: one line, before any loading
    _check_policy_drafts(hf, specs, config.policies)
    with flag_errors(flags):  # the pipeline's errors about the token budget or the dump, told about the flag
        report = entry.measure_function()(target, specs, prompts, config=config,
                                          progress=stage_progress(stderr_console()))
    meas, ids = report.measurement, report.prompts
    shown = {"target": target, "drafts": report.drafts, "prompts": prompts, "num_prompts": len(ids),
             "max_prompts": max_prompts, "k": ks, **config.params.as_dict(), "max_new_tokens": max_new_tokens,
             "ignore_eos": ignore_eos, "seed": seed, "repeats": repeats, "dump": report.dump,
             "dump_kind": report.dump_kind, "costs": costs if costs is not None else "measured",
             "threads": report.threads, "order": meas.settings["order"], "engine": engine,
             "policies": [p.name for p in config.policies], "skipped": meas.settings.get("skipped", []),
             "sklearn_importable": meas.settings.get("sklearn_importable")}
    if as_json:
        print_json({"config": shown, **report.as_dict()})
        return
    _print_tables(report.rows, meas, config.params, temperature, ids, max_new_tokens, ignore_eos, repeats,
                  report.warnings)
    render_policy_rows(stdout_console(), report.rows, meas)


def _check_policy_drafts(hf, specs: dict, policies: list) -> None:
    """A policy other than fixed runs on model drafts only (an n-gram draft has no probabilities): with n-gram drafts
    alone it would run on none, so it is refused before any loading, as ``simulate`` refuses it."""
    if not policies or any(hf.parse_ngram_spec(spec) is None for spec in specs.values()):
        return
    for p in policies:
        if p.kind != "fixed":
            fail(f"--policy {p.name}: policies other than fixed replay model drafts and this measurement has none (an "
                 "n-gram draft has no probabilities; use --k for it)")


def _print_tables(rows, meas, params, temperature, ids, max_new_tokens, ignore_eos, repeats, warnings) -> None:
    out = stdout_console()
    sampling = params.describe() if params.filtered else f"T={temperature:g}"
    budget = f"{max_new_tokens} new tokens" + (" (EOS ignored)" if ignore_eos else "")
    table = Table(title=f"fastspec measure: real loop vs simulate ({sampling}, {len(ids)} prompts x {budget}, "
                        f"repeats={repeats})", title_justify="left")
    for c in ("draft", "k", "predicted", "measured (95% CI)", "rel. error", "steps", "ms/token draft+target+verify"):
        table.add_column(c, justify="left" if c == "draft" else "right", no_wrap=True)
    for r, m in zip(rows, meas, strict=True):
        if m.policy is not None or m.engine != "fastspec":  # the policy table (render_policy_rows)
            continue
        p = r["predicted"] or {"mean_acceptance_length_exact": None, "lower": None}
        if p["mean_acceptance_length_exact"] is not None:
            ci = p["ci95_over_prompts"]
            ptxt = f"{p['mean_acceptance_length_exact']:.3f}" + (f" ({ci[0]:.3f}-{ci[1]:.3f})" if ci else "")
        elif p["lower"] is not None:
            ptxt = f"[{p['lower']:.3f}, {p['upper']:.3f}]"
        else:
            ptxt = "-"
        err = r["relative_error"]
        t = m.time_s
        per = 1000.0 / max(m.emitted + m.plain_steps, 1)
        table.add_row(m.draft, str(m.k), ptxt,
                      f"{m.mean_acceptance_length:.3f} ({m.ci95[0]:.3f}-{m.ci95[1]:.3f})",
                      ("-" if err is None else f"{100 * err:+.1f}%")
                      + ("" if r["z_difference"] is None else f" (z={r['z_difference']:+.1f})"),
                      str(m.verify_steps) + (f" +{m.plain_steps} plain" if m.plain_steps > len(ids) * repeats else ""),
                      f"{t['draft'] * per:.1f}+{t['target'] * per:.1f}+{t['verify'] * per:.1f}")
    out.print(table)
    out.print("predicted: simulate's exact expectation (trajectory DP) over the dump's recorded trajectories, 95% CI "
              "over prompts (one recorded trajectory each; sparse dump: [lower, upper] bounds; n-gram drafts: the "
              "replay of the proposer along the recorded prompt and tokens); measured: tokens per verify step of "
              "the real loop, 95% CI over prompts; rel. error = (predicted - measured) / measured (0 when inside a "
              "sparse interval); z = difference / combined standard error")

    clock = Table(title="wall clock: decoding tokens/s (prefill excluded), speed-up over plain decoding",
                  title_justify="left")
    for c in ("configuration", "tok/s", "e2e tok/s", "speed-up [95% CI]", "predicted [95% CI]", "rel. err (z)"):
        clock.add_column(c, justify="left" if c == "configuration" else "right", no_wrap=True)
    plain = meas.plain
    clock.add_row("plain (fastspec runner)", f"{plain.tokens_per_s:.2f}", f"{plain.end_to_end_tokens_per_s:.2f}",
                  "1 (baseline)", "", "")
    if meas.hf_generate is not None:
        g = meas.hf_generate
        clock.add_row("plain (HF generate)", f"{g.tokens_per_s:.2f}", f"{g.end_to_end_tokens_per_s:.2f}",
                      _fmt_ci(g.relative_to(plain)), "", "")
    for r, m in zip(rows, meas, strict=True):
        sp = r.get("speedup") or {}
        err, z = sp.get("relative_error"), sp.get("z_difference")
        etxt = "-" if err is None else f"{100 * err:+.1f}%" + ("" if z is None else f" ({z:+.1f})")
        hf_base = m.engine != "fastspec" and m.speedup_vs_hf_plain is not None  # its own code path's baseline
        clock.add_row(m.label + (" (vs HF plain)" if hf_base else ""), f"{m.clock.tokens_per_s:.2f}",
                      f"{m.clock.end_to_end_tokens_per_s:.2f}",
                      _fmt_ci(m.speedup_vs_hf_plain if hf_base else m.speedup),
                      _fmt_ci(sp.get("predicted")), etxt)
    out.print(clock)
    if meas.runner_vs_generate is not None:
        v = meas.runner_vs_generate
        out.print(f"honest clock: fastspec's runner decodes at {_fmt_ci(v['decode'])} x the tokens/s of Hugging Face "
                  f"generate ({_fmt_ci(v['end_to_end'])} x end to end), same model, prompts, threads and budget")
    out.print("tok/s: tokens made by decoding forwards / their seconds, summed over prompts and repeats (prefill "
              "timed apart; e2e: whole calls); speed-up = tok/s over plain decoding's (runner), a ratio of totals "
              "with a 95% CI over prompts (delta method, paired by prompt); configurations interleaved round-robin "
              "per prompt; predicted: simulate's speed-up from the cost table (the loop's cost model), 95% CI over "
              "prompts and costs; rel. err = (predicted - measured) / measured, z = difference / "
              "combined standard error")
    for w in warnings:
        out.print(f"warning: {w}", style="bold yellow")

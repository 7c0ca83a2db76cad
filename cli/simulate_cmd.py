"""``fastspec simulate``: what a draft would buy you, from a logit dump, before anyone touches a GPU."""
from __future__ import annotations

import os
from typing import List, Optional

import typer
from rich.table import Table

from ._common import EXIT_RUNTIME, fail, print_json, progress_bar, stderr_console, stdout_console
from ._dask import open_scheduler
from ._options import (config_from_flags, dump_argument, flag_errors, integrity_option, json_option, k_option,
                       min_p_option, policy_option, scheduler_option, seed_option, temperature_option, top_k_option,
                       top_p_option)
from ._app import app
from ._simulate_batch import batch_option, batch_plot_path, extrapolate_option, plot_batch, print_batch


def _fmt(v, digits=3):
    if v is None:
        return "-"
    return f"{v:.{digits}f}"


@app.command("simulate")
def simulate_command(
    dump: str = dump_argument(),
    k: str = k_option(),
    draft: Optional[List[str]] = typer.Option(None, "--draft", metavar="NAME", help="Simulate only this draft of the "
                                              "dump (repeatable; a repeated name counts once); default: every draft "
                                              "model (a target-only dump: ngram).  The prompt-lookup draft, replayed "
                                              "from the dump's prompt tokens: ngram or ngramMIN-MAX (fastspec's "
                                              "rule: latest occurrence, n 1-3), ngram.vllm / ngram.vllmN / "
                                              "ngram.vllmMIN-MAX (vLLM's: earliest occurrence, n 5-5 by default, "
                                              "one bound copies the other), ngram.hf / ngram.hfMAX (Hugging Face "
                                              "prompt lookup: earliest, n 1-2 by default); named so in the output "
                                              "(ngram1-3, ngram.vllm5-5, ngram.hf1-2)."),
    temperature: Optional[float] = temperature_option(),
    top_k: Optional[int] = top_k_option(),
    top_p: Optional[float] = top_p_option(),
    min_p: Optional[float] = min_p_option(),
    mode: str = typer.Option("bernoulli", "--mode", metavar="MODE", help="bernoulli (replay recorded alpha_t) or "
                             "token (real tokens through fastspec's verifier)."),
    trials: Optional[int] = typer.Option(None, "--trials", metavar="N", help="Replays per sequence, 2 to 10000000 "
                                         "(default 200 bernoulli, 20 token), split into 20 batches for the 95% CI (2 "
                                         "trials at least: two batches); memory does not grow with N, time does "
                                         "(progress bar on a terminal)."),
    seed: int = seed_option(),
    draft_cost: Optional[float] = typer.Option(None, "--draft-cost", metavar="C", help="One draft forward relative "
                                               "to one target forward (c)."),
    verify_cost: Optional[str] = typer.Option(None, "--verify-cost", metavar="COST", help="Target verify cost as a "
                                              "function of k: 1, 1+0.05k, or a JSON table {\"1\": 1.02, ...} (inline "
                                              "or file)."),
    costs: Optional[str] = typer.Option(None, "--costs", metavar="FILE", help="A JSON cost table of measured "
                                        "seconds (fastspec cost --out FILE, or a GPU deployment measured by hand; "
                                        "schema in the README) instead of the dump's recorded costs; 'none': no "
                                        "costs. --draft-cost/--verify-cost override both."),
    verify: str = typer.Option("token", "--verify", metavar="METHODS", help="Verification method(s), side by side: "
                               "token, block or token,block (block verification: Sun et al. 2024; Monte-Carlo through "
                               "the block kernel, needs dense logits)."),
    candidates: str = typer.Option("1", "--candidates", metavar="W", help="Candidates per drafted position (token "
                                   "verification with recursive rejection sampling), e.g. 1,2,4; exact via "
                                   "per-position beta_t(w)."),
    candidate_sampling: Optional[str] = typer.Option(None, "--candidate-sampling", metavar="HOW", help="How the w "
                                                     "candidates are proposed: iid (drawn from the draft; default) "
                                                     "or deterministic (the top-w draft tokens as point masses: "
                                                     "argmax drafts, also at --candidates 1)."),
    draft_sampling: Optional[str] = typer.Option(None, "--draft-sampling", metavar="HOW", help="How a model draft "
                                                 "proposes: sampled (x ~ q, judged with q; default) or argmax (its "
                                                 "top-1 token judged with a one-hot q, as vLLM V1: acceptance "
                                                 "p(argmax q); with --candidates w the top-w tokens).  Token "
                                                 "verification only; not for n-gram drafts."),
    block_trials: Optional[int] = typer.Option(None, "--block-trials", metavar="N", help="Replays per sequence for "
                                               "block verification (real tokens through the kernel), 2 to 10000000; "
                                               "default 10."),
    as_json: bool = json_option(),
    plot: Optional[str] = typer.Option(None, "--plot", metavar="PNG", help="Write a PNG (.png is appended when "
                                       "missing; the path is checked before computing): tokens per step and speed-up "
                                       "vs k, and per-position acceptance (needs matplotlib: pip install "
                                       "'fastspec[plot]')."),
    scheduler: Optional[str] = scheduler_option(),
    integrity: bool = integrity_option(),
    batch: Optional[str] = batch_option(),
    batch_extrapolate: bool = extrapolate_option(),
    policy: Optional[List[str]] = policy_option(),
) -> None:
    """Monte-Carlo and exact what-if analysis: tokens per verify step and speed-up per draft and k."""
    from fastspec.simulation import AGREEMENT_FALSE_ALARM, SimulateConfig, simulate

    # the one table: each flag, the SimulateConfig field it sets and its value (checked once, by the library)
    flags = {"--k": ("k", k), "--policy": ("policies", policy or None), "--temperature": ("temperature", temperature),
             "--top-k": ("top_k", top_k), "--top-p": ("top_p", top_p), "--min-p": ("min_p", min_p),
             "--mode": ("mode", mode), "--trials": ("trials", trials), "--block-trials": ("block_trials", block_trials),
             "--verify": ("verify", verify), "--candidates": ("candidates", candidates),
             "--candidate-sampling": ("candidate_sampling", candidate_sampling),
             "--draft-sampling": ("draft_sampling", draft_sampling), "--seed": ("seed", seed),
             "--draft-cost": ("draft_cost", draft_cost), "--verify-cost": ("verify_cost", verify_cost),
             "--costs": ("costs", False if costs is not None and costs.lower() == "none" else costs),
             "--draft": ("drafts", draft or None), "--batch": ("batch_sizes", batch),
             "--batch-extrapolate": ("batch_extrapolate", batch_extrapolate)}
    conflicts = {**CONFLICTS, ("batch_sizes", "dump"): f"--batch needs a cost table with the batch sizes {batch}: "
                 f"{dump} records none; give --costs FILE (fastspec cost --batch ... --out FILE)"}
    config = config_from_flags(SimulateConfig, flags, conflicts)
    if not os.path.exists(dump):
        fail(f"{dump}: no such file or directory")
    plt, plot = (None, None) if plot is None else _plot_target(plot)
    batch_plot = (_plot_target(batch_plot_path(plot))[1] if plot is not None and config.checked.batch_sizes
                  else None)

    console = stderr_console()
    start, advance, set_total, stop = progress_bar(console, "simulating", None) if not as_json else (None,) * 4
    if start is not None:
        start()
    try:
        with open_scheduler(scheduler) as client, flag_errors(flags, conflicts):
            res = simulate(dump, config, progress=advance, progress_total=set_total, client=client,
                           verify_integrity=integrity)
    finally:
        if stop is not None:
            stop()

    # the results first: a plot that cannot be written after all never costs them
    if as_json:
        print_json(res.as_dict())
    else:
        _print_human(res)
        if res.policies:
            from .policy_cmd import print_policies

            print_policies(res)
        if res.batch is not None:
            print_batch(res.batch)
    for r in res.disagreements:
        typer.echo(f"fastspec: WARNING: draft {r.draft!r} k={r.k}: {_disagreement(r)}; a correct replay fails such "
                   f"a check with probability {AGREEMENT_FALSE_ALARM:g}: likely a bug", err=True)
    if plot is not None:
        try:
            _plot(res, plot, plt)
        except (OSError, ValueError, RuntimeError) as exc:
            fail(f"--plot {plot}: the plot could not be written ({exc})", EXIT_RUNTIME)
        if as_json:
            typer.echo(f"fastspec: plot written to {plot}", err=True)
        else:
            stdout_console().print(f"plot written to {plot}")
    if batch_plot is not None:
        try:
            plot_batch(res.batch, batch_plot, plt)
        except (OSError, ValueError, RuntimeError) as exc:
            fail(f"--plot {batch_plot}: the plot could not be written ({exc})", EXIT_RUNTIME)
        if as_json:
            typer.echo(f"fastspec: plot written to {batch_plot}", err=True)
        else:
            stdout_console().print(f"plot written to {batch_plot}")


#: refusals of a combination of flags, worded for the command line (keyed by the SimulateConfig fields at fault)
CONFLICTS = {
    ("batch_extrapolate", "batch_sizes"): "--batch-extrapolate needs --batch (the batch sizes to predict)",
    ("batch_sizes", "draft_cost", "verify_cost"): "--batch needs measured seconds at each batch size (a cost table "
    "with a batch axis, --costs FILE), not the relative --draft-cost/--verify-cost",
    ("batch_sizes", "costs"): "--batch needs a cost table; --costs none gives none",
    ("verify", "draft_sampling"): "--verify block with argmax drafts (--draft-sampling argmax or --candidate-sampling "
    "deterministic) is not simulated: block verification's acceptance with a one-hot q is not derived here; use "
    "--verify token",
}


def _disagreement(r) -> str:
    what = []
    if r.mc_agrees_with_exact is False:
        what.append(f"the Monte-Carlo estimate disagrees with the exact expectation (|z| = {abs(r.mc_vs_exact_z):.2f} "
                    f"> {r.mc_vs_exact_threshold:.2f})")
    tc = r.check
    if tc is not None and not tc.passed:
        what.append(f"the token-mode acceptance frequency disagrees with alpha over the judged positions "
                    f"(|z| = {abs(tc.z):.2f} > {tc.threshold:.2f})")
    return " and ".join(what)


def _plot_target(path: str):
    """(pyplot, the PNG path that will be written: ``path`` with .png appended when missing), checked before any
    computation: matplotlib is there, the directory exists, and the file can be opened for writing (an existing
    file is left as it is, a new one is removed again)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        fail("--plot needs matplotlib: pip install 'fastspec[plot]' (or pip install matplotlib)")
    if not path.lower().endswith(".png"):
        path += ".png"
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        fail(f"--plot {path}: the directory {folder} " + ("is not a directory" if os.path.exists(folder) else
                                                          "does not exist"))
    existed = os.path.lexists(path)
    if existed and not os.path.isfile(path):
        fail(f"--plot {path}: exists and is not a regular file")
    try:
        with open(path, "ab"):
            pass
    except OSError as exc:
        fail(f"--plot {path}: cannot write a file there ({exc.strerror or exc})")
    if not existed:
        os.remove(path)
    return plt, path


def _variant_label(r) -> str:
    if r.verify == "block":
        return "block"
    return "token" if r.candidates == 1 else f"token w={r.candidates} {r.candidate_sampling}"


def _ci(pair, digits=3, suffix=""):
    return "-" if pair is None else f"{pair[0]:.{digits}f}-{pair[1]:.{digits}f}{suffix}"


def _costs_line(c: dict) -> str:
    """The cost source in one line (``c``: the pricing's description, the JSON ``config.costs``)."""
    if c["source"] == "flags":
        return f"costs: relative (--draft-cost {c['draft_cost']:g}, --verify-cost {c['verify_cost']})"
    where = "recorded in the dump" if c["source"] == "dump" else "from --costs"
    machine = f", {c['machine']}" if c.get("machine") else ""
    threads = f", {c['threads']} threads" if c.get("threads") else ""
    return (f"costs: measured seconds {where}{machine}{threads}; plain decoding {1e3 * c['plain_step_s']:.2f} ms "
            "per token")


def _bounds_cells(r, has_cost) -> list[str]:
    """A sparse dump's model draft: exact lower and upper bounds."""
    b, s = r.bounds, r.speedup_bounds
    row = [f"[{_fmt(b.alpha_lower)}, {_fmt(b.alpha_upper)}]",
           f"[{_fmt(b.mean_acceptance_length_lower)}, {_fmt(b.mean_acceptance_length_upper)}]",
           _ci(r.sequences.ci95_sequences)]
    return row + ([f"[{_fmt(s.speedup_lower, 2)}, {_fmt(s.speedup_upper, 2)}]x", _ci(s.speedup_ci95, 2, "x")]
                  if has_cost else [])


def _exact_only_cells(r, has_cost) -> list[str]:
    """An exact row in the bounds table (the n-gram draft of a sparse, greedy dump)."""
    s = r.priced
    row = ["-", f"{_fmt(r.exact.mean_acceptance_length_exact)}", _ci(r.sequences.ci95_sequences)]
    return row + ([f"{s.speedup:.2f}x" if s.speedup is not None else "-", _ci(s.speedup_ci95, 2, "x")]
                  if has_cost else [])


def _dense_cells(r, has_cost) -> list[str]:
    """A row of a dense dump: exact figures and the Monte-Carlo estimate (as the row's kind has them)."""
    mc, ex, seq, s = r.monte_carlo, r.exact, r.sequences, r.priced
    if mc is None:
        shown = "exact only"
    else:
        half = None if mc.ci95 is None else (mc.ci95[1] - mc.ci95[0]) / 2
        shown = (_fmt(mc.mean_acceptance_length) + (" (n/a)" if half is None else f" ±{half:.3f}")
                 + (" !" if mc.mc_agrees_with_exact is False else ""))
    row = [_fmt(r.alpha), "n/a (MC only)" if ex is None else _fmt(ex.mean_acceptance_length_exact),
           _ci(seq.ci95_sequences if seq is not None else None), shown,
           _fmt(mc.draft_acceptance_rate if mc is not None else ex.draft_acceptance_rate_exact)]
    if has_cost:
        row.append("-" if s.speedup is None else f"{s.speedup:.2f}x" + (
            f" ({_ci(s.speedup_ci95, 2)})" if s.speedup_ci95 is not None else ""))
    return row


def _columns(sparse, has_cost, variants) -> list[str]:
    if sparse:
        return (["draft", "k", "alpha [lo, hi]", "tokens/step exact [lo, hi]", "95% CI prompts"]
                + (["speed-up [lo, hi]", "speed-up 95% CI"] if has_cost else []))
    return (["draft", "k"] + (["verify"] if variants else [])
            + ["alpha", "tokens/step exact", "95% CI prompts", "MC (95% CI)", "accept rate"]
            + (["speed-up (95% CI)"] if has_cost else []))


def _results_table(res) -> Table:
    plan, sp = res.plan, res.plan.sampling
    sparse, has_cost, variants = plan.dump_kind == "sparse", plan.pricing is not None, bool(plan.extra_variants)
    title = (f"fastspec simulate {res.dump}  (T={sp.temperature:g}, top_k={sp.top_k}, top_p={sp.top_p:g}, "
             f"min_p={sp.min_p:g}, mode={plan.mode}, trials={plan.trials}, seed={plan.seed}"
             + (", argmax drafts" if plan.draft_sampling == "argmax" else "") + ")")
    table = Table(title=title, title_justify="left")
    for c in _columns(sparse, has_cost, variants):
        table.add_column(c, justify="left" if c == "draft" else "right", no_wrap=True)
    for r in res.results:
        mark = " *" if res.best.get(r.draft) == r.k and r.verify == "token" and r.candidates == 1 else ""
        cells = _bounds_cells if r.kind == "bounds" else _exact_only_cells if sparse else _dense_cells
        label = [_variant_label(r)] if variants and not sparse else []
        table.add_row(r.draft, f"{r.k}{mark}", *label, *cells(r, has_cost))
    return table


def _per_position_table(res) -> Table:
    pp = Table(title="per-position acceptance (unconditional, vLLM's definition), largest k per draft",
               title_justify="left")
    pp.add_column("draft", no_wrap=True)
    pp.add_column("k", justify="right")
    pp.add_column("position 1..k", no_wrap=False)
    for name in dict.fromkeys(r.draft for r in res.results):
        r = ([x for x in res.results if x.draft == name and x.verify == "token" and x.candidates == 1]
             or [x for x in res.results if x.draft == name])[-1]
        per_position = (r.monte_carlo.per_position_acceptance if r.monte_carlo is not None
                        else r.exact.per_position_acceptance_exact)
        pp.add_row(name, str(r.k), " ".join(f"{v:.2f}" for v in per_position))
    return pp


def _kind_notes(res) -> list[str]:
    """One note per kind of row shown that needs one (block, candidates, n-gram)."""
    out = []
    out += [f"block verification: {n}" for n in {r.exact_reason for r in res.results if r.exact_reason}]
    if any(r.kind == "candidates" for r in res.results):
        out.append("candidates w > 1: exact = trajectory DP on the per-position acceptance beta_t(w) of w candidates "
                   f"({res.plan.candidate_sampling}); speed-up prices k draft forwards and a target forward over "
                   "k*w + 1 positions")
    ngram_rows = [r for r in res.results if r.kind == "ngram"]
    if ngram_rows:
        worst = max(ngram_rows, key=lambda r: r.ngram.off_record)
        out.append(f"n-gram draft: exact replay of the lookup along the recorded text; accepted drafts that differ "
                   f"from the recording (the replay assumption's reach): up to {100 * worst.ngram.off_record:.1f}% "
                   f"({worst.draft} k={worst.k})")
    return out


def _print_human(res) -> None:
    out = stdout_console()
    out.print(_results_table(res))
    for note in _kind_notes(res):
        out.print(note)
    if res.plan.dump_kind != "sparse":
        out.print(_per_position_table(res))
    if res.plan.pricing is not None:
        out.print(_costs_line(res.config["costs"]))
        best = ", ".join(f"{d}: k={k}" for d, k in res.best.items() if k is not None)
        if best:
            out.print(f"best k per draft (* in the table): {best}")
    for r in res.results:
        tc = r.check
        if tc is not None:
            out.print(f"token-mode check {r.draft} k={r.k}: acceptance frequency {tc.acceptance_frequency:.4f} vs "
                      f"alpha over judged positions {tc.expected_frequency:.4f} (z = {tc.z:.2f}, "
                      f"{'passed' if tc.passed else 'FAILED'})")
    out.print("assumptions:")
    for a in res.assumptions:
        out.print(f"  - {a}")
    for w in res.warnings:
        out.print(f"warning: {w}", style="bold yellow")
    out.print(res.verdict, soft_wrap=True)  # one line, whatever the width


def _plot(res, path, plt) -> None:
    many = bool(res.plan.extra_variants)
    drafts = list(dict.fromkeys((r.draft, _variant_label(r)) for r in res.results))
    priced = res.plan.pricing is not None
    fig, axes = plt.subplots(1, 3 if priced else 2, figsize=(14, 4.2))
    for draft_name, variant in drafts:
        rows = [r for r in res.results if r.draft == draft_name and _variant_label(r) == variant]
        name = f"{draft_name} ({variant})" if many else draft_name
        ks = [r.k for r in rows]
        if rows[0].kind == "bounds":
            lo = [r.bounds.mean_acceptance_length_lower for r in rows]
            hi = [r.bounds.mean_acceptance_length_upper for r in rows]
            axes[0].fill_between(ks, lo, hi, alpha=0.3, label=name)
        else:
            y = [r.mean_acceptance_length for r in rows]
            ci = [r.ci95_sequences or r.ci95 for r in rows]  # over prompts when known, else Monte-Carlo
            err = [[yy - c[0] if c else 0.0 for yy, c in zip(y, ci, strict=True)],
                   [c[1] - yy if c else 0.0 for yy, c in zip(y, ci, strict=True)]]
            axes[0].errorbar(ks, y, yerr=err, marker="o", capsize=3, label=name)
            longest = rows[-1]
            axes[1].plot(range(1, longest.k + 1), longest.per_position_acceptance, marker="o",
                         label=f"{name} (k={longest.k})")
        if priced and len(axes) > 2:
            s = [r.priced_speedup if r.priced_speedup is not None else float("nan") for r in rows]
            axes[2].plot(ks, s, marker="o", label=name)
    axes[0].set(xlabel="k (drafted tokens per step)", ylabel="tokens per verify step",
                title="mean acceptance length (95% CI over prompts)")
    axes[1].set(xlabel="draft position", ylabel="acceptance (unconditional)", title="per-position acceptance")
    if len(axes) > 2:
        axes[2].set(xlabel="k", ylabel="speed-up", title="speed-up under the cost model")
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

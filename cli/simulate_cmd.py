"""``fastspec simulate``: what a draft would buy you, from a logit dump, before anyone touches a GPU."""
from __future__ import annotations

import os
from typing import List, Optional

import typer
from rich.table import Table

from ._common import fail, print_json, progress_bar, stderr_console, stdout_console
from ._dask import open_scheduler
from ._options import (check_sampling, dump_argument, integrity_option, json_option, k_option, min_p_option,
                       option_errors, parse_k, scheduler_option, seed_option, temperature_option, top_k_option,
                       top_p_option)
from .main import app


def _fmt(v, digits=3):
    if v is None:
        return "-"
    return f"{v:.{digits}f}"


@app.command("simulate")
def simulate_command(
    dump: str = dump_argument(),
    k: str = k_option(),
    draft: Optional[List[str]] = typer.Option(None, "--draft", metavar="NAME", help="Simulate only this draft of the "
                                              "dump (repeatable); default: every draft."),
    temperature: Optional[float] = temperature_option(),
    top_k: Optional[int] = top_k_option(),
    top_p: Optional[float] = top_p_option(),
    min_p: Optional[float] = min_p_option(),
    mode: str = typer.Option("bernoulli", "--mode", metavar="MODE", help="bernoulli (replay recorded alpha_t) or "
                             "token (real tokens through fastspec's verifier)."),
    trials: Optional[int] = typer.Option(None, "--trials", metavar="N", help="Replays per sequence (default 200 "
                                         "bernoulli, 4 token)."),
    seed: int = seed_option(),
    draft_cost: Optional[float] = typer.Option(None, "--draft-cost", metavar="C", help="One draft forward relative "
                                               "to one target forward (c)."),
    verify_cost: Optional[str] = typer.Option(None, "--verify-cost", metavar="COST", help="Target verify cost as a "
                                              "function of k: 1, 1+0.05k, or a JSON table {\"1\": 1.02, ...} (inline "
                                              "or file)."),
    verify: str = typer.Option("token", "--verify", metavar="METHODS", help="Verification method(s), side by side: "
                               "token, block or token,block (block verification: Sun et al. 2024; Monte-Carlo through "
                               "the block kernel, needs dense logits)."),
    candidates: str = typer.Option("1", "--candidates", metavar="W", help="Candidates per drafted position (token "
                                   "verification with recursive rejection sampling), e.g. 1,2,4; exact via "
                                   "per-position beta_t(w)."),
    candidate_sampling: str = typer.Option("iid", "--candidate-sampling", metavar="HOW", help="How the w candidates "
                                           "are proposed: iid (drawn from the draft) or deterministic (top-w draft "
                                           "logits)."),
    block_trials: Optional[int] = typer.Option(None, "--block-trials", metavar="N", help="Replays per sequence for "
                                               "block verification (real tokens through the kernel; default 10)."),
    as_json: bool = json_option(),
    plot: Optional[str] = typer.Option(None, "--plot", metavar="PNG", help="Write a PNG: tokens per step and "
                                       "speed-up vs k, and per-position acceptance (needs matplotlib: pip install "
                                       "'fastspec[plot]')."),
    scheduler: Optional[str] = scheduler_option(),
    integrity: bool = integrity_option(),
) -> None:
    """Monte-Carlo and exact what-if analysis: tokens per verify step and speed-up per draft and k."""
    from fastspec.simulate import VerifyCost, simulate
    from fastspec.simulate.config import block_trials as check_block_trials, check_mode, check_trials, variants

    ks = parse_k(k)
    given = check_sampling(temperature, top_k, top_p, min_p)
    with option_errors("--mode"):
        check_mode(mode)
    with option_errors("--trials"):
        check_trials(trials, mode)
    with option_errors("--block-trials"):
        check_block_trials(block_trials, 1)
    with option_errors("--verify/--candidates/--candidate-sampling"):
        variants(verify, candidates, candidate_sampling)
    with option_errors("--verify-cost"):
        VerifyCost.parse(verify_cost)
    if draft_cost is not None and not (draft_cost >= 0 and draft_cost < float("inf")):
        fail(f"--draft-cost {draft_cost:g} is invalid: use a finite value >= 0")
    if not os.path.exists(dump):
        fail(f"{dump}: no such file or directory")
    plt, plot = (None, None) if plot is None else _plot_target(plot)

    console = stderr_console()
    start, advance, set_total, stop = progress_bar(console, "simulating", None) if not as_json else (None,) * 4
    if start is not None:
        start()
    try:
        with open_scheduler(scheduler) as client:
            res = simulate(dump, k=ks, drafts=draft or None, **given, mode=mode, trials=trials, seed=seed,
                           draft_cost=draft_cost, verify_cost=verify_cost, progress=advance, progress_total=set_total,
                           client=client, verify=verify, candidates=candidates,
                           candidate_sampling=candidate_sampling, block_trials=block_trials,
                           verify_integrity=integrity)
    finally:
        if stop is not None:
            stop()

    if plot is not None:
        _plot(res, plot, plt)
    if as_json:
        print_json(res.as_dict())
    else:
        _print_human(res, plot)
    for r in res.disagreements:
        typer.echo(f"fastspec: WARNING: draft {r.draft!r} k={r.k}: the Monte-Carlo estimate disagrees with the exact "
                   f"expectation (z = {r.mc_vs_exact_z:.2f}) or the token-mode acceptance check failed: a bug or "
                   f"too few trials", err=True)


def _plot_target(path: str):
    """(pyplot, the PNG path that will be written), checked before any computation: matplotlib is there, the
    directory exists and the file can be written."""
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
        fail(f"--plot {path}: the directory {folder} does not exist")
    if os.path.isdir(path) or not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        fail(f"--plot {path}: cannot write a file there")
    return plt, path


def _variant_label(r) -> str:
    if r.verify == "block":
        return "block"
    return "token" if r.candidates == 1 else f"token w={r.candidates} {r.candidate_sampling}"


def _print_human(res, plot) -> None:
    out = stdout_console()
    cfg = res.config
    sparse = cfg["dump_kind"] == "sparse"
    title = (f"fastspec simulate {res.dump}  (T={cfg['temperature']:g}, top_k={cfg['top_k']}, top_p={cfg['top_p']:g}, "
             f"min_p={cfg['min_p']:g}, mode={cfg['mode']}, trials={cfg['trials']}, seed={cfg['seed']})")
    table = Table(title=title, title_justify="left")
    has_cost = cfg["draft_cost"] is not None
    if sparse:
        cols = ["draft", "k", "alpha [lo, hi]", "tokens/step exact [lo, hi]"]
        cols += ["speed-up [lo, hi]"] if has_cost else []
    else:
        cols = ["draft", "k", "alpha", "tokens/step (MC)", "95% CI", "exact (DP)", "draft accept rate"]
        cols += ["speed-up"] if has_cost else []
        if "variants" in cfg:
            cols.insert(2, "verify")
    for c in cols:
        table.add_column(c, justify="left" if c == "draft" else "right", no_wrap=True)
    for r in res.results:
        mark = " *" if res.best.get(r.draft) == r.k and r.verify == "token" and r.candidates == 1 else ""
        if sparse:
            row = [r.draft, f"{r.k}{mark}", f"[{_fmt(r.alpha_lower)}, {_fmt(r.alpha_upper)}]",
                   f"[{_fmt(r.mean_acceptance_length_lower)}, {_fmt(r.mean_acceptance_length_upper)}]"]
            if has_cost:
                row.append(f"[{_fmt(r.speedup_lower, 2)}, {_fmt(r.speedup_upper, 2)}]x")
        else:
            flag = " !" if r.mc_agrees_with_exact is False else ""
            row = [r.draft, f"{r.k}{mark}", _fmt(r.alpha), _fmt(r.mean_acceptance_length) + flag,
                   f"{_fmt(r.ci95[0])}-{_fmt(r.ci95[1])}",
                   _fmt(r.mean_acceptance_length_exact) if r.exact_reason is None else "n/a (MC only)",
                   _fmt(r.draft_acceptance_rate)]
            if has_cost:
                row.append(f"{r.speedup:.2f}x" if r.speedup is not None else "-")
            if "variants" in cfg:
                row.insert(2, _variant_label(r))
        table.add_row(*row)
    out.print(table)
    notes = {r.exact_reason for r in res.results if r.exact_reason}
    for n in notes:
        out.print(f"block verification: {n}")
    if any(r.candidates > 1 for r in res.results):
        out.print("candidates w > 1: exact = trajectory DP on the per-position acceptance beta_t(w) of w candidates "
                  f"({cfg.get('candidate_sampling')}); speed-up uses verify_cost(k*w) for the k*w tree nodes")
    if not sparse:
        pp = Table(title="per-position acceptance (unconditional, vLLM's definition), largest k per draft",
                   title_justify="left")
        pp.add_column("draft", no_wrap=True)
        pp.add_column("k", justify="right")
        pp.add_column("position 1..k", no_wrap=False)
        for name in dict.fromkeys(r.draft for r in res.results):
            r = ([x for x in res.results if x.draft == name and x.verify == "token" and x.candidates == 1]
                 or [x for x in res.results if x.draft == name])[-1]
            pp.add_row(name, str(r.k), " ".join(f"{v:.2f}" for v in r.per_position_acceptance))
        out.print(pp)
    if has_cost:
        best = ", ".join(f"{d}: k={k}" for d, k in res.best.items())
        out.print(f"best k under the cost model (c={cfg['draft_cost']:g}, verify={cfg['verify_cost']}): {best}  "
                  "(* in the table)")
    else:
        out.print("no cost model given (--draft-cost / --verify-cost): speed-up not computed")
    for r in res.results:
        if r.token_check is not None:
            tc = r.token_check
            out.print(f"token-mode check {r.draft} k={r.k}: acceptance frequency {tc['acceptance_frequency']:.4f} vs "
                      f"alpha over judged positions {tc['expected_frequency']:.4f} (z = {tc['z']:.2f}, "
                      f"{'passed' if tc['passed'] else 'FAILED'})")
    out.print("assumptions:")
    for a in res.assumptions:
        out.print(f"  - {a}")
    for w in res.warnings:
        out.print(f"warning: {w}", style="bold yellow")
    if plot:
        out.print(f"plot written to {plot}")


def _plot(res, path, plt) -> None:
    many = "variants" in res.config
    drafts = list(dict.fromkeys((r.draft, _variant_label(r)) for r in res.results))
    fig, axes = plt.subplots(1, 3 if res.config["draft_cost"] is not None else 2, figsize=(14, 4.2))
    for draft_name, variant in drafts:
        rows = [r for r in res.results if r.draft == draft_name and _variant_label(r) == variant]
        name = f"{draft_name} ({variant})" if many else draft_name
        ks = [r.k for r in rows]
        if res.config["dump_kind"] == "sparse":
            lo = [r.mean_acceptance_length_lower for r in rows]
            hi = [r.mean_acceptance_length_upper for r in rows]
            axes[0].fill_between(ks, lo, hi, alpha=0.3, label=name)
        else:
            y = [r.mean_acceptance_length for r in rows]
            err = [[r.mean_acceptance_length - r.ci95[0] for r in rows],
                   [r.ci95[1] - r.mean_acceptance_length for r in rows]]
            axes[0].errorbar(ks, y, yerr=err, marker="o", capsize=3, label=name)
            longest = rows[-1]
            axes[1].plot(range(1, longest.k + 1), longest.per_position_acceptance, marker="o",
                         label=f"{name} (k={longest.k})")
        if res.config["draft_cost"] is not None and len(axes) > 2:
            s = [r.speedup if r.speedup is not None else r.speedup_lower for r in rows]
            axes[2].plot(ks, s, marker="o", label=name)
    axes[0].set(xlabel="k (drafted tokens per step)", ylabel="tokens per verify step", title="mean acceptance length")
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

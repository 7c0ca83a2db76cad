"""``fastspec policy-search``: which draft-length policy to use -- best fixed k, Hugging Face's default and the best
adaptive policy side by side, from a dump and a cost table; and the policy table of ``fastspec simulate --policy``."""
from __future__ import annotations

import os
from typing import Optional

import typer
from rich.table import Table

from ._common import fail, print_json, progress_bar, stderr_console, stdout_console
from ._options import (config_from_flags, dump_argument, flag_errors, json_option, min_p_option, seed_option,
                       temperature_option, top_k_option, top_p_option)
from ._app import app


def _ci(pair, digits=3, suffix=""):
    return "-" if pair is None else f"{pair[0]:.{digits}f}-{pair[1]:.{digits}f}{suffix}"


def _speed(s, ci):
    return "-" if s is None else f"{s:.2f}x" + (f" ({_ci(ci, 2)})" if ci is not None else "")


def print_policies(res) -> None:
    """The rows of kind policy of a simulation (``fastspec simulate --policy``)."""
    has_cost = res.config.get("costs") is not None
    table = Table(title="draft-length policies (fastspec.policies; method: exact DP or Monte-Carlo)",
                  title_justify="left")
    cols = ["draft", "policy", "method", "tokens/step", "95% CI prompts", "drafts/step"] + (
        ["speed-up (95% CI)"] if has_cost else [])
    for c in cols:
        table.add_column(c, justify="left" if c in ("draft", "policy", "method") else "right",
                         no_wrap=c != "policy", overflow="fold" if c == "policy" else "ellipsis")
    for r in res.policies:
        m = f"{r.mean_acceptance_length:.3f}"
        if r.mc_ci95 is not None:
            m += f" ±{(r.mc_ci95[1] - r.mc_ci95[0]) / 2:.3f}"
        table.add_row(r.draft, r.policy, "exact DP" if r.exact else "Monte-Carlo", m, _ci(r.ci95_sequences),
                      f"{r.mean_draft_length:.2f}", *([_speed(r.speedup, r.speedup_ci95)] if has_cost else []))
    notes = []
    if any(not r.exact for r in res.policies):
        notes.append(f"Monte-Carlo: {res.config['trials']} replays per sequence, seed {res.config['seed']}; ± its "
                     "95% interval")
    if has_cost and any(r.speedup is None for r in res.policies):
        notes.append("speed-up -: the cost table does not price every draft length the policy uses (nothing is "
                     "substituted; measure more k with `fastspec cost`)")
    if notes:
        table.caption = "; ".join(notes)
    stdout_console().print(table)


@app.command("policy-search")
def policy_search_command(
    dump: str = dump_argument(),
    costs: Optional[str] = typer.Option(None, "--costs", metavar="FILE", help="A JSON cost table of measured seconds "
                                        "(fastspec cost --out FILE); default: the dump's recorded table.  Required: "
                                        "the search ranks policies by predicted wall-clock speed-up."),
    draft: Optional[str] = typer.Option(None, "--draft", metavar="NAME", help="The model draft (default: the dump's "
                                        "only draft)."),
    budget_s: float = typer.Option(120.0, "--budget-s", metavar="S", help="Seconds of evaluation at most (after one "
                                   "pass over the dump); points not reached are counted in the output."),
    trials: int = typer.Option(200, "--trials", metavar="N", help="Monte-Carlo replays per sequence for the policies "
                               "without an exact replay (Hugging Face's default with its ROC tuning), 2 to 1000000."),
    seed: int = seed_option(),
    temperature: Optional[float] = temperature_option(),
    top_k: Optional[int] = top_k_option(),
    top_p: Optional[float] = top_p_option(),
    min_p: Optional[float] = min_p_option(),
    top: int = typer.Option(10, "--top", metavar="N", help="Show the N best policies (0: only the verdict)."),
    as_json: bool = json_option(),
) -> None:
    """Search draft-length policies (fixed k, confidence stops, SpecDec++-style stops, Hugging Face's schedules) for
    the largest predicted speed-up; prints best fixed k, HF's default and the best policy in one sentence."""
    from fastspec.io import open_dump
    from fastspec.simulation.policy_search import PolicySearchConfig, search_policies

    # the one table: each flag, the PolicySearchConfig field it sets and its value (checked once, by the library)
    flags = {"--costs": ("costs", "dump" if costs is None else costs), "--draft": ("draft", draft),
             "--budget-s": ("budget_s", budget_s), "--trials": ("trials", trials), "--seed": ("seed", seed),
             "--temperature": ("temperature", temperature), "--top-k": ("top_k", top_k), "--top-p": ("top_p", top_p),
             "--min-p": ("min_p", min_p)}
    conflicts = {("costs", "dump"): f"--costs: {dump} records no cost table and none was given; the search needs "
                 "one: measure it with `fastspec cost --out FILE` and pass --costs FILE"}
    config = config_from_flags(PolicySearchConfig, flags)
    if top < 0:
        fail(f"--top {top} is invalid: give a count >= 0")
    if not os.path.exists(dump):
        fail(f"{dump}: no such file or directory")
    console = stderr_console()
    start, advance, set_total, stop = progress_bar(console, "policies", None) if not as_json else (None,) * 4
    shown = {"n": 0}

    def progress(done, total):
        if set_total is not None:
            set_total(total)
            advance(done - shown["n"])
            shown["n"] = done

    with open_dump(dump) as d:  # opened once: the search reads the one it is given
        if start is not None:
            start()
        try:
            with flag_errors(flags, conflicts):
                res = search_policies(d, config=config, progress=progress)
        finally:
            if stop is not None:
                stop()
    # the wall clock goes to stderr, never into the results: two identical runs print the same bytes on stdout
    console.print(f"policy-search: {len(res.evaluated)} of {res.total} points in {res.elapsed_s:.1f} s",
                  highlight=False)
    if as_json:
        print_json(res.as_dict())
        return
    out = stdout_console()
    if top:
        t = Table(title=f"fastspec policy-search {dump}  (draft {res.draft}; {len(res.evaluated)} of {res.total} "
                        "points)", title_justify="left")
        for c in ("policy", "method", "tokens/step", "drafts/step", "speed-up (95% CI)"):
            t.add_column(c, justify="left" if c in ("policy", "method") else "right", overflow="fold")
        ranked = sorted((c for c in res.evaluated if c.speedup is not None), key=lambda c: -c.speedup)[:top]
        for c in ranked:
            e = c.estimate
            t.add_row(c.policy, e.method, f"{e.mean_acceptance_length:.3f}", f"{e.mean_draft_length:.2f}",
                      _speed(c.speedup, c.speedup_ci95))
        out.print(t)
    for n in res.notes:
        out.print(f"note: {n}", style="bold yellow")
    out.print(res.verdict, soft_wrap=True)

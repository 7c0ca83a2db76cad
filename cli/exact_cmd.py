"""``fastspec exact`` and ``fastspec audit``: the exact (Fraction) path on the command line."""
from __future__ import annotations

from fractions import Fraction
from typing import Optional

import typer
from rich.table import Table

from fastspec import exact as E

from ._common import fail, parse_float_list, print_json, stdout_console
from .main import app

_P_HELP = "Target distribution p, comma-separated (decimals are exact: 0.1 means 1/10; 1/3 also works)."
_Q_HELP = "Draft distribution q, comma-separated, same length as p."


def _fmt(x: Fraction | None) -> str:
    if x is None:
        return "-"
    return str(x)


def _pair(p: str, q: str, normalize: bool):
    ps = parse_float_list(p, "--p")
    qs = parse_float_list(q, "--q")
    if len(ps) != len(qs):
        fail(f"length mismatch: --p has {len(ps)} entries, --q has {len(qs)}; both must cover the same vocabulary")
    try:
        return E.as_distribution(ps, "--p", normalize=normalize), E.as_distribution(qs, "--q", normalize=normalize)
    except (ValueError, TypeError) as exc:
        fail(str(exc).replace("normalize=True (CLI: --normalize)", "--normalize"))


@app.command("exact")
def exact_command(
    p: str = typer.Option(..., "--p", help=_P_HELP),
    q: str = typer.Option(..., "--q", help=_Q_HELP),
    normalize: bool = typer.Option(False, "--normalize", help="Divide p and q by their sums instead of requiring sum 1."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (fractions as \"n/d\" strings)."),
) -> None:
    """Verify one drafted position exactly: accepted mass, residual, recovered distribution, output == p."""
    pd, qd = _pair(p, q, normalize)
    step = E.verify_step(pd, qd)
    if as_json:
        print_json({
            "p": step.p, "q": step.q, "accepted": step.accepted, "acceptance": step.acceptance,
            "rejection": step.rejection, "residual": step.residual, "recovered": step.recovered,
            "output": step.output, "output_equals_p": step.output == step.p,
            "rejection_possible": step.rejection != 0,
        })
        return
    table = Table(title="Exact speculative verification of one drafted position", title_justify="left")
    for col in ("token", "p (target)", "q (draft)", "accepted min(p,q)", "residual max(p-q,0)", "recovered", "output"):
        table.add_column(col, justify="right")
    for i in range(len(step.p)):
        rec = step.recovered[i] if step.recovered is not None else None
        table.add_row(str(i), _fmt(step.p[i]), _fmt(step.q[i]), _fmt(step.accepted[i]), _fmt(step.residual[i]),
                      _fmt(rec), _fmt(step.output[i]))
    console = stdout_console()
    console.print(table)
    console.print(f"acceptance alpha = sum min(p, q) = {step.acceptance}")
    console.print(f"rejection 1 - alpha = {step.rejection}")
    if step.recovered is None:
        console.print("rejection is impossible (p == q): no recovered distribution, no division")
    else:
        console.print("recovered = residual / sum(residual) = ("
                      + ", ".join(map(str, step.recovered)) + ")")
    formula = "accepted" if step.recovered is None else "accepted + rejection * recovered"
    console.print(f"output = {formula} = (" + ", ".join(map(str, step.output)) + ") = p exactly")


@app.command("audit")
def audit_command(
    policy: str = typer.Option("standard", "--policy", help="Verification policy: " + ", ".join(E.POLICIES) + "."),
    p: str = typer.Option(..., "--p", help=_P_HELP),
    q: str = typer.Option(..., "--q", help=_Q_HELP),
    tau: Optional[str] = typer.Option(None, "--tau", help="Draft-probability threshold for the prune_* policies."),
    epsilon: str = typer.Option("0.09", "--epsilon", help="typical_acceptance: hard threshold epsilon."),
    delta: str = typer.Option("0.3", "--delta", help="typical_acceptance: entropy-scaled threshold delta."),
    normalize: bool = typer.Option(False, "--normalize", help="Divide p and q by their sums instead of requiring sum 1."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (fractions as \"n/d\" strings)."),
) -> None:
    """Exact output distribution of a verification policy, its acceptance and its TV distance to p."""
    if policy not in E.POLICIES:
        fail(f"unknown policy {policy!r}; choose one of: {', '.join(E.POLICIES)}")
    pd, qd = _pair(p, q, normalize)
    for name, value in (("--tau", tau), ("--epsilon", epsilon), ("--delta", delta)):
        if value is not None:
            parse_float_list(value, name)
    try:
        pol = E.get_policy(policy, tau=tau, epsilon=epsilon, delta=delta)
    except ValueError as exc:
        fail(str(exc).replace("tau (CLI: --tau)", "--tau"))
    res = E.audit_step(pd, qd, pol)
    if as_json:
        print_json({
            "policy": res.policy, "params": dict(pol.params), "p": res.p, "q": res.q, "output": res.output,
            "acceptance": res.acceptance, "total_variation": res.total_variation, "exact": res.exact,
            "claims_exact": pol.claims_exact,
        })
        return
    table = Table(title=f"Policy audit: {res.policy}", title_justify="left", caption=pol.description)
    for col in ("token", "p (target)", "q (draft)", "output", "output - p"):
        table.add_column(col, justify="right")
    for i in range(len(res.p)):
        table.add_row(str(i), _fmt(res.p[i]), _fmt(res.q[i]), _fmt(res.output[i]), _fmt(res.output[i] - res.p[i]))
    console = stdout_console()
    console.print(table)
    console.print(f"acceptance = {res.acceptance} ({float(res.acceptance):.6g})")
    verdict = "exact: output == p" if res.exact else "NOT exact: output differs from p"
    console.print(f"total variation to p = {res.total_variation} ({float(res.total_variation):.6g}) -> {verdict}")

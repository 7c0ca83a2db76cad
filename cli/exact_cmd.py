"""``fastspec exact`` and ``fastspec audit``: the exact (Fraction) path on the command line."""
from __future__ import annotations

from fractions import Fraction
from typing import Optional

import typer
from rich.table import Table

from fastspec import exact as E
from fastspec.errors import InvalidInput, InvalidType

from ._common import print_json, stdout_console
from ._options import FlagError
from ._app import app

_P_HELP = "Target distribution p, comma-separated (decimals are exact: 0.1 means 1/10; 1/3 also works)."
_Q_HELP = "Draft distribution q, comma-separated, same length as p."
_NORMALIZE_HELP = "Divide p and q by their sums instead of requiring sum 1."
_TYPICAL_DEFAULTS = E.rule_parameters("typical_acceptance")
#: the policies' parameters as this command names them: parameter -> (flag, what it is)
_PARAMS = {
    "tau": ("--tau", "the draft-probability threshold below which a drafted candidate is dropped"),
    "epsilon": ("--epsilon", "typical acceptance's hard threshold"),
    "delta": ("--delta", "typical acceptance's entropy-scaled threshold"),
}


def _fmt(x: Fraction | None) -> str:
    if x is None:
        return "-"
    return str(x)


def _number(text: str, flag: str, index: int | None = None) -> Fraction:
    """One exact number as the library reads it ("0.1" is 1/10, "1/3" works); a bad one ends the command."""
    return E.to_fraction(text, flag, index)  # InvalidInput / InvalidType: one line, exit 2 (cli.main)


def _entries(text: str, flag: str) -> list[Fraction]:
    """A comma-separated list of exact numbers given to ``flag``."""
    if text is None or not text.strip():
        raise FlagError(f"{flag} is empty; give comma-separated probabilities, e.g. {flag} 0.5,0.3,0.2")
    items = [t.strip() for t in text.split(",")]
    for i, t in enumerate(items):
        if not t:
            raise FlagError(f"{flag} has an empty entry at index {i}; give comma-separated numbers, e.g. "
                            "0.5,0.3,0.2")
    return [_number(t, flag, i) for i, t in enumerate(items)]


def _distribution(values: list[Fraction], flag: str, normalize: bool):
    # The library checks the entries (names them flag[i]); the sum rule is this command's, with its own flag.
    dist = E.as_distribution(values, flag, normalize=True)  # InvalidInput / InvalidType: one line, exit 2
    total = sum(values, Fraction(0))
    if not normalize and total != 1:
        raise FlagError(f"{flag} sums to {total} (= {float(total):.12g}), not 1; fix the entries or pass --normalize "
                        "to divide them by their sum")
    return dist


def _pair(p: str, q: str, normalize: bool):
    ps, qs = _entries(p, "--p"), _entries(q, "--q")
    if len(ps) != len(qs):
        raise FlagError(f"length mismatch: --p has {len(ps)} entries, --q has {len(qs)}; both must cover the same "
                        "vocabulary")
    return _distribution(ps, "--p", normalize), _distribution(qs, "--q", normalize)


def _policy(name: str, given: dict):
    """The policy ``name`` with the parameters given on the command line (None: not given)."""
    if name not in E.RULES:
        raise FlagError(f"unknown policy {name!r}; choose one of: {', '.join(E.RULES)}")
    takes = E.rule_parameters(name)
    for param, value in given.items():
        flag, what = _PARAMS[param]
        if value is not None and param not in takes:
            takers = [n for n in E.RULES if param in E.rule_parameters(n)]
            raise FlagError(f"{flag} does not apply to policy {name!r}; it is for: {', '.join(takers)}")
        if value is None and param in takes and takes[param] is None:
            raise FlagError(f"policy {name!r} needs {flag}, {what}; e.g. {flag} 0.3")
    values = {param: _number(v, _PARAMS[param][0]) for param, v in given.items() if v is not None}
    try:
        return E.get_rule(name, **values)
    except (InvalidInput, InvalidType) as exc:
        flags = " ".join(f"{_PARAMS[param][0]} {given[param]}" for param in values)
        raise FlagError(f"{flags}: {exc}") from None


@app.command("exact")
def exact_command(
    p: str = typer.Option(..., "--p", help=_P_HELP),
    q: str = typer.Option(..., "--q", help=_Q_HELP),
    normalize: bool = typer.Option(False, "--normalize", help=_NORMALIZE_HELP),
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
    policy: str = typer.Option("standard", "--policy", help="Verification policy: " + ", ".join(E.RULES) + "."),
    p: str = typer.Option(..., "--p", help=_P_HELP),
    q: str = typer.Option(..., "--q", help=_Q_HELP),
    tau: Optional[str] = typer.Option(None, "--tau", help="prune_* policies (required there): draft-probability "
                                      "threshold below which a drafted candidate is dropped."),
    epsilon: Optional[str] = typer.Option(None, "--epsilon", help="typical_acceptance: hard threshold epsilon "
                                          f"(default {_TYPICAL_DEFAULTS['epsilon']})."),
    delta: Optional[str] = typer.Option(None, "--delta", help="typical_acceptance: entropy-scaled threshold delta "
                                        f"(default {_TYPICAL_DEFAULTS['delta']})."),
    normalize: bool = typer.Option(False, "--normalize", help=_NORMALIZE_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (fractions as \"n/d\" strings)."),
) -> None:
    """Exact output distribution of a verification policy, its acceptance and its TV distance to p."""
    pol = _policy(policy, {"tau": tau, "epsilon": epsilon, "delta": delta})
    pd, qd = _pair(p, q, normalize)
    res = E.audit_step(pd, qd, pol)
    if as_json:
        print_json({
            "policy": res.rule, "params": dict(pol.params), "p": res.p, "q": res.q, "output": res.output,
            "acceptance": res.acceptance, "total_variation": res.total_variation, "exact": res.exact,
            "claims_exact": pol.claims_exact,
        })
        return
    table = Table(title=f"Policy audit: {res.rule}", title_justify="left", caption=pol.description)
    for col in ("token", "p (target)", "q (draft)", "output", "output - p"):
        table.add_column(col, justify="right")
    for i in range(len(res.p)):
        table.add_row(str(i), _fmt(res.p[i]), _fmt(res.q[i]), _fmt(res.output[i]), _fmt(res.output[i] - res.p[i]))
    console = stdout_console()
    console.print(table)
    console.print(f"acceptance = {res.acceptance} ({float(res.acceptance):.6g})")
    verdict = "exact: output == p" if res.exact else "NOT exact: output differs from p"
    console.print(f"total variation to p = {res.total_variation} ({float(res.total_variation):.6g}) -> {verdict}")

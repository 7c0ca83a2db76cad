"""``fastspec inspect DUMP``: what a logit dump holds, and per-draft acceptance figures."""
from __future__ import annotations

from typing import Optional

import typer
from rich.table import Table

from ._common import print_json, stdout_console
from ._dask import SCHEDULER_HELP, open_scheduler
from .main import app


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


@app.command("inspect")
def inspect_command(
    dump: str = typer.Argument(..., help="Logit dump: an .npz file or a directory of .npy files (see data/README.md)."),
    temperature: Optional[float] = typer.Option(None, "--temperature", help="Temperature (0 = greedy); default: the dump's recorded value, else 1."),
    top_k: Optional[int] = typer.Option(None, "--top-k", help="Top-k filter (0 = off); dense dumps only."),
    top_p: Optional[float] = typer.Option(None, "--top-p", help="Top-p filter (1 = off); dense dumps only."),
    min_p: Optional[float] = typer.Option(None, "--min-p", help="Min-p filter (0 = off); dense dumps only."),
    k: int = typer.Option(4, "--k", min=1, help="Draft length for the expected acceptance length (trajectory DP)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable JSON on stdout."),
    scheduler: Optional[str] = typer.Option(None, "--scheduler", help=SCHEDULER_HELP),
) -> None:
    """Show the arrays, shapes and drafts of a dump, and each draft's acceptance rate α."""
    from fastspec.acceptance import alpha_summary, dump_acceptance, expected_tokens_per_step
    from fastspec.shards import load_any  # a dump, or a directory of shards (fastspec.shards)

    with open_scheduler(scheduler) as client, load_any(dump, client=client) as d:
        info = d.describe()
        acc = d.acceptance if hasattr(d, "acceptance") else (lambda **kw: dump_acceptance(d, **kw))
        res = acc(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
        md = d.metadata
        settings = {
            "temperature": md.get("temperature", 1.0) if temperature is None else temperature,
            "top_k": md.get("top_k", 0) if top_k is None else top_k,
            "top_p": md.get("top_p", 1.0) if top_p is None else top_p,
            "min_p": md.get("min_p", 0.0) if min_p is None else min_p,
        }
        drafts = {}
        for name, r in res.items():
            entry: dict = {"exact": r.exact}
            if r.exact:
                entry["alpha"] = alpha_summary(r.alpha, r.valid)
                st = expected_tokens_per_step(r.alpha, k, lengths=d.lengths)
                entry["expected"] = st.as_dict()
            else:
                entry["alpha_lower"] = alpha_summary(r.lower, r.valid)
                entry["alpha_upper"] = alpha_summary(r.upper, r.valid)
                entry["expected_at_lower"] = expected_tokens_per_step(r.lower, k, lengths=d.lengths).as_dict()
                entry["expected_at_upper"] = expected_tokens_per_step(r.upper, k, lengths=d.lengths).as_dict()
            drafts[name] = entry
    info["settings"] = settings
    info["acceptance"] = drafts
    if as_json:
        print_json(info)
        return

    con = stdout_console()
    con.print(f"[bold]{info['path']}[/bold]  ({info['format']}, {_size(info['size_on_disk'])} on disk)")
    v = info["V"] if info["V"] is not None else "unknown"
    con.print(f"{info['kind']} dump: N={info['N']} sequences, T={info['T']} positions, V={v}, "
              f"{info['valid_positions']} valid positions; drafts: {', '.join(info['drafts'])}")
    if info["metadata"]:
        con.print("recorded: " + ", ".join(f"{a}={b}" for a, b in info["metadata"].items()))
    t = Table(title="arrays")
    for col in ("name", "shape", "dtype", "size", "storage"):
        t.add_column(col)
    for a in info["arrays"]:
        t.add_row(a["name"], str(a["shape"]), a["dtype"], _size(a["nbytes"]), a["storage"])
    con.print(t)
    s = settings
    t = Table(title=f"acceptance (temperature={s['temperature']:g}, top_k={s['top_k']}, top_p={s['top_p']:g}, "
                    f"min_p={s['min_p']:g}; k={k})")
    for col in ("draft", "mean α", "std (positions)", "std (sequences)", "seq min..max", f"tokens/step (k={k})",
                "draft acc. rate"):
        t.add_column(col, justify="right" if col != "draft" else "left")
    for name, e in drafts.items():
        if e["exact"]:
            a, x = e["alpha"], e["expected"]
            t.add_row(name, f"{a['mean']:.4f}", f"{a['std_positions']:.4f}", f"{a['std_sequences']:.4f}",
                      f"{a['min_sequence']:.3f}..{a['max_sequence']:.3f}", f"{x['mean_acceptance_length']:.3f}",
                      f"{x['draft_acceptance_rate']:.3f}")
        else:
            lo, hi = e["alpha_lower"], e["alpha_upper"]
            xl, xh = e["expected_at_lower"], e["expected_at_upper"]
            t.add_row(name, f"[{lo['mean']:.4f}, {hi['mean']:.4f}]", f"{lo['std_positions']:.4f}",
                      f"{lo['std_sequences']:.4f}", f"{lo['min_sequence']:.3f}..{hi['max_sequence']:.3f}",
                      f"{xl['mean_acceptance_length']:.3f}..{xh['mean_acceptance_length']:.3f}",
                      f"{xl['draft_acceptance_rate']:.3f}..{xh['draft_acceptance_rate']:.3f}")
    con.print(t)
    if info["kind"] == "sparse":
        con.print("sparse top-k dump: α is known only within \\[lower, upper]; expected figures are evaluated at "
                  "the two ends of the interval. The mean acceptance length is non-decreasing in every α_t, so its two "
                  "values bound the true one; the draft acceptance rate at the ends is not a bound.")

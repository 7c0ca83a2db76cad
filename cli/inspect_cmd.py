"""``fastspec inspect DUMP``: what a logit dump holds, and per-draft acceptance figures."""
from __future__ import annotations

import os
from typing import Optional

from rich.table import Table

from ._common import fail, print_json, progress_bar, stderr_console, stdout_console
from ._dask import open_scheduler
from ._options import (check_sampling, dump_argument, integrity_option, json_option, k_option, min_p_option, parse_k,
                       scheduler_option, temperature_option, top_k_option, top_p_option)
from ._app import app

PROGRESS_LINES_BYTES = 256 << 20  # dumps from this size on print progress lines when stderr is not a terminal


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


@app.command("inspect")
def inspect_command(
    dump: str = dump_argument(),
    temperature: Optional[float] = temperature_option(),
    top_k: Optional[int] = top_k_option(),
    top_p: Optional[float] = top_p_option(),
    min_p: Optional[float] = min_p_option(),
    k: str = k_option("4", "Expected tokens per step (trajectory DP) are shown for each."),
    as_json: bool = json_option("Machine-readable JSON on stdout."),
    scheduler: Optional[str] = scheduler_option(),
    integrity: bool = integrity_option(),
) -> None:
    """Show the arrays, shapes and drafts of a dump, and each draft's acceptance rate α."""
    from fastspec.acceptance import alpha_summary, expected_tokens_per_step, resolve_sampling
    from fastspec.shards import load_any  # a dump, or a directory of shards (fastspec.shards)

    ks = parse_k(k)
    given = check_sampling(temperature, top_k, top_p, min_p)
    if not os.path.exists(dump):
        fail(f"{dump}: no such file or directory")
    with open_scheduler(scheduler) as client, load_any(dump, client=client, verify_integrity=integrity) as d:
        info = d.describe()
        settings = resolve_sampling(d, **given).as_dict()
        acc = d.acceptance
        # the alpha pass reads every byte of the dump: a bar on a terminal; elsewhere (a log) a line per tenth of
        # a dump large enough to take a while
        big = d.size_on_disk >= PROGRESS_LINES_BYTES
        start, advance, _, stop = progress_bar(stderr_console(), "alpha pass (positions)", d.N * d.T,
                                               every=max(1, d.N * d.T // 10) if big else None)
        start()
        try:
            res = acc(**given, progress=advance)
        finally:
            stop()
        drafts = {}
        for name, r in res.items():
            entry: dict = {"exact": r.exact}
            if r.exact:
                entry["alpha"] = alpha_summary(r.alpha, r.valid)
                by_k = {kk: expected_tokens_per_step(r.alpha, kk, lengths=d.lengths).as_dict() for kk in ks}
                entry["expected"] = by_k[ks[0]]
                entry["expected_by_k"] = by_k
            else:
                entry["alpha_lower"] = alpha_summary(r.lower, r.valid)
                entry["alpha_upper"] = alpha_summary(r.upper, r.valid)
                lo = {kk: expected_tokens_per_step(r.lower, kk, lengths=d.lengths).as_dict() for kk in ks}
                hi = {kk: expected_tokens_per_step(r.upper, kk, lengths=d.lengths).as_dict() for kk in ks}
                entry["expected_at_lower"], entry["expected_at_upper"] = lo[ks[0]], hi[ks[0]]
                entry["expected_at_lower_by_k"], entry["expected_at_upper_by_k"] = lo, hi
            drafts[name] = entry
    info["settings"] = settings
    info["acceptance"] = drafts
    if as_json:
        print_json(info)
        return

    con = stdout_console()
    con.print(f"{info['path']}  ({info['format']}, {_size(info['size_on_disk'])} on disk)", style="bold")
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
                    f"min_p={s['min_p']:g})")
    cols = ["draft", "mean α", "std (positions)", "std (sequences)", "seq min..max"]
    cols += [f"tokens/step (k={kk})" for kk in ks] + [f"draft acc. rate (k={ks[0]})"]
    for col in cols:
        t.add_column(col, justify="right" if col != "draft" else "left")
    for name, e in drafts.items():
        if e["exact"]:
            a, x = e["alpha"], e["expected"]
            per_k = [f"{e['expected_by_k'][kk]['mean_acceptance_length']:.3f}" for kk in ks]
            t.add_row(name, f"{a['mean']:.4f}", f"{a['std_positions']:.4f}", f"{a['std_sequences']:.4f}",
                      f"{a['min_sequence']:.3f}..{a['max_sequence']:.3f}", *per_k, f"{x['draft_acceptance_rate']:.3f}")
        else:
            lo, hi = e["alpha_lower"], e["alpha_upper"]
            xl, xh = e["expected_at_lower"], e["expected_at_upper"]
            per_k = [f"{e['expected_at_lower_by_k'][kk]['mean_acceptance_length']:.3f}.."
                     f"{e['expected_at_upper_by_k'][kk]['mean_acceptance_length']:.3f}" for kk in ks]
            t.add_row(name, f"[{lo['mean']:.4f}, {hi['mean']:.4f}]", f"{lo['std_positions']:.4f}",
                      f"{lo['std_sequences']:.4f}", f"{lo['min_sequence']:.3f}..{hi['max_sequence']:.3f}", *per_k,
                      f"{xl['draft_acceptance_rate']:.3f}..{xh['draft_acceptance_rate']:.3f}")
    con.print(t)
    if info["kind"] == "sparse":
        con.print("sparse top-k dump: α is known only within [lower, upper]; expected figures are evaluated at "
                  "the two ends of the interval. The mean acceptance length is non-decreasing in every α_t, so its two "
                  "values bound the true one; the draft acceptance rate at the ends is not a bound.")

"""``fastspec inspect DUMP``: what a logit dump holds, and per-draft acceptance figures."""
from __future__ import annotations

import json
import os
from contextlib import contextmanager
from typing import Optional

from rich.table import Table

from ._common import fail, print_json, progress_bar, stderr_console, stdout_console
from ._dask import open_scheduler
from ._options import (config_from_flags, dump_argument, integrity_option, json_option, k_option, min_p_option,
                       parse_k, scheduler_option, temperature_option, top_k_option, top_p_option)
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
    from fastspec.acceptance import InspectConfig, inspect_dump
    from fastspec.io import open_dump  # a dump, a directory of shards, a llama.cpp file

    # the one table: each flag, the InspectConfig field it sets and its value (checked once, by the library; --k's
    # text read by the library's one parser of draft lengths)
    flags = {"--k": ("ks", parse_k(k)), "--temperature": ("temperature", temperature), "--top-k": ("top_k", top_k),
             "--top-p": ("top_p", top_p), "--min-p": ("min_p", min_p)}
    config = config_from_flags(InspectConfig, flags)
    if not os.path.exists(dump):
        fail(f"{dump}: no such file or directory")
    with open_scheduler(scheduler) as client, open_dump(dump, client=client, verify_integrity=integrity) as d:
        report = inspect_dump(d, config=config, progress=_alpha_pass_progress(d.size_on_disk))
    out = report.as_dict()
    if as_json:
        print_json(out)
        return
    _render(out, report.ks)


def _alpha_pass_progress(size_on_disk: int):
    """``progress(stage, total, every)`` for :func:`fastspec.acceptance.inspect_dump`: the alpha pass reads every
    byte of the dump: a bar on a terminal; elsewhere (a log) a line per tenth of a dump large enough to take a
    while, nothing for a small one."""
    big = size_on_disk >= PROGRESS_LINES_BYTES

    @contextmanager
    def stage(label: str, total: int, every: int):
        start, advance, _, stop = progress_bar(stderr_console(), label, total, every=every if big else None)
        start()
        try:
            yield advance
        finally:
            stop()

    return stage


def _render_provenance(con, info: dict) -> None:
    """Where a dump's numbers came from (its ``provenance``: one line per server when it lists them) and what it
    knows beyond the top-k lists; printed as plain text (no markup is read from a file)."""
    prov = info.get("provenance")
    if prov:
        servers = prov.get("servers")
        rest = {a: b for a, b in prov.items() if a != "servers" or not isinstance(servers, dict)}
        con.print("provenance: " + json.dumps(rest, sort_keys=True)[:2000], markup=False, highlight=False)
        if isinstance(servers, dict):
            for role, srv in servers.items():
                srv = srv if isinstance(srv, dict) else {"model": srv}
                con.print(f"  {role}: {srv.get('model')} ({srv.get('engine', '?')} {srv.get('version', '?')}) at "
                          f"{srv.get('url', '?')}", markup=False, highlight=False)
    for role, kinds in (info.get("known_beyond_topk") or {}).items():
        con.print(f"{role}: known beyond the top-k: {', '.join(kinds)} (used by the α bounds)", markup=False,
                  highlight=False)


def _render(info: dict, ks: tuple[int, ...]) -> None:
    """The human output of an inspection's :meth:`~fastspec.acceptance.DumpInspection.as_dict`."""
    con = stdout_console()
    con.print(f"{info['path']}  ({info['format']}, {_size(info['size_on_disk'])} on disk)", style="bold")
    v = info["V"] if info["V"] is not None else "unknown"
    con.print(f"{info['kind']} dump: N={info['N']} sequences, T={info['T']} positions, V={v}, "
              f"{info['valid_positions']} valid positions; drafts: {', '.join(info['drafts'])}")
    if info["metadata"]:
        con.print("recorded: " + ", ".join(f"{a}={b}" for a, b in info["metadata"].items()))
    _render_provenance(con, info)
    t = Table(title="arrays")
    for col in ("name", "shape", "dtype", "size", "storage"):
        t.add_column(col)
    for a in info["arrays"]:
        t.add_row(a["name"], str(a["shape"]), a["dtype"], _size(a["nbytes"]), a["storage"])
    con.print(t)
    s, drafts = info["settings"], info["acceptance"]
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

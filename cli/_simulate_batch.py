"""``fastspec simulate --batch``: its options, and the rendering of the batch-size predictions
(fastspec.simulation.batch; ``SimulateConfig.batch_sizes``, computed by :func:`fastspec.simulate` into the
result's ``batch``): table and plot."""
from __future__ import annotations

import typer
from rich.table import Table

from ._common import stdout_console


def batch_option():
    return typer.Option(None, "--batch", metavar="B,...", help="Batch sizes (1 to 4096, e.g. 1,2,4,8): per batch "
                        "size the predicted throughput (tokens/s aggregate and per sequence, continuous batching) "
                        "with and without speculation, the speed-up with its interval, the best k, and the batch "
                        "size above which each (draft, k) stops paying.  Needs a cost table with those batch sizes "
                        "(version 2: fastspec cost --batch); with --plot also speed-up vs batch (PNG_batch.png).")


def extrapolate_option():
    return typer.Option(False, "--batch-extrapolate", help="With --batch: read batch sizes the cost table lacks off "
                        "a straight line through the two nearest measured ones (listed in the output as "
                        "extrapolated) instead of refusing.")


def _ci(pair):
    return "" if pair is None else f" ({pair[0]:.2f}-{pair[1]:.2f})"


def print_batch(bp) -> None:
    out = stdout_console()
    static = bp.static
    tab = Table(title="by batch size (continuous batching; tokens/s of the batch and per sequence; best k per draft "
                      "at each B; all rows in --json)",
                title_justify="left")
    cols = ["B", "plain tok/s", "per seq", "draft", "best k", "tok/s", "tok/s per seq", "speed-up (95% CI)"]
    cols += ["static speed-up"] if static else []
    for c in cols:
        tab.add_column(c, justify="left" if c == "draft" else "right", no_wrap=True)
    plain = {p["batch"]: p for p in bp.plain}
    for b in bp.batches:
        first = True
        for draft, k in bp.best[b].items():
            r = next(x for x in bp.rows if x.batch == b and x.draft == draft and x.k == k)
            cells = [str(b) if first else "", f"{plain[b]['tokens_per_s']:.1f}" if first else "",
                     f"{plain[b]['tokens_per_s_per_sequence']:.2f}" if first else "", draft, str(k),
                     f"{r.tokens_per_s:.1f}", f"{r.tokens_per_s_per_sequence:.2f}",
                     f"{r.speedup:.2f}x{_ci(r.speedup_ci95)}" + (" (lower bound)" if r.bound else "")]
            if static:
                cells.append("-" if r.static_speedup is None else f"{r.static_speedup:.2f}x")
            tab.add_row(*cells)
            first = False
        if first:
            tab.add_row(str(b), f"{plain[b]['tokens_per_s']:.1f}", f"{plain[b]['tokens_per_s_per_sequence']:.2f}",
                        "-", "-", "-", "-", "-", *(["-"] if static else []))
    out.print(tab)
    be = Table(title="break-even batch size per (draft, k)", title_justify="left")
    for c in ("draft", "k", "where speculation stops paying"):
        be.add_column(c, justify="right" if c == "k" else "left", no_wrap=c != "where speculation stops paying")
    for e in bp.break_even:
        be.add_row(e["draft"], str(e["k"]), e["text"])
    out.print(be)
    for b in bp.batches:
        top = bp.best_overall[b]
        if top is not None:
            out.print(f"B = {b}: best {top['draft']} at k = {top['k']}, {top['speedup']:.2f}x", soft_wrap=True)
    out.print("batch model:")
    for a in bp.assumptions:
        out.print(f"  - {a}", soft_wrap=True)
    for w in bp.warnings:
        out.print(f"warning: {w}", style="bold yellow", soft_wrap=True)


def batch_plot_path(path: str) -> str:
    """Where --plot's speed-up-vs-batch figure goes: PNG_batch.png next to the main PNG."""
    stem = path[:-4] if path.lower().endswith(".png") else path
    return stem + "_batch.png"


def plot_batch(bp, path, plt) -> None:
    fig, ax = plt.subplots(1, 1, figsize=(7, 4.5))
    for draft, k in dict.fromkeys((r.draft, r.k) for r in bp.rows):
        rows = [r for r in bp.rows if r.draft == draft and r.k == k]
        ax.plot([r.batch for r in rows], [r.speedup for r in rows], marker="o", label=f"{draft} k={k}")
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    ax.set_xscale("log", base=2)
    ax.set(xlabel="batch size B (sequences in flight)", ylabel="speed-up over plain decoding",
           title="speed-up vs batch size (continuous batching)" + (" -- some entries extrapolated"
                                                                     if bp.extrapolated else ""))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

"""``fastspec cost``: measure the real loop's costs (a cost table, fastspec.costs) without writing logits
(needs fastspec[hf])."""
from __future__ import annotations

import json
import os
from typing import List, Optional

import typer
from fastspec.config import MAX_WARMUP
from rich.table import Table

from ._common import fail, print_json, progress_bar, stderr_console, stdout_console
from ._hf import check_drafts, import_hf, load_models, set_threads
from ._options import (REPEATS_HELP, SEED_HELP, THREADS_HELP, TOKENS_HELP, argument_errors, check_threads,
                       config_from_flags, flag_errors, json_option, k_option, min_p_option, parse_k, seed_option,
                       target_option, temperature_option, top_k_option, top_p_option)
from ._app import app


@app.command("cost")
def cost_command(
    target: str = target_option(),
    draft: List[str] = typer.Option([], "--draft", metavar="NAME=MODEL", help="Draft (repeatable). MODEL: model "
                                    "directory, .gguf file, exitL (the target's first L layers) or ngram, ngramMIN-MAX "
                                    "(prompt lookup)."),
    prompts: Optional[str] = typer.Option(None, "--prompts", help="Prompts file: the context is its median-length "
                                          "prompt continued greedily by the target to its length + "
                                          "--max-new-tokens/2 (a dump's middle row). Default: random tokens."),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", metavar="N", help="With --prompts: the dump's "
                                        f"continuation length the context imitates; {TOKENS_HELP}."),
    context_length: Optional[int] = typer.Option(None, "--context-length", metavar="C", help="Tokens in the context "
                                                 f"(default: from --prompts, else 128); {TOKENS_HELP}, and the "
                                                 "context + the largest k + 1 within every model's "
                                                 "max_position_embeddings (checked before any forward)."),
    k: str = k_option("1-8", "The table covers these draft lengths."),
    repeats: int = typer.Option(20, "--repeats", metavar="N", help="Interleaved rounds; each entry is a median "
                                f"over them ({REPEATS_HELP})."),
    warmup: int = typer.Option(2, "--warmup", metavar="N", help="Rounds discarded first (the first forwards are "
                               f"slow; 0..{MAX_WARMUP})."),
    temperature: float = temperature_option(1.0, "Temperature of the draws and verification timed in the "
                                                 "overhead (0 = greedy)."),
    top_k: int = top_k_option(0, "Top-k of the timed draws and verification (0 disables)."),
    top_p: float = top_p_option(1.0, "Top-p of the timed draws and verification, in (0, 1]."),
    min_p: float = min_p_option(0.0, "Min-p of the timed draws and verification, in [0, 1)."),
    seed: int = seed_option(f"Seed of the timing order, the draws and (without --prompts) the context; {SEED_HELP}."),
    threads: Optional[int] = typer.Option(None, "--threads", help=f"torch threads, {THREADS_HELP} (default "
                                          "min(2, cores))."),
    out: Optional[str] = typer.Option(None, "--out", metavar="FILE", help="Write the cost table (JSON) here."),
    batch: Optional[str] = typer.Option(None, "--batch", metavar="B,...", help="Also measure the batch axis at these "
                                        "batch sizes (1 to 4096, e.g. 1,2,4,8,16): forwards of B copies of the "
                                        "context over n new tokens each, the drafts' and the per-step overhead at "
                                        "B, in a second run of interleaved rounds; writes a version-2 table "
                                        "(simulate --batch)."),
    as_json: bool = json_option("Print the cost table (JSON) on stdout."),
) -> None:
    """Time the real speculative loop's steps on this machine: target forwards over 1..k+1 tokens, each draft's
    forward over 1 and 2 tokens (or one n-gram proposal), and fastspec's overhead per step; write a cost table."""
    from fastspec.runs import CostMeasureConfig

    # the one table: each flag, the CostMeasureConfig field it sets and its value (checked once, by the library,
    # before torch is imported; --k's text read by the library's one parser of draft lengths)
    flags = {"--k": ("ks", parse_k(k)), "--temperature": ("temperature", temperature), "--top-k": ("top_k", top_k),
             "--top-p": ("top_p", top_p), "--min-p": ("min_p", min_p), "--batch": ("batches", batch),
             "--repeats": ("repeats", repeats), "--warmup": ("warmup", warmup),
             "--max-new-tokens": ("max_new_tokens", max_new_tokens),
             "--context-length": ("context_length", context_length), "--seed": ("seed", seed)}
    config = config_from_flags(CostMeasureConfig, flags)
    if prompts is not None and not os.path.isfile(prompts):
        fail(f"--prompts {prompts}: no such file (one prompt per line, or .jsonl with chat messages)")
    check_threads(threads)
    if out is not None:
        parent = os.path.dirname(os.path.abspath(out))
        if not os.path.isdir(parent):
            fail(f"--out {out}: directory {parent} does not exist")
        if os.path.isdir(out):
            fail(f"--out {out} is a directory; give a file name (costs.json)")
    hf = import_hf()
    from fastspec.hf.timing import DEFAULT_CONTEXT_LENGTH, check_cost_context

    set_threads(hf, threads)
    if draft:
        check_drafts(hf, draft)
    tmodel, tok, drafts = load_models(hf, target, draft)
    ids = hf.read_prompts(prompts, tok) if prompts is not None else None
    positions = {"context_length": ("--context-length", context_length if context_length is not None else
                                    f"(default {DEFAULT_CONTEXT_LENGTH})"),
                 "max_new_tokens": ("--max-new-tokens", max_new_tokens)}
    with argument_errors(positions):  # the context and the largest k + 1 fit every model: before any forward
        check_cost_context(tmodel, drafts, ks=config.ks, prompts=ids, max_new_tokens=max_new_tokens,
                           context_length=context_length)
    rounds = (config.repeats + config.warmup) * (2 if config.batches else 1)
    start, advance, _, stop = progress_bar(stderr_console(), "measuring costs (rounds)", rounds, every=5)
    start()
    try:
        with flag_errors(flags):  # the largest batch forward within bounds (--batch), before any forward
            table = hf.measure_costs(tmodel, drafts, prompts=ids, config=config, progress=advance)
    finally:
        stop()
    if out is not None:
        table.save(out)  # atomically: a temporary file in the same directory, then renamed
    if as_json:
        print_json(json.loads(table.to_json()))
        return
    _print_table(table, target)
    if table.has_batch_axis:
        _print_batch(table)
    if out is not None:
        typer.echo(f"wrote {out}")


def _print_table(table, target: str) -> None:
    info = table.info
    con = stdout_console()
    t1 = table.target_forward_s[1]
    tab = Table(title=f"fastspec cost: {os.path.basename(target.rstrip('/'))} on {info.get('machine')}, "
                      f"{info.get('threads')} threads, context {info.get('context_length')} tokens, medians of "
                      f"{info.get('repeats')} interleaved rounds", title_justify="left")
    for c in ("what", "ms", "± se", "× target(1)"):
        tab.add_column(c, justify="left" if c == "what" else "right", no_wrap=True)

    def row(what, s, se):
        tab.add_row(what, f"{s * 1e3:.3f}", "-" if se is None else f"{se * 1e3:.3f}", f"{s / t1:.3f}")

    for n, s in sorted(table.target_forward_s.items()):
        row(f"target forward, {n} new token{'s' if n > 1 else ''}", s, table.target_forward_se.get(n))
    for name, f in table.draft_forward_s.items():
        se = table.draft_forward_se.get(name, {})
        if name in table.one_call:
            row(f"draft {name}: one proposal call", f[1], se.get(1))
            continue
        for n, s in sorted(f.items()):
            row(f"draft {name} forward, {n} new token{'s' if n > 1 else ''}", s, se.get(n))
    for kk, s in sorted(table.overhead_s.items()):
        row("overhead, plain step (one draw)" if kk == 0 else f"overhead, verify step k={kk}", s,
            table.overhead_se.get(kk))
    con.print(tab)
    con.print("× target(1): relative to one plain decoding forward. A verify step with k drafts costs the first draft "
              "forward (2 tokens after a step that accepted every draft), k - 1 one-token draft forwards (an n-gram "
              "draft: one call), the target forward over k + 1 tokens and the overhead (fastspec.costs).")


def _print_batch(table) -> None:
    con = stdout_console()
    tab = Table(title="batch axis (version 2): ms±se at batch size B (n new tokens per sequence, each cache at the "
                      "context length)", title_justify="left")
    tab.add_column("what", no_wrap=True)
    for b in table.batch_sizes:
        tab.add_column(f"B={b}", justify="right", no_wrap=True)

    def cells(axis, se, n):
        return [f"{axis[b][n] * 1e3:.4g}±{se.get(b, {}).get(n, 0.0) * 1e3:.2g}" if n in axis.get(b, {}) else "-"
                for b in table.batch_sizes]

    for n in sorted({n for v in table.target_batch_s.values() for n in v}):
        tab.add_row(f"target, n={n}", *cells(table.target_batch_s, table.target_batch_se, n))
    for name, axis in table.draft_batch_s.items():
        se = table.draft_batch_se.get(name, {})
        for n in sorted({n for v in axis.values() for n in v}):
            what = f"{name}: one call" if name in table.one_call else f"{name}, n={n}"
            tab.add_row(what, *cells(axis, se, n))
    for kk in sorted({n for v in table.overhead_batch_s.values() for n in v}):
        tab.add_row("overhead, plain" if kk == 0 else f"overhead, k={kk}",
                    *cells(table.overhead_batch_s, table.overhead_batch_se, kk))
    con.print(tab)

"""``fastspec audit-output``: do an engine's emitted tokens follow the target's processed distribution?  The target
is teacher-forced along the emitted text (needs fastspec[hf]); the statistics are :mod:`fastspec.audit`'s."""
from __future__ import annotations

import os
from typing import Optional

import typer
from rich.table import Table

from ._common import print_json, progress_bar, stderr_console, stdout_console
from ._hf import import_hf, load_models, set_threads, sigterm_as_interrupt
from ._options import (THREADS_HELP, FlagError, check_threads, config_from_flags, json_option, min_p_option,
                       option_errors, seed_option, target_option, temperature_option, top_k_option, top_p_option)
from ._app import app


def _p(v) -> str:
    return "-" if v is None else f"{v:.3g}"


@app.command("audit-output")
def audit_output_command(
    target: str = target_option(),
    tokens: str = typer.Option(..., "--tokens", metavar="FILE.jsonl", help="Emitted tokens: JSONL, one object per "
                               "prompt with prompt_token_ids and token_ids (vLLM's names; optional prompt text); "
                               "at most 256 MiB."),
    prompts: Optional[str] = typer.Option(None, "--prompts", help="Check that each line's prompt_token_ids equal "
                                          "this prompts file's tokenization (text or .jsonl, as dump and measure "
                                          "read it; line i of --tokens is prompt i)."),
    temperature: float = temperature_option(1.0, "Temperature the engine sampled at (0 = greedy: every token must "
                                            "be the argmax)."),
    top_k: int = top_k_option(0, "Top-k the engine sampled with (0 disables)."),
    top_p: float = top_p_option(1.0, "Top-p the engine sampled with, in (0, 1]."),
    min_p: float = min_p_option(0.0, "Min-p the engine sampled with, in [0, 1)."),
    epsilon: float = typer.Option(1e-6, "--epsilon", metavar="EPS", help="Tail threshold: tokens emitted with "
                                  "target probability below EPS are counted against their exact expectation."),
    seed: int = seed_option("Seed of the PIT's randomization (same seed, same p-values)."),
    threads: Optional[int] = typer.Option(None, "--threads", help=f"torch threads, {THREADS_HELP}."),
    as_json: bool = json_option("Print one JSON object on stdout (the audit's statistics and verdict)."),
) -> None:
    """Teacher-force the target along each prompt's emitted tokens and test that they follow its processed
    distribution (PIT KS and Anderson-Darling, tail count, per prompt and per position; greedy: argmax)."""
    from fastspec.audit import AuditConfig, check_token_ids, read_token_file

    # the one table: each flag, the AuditConfig field it sets and its value (checked once, by the library, before
    # torch is imported)
    flags = {"--temperature": ("temperature", temperature), "--top-k": ("top_k", top_k), "--top-p": ("top_p", top_p),
             "--min-p": ("min_p", min_p), "--epsilon": ("epsilon", epsilon), "--seed": ("seed", seed)}
    config = config_from_flags(AuditConfig, flags)
    params = config.params
    check_threads(threads)
    if prompts is not None and not os.path.isfile(prompts):
        raise FlagError(f"--prompts {prompts}: no such file (one prompt per line, or .jsonl with chat messages)")
    with option_errors("--tokens"):
        records = read_token_file(tokens)
    hf = import_hf()
    from fastspec.hf.audit import audit_model_output, check_context, check_prompts_match, vocab_size

    set_threads(hf, threads)
    tmodel, tok, _ = load_models(hf, target, [])
    with option_errors("--tokens"):
        check_token_ids(records, vocab_size(tmodel), tokens)
        check_context(tmodel, records, tokens)
    if prompts is not None:
        with option_errors("--prompts"):
            ids = hf.read_prompts(prompts, tok)
            check_prompts_match(records, ids, tokens, prompts)
    start, advance, _, stop = progress_bar(stderr_console(), "auditing prompts", len(records), every=1)
    with sigterm_as_interrupt():
        start()
        try:
            result = audit_model_output(tmodel, records, config=config, progress=advance)
        finally:
            stop()
    lines = [r.line for r in records]
    out = {"target": target, "tokens_file": tokens, "config": {**params.as_dict(), "epsilon": epsilon, "seed": seed},
           **result.as_dict(),
           "worst_prompt_line": None if result.worst_prompt is None else lines[result.worst_prompt]}
    if as_json:
        print_json(out)
        return
    console = stdout_console()
    t = Table(title=f"fastspec audit-output: {result.tokens} tokens of {result.prompts} prompts ({result.mode}, "
                    f"T = {params.temperature:g}, top-k {params.top_k}, top-p {params.top_p:g}, min-p "
                    f"{params.min_p:g})")
    for c in ("test", "value", "p", "threshold"):
        t.add_column(c, justify="left" if c == "test" else "right", no_wrap=True)
    if result.mode == "greedy":
        t.add_row("argmax mismatches", str(result.greedy_mismatches), "-", "0 beyond the tolerance")
        t.add_row(f"near-ties (gap <= {result.greedy_tolerance:g})", str(result.greedy_near_ties), "-", "-")
        t.add_row("largest gap (logits)", f"{result.greedy_max_gap:.3g}", "-", f"{result.greedy_tolerance:g}")
    else:
        tp = f"{result.threshold_pooled:.2g}"
        t.add_row("PIT Kolmogorov-Smirnov D", f"{result.ks_statistic:.4f}", _p(result.ks_p), tp)
        t.add_row("PIT Anderson-Darling A2", f"{result.ad_statistic:.3f}", _p(result.ad_p), tp)
        t.add_row(f"tail count (p < {epsilon:g})", f"{result.tail_count} vs {result.tail_expected:.3g} expected",
                  _p(result.tail_p), tp)
        if result.argmax_count is not None:
            t.add_row("argmax tokens (score test)", f"{result.argmax_count} vs {result.argmax_expected:.4g} expected "
                      f"(z = {result.argmax_z:+.2f})", _p(result.argmax_p), tp)
        if result.surprisal_z is not None:
            t.add_row("surprisal score (score test)", f"z = {result.surprisal_z:+.2f}", _p(result.surprisal_p), tp)
        t.add_row("tokens of target probability 0", str(result.zero_probability_tokens), "-", "-")
        tg = f"{result.threshold_group:.2g}"
        if result.worst_prompt is not None:
            t.add_row(f"worst prompt (line {lines[result.worst_prompt]})", "", _p(result.worst_prompt_p), tg)
        if result.worst_position is not None:
            t.add_row(f"worst position ({result.worst_position})", "", _p(result.worst_position_p), tg)
    console.print(t)
    typer.echo(result.verdict)

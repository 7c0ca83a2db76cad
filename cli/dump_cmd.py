"""``fastspec dump``: a logit dump from real models (target + drafts) over a prompts file (needs fastspec[hf])."""
from __future__ import annotations

import os
from typing import List, Optional

import typer
from rich.console import Console

from ._common import EXIT_RUNTIME, fail, print_json
from .main import app


def import_hf():
    """fastspec.hf, or a one-line error (exit 1) naming the extra to install."""
    try:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        from fastspec import hf
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    except ImportError as exc:
        fail(f"this command needs torch and transformers ({exc}); install the extra: pip install 'fastspec[hf]' "
             "(CPU torch: pip install torch==2.13.0)", EXIT_RUNTIME)
    return hf


def set_threads(threads: Optional[int]) -> None:
    import torch

    if threads is not None and threads < 1:
        fail(f"--threads {threads} is invalid: use a positive count")
    torch.set_num_threads(threads or max(1, min(2, os.cpu_count() or 1)))


def progress_bar(console: Console, label: str, total: int):
    """(start, advance, stop) callables for a rich progress bar on stderr (no-ops when not a terminal)."""
    if not console.is_terminal:
        return (lambda: None), None, (lambda: None)
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    bar = Progress(TextColumn(label), BarColumn(), TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                   TimeRemainingColumn(), console=console, transient=True)
    task = bar.add_task(label, total=total)
    return bar.start, (lambda n: bar.advance(task, n)), bar.stop


def check_common(max_new_tokens: int, temperature: float, prompts: str) -> None:
    if max_new_tokens < 1:
        fail(f"--max-new-tokens {max_new_tokens} is invalid: use a positive count")
    if not temperature >= 0:
        fail(f"--temperature {temperature:g} is invalid: use a value >= 0 (0 means greedy)")
    if not os.path.isfile(prompts):
        fail(f"--prompts {prompts}: no such file (one prompt per line, or .jsonl with chat messages)")


@app.command("dump")
def dump_command(
    target: str = typer.Option(..., "--target", help="Target model: a local Hugging Face model directory or a .gguf file."),
    draft: List[str] = typer.Option(..., "--draft", help="NAME=MODEL (repeatable). MODEL: model directory, .gguf file, "
                                    "or exitL = the target's first L layers + its final norm and LM head."),
    prompts: str = typer.Option(..., "--prompts", help="Prompts: text file (one per line) or .jsonl (chat messages, "
                                "{\"messages\": [...]}, {\"prompt\": ...})."),
    out: str = typer.Option(..., "--out", help="Output dump: DUMP.npz, or a directory of .npy files."),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", help="Continuation length per prompt (stops early at EOS)."),
    temperature: float = typer.Option(1.0, "--temperature", help="Temperature the continuation is sampled at (0 = greedy); "
                                      "recorded in the dump."),
    top_k_save: Optional[int] = typer.Option(None, "--top-k-save", help="Save sparse top-K log-probabilities instead of "
                                             "dense float16 logits."),
    seed: int = typer.Option(0, "--seed", help="Seed of the continuation sampling (prompt i uses a seed derived from (seed, i))."),
    compress: Optional[bool] = typer.Option(None, "--compress/--no-compress", help="Deflate the .npz (default: on for "
                                            "sparse, off for dense)."),
    threads: Optional[int] = typer.Option(None, "--threads", help="torch threads (default min(2, cores))."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary of the written dump on stdout."),
) -> None:
    """Sample a continuation from the target for each prompt, run every model teacher-forced over it, write a dump."""
    check_common(max_new_tokens, temperature, prompts)
    if top_k_save is not None and top_k_save < 1:
        fail(f"--top-k-save {top_k_save} is invalid: use a positive K (or omit it for dense logits)")
    if os.path.exists(out) and not os.path.isdir(out) and not out.endswith(".npz"):
        fail(f"--out {out}: exists and is not a directory; give DUMP.npz or a directory")
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        fail(f"--out {out}: directory {parent} does not exist")
    hf = import_hf()
    set_threads(threads)
    specs = hf.parse_draft_specs(draft)
    tmodel, tok, drafts = hf.resolve_models(target, specs)
    ids = hf.read_prompts(prompts, tok)
    console = Console(stderr=True)
    start, advance, stop = progress_bar(console, "dumping prompts", len(ids))
    start()
    try:
        hf.dump_logits(out, tmodel, drafts, ids, max_new_tokens=max_new_tokens, temperature=temperature,
                       top_k_save=top_k_save, seed=seed, eos_token_id=hf.eos_ids(tmodel, tok), compressed=compress,
                       progress=advance, workdir=parent)
    finally:
        stop()
    from fastspec.io import load_dump

    with load_dump(out) as d:
        info = d.describe()
    if as_json:
        print_json(info)
    else:
        typer.echo(f"wrote {out}: {info['kind']} dump, drafts {', '.join(info['drafts'])}, N={info['N']} prompts, "
                   f"T={info['T']}, V={info['V']}, {info['valid_positions']} positions, "
                   f"{info['size_on_disk'] / 2 ** 20:.2f} MiB")

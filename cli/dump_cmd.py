"""``fastspec dump``: a logit dump from real models (target + drafts) over a prompts file (needs fastspec[hf])."""
from __future__ import annotations

import os
from contextlib import contextmanager
from typing import List, Optional

import typer
from rich.console import Console

from ._common import EXIT_RUNTIME, fail, print_json
from .main import app


def import_hf():
    """fastspec.hf (transformers set to offline and quiet), or a one-line error (exit 1) naming the extra."""
    try:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        from fastspec import hf

        hf.quiet_logging()
    except ImportError as exc:
        fail(f"this command needs torch and transformers ({exc}); install the extra: pip install 'fastspec[hf]' "
             "(CPU torch: pip install torch==2.13.0)", EXIT_RUNTIME)
    return hf


@contextmanager
def option_errors(flag: str):
    """Report the library's InvalidInput / InvalidType as a mistake in ``flag`` (one line, exit 2)."""
    from fastspec.errors import InvalidInput, InvalidType

    try:
        yield
    except (InvalidInput, InvalidType) as exc:
        fail(f"{flag}: {exc}")


def sampling_params(temperature: float, top_k: int, top_p: float, min_p: float):
    """The validated :class:`fastspec.params.SamplingParams` of --temperature/--top-k/--top-p/--min-p."""
    from fastspec.params import SamplingParams

    values = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "min_p": min_p}
    for name, value in values.items():
        with option_errors("--" + name.replace("_", "-")):
            SamplingParams(**{name: value})
    return SamplingParams(**values)


def check_options(hf, *, max_new_tokens: int, prompts: str, threads: Optional[int],
                  top_k_save: Optional[int]) -> None:
    """The options dump and measure share (models are loaded only after these pass); sets torch's threads."""
    from fastspec.hf.args import check_max_new_tokens, positive_int

    if not os.path.isfile(prompts):
        fail(f"--prompts {prompts}: no such file (one prompt per line, or .jsonl with chat messages)")
    with option_errors("--max-new-tokens"):
        check_max_new_tokens(max_new_tokens)
    if top_k_save is not None:
        with option_errors("--top-k-save"):
            positive_int("top_k_save", top_k_save)
    with option_errors("--threads"):
        hf.set_threads(threads)


def progress_bar(console: Console, label: str, total: int):
    """(start, advance, stop) callables for a rich progress bar on stderr (no-ops when not a terminal)."""
    if not console.is_terminal:
        return (lambda: None), None, (lambda: None)
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    bar = Progress(TextColumn(label), BarColumn(), TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                   TimeRemainingColumn(), console=console, transient=True)
    task = bar.add_task(label, total=total)
    return bar.start, (lambda n: bar.advance(task, n)), bar.stop


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
    top_k: int = typer.Option(0, "--top-k", help="Top-k of the continuation sampling (0 disables); recorded."),
    top_p: float = typer.Option(1.0, "--top-p", help="Top-p of the continuation sampling, in (0, 1]; recorded."),
    min_p: float = typer.Option(0.0, "--min-p", help="Min-p of the continuation sampling, in [0, 1); recorded."),
    top_k_save: Optional[int] = typer.Option(None, "--top-k-save", help="Save sparse top-K log-probabilities "
                                             "(processed with the sampling parameters) instead of dense float16 "
                                             "logits."),
    seed: int = typer.Option(0, "--seed", help="Seed of the continuation sampling (prompt i uses a seed derived from (seed, i))."),
    compress: Optional[bool] = typer.Option(None, "--compress/--no-compress", help="Deflate the .npz (default: on for "
                                            "sparse, off for dense)."),
    threads: Optional[int] = typer.Option(None, "--threads", help="torch threads (default min(2, cores))."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary of the written dump on stdout."),
) -> None:
    """Sample a continuation from the target for each prompt, run every model teacher-forced over it, write a dump."""
    params = sampling_params(temperature, top_k, top_p, min_p)
    hf = import_hf()
    check_options(hf, max_new_tokens=max_new_tokens, prompts=prompts, threads=threads, top_k_save=top_k_save)
    with option_errors("--out"):
        out = hf.check_dump_path(out)
    tmodel, tok, drafts = hf.resolve_models(target, draft)
    ids = hf.read_prompts(prompts, tok)
    start, advance, stop = progress_bar(Console(stderr=True), "dumping prompts", len(ids))
    start()
    try:
        hf.dump_logits(out, tmodel, drafts, ids, max_new_tokens=max_new_tokens, **params.as_dict(),
                       top_k_save=top_k_save, seed=seed, eos_token_id=hf.eos_ids(tmodel, tok), compressed=compress,
                       progress=advance, workdir=os.path.dirname(os.path.abspath(out)))
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

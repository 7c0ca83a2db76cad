"""``fastspec dump``: a logit dump from real models (target + drafts) over a prompts file (needs fastspec[hf])."""
from __future__ import annotations

import os
from typing import List, Optional

import typer

from ._common import print_json, progress_bar, stderr_console
from ._hf import check_options, import_hf
from ._options import (json_option, min_p_option, option_errors, sampling_params, seed_option, temperature_option,
                       top_k_option, top_p_option)
from .main import app


@app.command("dump")
def dump_command(
    target: str = typer.Option(..., "--target", metavar="MODEL", help="Target model: a local Hugging Face model "
                                "directory or a .gguf file."),
    draft: List[str] = typer.Option(..., "--draft", help="NAME=MODEL (repeatable). MODEL: model directory, .gguf file, "
                                    "or exitL = the target's first L layers + its final norm and LM head."),
    prompts: str = typer.Option(..., "--prompts", help="Prompts: text file (one per line) or .jsonl (chat messages, "
                                "{\"messages\": [...]}, {\"prompt\": ...})."),
    out: str = typer.Option(..., "--out", help="Output dump: DUMP.npz, or a directory of .npy files."),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", metavar="N", help="Continuation length per prompt "
                                        "(stops early at EOS)."),
    temperature: float = temperature_option(1.0, "Temperature the continuation is sampled at (0 = greedy); "
                                            "recorded in the dump."),
    top_k: int = top_k_option(0, "Top-k of the continuation sampling (0 disables); recorded."),
    top_p: float = top_p_option(1.0, "Top-p of the continuation sampling, in (0, 1]; recorded."),
    min_p: float = min_p_option(0.0, "Min-p of the continuation sampling, in [0, 1); recorded."),
    top_k_save: Optional[int] = typer.Option(None, "--top-k-save", help="Save sparse top-K log-probabilities "
                                             "(processed with the sampling parameters) instead of dense float16 "
                                             "logits."),
    seed: int = seed_option("Seed of the continuation sampling (prompt i uses a seed derived from (seed, i))."),
    compress: Optional[bool] = typer.Option(None, "--compress/--no-compress", help="Deflate the .npz (default: on for "
                                            "sparse, off for dense)."),
    threads: Optional[int] = typer.Option(None, "--threads", help="torch threads (default min(2, cores))."),
    as_json: bool = json_option("Print a JSON summary of the written dump on stdout."),
) -> None:
    """Sample a continuation from the target for each prompt, run every model teacher-forced over it, write a dump."""
    params = sampling_params(temperature, top_k, top_p, min_p)
    hf = import_hf()
    check_options(hf, max_new_tokens=max_new_tokens, prompts=prompts, threads=threads, top_k_save=top_k_save)
    with option_errors("--out"):
        out = hf.check_dump_path(out)
    tmodel, tok, drafts = hf.resolve_models(target, draft)
    ids = hf.read_prompts(prompts, tok)
    start, advance, _, stop = progress_bar(stderr_console(), "dumping prompts", len(ids), every=1)
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

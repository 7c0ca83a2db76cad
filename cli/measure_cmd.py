"""``fastspec measure``: real speculative decoding on the CPU vs ``simulate``'s offline prediction
(needs fastspec[hf])."""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import List, Optional

import typer
from rich.table import Table

from ._common import fail, print_json, progress_bar, stderr_console, stdout_console
from ._hf import check_options, import_hf
from ._options import (json_option, k_option, min_p_option, option_errors, parse_k, sampling_params, seed_option,
                       temperature_option, top_k_option, top_p_option)
from .main import app


@app.command("measure")
def measure_command(
    target: str = typer.Option(..., "--target", metavar="MODEL", help="Target model: a local Hugging Face model "
                                "directory or a .gguf file."),
    draft: List[str] = typer.Option(..., "--draft", metavar="NAME=MODEL", help="NAME=MODEL (repeatable); MODEL: "
                                    "directory, .gguf file or exitL."),
    prompts: str = typer.Option(..., "--prompts", help="Prompts file (text, one per line, or .jsonl chat messages)."),
    k: str = k_option("1,2,4"),
    temperature: float = temperature_option(1.0, "Sampling temperature of the real loop and of the prediction "
                                                 "(0 = greedy)."),
    top_k: int = top_k_option(0, "Top-k of the real loop and of the prediction (0 disables)."),
    top_p: float = top_p_option(1.0, "Top-p of the real loop and of the prediction, in (0, 1]."),
    min_p: float = min_p_option(0.0, "Min-p of the real loop and of the prediction, in [0, 1)."),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", metavar="N", help="Tokens generated per prompt "
                                        "(stops early at EOS)."),
    seed: int = seed_option("Seed (the real loop and the dump it makes derive their seeds from it)."),
    repeats: int = typer.Option(1, "--repeats", help="Real-loop runs per prompt and (draft, k)."),
    max_prompts: Optional[int] = typer.Option(None, "--max-prompts", help="Use only the first N prompts of the file."),
    dump: Optional[str] = typer.Option(None, "--dump", help="Predict from this existing dump of the same prompts "
                                       "(default: make one now, dense, from the same prompts)."),
    top_k_save: Optional[int] = typer.Option(None, "--top-k-save", help="Make the prediction dump sparse top-K."),
    save_dump: Optional[str] = typer.Option(None, "--save-dump", metavar="PATH", help="Keep the prediction dump it "
                                             "makes at this path."),
    trials: Optional[int] = typer.Option(None, "--trials", help="simulate's Monte-Carlo replays per sequence."),
    threads: Optional[int] = typer.Option(None, "--threads", help="torch threads (default min(2, cores))."),
    as_json: bool = json_option(),
) -> None:
    """Measured mean acceptance length (95% CI) per (draft, k) next to simulate's prediction, and the relative error."""
    from fastspec.hf.args import positive_int

    ks = parse_k(k)
    params = sampling_params(temperature, top_k, top_p, min_p)
    if dump is not None and not os.path.exists(dump):
        fail(f"--dump {dump}: no such file or directory")
    if dump is not None and (save_dump is not None or top_k_save is not None):
        fail("--dump uses an existing dump; --save-dump and --top-k-save only apply to the dump measure makes")
    if max_prompts is not None and max_prompts < 1:
        fail(f"--max-prompts {max_prompts} is invalid: use a positive count")
    if trials is not None and trials < 2:
        fail(f"--trials {trials} is invalid: use at least 2")
    hf = import_hf()
    check_options(hf, max_new_tokens=max_new_tokens, prompts=prompts, threads=threads, top_k_save=top_k_save)
    with option_errors("--repeats"):
        positive_int("repeats", repeats)
    if save_dump is not None:
        with option_errors("--save-dump"):
            hf.check_dump_path(save_dump)
    specs = hf.parse_draft_specs(draft)
    tmodel, tok, drafts = hf.resolve_models(target, specs)
    ids = hf.read_prompts(prompts, tok)[:max_prompts]
    eos = hf.eos_ids(tmodel, tok)
    console = stderr_console()
    tmpdir = None
    path = dump
    try:
        if path is None:
            if save_dump is not None:
                path = save_dump
            else:
                tmpdir = tempfile.mkdtemp(prefix="fastspec-measure-")
                path = os.path.join(tmpdir, "dump")
            start, advance, _, stop = progress_bar(console, "dumping (prediction)", len(ids), every=1)
            start()
            try:
                hf.dump_logits(path, tmodel, drafts, ids, max_new_tokens=max_new_tokens, **params.as_dict(),
                               top_k_save=top_k_save, seed=seed, eos_token_id=eos, progress=advance)
            finally:
                stop()
        prediction = hf.predict(path, list(drafts), ks, **params.as_dict(), trials=trials, seed=seed)
    finally:
        if tmpdir is not None:
            shutil.rmtree(tmpdir, ignore_errors=True)

    start, advance, _, stop = progress_bar(console, "real speculative loop", len(ids) * len(ks) * len(drafts),
                                           every=1)
    start()
    try:
        meas = hf.measure(tmodel, drafts, ids, ks, **params.as_dict(), seed=seed, max_new_tokens=max_new_tokens,
                          eos_token_id=eos, repeats=repeats, progress=advance)
    finally:
        stop()
    rows = hf.compare(meas, prediction)
    config = {"target": target, "drafts": specs, "prompts": prompts, "num_prompts": len(ids),
              "max_prompts": max_prompts, "k": ks, **params.as_dict(), "max_new_tokens": max_new_tokens,
              "seed": seed, "repeats": repeats, "dump": dump if dump is not None else save_dump,
              "dump_kind": prediction.dump_kind}
    if as_json:
        print_json({"config": config, "results": rows, "prediction_warnings": prediction.warnings})
        return
    out = stdout_console()
    sampling = params.describe() if params.filtered else f"T={temperature:g}"
    table = Table(title=f"fastspec measure: real loop vs simulate ({sampling}, {len(ids)} prompts x "
                        f"{max_new_tokens} new tokens, repeats={repeats})", title_justify="left")
    for c in ("draft", "k", "predicted", "measured (95% CI)", "rel. error", "steps", "ms/token draft+target+verify"):
        table.add_column(c, justify="left" if c == "draft" else "right", no_wrap=True)
    for r, m in zip(rows, meas, strict=True):
        p = r["predicted"]
        if p["mean_acceptance_length_exact"] is not None:
            ci = p["ci95_over_prompts"]
            ptxt = f"{p['mean_acceptance_length_exact']:.3f}" + (f" ({ci[0]:.3f}-{ci[1]:.3f})" if ci else "")
        else:
            ptxt = f"[{p['lower']:.3f}, {p['upper']:.3f}]"
        err = r["relative_error"]
        t = m.time_s
        per = 1000.0 / max(m.emitted, 1)
        table.add_row(m.draft, str(m.k), ptxt,
                      f"{m.mean_acceptance_length:.3f} ({m.ci95[0]:.3f}-{m.ci95[1]:.3f})",
                      ("-" if err is None else f"{100 * err:+.1f}%")
                      + ("" if r["z_difference"] is None else f" (z={r['z_difference']:+.1f})"), str(m.verify_steps),
                      f"{t['draft'] * per:.1f}+{t['target'] * per:.1f}+{t['verify'] * per:.1f}")
    out.print(table)
    out.print("predicted: simulate's exact expectation (trajectory DP) over the dump's recorded trajectories, 95% CI "
              "over prompts (one recorded trajectory each; sparse dump: [lower, upper] bounds); measured: tokens per "
              "verify step of the real loop, 95% CI over prompts; rel. error = (predicted - measured) / measured (0 "
              "when inside a sparse interval); z = difference / combined standard error")
    for w in prediction.warnings:
        out.print(f"warning: {w}", style="bold yellow")

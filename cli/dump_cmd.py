"""``fastspec dump``: a logit dump from real models (target + drafts) over a prompts file (needs fastspec[hf])."""
from __future__ import annotations

from typing import List, Optional

import typer

from ._common import print_json, progress_bar, stderr_console
from ._hf import (check_drafts, check_options, eos_ids, ignore_eos_option, import_hf, load_models, set_threads,
                  sigterm_as_interrupt)
from ._options import (REPEATS_HELP, SEED_HELP, THREADS_HELP, TOKENS_HELP, argument_errors, config_from_flags,
                       json_option, min_p_option, option_errors, parse_k, seed_option, target_option,
                       temperature_option, top_k_option, top_p_option)
from ._app import app


@app.command("dump")
def dump_command(
    target: str = target_option(),
    draft: List[str] = typer.Option([], "--draft", metavar="NAME=MODEL", help="Draft (repeatable; none: a "
                                    "target-only dump, e.g. for n-gram analysis). MODEL: model directory, .gguf "
                                    "file, exitL = the target's first L layers + its final norm and LM head, or "
                                    "an n-gram prompt-lookup draft (no logits; its cost is recorded): ngram / "
                                    "ngramMIN-MAX (fastspec's rule), ngram.vllm / ngram.vllmMIN-MAX (vLLM's), "
                                    "ngram.hf / ngram.hfMAX (Hugging Face's); grammar: fastspec simulate --help."),
    prompts: str = typer.Option(..., "--prompts", help="Prompts: text file (one per line) or .jsonl (chat messages, "
                                "{\"messages\": [...]}, {\"prompt\": ...})."),
    out: str = typer.Option(..., "--out", help="Output dump: DUMP.npz, or a directory of .npy files."),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", metavar="N", help="Continuation length per prompt "
                                        "(stops early at EOS unless --ignore-eos); the dump's T is always N; "
                                        f"{TOKENS_HELP}, and the longest prompt + N - 1 within every model's "
                                        "max_position_embeddings (checked before generating)."),
    ignore_eos: bool = ignore_eos_option(),
    temperature: float = temperature_option(1.0, "Temperature the continuation is sampled at (0 = greedy); "
                                            "recorded in the dump."),
    top_k: int = top_k_option(0, "Top-k of the continuation sampling (0 disables); recorded."),
    top_p: float = top_p_option(1.0, "Top-p of the continuation sampling, in (0, 1]; recorded."),
    min_p: float = min_p_option(0.0, "Min-p of the continuation sampling, in [0, 1); recorded."),
    top_k_save: Optional[int] = typer.Option(None, "--top-k-save", help="Save sparse top-K log-probabilities "
                                             "(processed with the sampling parameters) instead of dense logits; "
                                             "1..2**24 (at most V are kept)."),
    dtype: str = typer.Option("float16", "--dtype", metavar="float16|float32", help="Dense logits' storage type "
                              "(float32: twice the size, no rounding of near-tied top tokens)."),
    seed: int = seed_option(f"Seed of the continuation sampling (prompt i uses a seed derived from (seed, i)); "
                            f"{SEED_HELP}."),
    compress: Optional[bool] = typer.Option(None, "--compress/--no-compress", help="Deflate the .npz (default: on for "
                                            "sparse, off for dense)."),
    costs: bool = typer.Option(True, "--costs/--no-costs", help="Measure the real loop's costs on this machine "
                               "with these models and record them in the dump (array 'costs'; see fastspec cost)."),
    cost_repeats: int = typer.Option(10, "--cost-repeats", metavar="N", help="Interleaved rounds the costs are "
                                     f"medians of ({REPEATS_HELP})."),
    cost_k: str = typer.Option("1-8", "--cost-k", metavar="K", help="Draft lengths the recorded costs cover "
                               "(1,2,4 or 1-8)."),
    threads: Optional[int] = typer.Option(None, "--threads", help=f"torch threads, {THREADS_HELP} (default "
                                          "min(2, cores))."),
    as_json: bool = json_option("Print a JSON summary of the written dump on stdout."),
) -> None:
    """Sample a continuation from the target for each prompt, record every model's logits along it, measure the
    loop's costs, write a dump."""
    from fastspec.config import DEFAULT_WARMUP
    from fastspec.runs import DumpConfig

    # the one table: each flag, the DumpConfig field it sets and its value (checked once, by the library, before
    # torch is imported; --cost-k's text read by the library's one parser of draft lengths, with --costs only)
    flags = {"--temperature": ("temperature", temperature), "--top-k": ("top_k", top_k), "--top-p": ("top_p", top_p),
             "--min-p": ("min_p", min_p), "--cost-k": ("cost_k", parse_k(cost_k, "--cost-k") if costs else (1,)),
             "--dtype": ("dtype", dtype), "--cost-repeats": ("cost_repeats", cost_repeats),
             "--max-new-tokens": ("max_new_tokens", max_new_tokens), "--top-k-save": ("top_k_save", top_k_save),
             "--seed": ("seed", seed), "--ignore-eos": ("ignore_eos", ignore_eos),
             "--compress": ("compressed", compress), "--costs": ("costs", costs)}
    config = config_from_flags(DumpConfig, flags)
    check_options(prompts=prompts, threads=threads)
    hf = import_hf()
    from fastspec.hf.dumping import check_dump_positions

    set_threads(hf, threads)
    from fastspec.io import check_dump_path

    with option_errors("--out"):
        out = check_dump_path(out)
    if draft:
        check_drafts(hf, draft)
    tmodel, tok, drafts = load_models(hf, target, draft)
    ids = hf.read_prompts(prompts, tok)
    with argument_errors({"max_new_tokens": ("--max-new-tokens", max_new_tokens), "cost_k": ("--cost-k", cost_k)}):
        check_dump_positions(tmodel, drafts, ids, max_new_tokens, config.cost_k if costs else None)
    console = stderr_console()
    start, advance, _, stop = progress_bar(console, "dumping prompts", len(ids), every=1)
    cstart, cadvance, _, cstop = progress_bar(console, "measuring costs (rounds)", cost_repeats + DEFAULT_WARMUP,
                                              every=5)
    costs_started = []

    def cost_progress(n=1):
        if not costs_started:  # the prompts are done: their bar gives way to the costs'
            stop()
            cstart()
            costs_started.append(True)
        cadvance(n)

    with sigterm_as_interrupt():
        start()
        try:

            hf.dump_logits(out, tmodel, drafts, ids, eos_token_id=eos_ids(hf, tmodel, tok, ignore_eos), config=config,
                           progress=advance, cost_progress=cost_progress)
        finally:
            stop()
            cstop()
    from fastspec.io import open_dump

    with open_dump(out) as d:
        info = d.describe()
    if as_json:
        print_json(info)
    else:
        typer.echo(f"wrote {out}: {info['kind']} dump, drafts {', '.join(info['drafts']) or 'none (target only)'}, "
                   f"N={info['N']} prompts, T={info['T']}, V={info['V']}, {info['valid_positions']} positions, "
                   f"{info['size_on_disk'] / 2 ** 20:.2f} MiB"
                   + ("" if info["costs"] is None else f"; costs recorded ({info['costs'].get('machine')}, "
                      f"{info['costs'].get('threads')} threads)"))

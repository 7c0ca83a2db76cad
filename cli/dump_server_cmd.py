"""``fastspec dump-server``: a sparse dump from running inference servers (vLLM's OpenAI-compatible server or
SGLang), for models too big to run here (:func:`fastspec.server_dump.dump_from_servers`)."""
from __future__ import annotations

import os
import warnings
from typing import List, Optional

import typer

from ._app import app
from ._common import fail, print_json, progress_bar, stderr_console
from ._hf import sigterm_as_interrupt
from ._options import (SEED_HELP, check_model_seed, json_option, min_p_option, option_errors, seed_option,
                       temperature_option, top_k_option, top_p_option)

#: the exit code of an interrupt (Ctrl-C, SIGTERM): 128 + SIGINT, what typer gives every command's Ctrl-C
EXIT_INTERRUPTED = 130


def _read_token_prompts(path: str) -> list:
    """Prompts as token ids without a tokenizer: a .jsonl of ``{"prompt_token_ids": [...]}`` (or bare lists), read
    by :func:`fastspec.io.servers.read_prompt_file` (the token-file reader of audit-output)."""
    from fastspec.io.servers import read_prompt_file

    if not path.endswith(".jsonl"):
        fail(f"--prompts {path}: without --tokenizer the prompts must be a .jsonl of {{\"prompt_token_ids\": "
             "[...]}} lines (or give --tokenizer MODEL_DIR_OR_GGUF)")
    with option_errors("--prompts"):
        return read_prompt_file(path)


def _parse_drafts(specs: List[str]) -> dict:
    drafts = {}
    for spec in specs:
        name, sep, url = spec.partition("=")
        if not sep or not name or not url:
            fail(f"--draft {spec!r}: use NAME=URL, e.g. --draft q4=http://127.0.0.1:8001")
        if name in drafts:
            fail(f"--draft {name}: given twice")
        drafts[name] = url
    return drafts


@app.command("dump-server")
def dump_server_command(
    target: str = typer.Option(..., "--target", metavar="URL", help="The target's server, e.g. "
                               "http://127.0.0.1:8000 (vLLM: python -m vllm.entrypoints.openai.api_server "
                               "--max-logprobs 20; SGLang: python -m sglang.launch_server)."),
    draft: List[str] = typer.Option([], "--draft", metavar="NAME=URL", help="A draft's server (repeatable; none: "
                                    "a target-only dump)."),
    prompts: str = typer.Option(..., "--prompts", help="Prompts: text file (one per line) or .jsonl (chat "
                                "messages, {\"prompt\": ...}) tokenized with --tokenizer as fastspec dump does; "
                                "without --tokenizer a .jsonl of {\"prompt_token_ids\": [...]}."),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", metavar="MODEL_DIR_OR_GGUF", help="The served "
                                            "models' tokenizer (needs fastspec[hf])."),
    out: str = typer.Option(..., "--out", help="Output dump: DUMP.npz (or a directory of .npy); it records the "
                            "servers (provenance), the logprobs mode and each sampled token's logprob; "
                            "OUT.servers.json is the run's report."),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", metavar="N", help="Continuation length per prompt "
                                        "(the target may stop earlier at EOS unless --ignore-eos)."),
    ignore_eos: bool = typer.Option(False, "--ignore-eos", help="Every continuation runs to --max-new-tokens."),
    temperature: float = temperature_option(1.0, "Temperature the continuation is sampled at (0 = greedy)."),
    top_k: int = top_k_option(0, "Top-k of the continuation sampling (0 disables)."),
    top_p: float = top_p_option(1.0, "Top-p of the continuation sampling."),
    min_p: float = min_p_option(0.0, "Min-p of the continuation sampling."),
    top_logprobs: int = typer.Option(20, "--top-logprobs", metavar="K", help="Top-k logprobs asked of every "
                                     "server per position (vLLM caps at --max-logprobs, default 20)."),
    logprobs_mode: str = typer.Option("raw", "--logprobs-mode", metavar="raw|processed", help="What the servers "
                                      "return: raw (vLLM's default raw_logprobs; only temperature 0 or 1 without "
                                      "truncation) or processed (vLLM --logprobs-mode processed_logprobs)."),
    engine: str = typer.Option("vllm", "--engine", metavar="vllm|sglang", help="The servers' API."),
    tight: Optional[bool] = typer.Option(None, "--tight/--no-tight", help="Fetch the logprobs of the other side's "
                                         "top-k ids too (SGLang only; default: on for SGLang when sampling)."),
    concurrency: int = typer.Option(4, "--concurrency", metavar="C", help="Prompts in flight at once."),
    timeout: float = typer.Option(600.0, "--timeout", metavar="S", help="Deadline in seconds for each request "
                                  "as a whole (connect, send, the whole answer), in (0, 86400]; each retry gets a "
                                  "fresh one."),
    retries: int = typer.Option(3, "--retries", metavar="R", help="Retries on transient errors (connection "
                                "refused/reset, timeouts, 429, 5xx), with exponential back-off; 4xx never."),
    seed: int = seed_option(f"Seed of the continuation sampling (prompt i gets a seed derived from (seed, i)); "
                            f"{SEED_HELP}."),
    served_model: List[str] = typer.Option([], "--model", metavar="ROLE=NAME", help="The served model name to use "
                                           "(ROLE: target or a draft's name; default: the first the server lists)."),
    as_json: bool = json_option("Print a JSON summary on stdout."),
) -> None:
    """Sample continuations on the target server, score them teacher-forced on every server, write a sparse dump
    (resumable: rerun the same command after an interruption)."""
    from fastspec.io.servers import check_timeout, check_url
    from fastspec.params import SamplingParams
    from fastspec.server_dump import dump_from_servers, staging_dir

    if engine not in ("vllm", "sglang"):
        fail(f"--engine {engine}: use vllm or sglang")
    if logprobs_mode not in ("raw", "processed"):
        fail(f"--logprobs-mode {logprobs_mode}: use raw or processed")
    if not 1 <= max_new_tokens <= 1 << 20:
        fail(f"--max-new-tokens {max_new_tokens}: give an integer in [1, 1048576]")
    if not 1 <= top_logprobs <= 1 << 16:
        fail(f"--top-logprobs {top_logprobs}: give an integer in [1, 65536]")
    if not 1 <= concurrency <= 1024:
        fail(f"--concurrency {concurrency}: give an integer in [1, 1024]")
    if not 0 <= retries <= 100:
        fail(f"--retries {retries}: give an integer in [0, 100]")
    with option_errors("--timeout"):
        check_timeout(timeout)
    check_model_seed(seed)
    with option_errors("--target"):
        check_url(target, "--target")
    drafts = _parse_drafts(draft)
    for name, url in drafts.items():
        with option_errors("--draft"):
            check_url(url, f"--draft {name}")
    models = {}
    for spec in served_model:
        role, sep, name = spec.partition("=")
        if not sep or not role or not name:
            fail(f"--model {spec!r}: use ROLE=NAME, e.g. --model target=meta-llama/Llama-3.1-8B-Instruct")
        if role != "target" and role not in drafts:
            fail(f"--model {spec!r}: {role!r} is neither 'target' nor a --draft name")
        if role in models:
            fail(f"--model {role}: given twice ({models[role]!r} and {name!r}); give one served model name per role")
        models[role] = name
    if tokenizer is not None:
        from ._hf import import_hf

        hf = import_hf()
        with option_errors("--tokenizer"):
            tok = hf.load_tokenizer(tokenizer)
        with option_errors("--prompts"):
            ids = hf.read_prompts(prompts, tok)
    else:
        ids = _read_token_prompts(prompts)
    console = stderr_console()
    start, advance, _, stop = progress_bar(console, "prompts (sample + score)", len(ids), every=1)
    start()
    # Ctrl-C (and SIGTERM, turned into the same KeyboardInterrupt) stops every request and retry at once; the
    # finished prompts stay staged.  Exit 130, the code typer gives every other command's Ctrl-C, with one line
    try:
        with warnings.catch_warnings(record=True) as caught, sigterm_as_interrupt():
            warnings.simplefilter("always")
            res = dump_from_servers(out, target, drafts, ids, max_new_tokens=max_new_tokens, ignore_eos=ignore_eos,
                                    sampling=SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p,
                                                            min_p=min_p),
                                    seed=seed, top_logprobs=top_logprobs, engine=engine,
                                    logprobs_mode=logprobs_mode, tight=tight, concurrency=concurrency,
                                    timeout=timeout, retries=retries, progress=advance, models=models)
    except KeyboardInterrupt:
        stop()
        staging = staging_dir(out)
        try:
            n = sum(name.startswith("prompt-") for name in os.listdir(staging))
        except OSError:
            n = 0
        fail(f"interrupted; {n} finished prompt{'' if n == 1 else 's'} staged in {staging}: rerun the same command "
             "to resume", EXIT_INTERRUPTED)
    finally:
        stop()
    for w in caught:
        typer.echo(f"fastspec: warning: {w.message}", err=True)
    summary = {"out": res.out, "side_file": res.side_file, "prompts": res.prompts, "resumed": res.resumed,
               "k_received": res.k_received, "servers": res.servers, "tight_bounds": res.tight_bounds,
               "warnings": res.warnings}
    if as_json:
        print_json(summary)
        return
    models = ", ".join(f"{r}: {s['model']} ({s['engine']} {s['version']})" for r, s in res.servers.items())
    line = (f"wrote {res.out}: sparse dump of {res.prompts} prompts ({res.resumed} resumed), "
            f"k = {res.k_received}; {models}; report in {res.side_file}")
    typer.echo(line)
    for name, tb in (res.tight_bounds or {}).items():
        typer.echo(f"{name}: alpha in [{tb['alpha_topk'][0]:.4f}, {tb['alpha_topk'][1]:.4f}] from the top-k lists, "
                   f"[{tb['alpha_union'][0]:.4f}, {tb['alpha_union'][1]:.4f}] with both sides' logprobs on the "
                   f"union, as simulate and inspect use it (mean width {tb['width_topk']:.4f} -> "
                   f"{tb['width_union']:.4f})")

"""``fastspec measure --engine vllm``: vLLM's own speculative decoding against fastspec's exact prediction, and the
output audit of vLLM's tokens (:func:`fastspec.engines.compare.compare_vllm`); the flags are checked here, the work
is the library's, the tables are rendered here."""
from __future__ import annotations

import os
from typing import Optional, Sequence

from rich.table import Table

from ._common import print_json, stdout_console
from ._options import FlagError, option_errors

ENGINES = ("fastspec", "vllm")
DRAFT_SAMPLE_METHODS = ("greedy", "probabilistic")


def check_engine_flags(engine: str, *, draft_sample_method: Optional[str], vllm_python: Optional[str],
                       runs_dir: Optional[str], ignore_eos: bool, not_for_vllm: dict) -> None:
    """``--engine`` and the flags that apply to one engine only: a flag that cannot apply is refused, never
    silently ignored.  ``not_for_vllm``: {flag: given?} of measure's fastspec-only flags."""
    if engine not in ENGINES:
        raise FlagError(f"--engine {engine} is unknown; choose one of: {', '.join(ENGINES)}")
    vllm_only = {"--draft-sample-method": draft_sample_method is not None, "--vllm-python": vllm_python is not None,
                 "--runs-dir": runs_dir is not None}
    if engine == "fastspec":
        given = [f for f, g in vllm_only.items() if g]
        if given:
            raise FlagError(f"{given[0]} applies to --engine vllm only")
        return
    given = [f for f, g in not_for_vllm.items() if g]
    if given:
        raise FlagError(f"{given[0]} applies to fastspec's own loop only, not to --engine vllm")
    if draft_sample_method is not None and draft_sample_method not in DRAFT_SAMPLE_METHODS:
        raise FlagError(f"--draft-sample-method {draft_sample_method} is unknown; choose one of: "
                        f"{', '.join(DRAFT_SAMPLE_METHODS)} (vLLM's speculative_config.draft_sample_method)")
    if not ignore_eos:
        raise FlagError("--engine vllm compares fixed-length runs (vLLM counts drafts accepted past the end of a "
                        "request): add --ignore-eos")
    if runs_dir is not None and os.path.exists(runs_dir) and not os.path.isdir(runs_dir):
        raise FlagError(f"--runs-dir {runs_dir}: exists and is not a directory")


def engine_drafts(specs: Sequence[str]):
    """measure's --draft values as vLLM runs them: [NAME=]DIR (a Hugging Face model directory: vLLM's
    ``draft_model``) or vLLM's n-gram rule (``ngram.vllm``, ``ngram.vllmN``, ``ngram.vllmMIN-MAX``); anything vLLM
    cannot run (a .gguf file, exitL, fastspec's or Hugging Face's n-gram rules) is refused by name."""
    from fastspec.engines.compare import EngineDraft
    from fastspec.ngram import ngram_name, parse_ngram_draft

    out, seen = [], set()
    for raw in specs:
        name, _, model = raw.partition("=") if "=" in raw else ("", "", raw)
        with option_errors("--draft"):
            prop = parse_ngram_draft(model, 1)
        if prop is not None:
            if prop.preset != "vllm":
                raise FlagError(f"--draft {raw}: vLLM's n-gram proposer has its own rule (earliest occurrence); "
                                "give ngram.vllm, ngram.vllmN or ngram.vllmMIN-MAX")
            draft = EngineDraft(name or ngram_name(prop), "ngram", min_n=prop.min_n, max_n=prop.max_n)
        else:
            if not os.path.isdir(model):
                raise FlagError(f"--draft {raw}: vLLM needs a Hugging Face model directory as a draft (a .gguf file "
                                "or exitL cannot run in vLLM)")
            draft = EngineDraft(name or os.path.basename(os.path.normpath(model)), "model", os.path.abspath(model))
        if draft.name in seen:
            raise FlagError(f"--draft {raw}: the name {draft.name} is given twice")
        seen.add(draft.name)
        out.append(draft)
    return out


def measure_vllm(*, target: str, draft: Sequence[str], prompts: str, ks, params, max_new_tokens: int, seed: int,
                 max_prompts: Optional[int], draft_sample_method: Optional[str], vllm_python: Optional[str],
                 runs_dir: Optional[str], audit: bool, as_json: bool, progress) -> None:
    from fastspec.engines import vllm as V
    from fastspec.engines.compare import compare_vllm

    if not os.path.isdir(target):
        raise FlagError(f"--target {target}: vLLM needs a Hugging Face model directory (save a GGUF model with "
                        "scripts/prepare_smollm2.py or transformers' save_pretrained)")
    drafts = engine_drafts(draft)
    python = V.find_python(vllm_python)
    from ._hf import import_hf

    import_hf()
    from fastspec.hf.audit import audit_model_output
    from fastspec.hf.models import load_tokenizer
    from fastspec.hf.prompts import read_prompts
    from fastspec.hf.teacher import TeacherCache

    ids = read_prompts(prompts, load_tokenizer(target))
    if max_prompts is not None:
        ids = ids[:max_prompts]
    if len(ids) < 2:
        raise FlagError(f"--prompts {prompts}: give at least two prompts (the intervals are over prompts)")
    teacher = TeacherCache()

    def run_audit(_name, outputs):
        records = [(o["prompt_token_ids"], o["token_ids"]) for o in outputs]
        return audit_model_output(teacher.model(target), records, **params.as_dict(), seed=seed)

    res = compare_vllm(target, drafts, ids, ks, sampling=params, seed=seed, max_new_tokens=max_new_tokens,
                       python=python, draft_sample_method=draft_sample_method or "greedy", teacher=teacher,
                       audit=run_audit if audit else None, progress=progress, runs_dir=runs_dir)
    if as_json:
        print_json(res.as_dict())
        return
    _render(res)


def _ci(lo_hi) -> str:
    return "-" if not lo_hi else f"[{lo_hi[0]:.2f}, {lo_hi[1]:.2f}]"


def _render(res) -> None:
    out = stdout_console()
    s = res.sampling
    t = Table(title=f"fastspec measure --engine vllm (vLLM {res.engine_version}; T={s['temperature']:g}; "
                    f"{res.prompts} prompts x {res.max_new_tokens} tokens, one request at a time)",
              title_justify="left")
    for c in ("draft", "k", "vLLM tokens/step [95% CI]", "predicted [95% CI]", "difference [95% CI]",
              "per-position acceptance vLLM / predicted", "tok/s", "speed-up [95% CI]", "audit"):
        t.add_column(c, justify="left" if c in ("draft", "audit") else "right", no_wrap=c != "audit")
    for r in res.rows:
        m, p, d = r.measured, r.predicted, r.difference
        half = d["ci95_half_width"]
        dtxt = f"{d['estimate']:+.2f}" + (f" [{d['estimate'] - half:+.2f}, {d['estimate'] + half:+.2f}]"
                                         if half == half and half != float("inf") else "")
        pos = " ".join(f"{a:.2f}/{b:.2f}" for a, b in zip(m["per_position_acceptance"], p["per_position_acceptance"],
                                                          strict=True))
        sp = r.speedup
        audit = "-" if r.audit is None else ("passed" if r.audit.get("passed") else "FAILED")
        t.add_row(r.draft + ("" if r.draft_sample_method in (None, "greedy") else f" ({r.draft_sample_method})"),
                  str(r.k), f"{m['mean_acceptance_length']:.2f} {_ci(m['ci95_sequences'])}",
                  f"{p['mean_acceptance_length']:.2f} {_ci(p['ci95_sequences'])}", dtxt, pos,
                  f"{r.tokens_per_s:.1f}", f"{sp['estimate']:.2f} {_ci(sp['ci95'])}", audit)
    out.print(t)
    plain_audit = "" if res.plain_audit is None else (
        "; audit of its output: " + ("passed" if res.plain_audit.get("passed") else "FAILED"))
    out.print(f"plain vLLM: {res.plain_tokens_per_s:.1f} tokens/s{plain_audit}")
    out.print("vLLM tokens/step: 1 + accepted / drafts from vLLM's own counters; predicted: fastspec's exact DP "
              "under vLLM's conventions (prefill emits the first token; k drafts per step, argmax drafts with a "
              "one-hot q unless probabilistic; n-gram: earliest occurrence; accepted drafts past max_tokens "
              "counted) along vLLM's plain-decoding continuation; difference paired by prompt; speed-up: tokens/s "
              "over vLLM's plain decoding, configurations run one after another; audit: the tokens against the "
              "target's processed distribution (fastspec.audit: same distribution, not same text)")
    for r in res.rows:
        out.print(r.verdict)
    for w in res.warnings:
        out.print(f"warning: {w}", style="bold yellow")
    out.print(f"verdict: {res.verdict}")

"""``fastspec measure --engine vllm`` (an engine of the registry whose ``pipeline`` is ``"counters"``): the work is
the library's (:func:`fastspec.engines.vllm.measure.measure_vllm`, named by the registry entry), its errors are
told about the flags here, and the tables are rendered here."""
from __future__ import annotations

from rich.table import Table

from ._common import print_json, stdout_console
from ._options import RUN_FLAGS, named_argument_errors

__all__ = ["measure_engine"]

#: the library's argument names (``InvalidInput.argument``) and the flags they come from
FLAGS = {**RUN_FLAGS, "target": "--target", "drafts": "--draft", "prompts": "--prompts", "runs_dir": "--runs-dir",
         "draft_sample_method": "--draft-sample-method"}


def measure_engine(entry, *, target, draft, prompts, ks, params, max_new_tokens, seed, max_prompts,
                   draft_sample_method, vllm_python, runs_dir, audit, as_json, progress) -> None:
    """Measure the engine of registry entry ``entry`` and print its comparison (a table, or JSON)."""
    from ._hf import import_hf

    with named_argument_errors(FLAGS):  # told about the option the user typed
        res = entry.measure_function()(target, list(draft), prompts, ks, sampling=params,
                                       max_new_tokens=max_new_tokens, seed=seed, max_prompts=max_prompts,
                                       draft_sample_method=draft_sample_method, python=vllm_python,
                                       runs_dir=runs_dir, audit=audit, progress=progress, before_hf=import_hf)
    if as_json:
        print_json(res.as_dict())
        return
    _render(res)


def _ci(lo_hi) -> str:
    return "-" if not lo_hi else f"[{lo_hi[0]:.2f}, {lo_hi[1]:.2f}]"


def _render(res) -> None:
    out = stdout_console()
    s = res.sampling
    t = Table(title=f"fastspec measure --engine vllm (vLLM {res.engine_version}; T={s.temperature:g}; "
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

"""``fastspec measure --engine llamacpp``: the work is the library's
(:func:`fastspec.engines.llamacpp.measure.measure_llamacpp`, named by the registry entry); its errors are told
about the flags here, and the table is rendered here."""
from __future__ import annotations

from rich.table import Table

from ._common import print_json, stdout_console
from ._options import RUN_FLAGS, named_argument_errors

__all__ = ["measure_llamacpp_engine"]

#: the library's argument names (``InvalidInput.argument``) and the flags they come from
FLAGS = {**RUN_FLAGS, "target": "--target", "drafts": "--draft", "prompts": "--prompts", "p_min": "--p-min",
         "n_min": "--n-min", "draft_sample_method": "--draft-sample-method", "sampling": "--temperature"}


def measure_llamacpp_engine(entry, *, target, draft, prompts, ks, params, max_new_tokens, seed, max_prompts,
                            draft_sample_method, binary, threads, p_min, n_min, audit, as_json, progress) -> None:
    """Measure llama.cpp (registry entry ``entry``) and print its comparison (a table, or JSON)."""
    with named_argument_errors(FLAGS):  # told about the option the user typed
        res = entry.measure_function()(
            target, list(draft), prompts, ks, sampling=params, max_new_tokens=max_new_tokens, seed=seed,
            max_prompts=max_prompts, draft_sample_method=draft_sample_method, binary=binary,
            threads=1 if threads is None else threads, p_min=0.0 if p_min is None else p_min,
            n_min=0 if n_min is None else n_min, audit=audit, progress=progress)
    if as_json:
        print_json(res.as_dict())
        return
    _render(res)


def _render(res) -> None:
    out = stdout_console()
    s = res.sampling
    t = Table(title=f"fastspec measure --engine llamacpp (T={s['temperature']:g}; {res.prompts} prompts x "
                    f"{res.max_new_tokens} tokens; -t {res.threads}; p_min {res.p_min:g}, n_min {res.n_min})",
              title_justify="left")
    for c in ("draft", "k", "drafted", "accepted", "exact", "flips", "tok/s", "speed-up", "audit"):
        t.add_column(c, justify="left" if c in ("draft", "audit") else "right", no_wrap=True)
    for r in res.rows:
        md, ma = sum(m[0] for m in r.measured), sum(m[1] for m in r.measured)
        pd_, pa = sum(q[0] for q in r.predicted), sum(q[1] for q in r.predicted)
        audit = "-" if r.audit is None else ("passed" if r.audit.get("passed") else "FAILED")
        t.add_row(r.draft + ("" if r.draft_sampling in ("greedy", "ngram-simple") else f" ({r.draft_sampling})"),
                  str(r.k),
                  f"{md} / {pd_:.1f}", f"{ma} / {pa:.1f}",
                  f"{r.matches}/{len(r.measured)}" if r.exact else "- (T > 0)",
                  f"{len(r.flips)}+{r.near_ties}" if r.exact else "-",
                  f"{r.tokens_per_s:.1f}", f"{r.speedup:.2f}", audit)
    out.print(t)
    plain_audit = "" if res.plain_audit is None else (
        "; audit of its output: " + ("passed" if res.plain_audit.get("passed") else "FAILED"))
    out.print(f"plain llama.cpp: {res.plain_tokens_per_s:.1f} tokens/s{plain_audit}")
    out.print("drafted / accepted: llama.cpp's timings.draft_n / draft_n_accepted summed over prompts / the "
              "prediction: fastspec's DP under llama.cpp's conventions (the first token from the prompt, drafts "
              "capped at min(k, budget - generated - 1), p_min on the top-10 probability, n_min) along the run's "
              "own output, teacher-forced by llama.cpp itself -- exact per prompt at T = 0, an expectation at "
              "T > 0; exact: prompts whose two counters equal the prediction; flips P+N: near-tie flips, P prompts "
              "whose output differs from plain decoding and N positions where the target's top two are tied or "
              "its argmax is not the token; speed-up: llama.cpp's decoding tokens/s over its plain decoding (one "
              "run each, not interleaved); audit: the tokens against the target's processed distribution "
              "(fastspec.audit)")
    if any(r.draft_sampling == "ngram-simple" for r in res.rows):
        out.print("ngram-simple rows: llama.cpp's n-gram lookup replayed token by token "
                  "(fastspec.engines.llamacpp.ngram), from the plain output at T = 0 (a prediction) and along the "
                  "run's own output at T > 0 (its drafts are a function of the tokens: exact there too)")
    for r in res.rows:
        out.print(r.verdict)
    for w in res.warnings:
        out.print(f"warning: {w}", style="bold yellow")
    out.print(f"verdict: {res.verdict}")

"""``fastspec measure --policy SPEC`` and ``--engine hf``: draft-length policies in fastspec's loop and Hugging Face's
own assisted generation next to the fixed-k configurations (issue 23).  ``--policy`` is parsed by the library
(:class:`fastspec.runs.MeasureConfig`, before any model is loaded; which engines take which flag:
:mod:`fastspec.engines.registry`); the work is the library's (:func:`fastspec.hf.measure_and_predict` with
``policies``, and ``hf_engine`` from the registry's ``hf`` entry); the policy rows' table is rendered here."""
from __future__ import annotations

from typing import Optional

from rich.table import Table

POLICY_HELP = ("A draft-length policy (repeatable), run in fastspec's loop next to the fixed k's and predicted from "
               "the same dump: fixed:k=K | conf:theta=T,kmax=K[,on=token|max] | specdec:h=H,kmax=K[,on=token|max] | "
               "hf[:k=20,schedule=constant|heuristic|heuristic_transient,theta=0.4,tune=roc|off] (bare hf = "
               "transformers' defaults); with --engine hf the fixed and hf policies also run in Hugging Face's "
               "assisted generation.  Policies other than fixed need a model draft (its probabilities).")


def _ci(d: Optional[dict]) -> str:
    if not d:
        return "-"
    lo, hi = d["ci95"]
    return f"{d['estimate']:.2f} ({lo:.2f}-{hi:.2f})"


def _point(p: Optional[dict], bare: bool = False) -> str:
    if not p:
        return "-"
    v = p["mean_acceptance_length_exact"]
    if v is None:
        v = p.get("mean_acceptance_length_mc")
    if v is None:
        return f"[{p['lower']:.3f}, {p['upper']:.3f}]" if p.get("lower") is not None else "-"
    ci = None if bare else p.get("ci95_over_prompts")
    return f"{v:.2f}" + (f" ({ci[0]:.2f}-{ci[1]:.2f})" if ci else "") + ("" if p.get("exact", True) else " MC")


def render_policy_rows(out, rows, measurement) -> None:
    """One table for the rows run under a policy or by Hugging Face's engine: measured tokens/step and drafts/step,
    forwards, speed-up, next to the prediction of the same policy."""
    chosen = [r for r in rows if r.get("policy") is not None or r.get("engine", "fastspec") != "fastspec"]
    if not chosen:
        return
    t = Table(title="draft-length policies: fastspec's loop and Hugging Face's assisted generation (hf:)",
              title_justify="left")
    for c in ("configuration", "tok/step pred.", "measured", "drafts p/m", "fwd t/d", "speed-up", "pred."):
        t.add_column(c, justify="left" if c == "configuration" else "right", no_wrap=c != "configuration",
                     min_width=28 if c == "configuration" else None, overflow="fold")
    for r in chosen:
        m, p = r["measured"], r["predicted"]
        sp = r.get("speedup") or {}
        mdl = m.get("mean_draft_length")
        fixed_k = r["k"] if not m.get("predicted_as") and m.get("draft_forwards") else None  # n-gram: varies
        pdl = None if not p else p.get("mean_draft_length", fixed_k)
        fwd = "/".join("-" if m.get(f) is None else str(m[f]) for f in ("target_forwards", "draft_forwards"))
        pred_sp = (sp.get("predicted") or {}).get("estimate")
        meas = f"{m['mean_acceptance_length']:.2f} ({m['ci95'][0]:.2f}-{m['ci95'][1]:.2f})"
        t.add_row(r["label"], _point(p, bare=True), meas,
                  ("-" if pdl is None else f"{pdl:.2f}") + "/" + ("-" if mdl is None else f"{mdl:.2f}"), fwd,
                  _ci(sp.get("measured")), "-" if pred_sp is None else f"{pred_sp:.2f}")
    out.print(t)
    s = measurement.settings
    notes = ["intervals of the predictions: --json; predicted: fastspec.simulation.policy_eval.evaluate_policy of "
             "the same policy on the dump (exact DP, or "
             "Monte-Carlo: MC; an hf: row is predicted as the policy its settings stand for, JSON predicted_as; "
             "fixed k: simulate's); hf: rows run transformers' own assisted generation (num_assistant_tokens / "
             "schedule / assistant_confidence_threshold on the draft's generation_config; counted by forward hooks "
             "and the candidate generator), their speed-up is over Hugging Face's plain generate"]
    if s.get("hf_engine"):
        notes.append("scikit-learn " + ("is" if s.get("sklearn_importable") else "is not") + " importable: "
                     "transformers " + ("tunes" if s.get("sklearn_importable") else "does not tune") +
                     " its confidence threshold (ROC)")
    for skipped in s.get("skipped", []):
        notes.append(f"not run: {skipped}")
    for n in notes:
        out.print(n)

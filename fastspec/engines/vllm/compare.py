"""fastspec against vLLM: run vLLM's own speculative decoding, predict its counters exactly, audit its output.

:func:`compare_vllm` (what ``fastspec measure --engine vllm`` runs), for one target, drafts, ks and prompts:

1. **vLLM without speculation** (one engine process): every prompt once with ``max_new_tokens + max(k)`` tokens
   (untimed: the record the prediction teacher-forces along, and the engine's warm-up), then every prompt alone
   with ``max_new_tokens`` tokens, timed (the baseline of every speed-up).
2. **vLLM with speculation**, one engine process per (draft, k): ``draft_model`` for a model directory (drafts by
   argmax with a one-hot q unless ``draft_sample_method="probabilistic"``), ``ngram`` for ``ngram@vllm...``
   drafts; every prompt alone, timed, vLLM's counters read per prompt.
3. **The prediction** (exact, no Monte-Carlo): the target and every model draft teacher-forced along vLLM's
   recorded continuations (torch, float32), each position's processed distributions (the same sampling config)
   give the conditional acceptance of a draft -- p_t(argmax q_t) for argmax drafts, sum min(p_t, q_t) for sampled
   ones, p_t(x) for an n-gram proposal x (at T = 0: whether the draft equals the recorded token, vLLM's own greedy
   choice) -- and :func:`fastspec.engines.conventions.expected_counters` replays vLLM's step rules exactly.  Under
   sampling, as in ``fastspec simulate``, the context is assumed to stay the recorded one after an accepted draft.
4. **Measured**: vLLM's counters (mean acceptance length 1 + accepted / drafts, per-position acceptance),
   tokens/s per configuration and the speed-up over vLLM's own plain decoding (a ratio of totals with prompts as
   clusters, :func:`fastspec.hf.prediction.speedup_ci`).  Configurations run one after another (each engine
   loads in about a minute), not interleaved: a machine whose load drifts between them moves the speed-ups.
5. **Verdict** per row: the measured mean acceptance length against the prediction, paired by prompt (a
   delta-method interval for the difference of the two ratios); "below the exact prediction" when the whole
   interval is below 0.  The output audit (:mod:`fastspec.audit`) of every configuration's tokens, when the
   caller passes ``audit`` (a function of (name, outputs) returning a result with ``passed`` and ``as_dict()``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from ...errors import InvalidInput
from ...params import SamplingParams
from ...processing import probabilities
from ...stats import t_quantile_975
from ..conventions import Counters, counters_summary, expected_counters
from . import runner as V
from .conventions import VLLM

__all__ = ["EngineDraft", "RowComparison", "EngineComparison", "compare_vllm", "paired_ratio_difference",
           "position_quantities"]


@dataclass(frozen=True)
class EngineDraft:
    """A draft as the engine runs it: ``kind`` "model" (``path`` a model directory) or "ngram" (``min_n``,
    ``max_n``: vLLM's ``prompt_lookup_min``/``max``)."""

    name: str
    kind: str
    path: str | None = None
    min_n: int = 5
    max_n: int = 5


def paired_ratio_difference(num_a, den_a, num_b, den_b) -> tuple[float, float, float]:
    """(difference, se, ci95 half-width) of sum(num_a)/sum(den_a) - sum(num_b)/sum(den_b), one entry per cluster
    (prompt) for both: delta method on the paired linearizations, Student t with n - 1 degrees of freedom."""
    a, b, c, d = (np.asarray(v, np.float64) for v in (num_a, den_a, num_b, den_b))
    n = len(a)
    A, B, C, D = a.sum(), b.sum(), c.sum(), d.sum()
    if not (B > 0 and D > 0):
        return float("nan"), float("inf"), float("inf")
    ra, rb = A / B, C / D
    if n < 2:
        return float(ra - rb), float("inf"), float("inf")
    z = (a - ra * b) / B - (c - rb * d) / D
    se = math.sqrt(n / (n - 1) * float((z ** 2).sum()))
    return float(ra - rb), se, se * t_quantile_975(n - 1)


def position_quantities(target_logits: np.ndarray, draft_logits: np.ndarray | None, sampling: SamplingParams):
    """Per position of a teacher-forced record: the target's processed probabilities p [T, V] (float64) and,
    with a draft, (argmax q_t, p_t(argmax q_t), sum_v min(p_t, q_t)) [T] each (else None)."""
    kw = sampling.as_dict()
    p = probabilities(target_logits, **kw)
    if draft_logits is None:
        return p, None
    q = probabilities(draft_logits, **kw)
    top = np.argmax(draft_logits, axis=-1)  # lowest index on ties, as every greedy choice in fastspec
    p_argmax = p[np.arange(p.shape[0]), top]
    alpha = np.minimum(p, q).sum(axis=-1)
    return p, (top, p_argmax, np.minimum(alpha, 1.0))


@dataclass
class RowComparison:
    """One (draft, k): vLLM's counters against fastspec's exact prediction under vLLM's conventions."""

    draft: str
    k: int
    method: str                      # vLLM's speculative method: draft_model or ngram
    draft_sample_method: str | None  # greedy (argmax, one-hot q) or probabilistic; None for ngram
    measured: dict                   # counters_summary of vLLM's per-prompt counters
    predicted: dict                  # counters_summary of the DP's per-prompt expectations
    difference: dict                 # measured - predicted mean acceptance length, paired by prompt
    tokens_per_s: float
    speedup: dict                    # over vLLM's plain decoding, 95% CI over prompts
    audit: dict | None = None
    verdict: str = ""


@dataclass
class EngineComparison:
    """What :func:`compare_vllm` returns; ``as_dict()`` is the JSON of ``fastspec measure --engine vllm``."""

    engine: str
    engine_version: str
    target: str
    sampling: SamplingParams
    max_new_tokens: int
    prompts: int
    plain_tokens_per_s: float
    rows: list
    plain_audit: dict | None = None
    warnings: list = field(default_factory=list)
    verdict: str = ""

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d["sampling"] = self.sampling.as_dict()
        d["rows"] = [dict(r.__dict__) for r in self.rows]
        return d


def _counters_of(c: Mapping, k: int) -> Counters:
    per_pos = list(c.get("num_accepted_tokens_per_pos") or [])
    return Counters(float(c.get("num_drafts", 0)), float(c.get("num_draft_tokens", 0)),
                    float(c.get("num_accepted_tokens", 0)), tuple(float(x) for x in (per_pos + [0] * k)[:k]))


def _keep(runs_dir: str | None, name: str, run) -> None:
    if runs_dir is None:
        return
    import json
    import os

    from ...io.files import atomic_write_text

    os.makedirs(runs_dir, exist_ok=True)
    atomic_write_text(os.path.join(runs_dir, name.replace("/", "_") + ".json"), json.dumps(dict(run.__dict__)))


def _row_verdict(row: RowComparison, audit_failed: bool) -> str:
    m, p = row.measured["mean_acceptance_length"], row.predicted["mean_acceptance_length"]
    diff, half = row.difference["estimate"], row.difference["ci95_half_width"]
    what = f"{row.draft} k = {row.k}: vLLM {m:.2f} tokens/step, predicted {p:.2f}"
    if not math.isfinite(half):
        s = f"{what} (too few prompts for an interval)"
    elif diff + half < 0:
        s = f"{what} -- vLLM's acceptance is BELOW the exact prediction (difference {diff:+.2f}, 95% interval " \
            f"{diff - half:+.2f} to {diff + half:+.2f})"
    elif diff - half > 0:
        s = f"{what} -- above the prediction (difference {diff:+.2f}, 95% interval {diff - half:+.2f} to " \
            f"{diff + half:+.2f})"
    else:
        s = f"{what} -- agrees (difference {diff:+.2f}, 95% interval {diff - half:+.2f} to {diff + half:+.2f})"
    if audit_failed:
        s += "; its output FAILS the audit: the tokens do not follow the target's distribution"
    return s


def compare_vllm(target: str, drafts: Sequence[EngineDraft], prompts: Sequence[Sequence[int]], ks: Sequence[int], *,
                 sampling: SamplingParams, seed: int, max_new_tokens: int, python: str,
                 draft_sample_method: str = "greedy", teacher: Callable | None = None,
                 audit: Callable | None = None, progress: Callable[[str], None] | None = None,
                 timeout_s: float = 3600.0, max_model_len: int | None = None,
                 runs_dir: str | None = None) -> EngineComparison:
    """Run and compare (module docstring).  ``teacher(model_path, prompt_ids, continuation)`` returns the
    teacher-forced logits [len(continuation), V] (default: :func:`fastspec.hf.teacher.teacher_forced_logits`
    with the model loaded once per path).  ``runs_dir``: each engine run's outputs and counters are also written
    there as JSON (``plain.json``, ``<draft>_k<k>.json``), for an audit later."""
    from ...hf.prediction import speedup_ci

    if not prompts:
        raise InvalidInput("prompts is empty: give at least two prompts (the intervals are over prompts)")
    ks = sorted({int(k) for k in ks})
    kmax = max(ks)
    say = progress or (lambda _msg: None)
    longest = max(len(p) for p in prompts)
    max_model_len = max_model_len or (longest + max_new_tokens + kmax + 8)
    common = dict(seed=seed, max_tokens=max_new_tokens, timeout_s=timeout_s, max_model_len=max_model_len)
    say("vllm: plain decoding (and the record the prediction reads)")
    plain = V.run(python, target, prompts, sampling, config="plain", record_tokens=max_new_tokens + kmax, **common)
    records = plain.record
    _keep(runs_dir, "plain", plain)
    for i, (out, rec) in enumerate(zip(plain.outputs, records, strict=True)):
        if rec[:len(out["token_ids"])] != out["token_ids"] and sampling.temperature == 0:
            raise InvalidInput(f"prompt {i}: vLLM's greedy continuation changed with the token budget; cannot "
                               "record a trajectory")
    warnings = []
    short = [i for i, r in enumerate(records) if len(r) < max_new_tokens + kmax]
    if short:
        raise InvalidInput(f"prompts {short[:5]}: vLLM stopped before {max_new_tokens + kmax} tokens; the "
                           "comparison needs fixed-length runs (ignore_eos) within max_model_len")

    # teacher-forced quantities along the record, per model
    if teacher is None:
        from ...hf.teacher import TeacherCache
        teacher = TeacherCache()
    say("fastspec: teacher-forcing the target and the drafts along vLLM's record")
    per_prompt_p = []
    tlog = [np.asarray(teacher(target, p, r), np.float64) for p, r in zip(prompts, records, strict=True)]
    model_q = {}
    for d in drafts:
        if d.kind == "model":
            model_q[d.name] = []
            for i, (p, r) in enumerate(zip(prompts, records, strict=True)):
                dl = np.asarray(teacher(d.path, p, r), np.float64)
                if dl.shape != tlog[i].shape:
                    raise InvalidInput(f"draft {d.name}: logits of shape {list(dl.shape)} against the target's "
                                       f"{list(tlog[i].shape)}: the models must share the vocabulary")
                model_q[d.name].append(position_quantities(tlog[i], dl, sampling)[1])
    for lg in tlog:
        per_prompt_p.append(position_quantities(lg, None, sampling)[0])
    greedy = sampling.temperature == 0

    def accept_fn(d: EngineDraft, k: int, i: int):
        rec = np.asarray(records[i], np.int64)
        p = per_prompt_p[i]
        if d.kind == "model":
            top, p_argmax, alpha = model_q[d.name][i]
            if greedy:  # the draft's argmax against the record (vLLM's own greedy tokens)
                a = (top == rec).astype(np.float64)
            else:
                a = p_argmax if draft_sample_method == "greedy" else alpha
            return lambda s: a[s:s + k]
        from ...ngram import proposals_along

        ctx = np.concatenate([np.asarray(prompts[i], np.int64), rec])
        props = proposals_along(ctx, len(prompts[i]), k, min_n=d.min_n, max_n=d.max_n, occurrence="earliest")

        def f(s):
            n = int(props.num_draft[s])
            x = props.draft_tokens[s, :n]
            pos = np.arange(s, s + n)
            if greedy:
                return (x == rec[pos]).astype(np.float64)
            return p[pos, x]
        return f

    base_tokens = [len(o["token_ids"]) for o in plain.outputs]
    plain_tps = sum(base_tokens) / sum(plain.wall_s)
    plain_audit = audit("plain", plain.outputs) if audit else None
    rows = []
    for d in drafts:
        for k in ks:
            name = f"{d.name} k={k}"
            spec = V.speculative_config("ngram" if d.kind == "ngram" else d.path, k,
                                        min_n=d.min_n if d.kind == "ngram" else None,
                                        max_n=d.max_n if d.kind == "ngram" else None,
                                        draft_sample_method=draft_sample_method)
            say(f"vllm: {name}")
            run = V.run(python, target, prompts, sampling, config=name, spec=spec, **common)
            _keep(runs_dir, f"{d.name}_k{k}", run)
            measured = [_counters_of(c, k) for c in run.counters]
            predicted = [expected_counters(accept_fn(d, k, i), max_new_tokens, k, first_step=VLLM.first_step)
                         for i in range(len(prompts))]
            ms, ps = counters_summary(measured, k), counters_summary(predicted, k)
            diff, se, half = paired_ratio_difference(
                [c.num_drafts + c.num_accepted_tokens for c in measured], [c.num_drafts for c in measured],
                [c.num_drafts + c.num_accepted_tokens for c in predicted], [c.num_drafts for c in predicted])
            toks = [len(o["token_ids"]) for o in run.outputs]
            s_est, s_se, s_half = speedup_ci(toks, run.wall_s, base_tokens, plain.wall_s)
            res_audit = audit(name, run.outputs) if audit else None
            row = RowComparison(
                d.name, k, spec["method"], draft_sample_method if d.kind == "model" else None, ms, ps,
                {"estimate": diff, "standard_error": se, "ci95_half_width": half},
                sum(toks) / sum(run.wall_s),
                {"estimate": s_est, "ci95": [s_est - s_half, s_est + s_half] if math.isfinite(s_half) else None},
                res_audit.as_dict() if res_audit is not None else None)
            row.verdict = _row_verdict(row, res_audit is not None and not res_audit.passed)
            rows.append(row)
    below = [r for r in rows if r.difference["estimate"] + r.difference["ci95_half_width"] < 0]
    failed = [r for r in rows if r.audit is not None and not r.audit.get("passed", True)]
    if plain_audit is not None and not plain_audit.passed:
        warnings.append("vLLM's plain decoding itself fails the audit: the teacher-forced target (float32 torch) "
                        "and vLLM disagree beyond numerics, so the audits of the speculative runs say little")
    parts = []
    if below:
        parts.append("vLLM's acceptance is below fastspec's exact prediction for " +
                     ", ".join(f"{r.draft} k = {r.k}" for r in below))
    if failed:
        parts.append("the output of " + ", ".join(f"{r.draft} k = {r.k}" for r in failed) +
                     " does not follow the target's distribution (audit failed)")
    verdict = ("; ".join(parts) + ".") if parts else (
        "vLLM's counters agree with fastspec's exact prediction" +
        (" and every output passes the audit." if audit else "."))
    return EngineComparison("vllm", plain.vllm_version, target, sampling, max_new_tokens, len(prompts),
                            plain_tps, rows, plain_audit.as_dict() if plain_audit is not None else None, warnings,
                            verdict)

"""The schedule of a finite batch run, replayed: what a few prompts at concurrency B really put in each engine step.

:func:`fastspec.simulation.batch.batch_predictions` assumes the batch is always full (B sequences in flight).  A
measured run of N prompts at concurrency B is not: the driver of ``benchmarks/vllm_batch/driver.py`` starts B
requests, replaces each finished one by the next prompt, and once the prompts run out the batch drains.  With
speculation the requests finish at different steps, so at B = N the run is one static batch whose last steps
carry few sequences.  At T = 0 every request's trajectory is deterministic, so the schedule can be replayed
exactly:

* :func:`request_tokens`: per prompt, the new tokens of each of its decode steps under vLLM's n-gram speculation
  along the recorded greedy continuation (the prefill step emits the first token; a step at s proposes d tokens
  from prompt + record[:s] with vLLM's rule -- 1 + d new tokens in the forward -- accepts the leading drafts
  equal to the record and emits them plus one token); plain decoding: one token per step;
* :func:`replay_schedule`: the requests in flight and their new tokens at every decode step (each request's first
  step is its prefill, priced apart) for a concurrency B and the driver's refill order;
* :func:`schedule_wall`: the predicted wall time: the measured prefill wall plus, per decode step, the table's
  ``target(B, n)`` at the sequences in flight and their mean new tokens n (linear in n and in B between the
  table's entries: an approximation) plus ``overhead(B, k)`` (``overhead(B, 0)`` when nobody drafted).  Unlike
  :class:`fastspec.costs.StepCost` at batch B, which prices every n-gram step as a full k-draft step at a full
  batch, this prices what vLLM schedules (:meth:`~fastspec.costs.StepCost.scheduled_step_s`).
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from fastspec.costs.step import StepCost
from fastspec.errors import InvalidInput

__all__ = ["request_tokens", "request_steps", "replay_schedule", "step_price", "schedule_wall",
           "schedule_predictions", "schedule_table"]


def request_tokens(prompts: Sequence[Sequence[int]], records: Sequence[Sequence[int]], *, k: int, min_n: int,
                   max_n: int, max_tokens: int) -> list[list[int]]:
    """Per prompt, the new tokens each of its decode steps puts into the batch forward under vLLM's n-gram
    speculation at T = 0 along ``records`` (at least ``max_tokens`` tokens each): 1 + the d drafts of the step
    (d = 0 when the lookup finds nothing), for the steps from position 1 while fewer than ``max_tokens`` tokens
    exist (the prefill step, which emits the first token, is not listed)."""
    from fastspec.ngram import proposals_along

    out = []
    for i, (p, r) in enumerate(zip(prompts, records, strict=True)):
        rec = np.asarray(r, np.int64)
        if len(rec) < max_tokens:
            raise InvalidInput(f"records[{i}] holds {len(rec)} tokens; give at least max_tokens = {max_tokens}")
        ctx = np.concatenate([np.asarray(p, np.int64), rec])
        props = proposals_along(ctx, len(p), k, min_n=min_n, max_n=max_n, occurrence="earliest")
        s, steps = 1, []
        while s < max_tokens:
            n = int(props.num_draft[s])
            a = 0
            while a < n and s + a < len(rec) and int(props.draft_tokens[s, a]) == int(rec[s + a]):
                a += 1
            steps.append(1 + n)
            s += a + 1
        out.append(steps)
    return out


def request_steps(prompts, records, *, k: int, min_n: int, max_n: int, max_tokens: int) -> list[int]:
    """Engine steps per request, its prefill step included (:func:`request_tokens` + 1)."""
    return [1 + len(t) for t in request_tokens(prompts, records, k=k, min_n=min_n, max_n=max_n,
                                               max_tokens=max_tokens)]


def replay_schedule(requests: Sequence[Sequence[int]], concurrency: int) -> list[tuple[int, int]]:
    """(requests in flight, their new tokens) at each decode step when ``requests`` (each the new tokens of its
    decode steps, :func:`request_tokens`) run at most ``concurrency`` at a time, in order, a finished request
    replaced at once by the next, which starts decoding after its prefill (priced apart)."""
    if concurrency < 1:
        raise InvalidInput(f"concurrency = {concurrency}: give at least 1")
    todo = [list(r) for r in requests][::-1]
    live: list[list[int]] = []
    out = []
    while todo and len(live) < concurrency:
        live.append(todo.pop())
    while live:
        active = [r for r in live if r]
        if active:
            out.append((len(active), sum(r[0] for r in active)))
        live = [r[1:] for r in live if len(r) > 1]
        while todo and len(live) < concurrency:
            live.append(todo.pop())
    return out


def step_price(table: Mapping, n_active: int, tokens: int, k: int) -> float:
    """Seconds of one step with ``n_active`` sequences and ``tokens`` new tokens in all: ``target(B, n)`` at
    n = tokens / n_active, linear in n between the table's integer n and in B between its batch sizes (the end
    value beyond the range), plus the overhead at B for k drafts when any sequence drafted (else for 0)."""
    return StepCost.scheduled_step_s(table, n_active, tokens, k)


def schedule_wall(table: Mapping, requests: Sequence[Sequence[int]], concurrency: int, *, k: int,
                  prefill_s: float) -> float:
    """Predicted wall seconds of the run: ``prefill_s`` + the replayed decode steps, each priced by
    :func:`step_price` (plain decoding: every request's steps are 1-token steps)."""
    return prefill_s + sum(step_price(table, b, t, k) for b, t in replay_schedule(requests, concurrency))


def schedule_predictions(measured: Mapping, prompts: Sequence[Sequence[int]]) -> dict:
    """Schedule-aware predictions of a measured run (:meth:`.driver.VllmBatchResult.as_dict`
    with its ``records``, ``prefill_s`` and ``cost_table``; ``prompts`` the token ids it ran): per batch size the
    predicted tokens/s of plain and n-gram decoding and the speed-up, next to the measured ones, relative errors
    (predicted / measured - 1), and the break-even batch size of both (the rule of
    :func:`fastspec.costs.batch.break_even`)."""
    from fastspec.costs.batch import break_even

    n_req, m_tok, k = int(measured["prompts"]), int(measured["max_tokens"]), int(measured["k"])
    lo, hi = measured["prompt_lookup"]
    if len(prompts) != n_req:
        raise InvalidInput(f"prompts holds {len(prompts)} prompts; the run had {n_req}")
    spec_req = request_tokens(prompts, measured["records"], k=k, min_n=lo, max_n=hi, max_tokens=m_tok)
    plain_req = [[1] * (m_tok - 1)] * n_req
    table, total = measured["cost_table"], n_req * m_tok
    rows, m_pts, p_pts = [], [], []
    for b in measured["batches"]:
        w1 = (measured.get("prefill_s") or {}).get(str(b))
        if w1 is None:
            raise InvalidInput(f"the run has no measured prefill wall at B = {b} (prefill_s)")
        pp = total / schedule_wall(table, plain_req, b, k=k, prefill_s=w1)
        ps = total / schedule_wall(table, spec_req, b, k=k, prefill_s=w1)
        mp = measured["throughput"]["plain"][str(b)]["tokens_per_s"]
        ms = measured["throughput"]["spec"][str(b)]["tokens_per_s"]
        busy = replay_schedule(spec_req, b)
        rows.append({"batch": b, "plain_measured": mp, "plain_predicted": pp, "plain_rel_error": pp / mp - 1,
                     "spec_measured": ms, "spec_predicted": ps, "spec_rel_error": ps / ms - 1,
                     "speedup_measured": ms / mp, "speedup_predicted": ps / pp,
                     "speedup_rel_error": (ps / pp) / (ms / mp) - 1,
                     "spec_mean_in_flight": sum(x for x, _ in busy) / len(busy) if busy else 0.0})
        m_pts.append((b, ms / mp))
        p_pts.append((b, ps / pp))
    m_be, p_be = break_even(m_pts), break_even(p_pts)
    same = all(m_be[key] == p_be[key] for key in ("status", "pays_up_to", "stops_at"))
    return {"rows": rows, "break_even": {"measured": m_be, "predicted": p_be}, "break_even_matches": same,
            "steps_per_request": [1 + len(r) for r in spec_req]}


def schedule_table(pred: Mapping) -> str:
    """:func:`schedule_predictions` as a Markdown table and a break-even line."""
    lines = ["| B | plain tok/s measured / predicted (err) | ngram tok/s measured / predicted (err) | speed-up "
             "measured / predicted (err) | ngram: mean in flight |", "|---|---|---|---|---|"]
    for r in pred["rows"]:
        lines.append(f"| {r['batch']} | {r['plain_measured']:.1f} / {r['plain_predicted']:.1f} "
                     f"({r['plain_rel_error']:+.0%}) | {r['spec_measured']:.1f} / {r['spec_predicted']:.1f} "
                     f"({r['spec_rel_error']:+.0%}) | {r['speedup_measured']:.2f} / {r['speedup_predicted']:.2f} "
                     f"({r['speedup_rel_error']:+.0%}) | {r['spec_mean_in_flight']:.1f} |")
    lines += ["", break_even_line(pred["break_even"], pred["break_even_matches"])]
    return "\n".join(lines)


def say_break_even(x: Mapping) -> str:
    """One :func:`fastspec.costs.batch.break_even` result in words."""
    if x["status"] == "stops paying":
        return f"pays up to B = {x['pays_up_to']}, not at B = {x['stops_at']} (1.0 near B = {x['estimate']:.1f})"
    return x["status"]


def break_even_line(be: Mapping, matches: bool) -> str:
    """``break-even: measured ...; predicted ... -- matches`` from the measured and predicted break-evens."""
    say = say_break_even
    return (f"break-even: measured {say(be['measured'])}; predicted {say(be['predicted'])} -- "
            + ("matches" if matches else "does NOT match"))

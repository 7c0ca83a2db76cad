"""What-if analysis of draft models from logit dumps: Monte-Carlo and exact.

:func:`simulate` answers "how many tokens per verify step, and how much faster,
would this draft give this target under this sampling config?" offline.

Method (trajectory replay).  The dump records, for each sequence, the target's
and each draft's distribution at every position of one sampled trajectory.
fastspec computes the per-position acceptance rate alpha_t = sum_v min(p_t, q_t)
after applying the requested sampling config to both models
(:func:`fastspec.acceptance.dump_acceptance`) and replays speculative decoding
along the recorded contexts:

* ``mode="bernoulli"`` (default): each drafted position t is accepted with
  probability alpha_t (a counter-based uniform per (seed, sequence, trial,
  position)).  Fast: hundreds of millions of draft positions per second.
* ``mode="token"``: real tokens through fastspec's own verifier -- draft tokens
  sampled from q_t, acceptance and recovered/bonus sampling by
  :func:`fastspec.verify_logits` -- so the shipped kernel is exercised on the
  user's distributions.  Its acceptance frequency over judged positions is
  compared with the alpha_t of those positions (``token_check``).

Both are compared with the exact expectation of the same process
(:func:`fastspec.acceptance.expected_tokens_per_step`, dynamic programming).
End of sequence: a step at t drafts ``min(k, L - 1 - t)`` tokens; a step that
would draft nothing is a plain target step and is not counted.

Uncertainty.  ``ci95`` is a batch-means interval for the Monte-Carlo estimate:
the trials are split into ``batches`` independent groups, each replaying every
sequence; the interval is the ratio-of-totals estimate +- t_{0.975, batches-1}
times the standard error of the batch estimates.  It is Monte-Carlo
uncertainty *given the recorded trajectories*, not uncertainty over prompts.
The MC estimate and the exact value are flagged as disagreeing when they are
more than 4 standard errors apart (false-alarm rate about 6e-5 for a correct
implementation): that means a bug or too few trials.

Sparse dumps.  Only an interval [lower_t, upper_t] containing alpha_t is
known.  The exact mean acceptance length is non-decreasing in every alpha_t, so
the DP evaluated at the lower and upper ends bounds the true value.  Proof
sketch (one coin u_t per position, accept iff u_t <= alpha_t, so raising alpha
only turns failures into successes): the next start ``nxt(t) = t + 1 +
min(run(t), d(t))`` (run = consecutive successes from t, d(t) = min(k, L-1-t))
is non-decreasing in t and in the success set, so after every m steps the
position with more successes is at least as far; hence it needs no more verify
steps S, and the emitted tokens A + S lie in {L-1, L} with A + S = L-1 only
when it also saved a step.  With E[A+S] >= E[S], (E[A+S] - q)/(E[S] - q) >=
E[A+S]/E[S] for the saved mass q, per sequence and for the ratio of totals.
(The draft acceptance rate has no such guarantee and is not bounded.)

Assumptions to keep in mind: contexts follow the recorded sequences (when the
requested sampling config differs from the one the trajectories were sampled
with, the recorded contexts do not follow the serving distribution -- a
warning says so); this is an offline estimate, not a deployment measurement.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from . import _rng
from ._replay import bernoulli_replay, step_seeds, draft_uniforms
from .acceptance import alpha_summary, dump_acceptance, expected_tokens_per_step

__all__ = ["VerifyCost", "CostModel", "parse_k_list", "DraftKResult", "SimulationResult", "simulate",
           "batch_means_ci", "MODES", "AGREEMENT_Z"]

MODES = ("bernoulli", "token")
AGREEMENT_Z = 4.0  # |MC - exact| / se above this is reported as a disagreement


# ----------------------------------------------------------------------------------------- cost model

@dataclass(frozen=True)
class VerifyCost:
    """The target's verify-step cost as a function of k, relative to one target forward.

    Either linear ``const + slope * k`` or a table ``{k: cost}`` of measured per-k times.
    """

    const: float = 1.0
    slope: float = 0.0
    table: Mapping[int, float] | None = None

    def __call__(self, k: int) -> float:
        if self.table is not None:
            if k not in self.table:
                raise ValueError(f"verify-cost table has no entry for k = {k}; it covers k = "
                                 f"{', '.join(map(str, sorted(self.table)))}")
            return float(self.table[k])
        return self.const + self.slope * k

    def describe(self) -> str:
        if self.table is not None:
            return "table " + json.dumps({str(k): v for k, v in sorted(self.table.items())})
        return f"{self.const:g} + {self.slope:g}*k" if self.slope else f"{self.const:g}"

    @classmethod
    def parse(cls, spec) -> "VerifyCost":
        """``None``/number -> constant; ``"1+0.05k"`` (also ``1 + 0.05*k``, ``0.05k+1``) -> linear;
        a mapping, a JSON object string or a path to a ``.json`` file ``{"1": 1.02, "4": 1.10}`` -> table."""
        if spec is None:
            return cls()
        if isinstance(spec, Mapping):
            return cls(table=_parse_table(spec, "verify_cost"))
        if isinstance(spec, (int, float)) and not isinstance(spec, bool):
            return cls(const=_positive(float(spec), "verify_cost"))
        if not isinstance(spec, str):
            raise TypeError(f"verify_cost must be a number, a 'a+b*k' string, a mapping or a JSON path, "
                            f"got {type(spec).__name__}")
        text = spec.strip()
        if text.startswith("{"):
            try:
                return cls(table=_parse_table(json.loads(text), "verify_cost"))
            except json.JSONDecodeError as exc:
                raise ValueError(f"verify_cost: invalid JSON table ({exc.msg})") from None
        if text.endswith(".json") or os.path.sep in text:
            if not os.path.isfile(text):
                raise ValueError(f"verify_cost: no such file {text!r}")
            with open(text) as fh:
                try:
                    return cls(table=_parse_table(json.load(fh), f"verify_cost ({text})"))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"verify_cost: {text} is not valid JSON ({exc.msg})") from None
        const, slope = 0.0, 0.0
        compact = text.replace(" ", "").replace("*", "")
        if not compact or not re.fullmatch(r"[0-9eE.+\-k]+", compact):
            raise ValueError(f"verify_cost {spec!r} is not understood; write e.g. 1, 1+0.05k or a JSON table")
        for term in re.findall(r"[+\-]?[^+\-]+(?:[eE][+\-]?[0-9]+)?", compact):
            try:
                if term.endswith("k"):
                    coef = term[:-1]
                    slope += float(coef + "1" if coef in ("", "+", "-") else coef)
                else:
                    const += float(term)
            except ValueError:
                raise ValueError(f"verify_cost {spec!r}: cannot read the term {term!r}; write e.g. 1+0.05k") from None
        if not (math.isfinite(const) and math.isfinite(slope)):
            raise ValueError(f"verify_cost {spec!r} must be finite")
        return cls(const=const, slope=slope)


def _positive(v: float, name: str) -> float:
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{name} = {v!r} must be a finite number > 0")
    return v


def _parse_table(obj, name: str) -> dict[int, float]:
    if not isinstance(obj, Mapping) or not obj:
        raise ValueError(f"{name}: a table must be a non-empty JSON object {{\"k\": cost, ...}}")
    out = {}
    for key, val in obj.items():
        try:
            k = int(key)
        except (TypeError, ValueError):
            raise ValueError(f"{name}: key {key!r} is not an integer k") from None
        if k < 1:
            raise ValueError(f"{name}: key {key!r}: k must be >= 1")
        if isinstance(val, bool) or not isinstance(val, (int, float)):
            raise ValueError(f"{name}[{key!r}] = {val!r} is not a number")
        out[k] = _positive(float(val), f"{name}[{key!r}]")
    return out


@dataclass(frozen=True)
class CostModel:
    """Cost of one verify step with k drafts, in units of one target forward: ``k * draft_cost + verify(k)``."""

    draft_cost: float = 0.0
    verify: VerifyCost = field(default_factory=VerifyCost)

    def step_cost(self, k: int) -> float:
        cost = k * self.draft_cost + self.verify(k)
        if not cost > 0:
            raise ValueError(f"the cost model gives a step cost of {cost!r} at k = {k}; it must be > 0")
        return cost

    def speedup(self, tokens_per_step: float, k: int) -> float:
        """Tokens per unit of target-forward time, relative to plain decoding (1 token per target forward)."""
        return tokens_per_step / self.step_cost(k)


def parse_k_list(spec) -> list[int]:
    """``4`` / ``"4"`` / ``"1,2,4,8"`` / ``"1-8"`` (and mixtures ``"1-3,8"``) -> sorted unique ks >= 1."""
    if isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
        items = [int(spec)]
    elif isinstance(spec, str):
        items = []
        for part in spec.split(","):
            part = part.strip()
            m = re.fullmatch(r"(-?\d+)\s*-\s*(-?\d+)", part)
            try:
                if m:
                    lo, hi = int(m.group(1)), int(m.group(2))
                    if hi < lo:
                        raise ValueError(f"k range {part!r} is empty; write low-high, e.g. 1-8")
                    items.extend(range(lo, hi + 1))
                else:
                    items.append(int(part))
            except ValueError as exc:
                if "range" in str(exc):
                    raise
                raise ValueError(f"k {part!r} is not an integer; write e.g. 4, 1,2,4,8 or 1-8") from None
    elif isinstance(spec, Sequence):
        items = []
        for v in spec:
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise TypeError(f"k values must be integers, got {v!r}")
            items.append(int(v))
    else:
        raise TypeError(f"k must be an integer, a list of integers or a string like '1-8', got {type(spec).__name__}")
    if not items:
        raise ValueError("k is empty; give at least one draft length, e.g. 4")
    bad = [v for v in items if v < 1]
    if bad:
        raise ValueError(f"k = {bad[0]} is invalid: the draft length must be >= 1")
    if max(items) > 256:
        raise ValueError(f"k = {max(items)} is too large (at most 256 drafted tokens per step)")
    return sorted(set(items))


# ----------------------------------------------------------------------------------------- statistics

def _t_quantile_975(df: int) -> float:
    """Student-t 0.975 quantile (Cornish-Fisher expansion; error < 1e-3 for df >= 3)."""
    z = 1.959963984540054
    if df <= 0:
        return float("inf")
    table = {1: 12.7062, 2: 4.3027, 3: 3.1824, 4: 2.7764, 5: 2.5706}
    if df in table:
        return table[df]
    g1 = (z ** 3 + z) / 4
    g2 = (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96
    g3 = (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384
    return z + g1 / df + g2 / df ** 2 + g3 / df ** 3


def batch_means_ci(numerators: np.ndarray, denominators: np.ndarray, *, empty: float = float("nan")
                   ) -> tuple[float, float, float]:
    """(estimate, standard error, ci95 half-width) of sum(num)/sum(den) from independent batches.

    ``empty`` is the estimate when every denominator is 0 (e.g. 1 token per step when nothing was drafted);
    it is then exact (standard error 0)."""
    num = np.asarray(numerators, dtype=np.float64)
    den = np.asarray(denominators, dtype=np.float64)
    total = den.sum()
    if not total > 0:
        return float(empty), 0.0, 0.0
    est = num.sum() / total
    ok = den > 0
    nb = int(ok.sum())
    if nb < 2:
        return est, float("inf"), float("inf")
    r = num[ok] / den[ok]
    se = float(r.std(ddof=1) / math.sqrt(nb))
    return est, se, se * _t_quantile_975(nb - 1)


# ----------------------------------------------------------------------------------------- results

@dataclass
class DraftKResult:
    """Figures for one (draft, k).  JSON names (see :meth:`as_dict`) are stable."""

    draft: str
    k: int
    alpha: float | None
    mean_acceptance_length: float | None
    ci95: tuple[float, float] | None
    mean_acceptance_length_exact: float | None
    draft_acceptance_rate: float | None
    per_position_acceptance: list[float] | None
    accepted_length_histogram: list[float] | None
    speedup: float | None
    standard_error: float | None = None
    mc_vs_exact_z: float | None = None
    mc_agrees_with_exact: bool | None = None
    draft_acceptance_rate_exact: float | None = None
    per_position_acceptance_exact: list[float] | None = None
    alpha_lower: float | None = None
    alpha_upper: float | None = None
    mean_acceptance_length_lower: float | None = None
    mean_acceptance_length_upper: float | None = None
    speedup_lower: float | None = None
    speedup_upper: float | None = None
    speedup_closed_form: float | None = None
    mean_acceptance_length_closed_form: float | None = None
    verify_steps: int | None = None
    token_check: dict | None = None
    verify: str = "token"
    candidates: int = 1
    candidate_sampling: str | None = None
    exact_reason: str | None = None
    mc_method: str | None = None

    def as_dict(self) -> dict:
        d = {f: getattr(self, f) for f in self.__dataclass_fields__}
        d["ci95"] = list(self.ci95) if self.ci95 is not None else None
        return d


@dataclass
class SimulationResult:
    """What :func:`simulate` computed; ``as_dict()`` is the CLI's ``--json`` object."""

    dump: str
    config: dict
    results: list[DraftKResult]
    best: dict[str, int | None]
    warnings: list[str]
    alpha_summary: dict[str, dict]
    assumptions: list[str]

    def as_dict(self) -> dict:
        return {"dump": self.dump, "config": self.config, "results": [r.as_dict() for r in self.results],
                "best": self.best, "warnings": self.warnings, "alpha_summary": self.alpha_summary,
                "assumptions": self.assumptions}

    @property
    def disagreements(self) -> list[DraftKResult]:
        """Rows whose Monte-Carlo estimate is inconsistent with the exact expectation (or token check)."""
        bad = []
        for r in self.results:
            if r.mc_agrees_with_exact is False or (r.token_check is not None and not r.token_check["passed"]):
                bad.append(r)
        return bad


ASSUMPTIONS = [
    "trajectory replay: contexts follow the recorded sequences, whatever was accepted",
    "offline estimate from recorded distributions, not a deployment measurement",
    "end of sequence: a step at position t drafts min(k, L-1-t) tokens; the last token alone is a plain "
    "target step and is not counted",
    "ci95: batch means over independent groups of trials (Monte-Carlo uncertainty given the recorded "
    "trajectories, not uncertainty over prompts)",
    "speedup = tokens per verify step / (k * draft_cost + verify_cost(k)), costs relative to one target forward",
]


def _sampling_warnings(md: Mapping, t, top_k, top_p, min_p) -> list[str]:
    out = []
    if "temperature" not in md:
        out.append("the dump does not record the sampling config its trajectories were sampled with "
                   "(metadata 'temperature' missing): the replayed contexts may not follow the serving distribution")
        return out
    rec = {"temperature": float(md.get("temperature", 1.0)), "top_k": int(md.get("top_k", 0)),
           "top_p": float(md.get("top_p", 1.0)), "min_p": float(md.get("min_p", 0.0))}
    req = {"temperature": float(t), "top_k": int(top_k), "top_p": float(top_p), "min_p": float(min_p)}
    diff = [f"{k} {req[k]:g} (recorded {rec[k]:g})" for k in rec if req[k] != rec[k]]
    if diff:
        out.append("the requested sampling config differs from the one the dump's trajectories were sampled with: "
                   + ", ".join(diff) + ". The recorded contexts then do not follow the serving distribution; on a "
                   "real pair (SmolLM2-135M-Instruct, 4-bit draft) replaying T=1 trajectories at T=0.7 was "
                   "reported to under-predict a real speculative loop by up to 8%, and at greedy by up to 13% "
                   "(a measurement quoted in fastspec's issue #5, not reproduced in this repository)")
    return out


# ----------------------------------------------------------------------------------------- replays

def _bernoulli(alpha, lengths, row_ids, k, trials, batches, seed, *, max_bytes=32 << 20):
    """Bernoulli replay in blocks of rows, so scratch counters stay under ``max_bytes`` whatever N and k.
    Blocks do not change results: every uniform is keyed by the row's global id."""
    N = alpha.shape[0]
    alpha = np.ascontiguousarray(alpha, dtype=np.float64)
    rows = int(max(1, min(N, max_bytes // (8 * batches * (2 * k + 1) + 1))))
    out = {key: np.zeros(batches, np.int64) for key in ("tokens", "steps", "drafted", "accepted")}
    hist_tot = np.zeros(k + 1, np.int64)
    pos_tot = np.zeros(k, np.int64)
    for s in range(0, N, rows):
        e = min(N, s + rows)
        R = e - s
        z2 = lambda: np.zeros((R, batches), np.int64)  # noqa: E731
        tokens, steps, drafted, accepted = z2(), z2(), z2(), z2()
        hist = np.zeros((R, batches, k + 1), np.int64)
        pos_d = np.zeros((R, batches, k), np.int64)
        pos_a = np.zeros((R, batches, k), np.int64)
        bernoulli_replay(alpha[s:e], lengths[s:e], row_ids[s:e], k, trials, batches, int(seed), tokens, steps,
                         drafted, accepted, hist, pos_d, pos_a)
        for key, arr in (("tokens", tokens), ("steps", steps), ("drafted", drafted), ("accepted", accepted)):
            out[key] += arr.sum(0)
        hist_tot += hist.sum((0, 1))
        pos_tot += pos_a.sum((0, 1))
    return dict(**out, hist=hist_tot, pos_accepted=pos_tot, judged=None, judged_alpha=None)


def _sample_draft_tokens(draft_rows, u, temperature, top_k, top_p, min_p):
    """x ~ q for each row of draft_rows [R, V] using uniforms u [R] (inverse CDF on the processed q)."""
    from ._process import probabilities

    q = probabilities(draft_rows, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    cum = np.cumsum(q, axis=-1)
    target = u * cum[:, -1]
    idx = (cum < target[:, None]).sum(axis=-1)
    # never a zero-probability token: fall back to the last positive one
    last_pos = q.shape[1] - 1 - np.argmax(q[:, ::-1] > 0, axis=1)
    idx = np.minimum(idx, last_pos)
    zero = q[np.arange(len(idx)), idx] <= 0
    if zero.any():  # u*total landed exactly on a boundary before a zero-weight token
        for i in np.flatnonzero(zero):
            idx[i] = np.flatnonzero(q[i] > 0)[np.searchsorted(np.flatnonzero(q[i] > 0), idx[i]) - 1]
    return idx.astype(np.int64)


def _iter_sequences(dump, draft, max_bytes=64 << 20):
    """Yield (n0, n1, target [m, T, V], draft [m, T, V]) for whole sequences, ``max_bytes`` per array."""
    infos = [dump.arrays[dump.array_name("target", "logits")], dump.arrays[dump.array_name(draft, "logits")]]
    row_bytes = max(np.dtype(i.dtype).itemsize for i in infos) * dump.V
    per_seq = dump.T * row_bytes
    m = max(1, max_bytes // per_seq)
    n0 = 0
    for ch in dump.iter_chunks(drafts=(draft,), max_bytes=m * per_seq):
        rows = ch.stop - ch.start
        n1 = n0 + rows // dump.T
        yield n0, n1, ch.target.reshape(n1 - n0, dump.T, -1), ch.drafts[draft].reshape(n1 - n0, dump.T, -1)
        n0 = n1


def _token_replay(dump, draft, alpha, k, trials, batches, seed, params, progress=None, max_rows=64,
                  method="token"):
    """Replay with real tokens through fastspec.verify_logits, in lockstep batches of (sequence, trial)."""
    from .verify import verify_logits

    t, top_k, top_p, min_p = params
    row_offset = int(getattr(dump, "row_offset", 0))
    lengths = dump.lengths
    tokens = np.zeros(batches, np.int64)
    steps = np.zeros(batches, np.int64)
    drafted = np.zeros(batches, np.int64)
    accepted_tot = np.zeros(batches, np.int64)
    hist = np.zeros(k + 1, np.int64)
    pos_a = np.zeros(k, np.int64)
    judged = 0
    judged_alpha = 0.0
    judged_var = 0.0
    judged_accepted = 0
    for n0, n1, tgt, drf in _iter_sequences(dump, draft):
        m = n1 - n0
        # every (sequence, trial) replay of this chunk advances in lockstep, one verify call per group
        seq = np.repeat(np.arange(m), trials)
        trial = np.tile(np.arange(trials), m).astype(np.int64)
        L = lengths[n0 + seq].astype(np.int64)
        gid = (row_offset + n0 + seq).astype(np.int64)
        pos = np.zeros(m * trials, np.int64)
        while True:
            live = np.flatnonzero(pos < L)
            if not live.size:
                break
            kk_all = np.minimum(k, L[live] - 1 - pos[live])
            pos[live[kk_all <= 0]] += 1  # plain target step at the last position
            act, kk = live[kk_all > 0], kk_all[kk_all > 0]
            for s in range(0, act.size, max_rows):
                rows, kr = act[s:s + max_rows], kk[s:s + max_rows]
                kmax = int(kr.max())
                starts = pos[rows]
                offs = np.arange(kmax + 1)
                tpos = np.minimum(starts[:, None] + offs[None, :], L[rows, None] - 1)
                target_rows = tgt[seq[rows, None], tpos]  # [R, kmax+1, V]
                draft_rows = drf[seq[rows, None], tpos[:, :kmax]]  # [R, kmax, V]
                if method == "block":  # fresh drafts every step (see fastspec.block.step_draft_uniforms)
                    from .block import step_draft_uniforms

                    u = step_draft_uniforms(step_seeds(int(seed), gid[rows], trial[rows], starts), kmax)
                else:
                    u = draft_uniforms(int(seed), gid[rows], trial[rows], starts, kmax)
                x = _sample_draft_tokens(draft_rows.reshape(-1, draft_rows.shape[-1]), u.reshape(-1),
                                         t, top_k, top_p, min_p).reshape(len(rows), kmax)
                x = np.where(offs[None, :kmax] < kr[:, None], x, -1)
                seeds = step_seeds(int(seed), gid[rows], trial[rows], starts)
                res = verify_logits(target_rows, draft_rows, x, num_draft=kr, temperature=t, top_k=top_k,
                                    top_p=top_p, min_p=min_p, seed=seeds, method=method)
                acc = res.num_accepted
                b = trial[rows] % batches
                np.add.at(steps, b, 1)
                np.add.at(drafted, b, kr)
                np.add.at(accepted_tot, b, acc)
                np.add.at(tokens, b, acc + 1)
                np.add.at(hist, acc, 1)
                for j in range(kmax):
                    pos_a[j] += int((acc > j).sum())
                # judged positions: drafts 0..acc (the rejected one included) unless all were accepted
                nj = np.minimum(acc + 1, kr)
                judged_mask = offs[None, :kmax] < nj[:, None]
                a_seg = alpha[n0 + seq[rows, None], np.minimum(tpos[:, :kmax], alpha.shape[1] - 1)]
                a_seg = np.where(judged_mask, a_seg, 0.0)
                judged += int(nj.sum())
                judged_alpha += float(a_seg.sum())
                judged_var += float((a_seg * (1 - a_seg)).sum())
                judged_accepted += int(np.minimum(acc, nj).sum())
                pos[rows] += acc + 1
        if progress is not None:
            progress(m)
    check = None
    if judged and method == "token":  # block verification's acceptance is not alpha_t per position
        sd = math.sqrt(judged_var) if judged_var > 0 else 0.0
        z = (judged_accepted - judged_alpha) / sd if sd > 0 else (0.0 if judged_accepted == judged_alpha else math.inf)
        check = {"judged_positions": judged, "accepted": judged_accepted, "expected_accepted": judged_alpha,
                 "acceptance_frequency": judged_accepted / judged, "expected_frequency": judged_alpha / judged,
                 "z": z, "passed": bool(abs(z) <= AGREEMENT_Z)}
    return dict(tokens=tokens, steps=steps, drafted=drafted, accepted=accepted_tot, hist=hist,
                pos_accepted=pos_a, token_check=check)


# ----------------------------------------------------------------------------------------- simulate

def simulate(dump, *, k=4, drafts=None, temperature=None, top_k=None, top_p=None, min_p=None,
             mode: str = "bernoulli", trials: int | None = None, seed: int = 0, draft_cost=None,
             verify_cost=None, batches: int = 20, progress: Callable[[int], None] | None = None,
             progress_total: Callable[[int], None] | None = None, client=None, verify="token", candidates=1,
             candidate_sampling: str = "iid", block_trials: int | None = None) -> SimulationResult:
    """Simulate speculative decoding of each draft in ``dump`` against its target, for each k.

    ``dump``: a path or an open :class:`fastspec.io.Dump`.  ``k``: an int, a list, or ``"1-8"`` /
    ``"1,2,4"``.  Sampling flags default to the dump's recorded metadata (temperature 1 if none).
    ``mode``: "bernoulli" or "token" (module docstring).  ``trials``: replays per sequence (default 200 in
    Bernoulli mode, 4 in token mode), rounded up to a multiple of ``batches``.  ``draft_cost`` (c, one
    draft forward relative to one target forward) and ``verify_cost`` (see :meth:`VerifyCost.parse`)
    define the cost model; without either, ``speedup`` is None.  ``client``: a ``dask.distributed.Client``
    for the α pass when ``dump`` is a path (a directory of shards, :mod:`fastspec.shards`, is accepted with
    or without one).  Returns a :class:`SimulationResult`.
    """
    from .io import load_dump

    ks = parse_k_list(k)
    variants = _variants(verify, candidates, candidate_sampling)
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is unknown; choose one of: {', '.join(MODES)}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an integer, got {seed!r}")
    if not -(2 ** 63) <= int(seed) < 2 ** 63:
        raise ValueError(f"seed = {seed} does not fit in 64 bits; use an integer in [-2**63, 2**63)")
    if trials is None:
        trials = 200 if mode == "bernoulli" else 4
    if isinstance(trials, bool) or not isinstance(trials, (int, np.integer)) or not 2 <= trials <= 10 ** 7:
        raise ValueError(f"trials = {trials!r} is invalid: give an integer from 2 to 10**7 (replays per sequence)")
    if isinstance(batches, bool) or not isinstance(batches, (int, np.integer)) or batches < 2:
        raise ValueError(f"batches = {batches!r} must be an integer >= 2")
    batches = int(min(batches, trials))
    trials = int(-(-trials // batches) * batches)
    cost = None
    if draft_cost is not None or verify_cost is not None:
        c = 0.0 if draft_cost is None else float(draft_cost)
        if not (math.isfinite(c) and c >= 0):
            raise ValueError(f"draft_cost = {draft_cost!r} must be a finite number >= 0 (one draft forward "
                             "relative to one target forward)")
        cost = CostModel(c, VerifyCost.parse(verify_cost))
        for kk in ks:
            cost.step_cost(kk)  # table coverage and positivity, before any heavy work

    own = not hasattr(dump, "iter_chunks")
    if own and (client is not None or os.path.isdir(os.fspath(dump))):  # a directory of shards / a Dask client
        from .shards import load_any

        d = load_any(dump, client=client)
    else:
        d = load_dump(dump) if own else dump
    try:
        names = d.drafts if not drafts else tuple(drafts)
        for name in names:
            if name not in d.drafts:
                raise ValueError(f"{d.path}: no draft named {name!r}; the dump holds {', '.join(d.drafts)}")
        if mode == "token" and d.kind != "dense":
            raise ValueError(f"{d.path}: token mode needs dense logits; this dump is sparse top-k "
                             "(use --mode bernoulli, which reports alpha bounds)")
        if hasattr(d, "acceptance"):  # e.g. a sharded dump computing alpha on a cluster
            accs = d.acceptance(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, drafts=names)
        else:
            accs = dump_acceptance(d, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, drafts=names)
        from .acceptance import _resolve_params

        t, tk, tp, mp = _resolve_params(d, temperature, top_k, top_p, min_p)
        warnings = _sampling_warnings(d.metadata, t, tk, tp, mp)
        lengths = d.lengths.astype(np.int64)
        row_ids = np.arange(d.N, dtype=np.int64) + int(getattr(d, "row_offset", 0))
        config = {"k": ks, "drafts": list(names), "temperature": t, "top_k": tk, "top_p": tp, "min_p": mp,
                  "mode": mode, "trials": trials, "batches": batches, "seed": int(seed),
                  "draft_cost": cost.draft_cost if cost else None,
                  "verify_cost": cost.verify.describe() if cost else None,
                  "sequences": int(d.N), "positions": int(lengths.sum()), "vocab_size": d.V, "dump_kind": d.kind}
        extra = [v for v in variants if v != ("token", 1)]
        if extra:
            _check_variants_supported(d, extra)
            config["variants"] = [{"verify": v, "candidates": w} for v, w in variants]
            config["candidate_sampling"] = candidate_sampling
            config["block_trials"] = _block_trials(block_trials, batches) if ("block", 1) in variants else None
        if progress_total is not None:
            per = {"token": d.N if mode == "token" else 1, "block": d.N}
            progress_total(len(names) * len(ks) * sum(per["block"] if v == "block" else (per["token"] if w == 1
                                                                                       else 1) for v, w in variants))
        results: list[DraftKResult] = []
        summaries = {}
        for name in names:
            acc = accs[name]
            valid = acc.valid
            if acc.exact:
                summaries[name] = alpha_summary(acc.alpha, valid)
            else:
                summaries[name] = {"lower": alpha_summary(acc.lower, valid), "upper": alpha_summary(acc.upper, valid)}
            betas = {}
            for kk in ks:
                for v, w in variants:
                    if (v, w) == ("token", 1):
                        results.append(_one(d, name, acc, kk, lengths, row_ids, mode, trials, batches, int(seed),
                                            cost, (t, tk, tp, mp), progress))
                    else:
                        results.append(_variant_row(d, name, acc, kk, v, w, candidate_sampling, lengths, row_ids,
                                                    trials, batches, int(seed), cost, (t, tk, tp, mp), progress,
                                                    betas, block_trials))
        best = {}
        for name in names:
            rows = [r for r in results if r.draft == name]
            base = [r for r in rows if r.verify == "token" and r.candidates == 1]
            rows = base or [r for r in rows if r.speedup is not None] or rows  # best k: token verification rows
            if cost is None:
                best[name] = None
            else:
                key = (lambda r: r.speedup) if rows[0].speedup is not None else (lambda r: r.speedup_lower)
                best[name] = max(rows, key=lambda r: (key(r), -r.k)).k
        assumptions = list(ASSUMPTIONS) + ([VARIANT_ASSUMPTIONS[v] for v in ("candidates", "block")
                                            if any((m == v) if v == "block" else (w > 1) for m, w in variants)]
                                           if len(variants) > 1 or variants[0] != ("token", 1) else [])
        return SimulationResult(d.path, config, results, best, warnings, summaries, assumptions)
    finally:
        if own:
            d.close()


def _one(d, name, acc, k, lengths, row_ids, mode, trials, batches, seed, cost, params, progress) -> DraftKResult:
    from .acceptance import expected_tokens_closed_form

    valid = acc.valid
    if not acc.exact:  # sparse: exact bounds only (the DP is monotone in every alpha_t)
        lo = expected_tokens_per_step(acc.lower, k, lengths=lengths)
        hi = expected_tokens_per_step(acc.upper, k, lengths=lengths)
        if progress is not None:
            progress(1)
        res = DraftKResult(
            draft=name, k=k, alpha=None, mean_acceptance_length=None, ci95=None, mean_acceptance_length_exact=None,
            draft_acceptance_rate=None, per_position_acceptance=None, accepted_length_histogram=None, speedup=None,
            alpha_lower=float(acc.lower[valid].mean()), alpha_upper=float(acc.upper[valid].mean()),
            mean_acceptance_length_lower=lo.mean_acceptance_length,
            mean_acceptance_length_upper=hi.mean_acceptance_length)
        if cost is not None:
            res.speedup_lower = cost.speedup(lo.mean_acceptance_length, k)
            res.speedup_upper = cost.speedup(hi.mean_acceptance_length, k)
        return res
    alpha = acc.alpha
    ex = expected_tokens_per_step(alpha, k, lengths=lengths)
    if mode == "bernoulli":
        mc = _bernoulli(alpha, lengths, row_ids, k, trials, batches, seed)
        if progress is not None:
            progress(1)
    else:
        mc = _token_replay(d, name, alpha, k, trials, batches, seed, params, progress)
    est, se, half = batch_means_ci(mc["tokens"], mc["steps"], empty=1.0)
    total_steps = int(mc["steps"].sum())
    total_drafted = int(mc["drafted"].sum())
    diff = est - ex.mean_acceptance_length
    if abs(diff) <= 1e-9 * max(1.0, abs(ex.mean_acceptance_length)):
        z = 0.0  # equal up to rounding (e.g. greedy: every batch identical, standard error ~1e-16)
    else:
        z = diff / se if se > 0 and math.isfinite(se) else math.inf
    a_mean = float(alpha[valid].mean())
    res = DraftKResult(
        draft=name, k=k, alpha=a_mean, mean_acceptance_length=float(est),
        ci95=(float(est - half), float(est + half)), mean_acceptance_length_exact=ex.mean_acceptance_length,
        draft_acceptance_rate=float(mc["accepted"].sum() / total_drafted) if total_drafted else 0.0,
        per_position_acceptance=(mc["pos_accepted"] / max(total_steps, 1)).tolist(),
        accepted_length_histogram=(mc["hist"] / max(total_steps, 1)).tolist(),
        speedup=cost.speedup(ex.mean_acceptance_length, k) if cost else None,
        standard_error=float(se), mc_vs_exact_z=float(z), mc_agrees_with_exact=bool(abs(z) <= AGREEMENT_Z),
        draft_acceptance_rate_exact=ex.draft_acceptance_rate,
        per_position_acceptance_exact=ex.per_position_acceptance.tolist(),
        mean_acceptance_length_closed_form=expected_tokens_closed_form(a_mean, k),
        speedup_closed_form=cost.speedup(expected_tokens_closed_form(a_mean, k), k) if cost else None,
        verify_steps=total_steps, token_check=mc.get("token_check"))
    return res


# ----------------------------------------------------------------------------------------- block / candidates

VERIFY_METHODS = ("token", "block")
CANDIDATE_SAMPLING = ("iid", "deterministic")

VARIANT_ASSUMPTIONS = {
    "candidates": "candidates w > 1: at each drafted position w fresh candidates are judged by recursive rejection "
    "sampling against the recorded p_t, q_t; the event 'some candidate accepted' has probability beta_t(w) "
    "(iid: 1 - prod_s (1 - a_s) over the residual chain, O(V w); deterministic: target mass of the top-w draft "
    "logits), independent across positions, so the DP and the Bernoulli replay apply to beta_t(w) unchanged; "
    "the replay keeps the recorded contexts (a real tree would continue from the accepted candidate)",
    "block": "block verification: real drafted tokens (x ~ q_t) through verify_logits(method='block') along the "
    "recorded contexts; Monte-Carlo only (no exact expectation, see exact_reason)",
}

BLOCK_EXACT_REASON = ("block verification's acceptance depends on the joint law of the drafted tokens' ratio chain "
                      "w_i = min(w_{i-1} p(x_i)/q(x_i), 1), not on per-position summaries: no exact expectation is "
                      "computed from the dump (P(tau >= i) = E[w_i] per block, but the expectation over the "
                      "trajectory needs the law of w, V^k terms); Monte-Carlo through fastspec's block kernel only")


def _as_list(value, name):
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return [int(value)]
    try:
        return list(value)
    except TypeError:
        raise TypeError(f"{name} must be a value or a list of values, got {type(value).__name__}") from None


def _variants(verify, candidates, candidate_sampling) -> list[tuple[str, int]]:
    """[(verify, candidates)] rows to compute per (draft, k): token verification with each w, block with w = 1."""
    methods = _as_list(verify, "verify")
    for m in methods:
        if m not in VERIFY_METHODS:
            raise ValueError(f"verify {m!r} is unknown; choose token, block or both (token,block)")
    ws = []
    for w in _as_list(candidates, "candidates"):
        try:
            wi = int(w)
        except (TypeError, ValueError):
            raise ValueError(f"candidates {w!r} is not an integer; write e.g. 1, 2 or 1,2,4") from None
        if isinstance(w, bool) or wi < 1 or wi > 64:
            raise ValueError(f"candidates = {w!r} is invalid: use an integer in [1, 64] (candidates per position)")
        ws.append(wi)
    if not methods or not ws:
        raise ValueError("verify and candidates must each name at least one value")
    if candidate_sampling not in CANDIDATE_SAMPLING:
        extra = (" (without replacement the per-position acceptance depends on which candidates were drawn; it is "
                 "supported by fastspec.verify_tree_probs and fastspec.exact, not by the simulator)"
                 if candidate_sampling == "without_replacement" else "")
        raise ValueError(f"candidate_sampling {candidate_sampling!r} is not supported by simulate; choose one of: "
                         f"{', '.join(CANDIDATE_SAMPLING)}{extra}")
    out = []
    for m in methods:
        for w in sorted(set(ws)):
            if m == "block" and w > 1:
                continue  # block verification of candidate trees is not defined here
            out.append((m, w))
    if not out:
        raise ValueError("block verification judges one candidate per position: use candidates 1 with --verify block")
    return list(dict.fromkeys(out))


def _check_variants_supported(d, extra) -> None:
    if d.kind != "dense" or not hasattr(d, "iter_chunks") or not hasattr(d, "arrays"):
        what = " and ".join(sorted({"block verification" if v == "block" else "candidates > 1" for v, _ in extra}))
        raise ValueError(f"{d.path}: {what} needs the full target and draft distributions (dense logits); this "
                         "dump is sparse top-k or not readable here: use --verify token --candidates 1, or a "
                         "dense dump")


def _block_trials(block_trials, batches) -> int:
    n = 10 if block_trials is None else int(block_trials)
    if n < 2:
        raise ValueError(f"block_trials = {block_trials!r} must be >= 2")
    b = min(batches, n)
    return int(-(-n // b) * b)


def _candidate_beta(d, name, params, w, sampling, valid) -> np.ndarray:
    """beta_t(w) [N, T]: probability that one of w candidates is accepted at position t (exact, per position)."""
    from ._process import probabilities
    from .candidates import candidate_acceptance

    t, top_k, top_p, min_p = params
    beta = np.zeros((d.N, d.T))
    for n0, n1, tgt, drf in _iter_sequences(d, name):
        m = n1 - n0
        x = tgt.reshape(m * d.T, -1)
        y = drf.reshape(m * d.T, -1)
        ok = valid[n0:n1].reshape(-1)
        rows = np.flatnonzero(ok)
        for s in range(0, rows.size, 256):
            r = rows[s:s + 256]
            p = probabilities(x[r], temperature=t, top_k=top_k, top_p=top_p, min_p=min_p)
            q = probabilities(y[r], temperature=t, top_k=top_k, top_p=top_p, min_p=min_p)
            b = candidate_acceptance(p, q, w, sampling=sampling,
                                     draft_logits=np.asarray(y[r], dtype=np.float64) if sampling == "deterministic"
                                     else None)
            flat = beta[n0:n1].reshape(-1)
            flat[r] = b
            beta[n0:n1] = flat.reshape(m, d.T)
    return beta


def _variant_row(d, name, acc, k, verify, w, sampling, lengths, row_ids, trials, batches, seed, cost, params,
                 progress, betas, block_trials) -> DraftKResult:
    """One (draft, k) row for block verification or w > 1 candidates per position."""
    from .acceptance import DraftAcceptance

    if verify == "token":
        # beta_t(w) replaces alpha_t: each position is drafted at most once and its w candidates are fresh, so
        # acceptance at t is an independent Bernoulli(beta_t(w)) and the DP and the Bernoulli replay apply unchanged.
        if w not in betas:
            betas[w] = _candidate_beta(d, name, params, w, sampling, acc.valid)
        beta_acc = DraftAcceptance(name, acc.valid, alpha=betas[w])
        res = _one(d, name, beta_acc, k, lengths, row_ids, "bernoulli", trials, batches, seed, cost, params, progress)
        res.verify, res.candidates, res.candidate_sampling = "token", w, sampling
        res.mc_method = f"bernoulli replay of beta_t({w}) (exact per-position acceptance of {w} candidates)"
        if cost is not None:
            try:  # a tree of k*w drafted nodes: k draft forwards (one per depth), verify cost of k*w positions
                res.speedup = res.mean_acceptance_length_exact / (k * cost.draft_cost + cost.verify(k * w))
                res.speedup_closed_form = None
            except ValueError:
                res.speedup = None
        res.mean_acceptance_length_closed_form = None
        return res
    bt = _block_trials(block_trials, batches)
    nb = min(batches, bt)
    mc = _token_replay(d, name, acc.alpha, k, bt, nb, seed, params, progress, method="block")
    est, se, half = batch_means_ci(mc["tokens"], mc["steps"], empty=1.0)
    steps = int(mc["steps"].sum())
    drafted = int(mc["drafted"].sum())
    res = DraftKResult(
        draft=name, k=k, alpha=float(acc.alpha[acc.valid].mean()), mean_acceptance_length=float(est),
        ci95=(float(est - half), float(est + half)), mean_acceptance_length_exact=None,
        draft_acceptance_rate=float(mc["accepted"].sum() / drafted) if drafted else 0.0,
        per_position_acceptance=(mc["pos_accepted"] / max(steps, 1)).tolist(),
        accepted_length_histogram=(mc["hist"] / max(steps, 1)).tolist(),
        speedup=cost.speedup(float(est), k) if cost else None, standard_error=float(se),
        verify_steps=steps, verify="block", candidates=1, exact_reason=BLOCK_EXACT_REASON,
        mc_method=f"{bt} replays per sequence through verify_logits(method='block') (real drafted tokens)")
    # no exact figure to compare with; the token-verification row of the same (draft, k) is the reference
    return res

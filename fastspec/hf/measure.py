"""Measured acceptance: the real speculative loop over prompts, per draft and k, with a 95% CI over prompts.

Compare the result with a dump's prediction through :func:`fastspec.hf.prediction.compare`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from ..errors import InvalidInput
from ..params import SamplingParams
from .args import as_token_ids, check_k, check_max_new_tokens, positive_int
from .loop import derive_seed, speculative_generate
from .prediction import ratio_ci

__all__ = ["MeasureResult", "measure"]

_TOTALS = ("verify_steps", "drafted", "accepted", "emitted")
_TIMES = {"draft": "draft_s", "target": "target_s", "verify": "verify_s", "total": "total_s"}


@dataclass
class MeasureResult:
    """Figures of one (draft, k) over every prompt and repeat: mean acceptance length = emitted / verify steps,
    its 95% CI and standard error (prompts as clusters, :func:`ratio_ci`), totals, per-position acceptance
    (steps whose draft j was accepted / verify steps), times in seconds summed over runs, and the run count.
    ``as_dict()`` is the ``measured`` object of a :func:`fastspec.hf.compare` row."""

    draft: str
    k: int
    mean_acceptance_length: float
    ci95: tuple[float, float]
    standard_error: float
    verify_steps: int
    drafted: int
    accepted: int
    emitted: int
    draft_acceptance_rate: float
    per_position_acceptance: list[float]
    time_s: dict = field(default_factory=dict)
    runs: int = 0

    def as_dict(self) -> dict:
        d = {f: getattr(self, f) for f in self.__dataclass_fields__}
        d["ci95"] = list(self.ci95)
        return d


def _aggregate(name: str, k: int, runs: list[list]) -> MeasureResult:
    """The :class:`MeasureResult` of one (draft, k) from its runs (``runs[i]``: the SpecResults of prompt i)."""
    flat = [r for per_prompt in runs for r in per_prompt]
    est, se, half = ratio_ci([sum(r.emitted for r in rs) for rs in runs],
                             [sum(r.verify_steps for r in rs) for rs in runs])
    tot = {f: sum(getattr(r, f) for r in flat) for f in _TOTALS}
    pos = sum((r.per_position_accepted for r in flat), np.zeros(k, np.int64))
    return MeasureResult(
        draft=name, k=k, mean_acceptance_length=est, ci95=(est - half, est + half), standard_error=se,
        verify_steps=tot["verify_steps"], drafted=tot["drafted"], accepted=tot["accepted"], emitted=tot["emitted"],
        draft_acceptance_rate=tot["accepted"] / tot["drafted"] if tot["drafted"] else float("nan"),
        per_position_acceptance=(pos / max(tot["verify_steps"], 1)).tolist(),
        time_s={key: sum(getattr(r, attr) for r in flat) for key, attr in _TIMES.items()}, runs=len(flat))


def measure(target, drafts: Mapping, prompts: Sequence[Sequence[int]], ks: Sequence[int], *, temperature=1.0,
            top_k=0, top_p=1.0, min_p=0.0, seed=0, max_new_tokens=128, eos_token_id=None, repeats: int = 1,
            progress: Callable[[int], None] | None = None) -> list[MeasureResult]:
    """Run :func:`fastspec.hf.speculative_generate` for every (draft, k) over every prompt (``repeats`` times
    each, seeds derived from (seed, draft index, k, prompt, repeat)) and aggregate: mean acceptance length =
    total emitted / total verify steps with a 95% CI from :func:`ratio_ci` over prompts (repeats of a prompt
    pooled).  ``progress(1)`` is called after each (draft, k, prompt)."""
    params = SamplingParams(temperature, top_k, top_p, min_p)
    ks = [check_k(k) for k in ks]
    max_new_tokens = check_max_new_tokens(max_new_tokens)
    repeats = positive_int("repeats", repeats)
    prompts = [as_token_ids(p, f"prompts[{i}]") for i, p in enumerate(prompts)]
    if not drafts or not prompts or not ks:
        raise InvalidInput("measure needs at least one draft, one prompt and one k")
    results = []
    for di, (name, dm) in enumerate(drafts.items()):
        for k in ks:
            runs = []
            for i, prompt in enumerate(prompts):
                runs.append([speculative_generate(target, dm, prompt, k, **params.as_dict(),
                                                  seed=derive_seed(seed, di, k, i, rep), max_new_tokens=max_new_tokens,
                                                  eos_token_id=eos_token_id) for rep in range(repeats)])
                if progress is not None:
                    progress(1)
            results.append(_aggregate(name, k, runs))
    return results

"""What :func:`fastspec.simulate` returns; ``as_dict()`` is the command line's ``--json`` object (names stable)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

__all__ = ["DraftKResult", "SimulationResult", "ASSUMPTIONS", "VARIANT_ASSUMPTIONS", "BLOCK_EXACT_REASON",
           "ARGMAX_ASSUMPTION", "SPEEDUP_ASSUMPTIONS", "RESULT_KINDS", "SECTIONS", "SECTION_TYPES", "TokenCheck",
           "ExactFigures", "MonteCarloFigures", "SequenceInterval", "SpeedupFigures", "BoundFigures", "SpeedupBounds",
           "NgramFigures"]

#: what a row (:attr:`DraftKResult.kind`) is, and the sections (:data:`SECTIONS`) it fills; a new kind of row (a
#: new draft or verifier) is one entry here, set by the code that builds its rows
RESULT_KINDS = {
    "model": ("a model draft, token verification, one candidate: exact DP and a Monte-Carlo replay",
              ("exact", "monte_carlo", "sequences", "speedup")),
    "bounds": ("a model draft of a sparse top-k dump: exact lower and upper bounds only",
               ("bounds", "sequences", "speedup_bounds")),
    "candidates": ("a model draft with w > 1 candidates per position: beta_t(w) in place of alpha_t",
                   ("exact", "monte_carlo", "sequences", "speedup")),
    "block": ("a model draft under block verification: Monte-Carlo only (exact_reason says why)",
              ("monte_carlo", "speedup")),
    "ngram": ("the n-gram (prompt-lookup) draft: an exact replay, no Monte-Carlo",
              ("exact", "sequences", "speedup", "ngram")),
}

class TokenCheck(NamedTuple):
    """Token mode's check: the acceptance frequency over the judged positions against their alpha_t
    (``token_check`` in the JSON)."""

    judged_positions: int
    accepted: int
    expected_accepted: float
    acceptance_frequency: float
    expected_frequency: float
    z: float
    threshold: float
    passed: bool


class ExactFigures(NamedTuple):
    """The exact expectation of the replayed process (dynamic programming), and the closed form of the mean alpha."""

    mean_acceptance_length_exact: float | None
    draft_acceptance_rate_exact: float | None
    per_position_acceptance_exact: list | None
    mean_acceptance_length_closed_form: float | None
    speedup_closed_form: float | None
    p_all_accepted: float | None
    #: why there is no exact figure (block verification), else None
    exact_reason: str | None


class MonteCarloFigures(NamedTuple):
    """The Monte-Carlo replay: its estimate and batch-means interval, and its agreement with the exact value."""

    mean_acceptance_length: float | None
    ci95: tuple | None
    standard_error: float | None
    draft_acceptance_rate: float | None
    per_position_acceptance: list | None
    accepted_length_histogram: list | None
    verify_steps: int | None
    mc_method: str | None
    mc_vs_exact_z: float | None
    mc_vs_exact_threshold: float | None
    mc_agrees_with_exact: bool | None
    token_check: TokenCheck | None


class SequenceInterval(NamedTuple):
    """The exact expectation's uncertainty over the recorded sequences (prompts as clusters)."""

    ci95_sequences: tuple | None
    standard_error_sequences: float | None


class SpeedupFigures(NamedTuple):
    """The predicted speed-up and its interval (sequences and measured costs)."""

    speedup: float | None
    speedup_ci95: tuple | None


class BoundFigures(NamedTuple):
    """A sparse dump: exact lower and upper bounds of alpha and of tokens per step."""

    alpha_lower: float | None
    alpha_upper: float | None
    mean_acceptance_length_lower: float | None
    mean_acceptance_length_upper: float | None


class SpeedupBounds(NamedTuple):
    """A sparse dump: the speed-up at the bounds, and the interval from the lower bound's low end to the upper
    bound's high end."""

    speedup_lower: float | None
    speedup_upper: float | None
    speedup_ci95: tuple | None


class NgramFigures(NamedTuple):
    """The n-gram draft's replay: plain target steps, tokens per target forward, accepted drafts off the record."""

    plain_steps: float | None
    tokens_per_target_forward: float | None
    off_record: float | None


#: section -> its type (a typed, read-only record), whose fields are the flat fields (JSON names, stable) it groups
SECTION_TYPES = {"exact": ExactFigures, "monte_carlo": MonteCarloFigures, "sequences": SequenceInterval,
                 "speedup": SpeedupFigures, "bounds": BoundFigures, "speedup_bounds": SpeedupBounds,
                 "ngram": NgramFigures}
#: section -> the flat fields (JSON names, stable) it groups
SECTIONS = {name: t._fields for name, t in SECTION_TYPES.items()}


@dataclass
class DraftKResult:
    """Figures for one (draft, k) -- and verification variant.  JSON names (see :meth:`as_dict`) are stable.

    ``kind`` (:data:`RESULT_KINDS`) says what the row is; its figures come in typed sections (:data:`SECTION_TYPES`:
    :attr:`exact`, :attr:`monte_carlo`, :attr:`sequences`, :attr:`priced`, :attr:`bounds`, :attr:`speedup_bounds`,
    :attr:`ngram`), each None when the kind has no such section: read the sections, not which fields are None.  The
    flat fields are the JSON names (:meth:`as_dict`).
    """

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
    mc_vs_exact_threshold: float | None = None
    #: 95% interval of the exact mean acceptance length over the recorded sequences (prompts as clusters); for a
    #: sparse dump from the lower bound's low end to the upper bound's high end
    ci95_sequences: tuple[float, float] | None = None
    standard_error_sequences: float | None = None
    #: 95% interval of the speed-up: sequences and measured costs (fastspec.simulation.speedup)
    speedup_ci95: tuple[float, float] | None = None
    #: expected share of verify steps that accepted every draft (the draft then catches up on two tokens)
    p_all_accepted: float | None = None
    #: n-gram drafts: verify steps with no proposal (plain target steps), tokens per target forward, and the share
    #: of accepted drafts that differ from the recorded tokens (the reach of the trajectory-replay assumption)
    plain_steps: float | None = None
    tokens_per_target_forward: float | None = None
    off_record: float | None = None
    #: what the row is: a key of RESULT_KINDS ("model", "bounds", "candidates", "block", "ngram")
    kind: str = "model"
    #: how a model draft proposed: "sampled" (x ~ q, judged with q) or "argmax" (its top-1 token / top-w
    #: candidates, judged with a one-hot q: vLLM V1); None for the n-gram draft (a deterministic proposal itself)
    draft_sampling: str | None = None

    @property
    def sections(self) -> tuple[str, ...]:
        """The sections this kind of row fills (:data:`RESULT_KINDS`)."""
        return RESULT_KINDS[self.kind][1]

    def section(self, name: str):
        """One typed section (:data:`SECTION_TYPES`), e.g. ``row.section("bounds")``; None when this kind of row has
        no such section."""
        if name not in self.sections:
            return None
        kind = SECTION_TYPES[name]
        values = {f: getattr(self, f) for f in SECTIONS[name]}
        if name == "monte_carlo" and values["token_check"] is not None:
            values["token_check"] = TokenCheck(**values["token_check"])
        return kind(**values)

    @property
    def exact(self) -> ExactFigures | None:
        return self.section("exact")

    @property
    def monte_carlo(self) -> MonteCarloFigures | None:
        return self.section("monte_carlo")

    @property
    def sequences(self) -> SequenceInterval | None:
        return self.section("sequences")

    @property
    def priced(self) -> SpeedupFigures | None:
        """The speed-up section (``section("speedup")``)."""
        return self.section("speedup")

    @property
    def bounds(self) -> BoundFigures | None:
        return self.section("bounds")

    @property
    def speedup_bounds(self) -> SpeedupBounds | None:
        return self.section("speedup_bounds")

    @property
    def ngram(self) -> NgramFigures | None:
        return self.section("ngram")

    @property
    def check(self) -> TokenCheck | None:
        """Token mode's acceptance check, typed (None: not token mode)."""
        return None if self.token_check is None else TokenCheck(**self.token_check)

    @property
    def priced_speedup(self) -> float | None:
        """The speed-up that ranks this row: the estimate, or for bounds the lower one (the conservative choice)."""
        return self.speedup if self.speedup is not None else self.speedup_lower

    def as_dict(self) -> dict:
        d = {f: getattr(self, f) for f in self.__dataclass_fields__}
        for f in ("ci95", "ci95_sequences", "speedup_ci95"):
            d[f] = list(d[f]) if d[f] is not None else None
        return d


@dataclass
class SimulationResult:
    """What :func:`fastspec.simulate` computed; ``as_dict()`` is the CLI's ``--json`` object."""

    dump: str
    config: dict
    results: list[DraftKResult]
    best: dict[str, int | None]
    warnings: list[str]
    alpha_summary: dict[str, dict]
    assumptions: list[str]
    #: the (draft, k, variant) with the highest predicted speed-up over every row (None: no costs)
    best_overall: dict | None = None
    #: one plain sentence on what the best draft buys (or why no speed-up was computed)
    verdict: str = ""
    #: rows of kind "policy" (fastspec.simulation.policy_rows.PolicyRow): one per (model draft, policy)
    policies: list = field(default_factory=list)
    #: how it was simulated: the config resolved against the dump (fastspec.simulation.SimulatePlan)
    plan: Any = None
    #: the predictions at the serving batch sizes asked for (fastspec.simulation.batch.BatchPrediction), or None
    batch: Any = None

    def as_dict(self) -> dict:
        out = {"dump": self.dump, "config": self.config, "results": [r.as_dict() for r in self.results],
               "best": self.best, "best_overall": self.best_overall, "verdict": self.verdict,
               "warnings": self.warnings, "alpha_summary": self.alpha_summary, "assumptions": self.assumptions,
               "policies": [p.as_dict() for p in self.policies]}
        if self.batch is not None:
            out["batch"] = self.batch.as_dict()
        return out

    @property
    def disagreements(self) -> list[DraftKResult]:
        """Rows whose Monte-Carlo estimate is inconsistent with the exact expectation (or token check); rows
        without an interval (``mc_agrees_with_exact`` None) were not checked and are not listed."""
        return [r for r in self.results
                if r.mc_agrees_with_exact is False or (r.check is not None and not r.check.passed)]


ASSUMPTIONS = [
    "trajectory replay: contexts follow the recorded sequences, whatever was accepted",
    "offline estimate from recorded distributions, not a deployment measurement",
    "end of sequence: a step at position t drafts min(k, L-1-t) tokens; the last token alone is a plain "
    "target step and is not counted",
    "ci95: batch means over independent groups of trials (Monte-Carlo uncertainty given the recorded "
    "trajectories, not uncertainty over prompts)",
    "ci95_sequences: the exact expectation's uncertainty over the recorded sequences (prompts as clusters, ratio of "
    "totals, Student t): how far another draw of prompts like these could move tokens per step",
    "speedup = tokens per verify step / (k * draft_cost + verify_cost(k)), costs relative to one target forward",
]

#: the speed-up line of ASSUMPTIONS for each pricing source (fastspec.simulation.speedup)
SPEEDUP_ASSUMPTIONS = {
    "flags": ASSUMPTIONS[-1],
    "table": "speedup = tokens per verify step x plain step / step(k), with plain = target(1) + overhead(0) and "
    "step(k) = draft(1 + a) + (k - 1) draft(1) + target(k + 1) + overhead(k) in measured seconds (the real loop's "
    "calls, fastspec.costs; a: the share of steps that accepted every draft); an n-gram step costs one lookup "
    "call + target(d + 1) + overhead(d) for its d proposed tokens",
    "none": "speedup not computed: no costs (the dump records none and neither a cost table nor relative costs "
    "were given)",
}

VARIANT_ASSUMPTIONS = {
    "candidates": "candidates w > 1: at each drafted position w fresh candidates are judged by recursive rejection "
    "sampling against the recorded p_t, q_t; the event 'some candidate accepted' has probability beta_t(w) "
    "(iid: 1 - prod_s (1 - a_s) over the residual chain, O(V w); deterministic: target mass of the top-w draft "
    "logits), independent across positions, so the DP and the Bernoulli replay apply to beta_t(w) unchanged; "
    "the replay keeps the recorded contexts (a real tree would continue from the accepted candidate)",
    "block": "block verification: real drafted tokens (x ~ q_t) through verify_logits(method='block') along the "
    "recorded contexts; Monte-Carlo only (no exact expectation, see exact_reason)",
}

#: the assumption line of a simulation with argmax drafts (fastspec.simulation.argmax)
ARGMAX_ASSUMPTION = ("argmax drafts: each model draft proposes its top-1 token (lowest id among ties; w candidates: "
                     "its top-w tokens), judged with a one-hot q as vLLM V1 does, so position t accepts with "
                     "p_t(argmax q_t) (processed p) in place of sum_v min(p_t, q_t); token mode drafts the argmax and "
                     "verifies with draft_logits=None; equal to greedy drafts at temperature 0")

BLOCK_EXACT_REASON = ("block verification's acceptance depends on the joint law of the drafted tokens' ratio chain "
                      "w_i = min(w_{i-1} p(x_i)/q(x_i), 1), not on per-position summaries: no exact expectation is "
                      "computed from the dump (P(tau >= i) = E[w_i] per block, but the expectation over the "
                      "trajectory needs the law of w, V^k terms); Monte-Carlo through fastspec's block kernel only")


def sampling_warnings(metadata, sp) -> list[str]:
    """Warnings when the analysed sampling configuration is not the one the trajectories were sampled with."""
    from ..params import SamplingParams

    rec = SamplingParams.recorded(metadata)
    if rec is None:
        return ["the dump does not record the sampling config its trajectories were sampled with (metadata "
                "'temperature' missing): the replayed contexts may not follow the serving distribution"]
    diff = sp.differences(rec)
    if not diff:
        return []
    return ["the requested sampling config differs from the one the dump's trajectories were sampled with: "
            + ", ".join(diff) + ". The recorded contexts then do not follow the serving distribution, so the "
            "prediction describes the recorded contexts, not those the requested config would produce"]

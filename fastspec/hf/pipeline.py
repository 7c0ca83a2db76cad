"""The real loop measured against a dump's prediction, end to end: what ``fastspec measure`` runs.

:func:`measure_and_predict` runs the five stages in order -- load the models (:func:`resolve_models`), read the
prompts (:func:`read_prompts`), check every model's positions before any generation, measure the cost table
(:func:`measure_costs`, unless one is given), make the prediction dump (:func:`dump_logits`, unless an existing
dump is given) and predict from it (:func:`predict`), run the real loop against plain decoding
(:func:`measure`) -- and compares them (:func:`compare`).  It returns a :class:`MeasureReport`; the command line
only parses its options, shows the progress and renders the report.

Bad arguments raise :class:`fastspec.errors.InvalidInput` / :class:`~fastspec.errors.InvalidType`; those about
the token budget or the dump carry ``argument`` (``"max_new_tokens"`` or ``"dump"``) so a caller can name its own
option in the message.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Callable, ContextManager, Iterator, Mapping, Sequence

import torch

from ..costs import CostTable
from ..errors import about, config_or_settings
from ..ngram import NgramProposer
from ..params import SamplingParams
from ..runs import MeasureConfig
from .args import check_generation_positions
from .timing import DEFAULT_WARMUP, check_cost_context, measure_costs
from .dumping import dump_logits
from .measure import Measurement, measure, predicted_policies, speculative_configs
from .models import eos_ids, model_files, parse_draft_specs, resolve_models
from .prediction import Prediction, compare, predict
from .prompts import read_prompts

__all__ = ["MeasureReport", "measure_and_predict", "Progress"]

#: ``progress(stage, total, every)``: a context manager around one stage (``"loading models"``, ``"measuring
#: costs (rounds)"``, ``"dumping (prediction)"``, ``"timed runs (interleaved)"``) of ``total`` units that yields
#: ``advance(n=1)``; ``every`` is the units of one natural step (a round of every configuration), a hint for how
#: often to report.
Progress = Callable[[str, int, int], ContextManager[Callable[..., None]]]


@contextlib.contextmanager
def _quiet(_stage: str, _total: int, _every: int) -> Iterator[Callable[..., None]]:
    yield lambda _n=1: None


@dataclass
class MeasureReport:
    """What :func:`measure_and_predict` returns: ``drafts`` ({name: MODEL specification}), ``prompts`` (the token
    ids measured), ``measurement`` (:class:`~fastspec.hf.measure.Measurement`), ``prediction``
    (:class:`~fastspec.hf.prediction.Prediction`), ``rows`` (:func:`~fastspec.hf.prediction.compare`'s, one per
    (draft, k)), ``costs`` (the :class:`fastspec.costs.CostTable` that priced the predicted speed-ups),
    ``costs_measured`` (True when measured now), ``warnings`` (the prediction's, then the report's own),
    ``threads`` (torch's thread count of the timed runs) and ``dump`` (the dump predicted from, when it is kept:
    the one given or ``save_dump``; None for a temporary one)."""

    drafts: dict
    prompts: list
    measurement: Measurement
    prediction: Prediction
    rows: list
    costs: CostTable
    costs_measured: bool
    warnings: list = field(default_factory=list)
    threads: int = 0
    dump: str | None = None

    @property
    def dump_kind(self) -> str:
        return self.prediction.dump_kind

    def as_dict(self) -> dict:
        """The report's JSON objects (what the ``measure`` command prints as JSON, less its ``config``)."""
        meas = self.measurement
        return {"results": self.rows, "plain": meas.plain.as_dict(),
                "hf_generate": None if meas.hf_generate is None else meas.hf_generate.as_dict(),
                "runner_vs_generate": meas.runner_vs_generate, "costs": self.costs.as_dict(),
                "prediction_warnings": list(self.warnings), "schedule": [list(s) for s in meas.schedule]}


def measure_and_predict(target, drafts: Mapping[str, str] | Sequence[str], prompts, ks: Sequence[int] = (1, 2, 4), *,
                        temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
                        max_new_tokens: int = 64, ignore_eos: bool = False, seed: int = 0, repeats: int = 1,
                        max_prompts: int | None = None, dump=None, save_dump=None, top_k_save: int | None = None,
                        costs=None, cost_repeats: int = 20, hf_generate: bool = True, trials: int | None = None,
                        policies: Sequence = (), sampling: SamplingParams | None = None,
                        config: MeasureConfig | None = None,
                        progress: Progress | None = None, hf_engine: bool = False) -> MeasureReport:
    """Measure the real speculative loop of ``target`` with ``drafts`` over ``prompts`` for every k of ``ks``,
    against plain decoding, next to the prediction from a dump and a cost table (module docstring).

    ``target``: a model directory or .gguf file; ``drafts``: ``NAME=MODEL`` specifications
    (:func:`~fastspec.hf.parse_draft_specs`: a model, ``exitL`` or an n-gram draft); ``prompts``: a prompts file
    (:func:`~fastspec.hf.read_prompts`), only its first ``max_prompts`` used.  The settings come one by one or as
    one :class:`fastspec.runs.MeasureConfig` (``config``; not both), validated before anything is loaded (errors
    tagged with the argument at fault, ``exc.arguments``).  ``dump``: predict from this existing dump of the same
    prompts; else one is made now (dense, or sparse top-``top_k_save``) at ``save_dump``, or in a temporary
    directory removed afterwards.  ``costs``: a cost table (a :class:`~fastspec.costs.CostTable`, its mapping or a
    JSON file); None: measured now (``cost_repeats`` rounds) with these models, prompts and threads.
    ``hf_generate``: also time Hugging Face ``generate``; ``trials``: simulate's Monte-Carlo replays.
    ``progress``: :data:`Progress` (none: silent).  The stages run in this order, every check before the first
    forward: the token budget's positions (InvalidInput tagged ``argument="max_new_tokens"``), the cost table,
    the dump and its prediction (errors tagged ``argument="dump"``), the timed runs.  ``policies`` /
    ``hf_engine``: :func:`~fastspec.hf.measure.measure`'s draft-length policies and Hugging Face's assisted
    generation, predicted by :func:`~fastspec.hf.prediction.predict` with ``policies``; a cost table measured now
    then covers every draft length up to the largest a policy can draft."""
    c = config_or_settings(MeasureConfig, config, dict(
        ks=ks, sampling=sampling, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
        max_new_tokens=max_new_tokens, ignore_eos=ignore_eos, seed=seed, repeats=repeats, max_prompts=max_prompts,
        dump=dump, save_dump=save_dump, top_k_save=top_k_save, costs=costs, cost_repeats=cost_repeats,
        hf_generate=hf_generate, trials=trials,
        policies=policies))
    stage = progress or _quiet
    ks, params, max_new_tokens, seed = list(c.ks), c.params, c.max_new_tokens, c.seed
    table = c.costs
    specs = parse_draft_specs(drafts) if drafts else {}
    pred_policies = predicted_policies(c.policies, hf_engine)
    from ..policies import parse_policy

    longest = max([1] + [parse_policy(p).k_max for p in pred_policies])  # a measured table covers every length
    cost_ks = sorted(set(ks) | set(range(1, min(longest, max_new_tokens - 1) + 1)))
    with stage("loading models", model_files(specs), 1) as advance:
        tmodel, tok, loaded = resolve_models(target, specs, progress=advance)
    models = {n: m for n, m in loaded.items() if not isinstance(m, NgramProposer)}
    ngrams = {n: m for n, m in loaded.items() if isinstance(m, NgramProposer)}
    ids = read_prompts(prompts, tok)[:c.max_prompts]
    with about("max_new_tokens"):  # before any generation
        check_generation_positions({"the target": tmodel, **{f"draft {n}": m for n, m in loaded.items()}}, ids,
                                   max_new_tokens)
        if table is None:  # the cost measurement's context (median prompt + N // 2) + the largest k + 1
            check_cost_context(tmodel, loaded, ks=cost_ks, prompts=ids, max_new_tokens=max_new_tokens)
    measured = table is None
    if table is None:
        with stage("measuring costs (rounds)", c.cost_repeats + DEFAULT_WARMUP, 5) as advance:
            table = measure_costs(tmodel, loaded, ks=cost_ks, prompts=ids, max_new_tokens=max_new_tokens,
                                  repeats=c.cost_repeats, **params.as_dict(), seed=seed, progress=advance)
    notes = []
    missing = [n for n in loaded if n not in table.draft_forward_s]
    if missing:
        notes.append(f"the cost table has no entry for draft(s) {', '.join(missing)}: their speed-up is not "
                     f"predicted (it has {', '.join(table.draft_forward_s) or 'none'})")
    prediction = _prediction(c.dump, c.save_dump, tmodel, tok, models, ngrams, ids, ks, params, table,
                             max_new_tokens=max_new_tokens, top_k_save=c.top_k_save, seed=seed,
                             ignore_eos=c.ignore_eos, trials=c.trials, stage=stage, policies=pred_policies)
    n_configs = 1 + int(c.hf_generate) + len(speculative_configs(loaded, ks, c.policies, hf_engine))
    with stage("timed runs (interleaved)", len(ids) * c.repeats * n_configs, n_configs) as advance:
        meas = measure(tmodel, loaded, ids, ks, **params.as_dict(), seed=seed, max_new_tokens=max_new_tokens,
                       eos_token_id=None if c.ignore_eos else eos_ids(tmodel, tok), ignore_eos=c.ignore_eos,
                       repeats=c.repeats, plain=True, hf_generate=c.hf_generate, progress=advance,
                       policies=c.policies, hf_engine=hf_engine)
    return MeasureReport(drafts=specs, prompts=ids, measurement=meas, prediction=prediction,
                         rows=compare(meas, prediction), costs=table, costs_measured=measured,
                         warnings=prediction.warnings + notes, threads=torch.get_num_threads(),
                         dump=c.dump if c.dump is not None else c.save_dump)


def _prediction(dump, save_dump, tmodel, tok, models, ngrams, ids, ks, params, table, *, max_new_tokens, top_k_save,
                seed, ignore_eos, trials, stage, policies=()) -> Prediction:
    """:func:`predict` from ``dump``, or from a dump made now at ``save_dump`` (else in a temporary directory,
    removed afterwards)."""
    tmpdir = None
    path = dump
    try:
        if path is None:
            if save_dump is not None:
                path = save_dump
            else:
                tmpdir = tempfile.mkdtemp(prefix="fastspec-measure-")
                path = os.path.join(tmpdir, "dump")
            with stage("dumping (prediction)", len(ids), 1) as advance:
                dump_logits(path, tmodel, models, ids, max_new_tokens=max_new_tokens, **params.as_dict(),
                            top_k_save=top_k_save, seed=seed, eos_token_id=eos_ids(tmodel, tok),
                            ignore_eos=ignore_eos, costs=False, progress=advance)
        with about("dump"):
            return predict(path, list(models), ks, **params.as_dict(), trials=trials, seed=seed, ngram=ngrams,
                           costs=table, policies=policies)
    finally:
        if tmpdir is not None:
            shutil.rmtree(tmpdir, ignore_errors=True)

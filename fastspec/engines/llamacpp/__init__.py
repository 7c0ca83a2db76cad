"""llama.cpp, run and read by fastspec (its ``llama-server``, built by ``scripts/llamacpp_build.sh``; fastspec
starts and stops the server itself and speaks HTTP to it):

* :mod:`~fastspec.engines.llamacpp.conventions` -- how llama.cpp drafts, judges and counts, as data, each fact
  cited from its source, and the draft-length rule (``n_max``, ``p_min``, ``n_min``, the token budget);
* :mod:`~fastspec.engines.llamacpp.runner` -- ``llama-server`` on a free loopback port (:class:`Server`);
* :mod:`~fastspec.engines.llamacpp.gguf_header` -- a GGUF file's tokenizer metadata, read from its header, and
  llama.cpp's rule for a draft's vocabulary;
* :mod:`~fastspec.engines.llamacpp.measure` -- what ``fastspec measure --engine llamacpp`` runs: llama.cpp's
  counters per prompt against fastspec's prediction, teacher forcing by llama.cpp itself, and the output audit; a
  model draft's steps at T = 0 and their cost (``greedy_steps``, ``model_draft_time``);
* :mod:`~fastspec.engines.llamacpp.ngram` -- the ``ngram-simple`` speculator and its T = 0 counters from a record.
"""

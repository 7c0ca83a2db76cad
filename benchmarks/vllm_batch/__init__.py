"""The vLLM batch experiment of ``benchmarks/bench_vllm_batch.py`` (not part of the library): where n-gram
speculation stops paying in vLLM as the concurrency grows.

* ``driver`` -- two vLLM offline engines side by side (plain and ``ngram``), their throughput per concurrency,
  their counters against the exact prediction, and a batch cost table measured in vLLM in the same run;
* ``schedule`` -- the run's own schedule replayed and priced step by step;
* ``_worker.py`` -- the long-lived engine, run by path in vLLM's own Python (standard library and vllm only).
"""

"""Dumps from running inference servers (vLLM's OpenAI-compatible server, SGLang): :func:`dump_from_servers`.

Standard library HTTP only (:class:`HttpClient`: timeouts, bounded concurrency, retries with back-off on transient
errors); the wire formats are in :mod:`.engines`, the dump builder in :mod:`.builder`.
"""
from __future__ import annotations

from .builder import (LOGPROBS_MODES, ServerDumpResult, dump_from_servers, prompt_seed, staging_dir,
                      union_bounds)
from .client import HttpClient, ServerError, check_url
from .engines import ENGINES, Scored, SglangEngine, VllmEngine, make_engine

__all__ = ["dump_from_servers", "ServerDumpResult", "HttpClient", "ServerError", "check_url", "VllmEngine",
           "SglangEngine", "ENGINES", "Scored", "make_engine", "prompt_seed", "staging_dir", "union_bounds",
           "LOGPROBS_MODES"]

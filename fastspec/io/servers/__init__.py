"""Dumps from running inference servers (vLLM's OpenAI-compatible server, SGLang): :func:`dump_from_servers`.

Standard library HTTP only (:class:`HttpClient`: timeouts, bounded concurrency, retries with back-off on transient
errors); the wire formats are in :mod:`.engines`, the dump builder in :mod:`.builder`.
"""
from __future__ import annotations

from .builder import (LOGPROBS_MODES, ServerDumpResult, dump_from_servers, prompt_seed, staging_dir,
                      union_bounds)
from .client import HttpClient, ServerError, Stopped, check_timeout, check_url
from .engines import ENGINES, Scored, SglangEngine, VllmEngine, make_engine
from .prompts import read_prompt_file

__all__ = ["dump_from_servers", "ServerDumpResult", "HttpClient", "ServerError", "Stopped", "check_url",
           "check_timeout", "read_prompt_file", "VllmEngine",
           "SglangEngine", "ENGINES", "Scored", "make_engine", "prompt_seed", "staging_dir", "union_bounds",
           "LOGPROBS_MODES"]

"""The wire formats of running inference servers (vLLM's OpenAI-compatible server, SGLang).

Standard library HTTP only (:class:`HttpClient`: timeouts, bounded concurrency, retries with back-off on transient
errors); the wire formats are in :mod:`.engines`.  The pipeline that builds a dump from them, with its tight-bounds
report (an analysis), is :func:`fastspec.server_dump.dump_from_servers`: this package, as all of :mod:`fastspec.io`,
imports no analysis.
"""
from __future__ import annotations

from .client import HttpClient, ServerError, Stopped, check_timeout, check_url
from .engines import ENGINES, Scored, SglangEngine, VllmEngine, make_engine
from .prompts import read_prompt_file

__all__ = ["HttpClient", "ServerError", "Stopped", "check_url", "check_timeout", "read_prompt_file", "VllmEngine",
           "SglangEngine", "ENGINES", "Scored", "make_engine"]

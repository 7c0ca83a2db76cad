"""A sparse dump from running servers: :func:`dump_from_servers` (the pipeline of ``fastspec dump-server``; the
wire formats it speaks are in :mod:`fastspec.io.servers`, the tight-bounds report it writes is an analysis, so the
pipeline sits above both).

For prompt i the target server samples a continuation (seed :func:`prompt_seed` (seed, i), at most
``max_new_tokens`` tokens; exactly that many with ``ignore_eos``); then the target and every draft server score
prompt + continuation teacher-forced and return the top-k logprobs of every continuation position.  Row t of a
model is the distribution that predicts continuation token t, as in every dump
(``docs/reference/dump-format.md``).  With an engine that returns the logprobs of given ids (SGLang's
``token_ids_logprob``) each side also scores the other's
top-k ids: both probabilities are then known on the union of the lists and the acceptance interval shrinks (the
report says by how much); vLLM has no such field.  Those logprobs go into the dump as each role's
``extra_ids`` / ``extra_logprobs`` (per position, the other side's top-k ids outside the role's own), so
``simulate`` and ``inspect`` use the tighter interval (:mod:`fastspec.acceptance`).

Resumable: each finished prompt is one JSON file in the staging directory ``.fastspec-servers-<out name>.partial``
next to
the output, written atomically (temporary file + rename); a rerun with the same arguments and the same served
models skips the prompts already there, a rerun with other arguments is refused.  The dump itself (with
:func:`fastspec.io.save_dump`, so it is validated like every dump) carries what an analysis needs: the top-k
lists, each sampled token's own logprob per model (``<role>_sampled_logprob``), the extra known logprobs (tight
mode), ``logprobs_mode`` and ``provenance`` (engine, served model name, version and url per role, k asked and
received, seed).  The side file ``<out>.servers.json`` is the run's report (the same provenance, the prompt
seeds, warnings, the tight-bounds shrink); nothing reads it back.  Both are written only once every prompt is
done, each renamed into place: a file at ``out`` is always complete.  The staging directory is removed after
that.
The page that explains it: ``docs/guide/server-dumps.md``.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import signal
import threading
import warnings
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from .acceptance import dump_acceptance
from .errors import InvalidInput, InvalidType, check_int
from .io import open_dump
from .io.files import atomic_write_text
from .io.format import LOGPROBS_MODES, check_draft_name
from .io.save import save_dump
from .io.servers.client import HttpClient, ServerError, check_timeout
from .io.servers.engines import make_engine
from .io.servers.records import BadRecord, check_record
from .params import SamplingParams

__all__ = ["dump_from_servers", "ServerDumpResult", "prompt_seed", "staging_dir", "LOGPROBS_MODES",
           "union_bounds"]

STAGING_PREFIX = ".fastspec-servers-"
SIDE_SUFFIX = ".servers.json"
_FORMAT = 1


@dataclass
class ServerDumpResult:
    out: str
    side_file: str
    prompts: int
    resumed: int            # prompts taken from an earlier run's staging directory
    k_received: dict        # model -> k
    servers: dict           # model -> {engine, model, version, url}
    tight_bounds: dict | None
    warnings: list


def prompt_seed(seed: int, i: int) -> int:
    """The sampling seed of prompt i (a non-negative 31-bit integer, a pure function of (seed, i))."""
    h = hashlib.sha256(f"fastspec-servers:{int(seed)}:{int(i)}".encode()).digest()
    return int.from_bytes(h[:4], "little") & 0x7FFFFFFF


def staging_dir(out: str) -> str:
    """The staging directory of ``out``, next to it, written the way ``out`` was (relative stays relative)."""
    out = os.path.normpath(os.fspath(out))
    return os.path.join(os.path.dirname(out), STAGING_PREFIX + os.path.basename(out) + ".partial")


def _check_out(out) -> str:
    out = os.fspath(out)
    parent = os.path.dirname(os.path.normpath(out))
    if not os.path.isdir(parent or "."):
        raise InvalidInput(f"out {out!r}: directory {parent} does not exist")
    base = os.path.basename(os.path.normpath(out))
    if base.startswith("."):
        raise InvalidInput(f"out {out!r}: a name starting with '.' is reserved for temporary files")
    if os.path.exists(out):
        raise InvalidInput(f"out {out!r} exists; remove it or choose a new path")
    return out


def _check_sampling(sampling) -> SamplingParams:
    if sampling is None:
        return SamplingParams()
    if not isinstance(sampling, SamplingParams):
        raise InvalidType(f"sampling must be a fastspec.SamplingParams or None (temperature 1, no filters), got "
                          f"{type(sampling).__name__}", argument="sampling")
    return sampling


def _check_prompts(prompts) -> list:
    if not isinstance(prompts, Sequence) or isinstance(prompts, (str, bytes)) or not prompts:
        raise InvalidInput("prompts must be a non-empty list of token-id lists")
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, (str, bytes)) or not isinstance(p, Sequence) or not p:
            raise InvalidInput(f"prompts[{i}] must be a non-empty list of token ids")
        ids = []
        for t in p:
            if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= int(t) < 2 ** 31:
                raise InvalidInput(f"prompts[{i}]: {t!r} is not a token id (an integer in [0, 2**31))")
            ids.append(int(t))
        out.append(ids)
    return out


def union_bounds(p_ids, p_lps, p_extra, q_ids, q_lps, q_extra):
    """[lower, upper] of alpha = sum_v min(p, q) for one position when p is known on its top-k plus ``p_extra``
    ({id: logprob}) and q likewise; exact on every id known on both sides; unknown ids bounded by the mass left.
    Returns None when some id of the union is known on one side only (then use the top-k bounds)."""
    p = {int(t): math.exp(lp) for t, lp in zip(p_ids, p_lps, strict=True)}
    p.update({int(t): math.exp(lp) for t, lp in p_extra.items()})
    q = {int(t): math.exp(lp) for t, lp in zip(q_ids, q_lps, strict=True)}
    q.update({int(t): math.exp(lp) for t, lp in q_extra.items()})
    union = set(int(t) for t in p_ids) | set(int(t) for t in q_ids)
    if not union <= set(p) or not union <= set(q):
        return None
    lo = sum(min(p[v], q[v]) for v in union)
    rest_p = max(0.0, 1.0 - sum(p[v] for v in union))
    rest_q = max(0.0, 1.0 - sum(q[v] for v in union))
    return min(1.0, lo), min(1.0, lo + min(rest_p, rest_q))


class _Run:
    def __init__(self, engines: dict, prompts, max_new_tokens, sampling, seed, ignore_eos, k, tight, staging):
        self.engines = engines
        self.prompts = prompts
        self.max_new_tokens = max_new_tokens
        self.sampling = sampling
        self.seed = seed
        self.ignore_eos = ignore_eos
        self.k = k
        self.tight = tight
        self.staging = staging
        self.caps: dict = {}
        self.lock = threading.Lock()

    def one(self, i: int) -> dict:
        prompt = self.prompts[i]
        P = len(prompt)
        cont = self.engines["target"].generate(prompt, self.max_new_tokens, self.sampling, prompt_seed(self.seed, i),
                                               self.ignore_eos, what=f"prompt {i}: sample the continuation")
        if len(cont) > self.max_new_tokens:
            raise ServerError(f"{self.engines['target'].client.where('generate')} (prompt {i}): {len(cont)} tokens "
                              f"returned for max {self.max_new_tokens}")
        if self.ignore_eos and len(cont) != self.max_new_tokens:
            raise ServerError(f"{self.engines['target'].client.where('generate')} (prompt {i}): {len(cont)} tokens "
                              f"with ignore_eos, expected {self.max_new_tokens}")
        seq = prompt + cont
        scored = {}
        for role, eng in self.engines.items():
            scored[role] = eng.score(seq, P, self.k, None, what=f"prompt {i}: score {len(cont)} positions")
            with self.lock:
                if eng.k_cap is not None:
                    self.caps[role] = eng.k_cap
        if self.tight:
            t_ids = {int(x) for row in scored["target"].ids for x in row}
            for role, eng in self.engines.items():
                if role == "target":
                    want = {int(x) for r2, s in scored.items() if r2 != "target" for row in s.ids for x in row}
                else:
                    want = t_ids
                got = eng.score(seq, P, 1, sorted(want), what=f"prompt {i}: logprobs of the other side's ids")
                scored[role].extra = got.extra
        rec = {"i": i, "continuation": cont, "models": {}}
        for role, s in scored.items():
            rec["models"][role] = {"ids": s.ids, "logprobs": s.logprobs, "own": s.own,
                                   "extra": [{str(t): v for t, v in e.items()} for e in s.extra] if self.tight
                                   else None}
        try:   # what the dump will store passes every check of save_dump: else nothing is staged
            self.check(rec, i)
        except BadRecord as exc:
            c = self.engines[exc.role or "target"].client
            raise ServerError(f"{c.name} server {c.base_url}: prompt {i}: {exc}") from None
        atomic_write_text(os.path.join(self.staging, f"prompt-{i:06d}.json"), json.dumps(rec, allow_nan=False))
        return rec

    def check(self, rec, i: int) -> None:
        check_record(rec, i, list(self.engines), max_new_tokens=self.max_new_tokens, ignore_eos=self.ignore_eos,
                     tight=self.tight)


def dump_from_servers(out, target_url: str, drafts: Mapping[str, str] | None = None, prompts=(), *,
                      max_new_tokens: int = 128, sampling: SamplingParams | None = None, seed: int = 0,
                      ignore_eos: bool = False, top_logprobs: int = 20, engine: str = "vllm",
                      logprobs_mode: str = "raw", tight: bool | None = None, concurrency: int = 4,
                      timeout: float = 600.0, retries: int = 3, backoff: float = 0.5,
                      progress: Callable[[int], None] | None = None, api_key: str | None = None,
                      compressed: bool = True, models: Mapping[str, str] | None = None) -> ServerDumpResult:
    """Build a sparse dump at ``out`` (``.npz``, or a directory of ``.npy``) from running servers.

    ``target_url``: the target's server; ``drafts``: {name: url}; ``prompts``: lists of token ids; ``engine``:
    ``"vllm"`` (OpenAI-compatible ``/v1/completions``) or ``"sglang"`` (``/generate``), for every server;
    ``sampling``: the :class:`fastspec.SamplingParams` of the continuation (recorded; None: temperature 1, no
    filters); ``top_logprobs``: k asked of
    every server (a server that caps it: warning, the k received is recorded); ``logprobs_mode``: what the servers
    return, ``"raw"`` (vLLM's default: logprobs before temperature and truncation) or ``"processed"``; raw logprobs
    are accepted only where they equal the sampled distribution (temperature 0 or 1, no top-k/top-p/min-p).
    ``tight``: also fetch the other side's top-k ids (default: when the engine can, i.e. SGLang).  ``concurrency``
    prompts in flight (each server sees at most that many requests at once); ``timeout``: a deadline in seconds
    for each request as a whole, in (0, 86400]; ``retries`` on transient errors; ``seed`` in [0, 2**63);
    ``models``: {"target" or a draft name: served model name} where a server serves several (default: the first
    it lists; a name it does not serve is a :class:`ServerError`).
    Each prompt's answers are checked when they arrive (:func:`.records.check_record`: every rule of a dump) and
    staged only if they pass; a staged prompt that fails the check on a rerun (a corrupt file, an answer staged by
    an older version) is fetched again, with a warning naming the file.
    Errors: :class:`fastspec.errors.InvalidInput` for bad arguments (a different staged run, tokenizers that
    differ), :class:`ServerError` for a server that fails or answers badly, naming the server and the prompt
    (completed prompts stay staged for the resume).  On KeyboardInterrupt every request and retry stops at once;
    the finished prompts stay staged.
    """
    out = _check_out(out)
    drafts = dict(drafts or {})
    for name in drafts:
        check_draft_name(name, "drafts: name")
    prompts = _check_prompts(prompts)
    check_int("max_new_tokens", max_new_tokens, 1, 1 << 20)
    check_int("top_logprobs", top_logprobs, 1, 1 << 16)
    check_int("concurrency", concurrency, 1, 1024)
    check_int("retries", retries, 0, 100)
    timeout = check_timeout(timeout)
    check_int("seed", seed, 0, 2 ** 63 - 1)
    sampling = _check_sampling(sampling)
    if logprobs_mode not in LOGPROBS_MODES:
        raise InvalidInput(f"logprobs_mode {logprobs_mode!r}: use raw or processed")
    if logprobs_mode == "raw" and (sampling.temperature not in (0.0, 1.0) or sampling.filtered):
        raise InvalidInput("raw logprobs (vLLM's default --logprobs-mode raw_logprobs) are the distribution "
                           "sampled from only at temperature 0 or 1 without top-k/top-p/min-p; start the servers "
                           "with --logprobs-mode processed_logprobs and pass logprobs_mode='processed', or sample "
                           "at temperature 1 (or 0)")
    stop = threading.Event()   # set on an interrupt: no new request, no retry, requests in flight cut off
    clients = {"target": HttpClient("target", target_url, timeout=timeout, retries=retries, backoff=backoff,
                                    concurrency=concurrency, api_key=api_key, stop=stop)}
    for name, url in drafts.items():
        clients[name] = HttpClient(f"draft {name!r}", url, timeout=timeout, retries=retries, backoff=backoff,
                                   concurrency=concurrency, api_key=api_key, stop=stop)
    models = dict(models or {})
    unknown = set(models) - set(clients)
    if unknown:
        raise InvalidInput(f"models: {sorted(unknown)} name no server (use 'target' or a draft's name)")
    engines = {role: make_engine(engine, c, models.get(role)) for role, c in clients.items()}
    can_tight = all(e.can_score_ids for e in engines.values())
    if tight is None:
        tight = can_tight and bool(drafts) and sampling.temperature != 0.0
    elif tight and not can_tight:
        raise InvalidInput(f"tight bounds need the logprobs of given ids, which the {engine} server does not return "
                           "(SGLang's token_ids_logprob does)")
    # servers: names, versions, the same tokenizer
    servers = {}
    for role, e in engines.items():
        info = e.info()
        info["url"] = e.client.base_url
        servers[role] = info
    probes = {role: e.vocab_probe() for role, e in engines.items()}
    for role, pr in probes.items():
        if role != "target" and pr != probes["target"]:
            raise InvalidInput(f"draft {role!r} ({servers[role]['model']!r} at {servers[role]['url']}) and the "
                               f"target ({servers['target']['model']!r} at {servers['target']['url']}) tokenize "
                               "differently: "
                               "a dump needs one vocabulary")
    # the staging directory and the resume
    staging = staging_dir(out)
    digest = hashlib.sha256(json.dumps(prompts).encode()).hexdigest()
    args = {"format": _FORMAT, "engine": engine, "drafts": sorted(drafts), "prompts_sha256": digest,
            "prompts": len(prompts), "max_new_tokens": int(max_new_tokens), "sampling": sampling.as_dict(),
            "seed": int(seed),
            "ignore_eos": bool(ignore_eos), "top_logprobs": int(top_logprobs), "logprobs_mode": logprobs_mode,
            "tight": bool(tight), "models": {r: servers[r]["model"] for r in servers},
            "versions": {r: servers[r]["version"] for r in servers}}
    args_path = os.path.join(staging, "args.json")
    if os.path.isdir(staging) and os.path.exists(args_path):
        try:
            with open(args_path, encoding="utf-8") as fh:
                before = json.load(fh)
        except (OSError, ValueError, RecursionError):
            before = None
        if not isinstance(before, dict):
            before = None
        if before != args:
            diff = sorted(k for k in set(args) | set(before or {}) if (before or {}).get(k) != args.get(k))
            raise InvalidInput(f"{staging} holds an unfinished run with other arguments or servers "
                               f"({', '.join(diff) or 'unreadable args.json'} differ); rerun it with the same "
                               "arguments to finish it, or remove the directory to start over")
    else:
        os.makedirs(staging, exist_ok=True)
        atomic_write_text(args_path, json.dumps(args, indent=1, sort_keys=True))
    run = _Run(engines, prompts, int(max_new_tokens), sampling, int(seed), bool(ignore_eos), int(top_logprobs),
               bool(tight), staging)
    done, refetch = _staged(run, staging, len(prompts))
    resumed = len(done)
    if progress and resumed:
        progress(resumed)
    todo = [i for i in range(len(prompts)) if i not in done]
    if todo:
        pool = ThreadPoolExecutor(max_workers=min(concurrency, len(todo)))
        futures = {pool.submit(run.one, i): i for i in todo}
        pending = set(futures)
        interrupted = True
        try:
            with _DeferredInterrupt() as signalled:
                while pending:
                    finished, pending = wait(pending, timeout=_INTERRUPT_POLL_S, return_when=FIRST_COMPLETED)
                    if signalled:
                        raise KeyboardInterrupt
                    failed = None
                    for f in sorted(finished, key=futures.get):
                        if f.exception() is not None:
                            failed = failed or f.exception()
                        else:
                            done[futures[f]] = f.result()
                            if progress:
                                progress(1)
                    if failed is not None:
                        interrupted = False
                        raise failed
            interrupted = False
        finally:
            # on a failure nothing new starts; requests in flight finish (each within its deadline) and their
            # prompts are staged for the resume.  On an interrupt (Ctrl-C, SIGTERM) the stop event also ends
            # retries, back-off waits and requests in flight at once: only finished prompts stay staged.
            if interrupted:
                stop.set()
            for f in pending:
                f.cancel()
            pool.shutdown(wait=True, cancel_futures=True)
    return _assemble(out, staging, prompts, done, servers, args, run.caps, resumed, compressed, refetch)


_INTERRUPT_POLL_S = 0.1


class _DeferredInterrupt:
    """While active (main thread only), Ctrl-C -- and SIGTERM where a Python handler already takes it, as the CLI
    does -- only marks the interrupt (the context value turns true); the waiting loop polls it and raises
    KeyboardInterrupt at a safe point.  Raised asynchronously, it could land inside
    ``concurrent.futures.wait`` while it holds the futures' locks, and a worker finishing its request would then
    wait on such a lock forever (the pool's shutdown with it)."""

    def __init__(self):
        self.hit = False
        self._previous = {}

    def __bool__(self) -> bool:
        return self.hit

    def _mark(self, _signum, _frame):
        self.hit = True

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, getattr(signal, "SIGTERM", None)):
                if sig is None:
                    continue
                current = signal.getsignal(sig)
                if sig == signal.SIGINT and current is signal.default_int_handler or \
                        sig != signal.SIGINT and callable(current):
                    self._previous[sig] = signal.signal(sig, self._mark)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        return False


def _staged(run: _Run, staging: str, n: int):
    """({i: record} of the valid staged prompts, [notes]): a staged file that cannot be read or fails the record
    check is removed (the prompt is fetched again) and named in a note; one that cannot be removed is an
    InvalidInput naming it and the command that clears it."""
    import shlex

    done, notes = {}, []
    for i in range(n):
        path = os.path.join(staging, f"prompt-{i:06d}.json")
        if not os.path.lexists(path):
            continue
        try:
            with open(path, encoding="utf-8") as fh:
                rec = json.load(fh)
            run.check(rec, i)
            done[i] = rec
            continue
        except (OSError, ValueError, RecursionError) as exc:   # JSONDecodeError, UnicodeDecodeError, BadRecord
            why = str(exc) if isinstance(exc, BadRecord) else (
                f"not valid JSON ({exc.msg})" if isinstance(exc, json.JSONDecodeError) else
                " ".join(f"{type(exc).__name__}: {exc}".split())[:160])
        try:
            os.unlink(path)
        except OSError as exc:
            raise InvalidInput(f"staged prompt file {path} is unusable ({why}) and cannot be removed "
                               f"({exc.strerror}); remove it with: rm -r {shlex.quote(path)}") from None
        notes.append(f"staged prompt file {path} was unusable ({why}): prompt {i} fetched again")
    return done, notes


def _assemble(out, staging, prompts, done, servers, args, caps, resumed, compressed, refetch=()) -> ServerDumpResult:
    N, T = len(prompts), args["max_new_tokens"]
    roles = list(servers)
    notes = list(refetch)
    k_rec = {}
    for role in roles:
        k = min(len(row) for i in range(N) for row in done[i]["models"][role]["ids"])
        k_rec[role] = k
        if k < args["top_logprobs"]:
            why = f"the server caps it at {caps[role]}" if role in caps else "the server returned fewer"
            notes.append(f"{'target' if role == 'target' else 'draft ' + repr(role)} "
                         f"({servers[role]['url']}): top-{args['top_logprobs']} logprobs asked, {k} received "
                         f"({why}); the dump records k = {k}")
    for n in notes:
        warnings.warn(n, stacklevel=3)
    lengths = np.array([len(done[i]["continuation"]) for i in range(N)], dtype=np.int64)
    tokens = np.zeros((N, T), dtype=np.int64)
    P = max(len(p) for p in prompts)
    prompt_tokens = np.zeros((N, P), dtype=np.int64)
    for i in range(N):
        tokens[i, :lengths[i]] = done[i]["continuation"]
        prompt_tokens[i, :len(prompts[i])] = prompts[i]
    arrays = {}
    own = {}
    for role in roles:
        k = k_rec[role]
        ids = np.tile(np.arange(k, dtype=np.int32), (N, T, 1))
        lps = np.full((N, T, k), -math.log(k) if k > 1 else 0.0, dtype=np.float32)
        own[role] = np.zeros((N, T), dtype=np.float32)
        for i in range(N):
            m = done[i]["models"][role]
            L = int(lengths[i])
            ids[i, :L] = np.array([row[:k] for row in m["ids"]], dtype=np.int32)
            lps[i, :L] = np.array([row[:k] for row in m["logprobs"]], dtype=np.float32)
            own[role][i, :L] = np.array(m["own"], dtype=np.float32)
        arrays[role] = (ids, lps)
    extras = _extra_arrays(done, roles, arrays, lengths) if args["tight"] and len(roles) > 1 else None
    s = args["sampling"]
    provenance = {"source": "fastspec dump-server", "engine": args["engine"], "servers": servers,
                  "logprobs_mode": args["logprobs_mode"], "top_logprobs_asked": args["top_logprobs"],
                  "k_received": k_rec, "seed": args["seed"], "tight": args["tight"]}
    name = os.path.basename(os.path.abspath(out))
    tmp = os.path.join(staging, name)
    if os.path.exists(tmp):
        shutil.rmtree(tmp) if os.path.isdir(tmp) else os.unlink(tmp)
    save_dump(tmp, arrays["target"], {r: arrays[r] for r in roles if r != "target"}, tokens=tokens,
              lengths=lengths, temperature=s["temperature"], top_k=s["top_k"], top_p=s["top_p"], min_p=s["min_p"],
              prompt_tokens=prompt_tokens, prompt_lengths=np.array([len(p) for p in prompts], dtype=np.int64),
              ignore_eos=args["ignore_eos"], compressed=compressed, sampled_logprobs=own, extras=extras,
              logprobs_mode=args["logprobs_mode"], provenance=provenance)
    tight = _tight_report(tmp, roles) if args["tight"] and len(roles) > 1 else None
    side = {"format": _FORMAT, "dump": name, "servers": servers, "engine": args["engine"],
            "logprobs_mode": args["logprobs_mode"], "top_logprobs_asked": args["top_logprobs"],
            "k_received": k_rec, "sampling": s, "seed": args["seed"], "ignore_eos": args["ignore_eos"],
            "prompt_seeds": [prompt_seed(args["seed"], i) for i in range(N)],
            "in_the_dump": "top-k lists, <role>_sampled_logprob, <role>_extra_ids/_extra_logprobs (tight), "
                           "logprobs_mode, provenance",
            "tight_bounds": tight,
            "tight_bounds_note": None if args["tight"] else
            (f"not fetched: the {args['engine']} server cannot return the logprobs of given ids"
             if args["engine"] == "vllm" else "not requested"),
            "warnings": notes}
    side_path = os.fspath(out) + SIDE_SUFFIX
    atomic_write_text(side_path, json.dumps(side))
    os.replace(tmp, out)   # the dump appears complete or not at all
    shutil.rmtree(staging, ignore_errors=True)
    return ServerDumpResult(out=out, side_file=side_path, prompts=N, resumed=resumed, k_received=k_rec,
                            servers=servers, tight_bounds=tight, warnings=notes)


def _extra_arrays(done, roles, arrays, lengths) -> dict:
    """{role: (ids, logprobs) [N, T, m]}: per position, the other side's top-k ids outside the role's own top-k
    with the logprobs the role's server gave them (the target: every draft's; a draft: the target's); unused
    slots (-1, -inf)."""
    N, T = arrays["target"][0].shape[:2]
    out = {}
    for role in roles:
        others = [r for r in roles if r != role] if role == "target" else ["target"]
        rows = {}
        for i in range(N):
            ext = done[i]["models"][role]["extra"] or []
            for t in range(int(lengths[i])):
                mine = {int(x) for x in arrays[role][0][i, t]}
                got = ext[t] if t < len(ext) else {}
                want = sorted({int(x) for o in others for x in arrays[o][0][i, t]} - mine)
                rows[i, t] = [(v, float(got[str(v)])) for v in want if str(v) in got]
        m = max([len(r) for r in rows.values()] + [1])
        ids = np.full((N, T, m), -1, dtype=np.int32)
        lps = np.full((N, T, m), -np.inf, dtype=np.float32)
        for (i, t), r in rows.items():
            for j, (v, lp) in enumerate(r):
                ids[i, t, j] = v
                lps[i, t, j] = lp
        out[role] = (ids, lps)
    return out


def _tight_report(path, roles) -> dict:
    """Mean alpha interval per draft from the plain top-k lists and from everything the dump knows."""
    rep = {}
    with open_dump(path) as d:
        plain = dump_acceptance(d, beyond_topk=False)
        known = dump_acceptance(d)
    for name in roles:
        if name == "target":
            continue
        a, b = plain[name], known[name]
        v = a.valid
        wk = float(np.mean(a.upper[v] - a.lower[v]))
        wu = float(np.mean(b.upper[v] - b.lower[v]))
        rep[name] = {"alpha_topk": [float(a.lower[v].mean()), float(a.upper[v].mean())],
                     "alpha_union": [float(b.lower[v].mean()), float(b.upper[v].mean())],
                     "width_topk": wk, "width_union": wu,
                     "shrink": None if wk == 0 else 1.0 - wu / wk}
    return rep

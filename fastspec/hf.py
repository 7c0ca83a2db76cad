"""Real models (optional extra ``fastspec[hf]``): logit dumps and a real speculative decoding loop on the CPU.

This module imports torch and transformers; ``fastspec/__init__.py`` never imports it, so the core library
works without them.  Everything loads from local files only (``local_files_only=True``): a Hugging Face model
directory, a GGUF file (``from_pretrained(dir, gguf_file=name)``, dequantized to float32) or, for drafts, a
self-speculative early-exit draft ``exitL`` derived from the target (its first L decoder layers, then the
target's final norm and LM head, weights shared, no copy).

* :func:`speculative_generate` -- standard speculative sampling with real models.  The draft proposes k
  tokens autoregressively with its own KV cache, sampled from exactly the processed draft distribution
  (``fastspec.probabilities`` on the raw logits, seeded inverse CDF); the target scores them in one forward
  pass; :func:`fastspec.verify_logits` decides (it receives the raw float32 logits and applies the sampling
  parameters itself, identically to p and q); both caches are rolled back to the accepted prefix
  (``Cache.crop(-n)``, which removes the last n cached positions).  The emitted token is not cached: it is
  fed at the next step together with anything else not yet in a cache.
* :func:`dump_logits` -- for each prompt, sample a continuation from the target, then run every model
  teacher-forced over prompt + continuation and record, for each generated position t, the logits that
  predict token t (dense float16) or the top-k processed log-probabilities (sparse), in the dump format of
  ``data/README.md`` (written with :func:`fastspec.io.save_dump`, so validation is shared).
* :func:`measure` -- run the real loop over prompts for several drafts and k and report measured mean
  acceptance length with a 95% CI (prompts as clusters).

Conventions match :mod:`fastspec.simulate`: a step drafts ``min(k, max_new_tokens - generated - 1)`` tokens;
a step that would draft nothing is a plain target step and is not counted; mean acceptance length =
tokens emitted per verify step (bonus / recovered token included).
"""
from __future__ import annotations

import copy
import inspect
import json
import math
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np
import torch

from .processing import probabilities
from .verify import verify_logits

__all__ = ["load_model", "load_tokenizer", "early_exit", "check_same_tokenizer", "resolve_models", "read_prompts",
           "generate", "teacher_forced_logits", "speculative_generate", "SpecResult", "dump_logits", "measure",
           "MeasureResult", "ratio_ci"]

_EXIT_RE = re.compile(r"^exit(\d+)$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


# ---------------------------------------------------------------------------------------------- loading

def _split_spec(spec: str) -> tuple[str, dict]:
    """(directory, extra from_pretrained kwargs) for a model path: a directory or a .gguf file."""
    spec = os.fspath(spec)
    if os.path.isfile(spec) and spec.lower().endswith(".gguf"):
        return os.path.dirname(os.path.abspath(spec)), {"gguf_file": os.path.basename(spec)}
    if os.path.isdir(spec):
        return spec, {}
    if not os.path.exists(spec):
        raise ValueError(f"model {spec!r}: no such file or directory; give a local Hugging Face model directory, "
                         "a .gguf file, or (drafts only) exitL for the target's first L layers")
    raise ValueError(f"model {spec!r} is a file but not a .gguf file; give a model directory or a .gguf file")


def load_tokenizer(spec):
    """The tokenizer of a local model directory or GGUF file (no download)."""
    from transformers import AutoTokenizer

    path, kw = _split_spec(spec)
    return AutoTokenizer.from_pretrained(path, local_files_only=True, **kw)


def load_model(spec, *, dtype=torch.float32):
    """(model, tokenizer) from a local model directory or GGUF file, in eval mode, float32 by default."""
    from transformers import AutoModelForCausalLM

    path, kw = _split_spec(spec)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype, **kw)
    except TypeError:  # older transformers: torch_dtype
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, torch_dtype=dtype, **kw)
    model.eval()
    return model, load_tokenizer(spec)


def _decoder(model):
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "norm") or not hasattr(model, "lm_head"):
        raise ValueError(f"early-exit drafts need a Llama-style decoder (model.model.layers, model.model.norm, "
                         f"model.lm_head); {type(model).__name__} has no such structure")
    return inner


def early_exit(model, num_layers: int):
    """Self-speculative draft: the target's embeddings and first ``num_layers`` decoder layers, then its final
    norm and LM head (Draft & Verify, LayerSkip).  Shares every weight with ``model`` (no copy); owns its own
    KV cache when run.  ``num_layers`` must be in [1, number of layers]."""
    inner = _decoder(model)
    n = len(inner.layers)
    if isinstance(num_layers, bool) or not isinstance(num_layers, (int, np.integer)) or not 1 <= num_layers <= n:
        raise ValueError(f"exit depth {num_layers!r} is invalid: the target has {n} decoder layers; use exitL with "
                         f"1 <= L <= {n}")
    L = int(num_layers)
    cfg = copy.deepcopy(model.config)
    cfg.num_hidden_layers = L
    if getattr(cfg, "layer_types", None) is not None:
        cfg.layer_types = list(cfg.layer_types)[:L]
    new_inner = copy.copy(inner)  # shallow: same parameter tensors
    new_inner._modules = dict(inner._modules)
    new_inner._modules["layers"] = torch.nn.ModuleList(list(inner.layers)[:L])
    new_inner.config = cfg
    draft = copy.copy(model)
    draft._modules = dict(model._modules)
    draft._modules["model"] = new_inner
    draft.config = cfg
    draft.fastspec_exit_layers = L
    return draft


def check_same_tokenizer(reference, other, *, names=("target", "draft")) -> None:
    """Raise ValueError unless the two tokenizers map every token string to the same id (same vocabulary and
    special tokens): speculative decoding compares distributions over one shared vocabulary."""
    a, b = reference.get_vocab(), other.get_vocab()
    if a != b:
        only_a = sorted(set(a) - set(b))[:3]
        diff = [t for t in a if t in b and a[t] != b[t]][:3]
        detail = (f"{len(set(a) ^ set(b))} tokens are in only one of them (e.g. {only_a})" if set(a) != set(b)
                  else f"ids differ (e.g. {diff})")
        raise ValueError(f"{names[1]} does not share the tokenizer of {names[0]} ({len(a)} vs {len(b)} tokens; "
                         f"{detail}); speculative decoding needs the same vocabulary: use a draft from the same "
                         "model family")
    for attr in ("bos_token_id", "eos_token_id"):
        if getattr(reference, attr, None) != getattr(other, attr, None):
            raise ValueError(f"{names[1]} does not share the tokenizer of {names[0]}: {attr} "
                             f"{getattr(other, attr, None)} vs {getattr(reference, attr, None)}")


def resolve_models(target: str, drafts: Mapping[str, str] | Sequence[str]):
    """Load ``target`` and every draft: (target_model, tokenizer, {name: draft_model}).

    ``drafts``: mapping name -> MODEL, or a list of ``NAME=MODEL`` / ``MODEL`` strings; MODEL is a local model
    directory, a .gguf file or ``exitL``.  Drafts with another tokenizer are refused (ValueError)."""
    specs = parse_draft_specs(drafts)
    tmodel, tok = load_model(target)
    out = {}
    for name, spec in specs.items():
        m = _EXIT_RE.match(spec)
        if m:
            out[name] = early_exit(tmodel, int(m.group(1)))
            continue
        dtok = load_tokenizer(spec)
        check_same_tokenizer(tok, dtok, names=(f"target {target}", f"draft {name} ({spec})"))
        out[name], _ = load_model(spec)
        check_vocab_size(tmodel, out[name], name)
    return tmodel, tok, out


def check_vocab_size(target, draft, name="draft"):
    vt = target.get_output_embeddings().weight.shape[0]
    vd = draft.get_output_embeddings().weight.shape[0]
    if vt != vd:
        raise ValueError(f"draft {name}: its LM head has {vd} outputs but the target's has {vt}; the two models "
                         "must score the same vocabulary")


def parse_draft_specs(drafts) -> dict[str, str]:
    if isinstance(drafts, Mapping):
        items = [(str(k), str(v)) for k, v in drafts.items()]
    else:
        items = []
        for s in drafts:
            s = str(s)
            if "=" in s:
                name, spec = s.split("=", 1)
            else:
                spec = s
                name = spec if _EXIT_RE.match(spec) else os.path.splitext(os.path.basename(spec.rstrip("/")))[0]
            items.append((name.strip(), spec.strip()))
    if not items:
        raise ValueError("give at least one draft: --draft NAME=MODEL (MODEL: model directory, .gguf file or exitL)")
    out = {}
    for name, spec in items:
        if not _NAME_RE.match(name) or "__" in name:
            raise ValueError(f"draft name {name!r} must be letters, digits, '_', '.', '-' (no '__'); "
                             "write --draft NAME=MODEL")
        if name in out:
            raise ValueError(f"draft name {name!r} is given twice; names must be distinct")
        if not spec:
            raise ValueError(f"draft {name!r} has an empty MODEL; write --draft NAME=MODEL")
        out[name] = spec
    return out


def read_prompts(path, tokenizer) -> list[list[int]]:
    """Token ids of each prompt in ``path``.

    A ``.jsonl`` file holds one JSON value per line: a list of chat messages ``[{"role", "content"}, ...]``,
    an object ``{"messages": [...]}`` or ``{"prompt": "text"}``, or a string.  Any other file is plain text, one
    prompt per non-blank line.  When the tokenizer has a chat template, each prompt becomes a conversation
    (a text prompt is one user message) and the template is applied with the generation prompt."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"prompts file {path!r}: no such file")
    with open(path, encoding="utf-8") as fh:
        lines = [(i + 1, ln.rstrip("\n")) for i, ln in enumerate(fh)]
    lines = [(i, ln) for i, ln in lines if ln.strip()]
    if not lines:
        raise ValueError(f"prompts file {path!r} holds no prompts; write one prompt per line")
    items = []
    for i, ln in lines:
        if path.endswith(".jsonl"):
            try:
                obj = json.loads(ln)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{i}: not valid JSON ({exc.msg}); a .jsonl file holds one JSON value "
                                 "per line") from None
            if isinstance(obj, dict) and "messages" in obj:
                obj = obj["messages"]
            elif isinstance(obj, dict) and "prompt" in obj:
                obj = obj["prompt"]
            if isinstance(obj, list):
                if not obj or not all(isinstance(m, dict) and "role" in m and "content" in m for m in obj):
                    raise ValueError(f"{path}:{i}: chat messages must be a non-empty list of "
                                     "{\"role\": ..., \"content\": ...} objects")
            elif not isinstance(obj, str):
                raise ValueError(f"{path}:{i}: expected chat messages, {{\"messages\": [...]}}, "
                                 "{\"prompt\": \"...\"} or a string")
            items.append((i, obj))
        else:
            items.append((i, ln))
    template = getattr(tokenizer, "chat_template", None)
    out = []
    for i, obj in items:
        if template:
            msgs = obj if isinstance(obj, list) else [{"role": "user", "content": obj}]
            text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        else:
            text = obj if isinstance(obj, str) else "\n".join(f"{m['role']}: {m['content']}" for m in obj)
            ids = tokenizer(text)["input_ids"]
        if not ids:
            raise ValueError(f"{path}:{i}: the prompt tokenizes to nothing")
        out.append([int(t) for t in ids])
    return out


def eos_ids(model, tokenizer=None) -> tuple[int, ...]:
    """End-of-sequence ids: the generation config's eos_token_id (int or list), else the tokenizer's."""
    ids = []
    gc = getattr(model, "generation_config", None)
    for src in (getattr(gc, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None) if tokenizer else None):
        if src is None:
            continue
        ids.extend([src] if isinstance(src, int) else list(src))
        if ids:
            break
    return tuple(int(i) for i in dict.fromkeys(ids))


# ---------------------------------------------------------------------------------------------- forwards

def _cache_kw(model) -> str:
    """Name of the cache argument of ``model.forward`` ('cache' in transformers >= 5.x, else 'past_key_values')."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _new_cache(model):
    from transformers import DynamicCache

    try:
        return DynamicCache(config=model.config)
    except TypeError:
        return DynamicCache()


def _crop(cache, length: int) -> None:
    """Roll ``cache`` back to its first ``length`` positions (a negative crop removes that many; this works with
    both the old absolute and the new relative ``crop`` semantics)."""
    cur = cache.get_seq_length()
    if length < cur:
        cache.crop(-(cur - length))


class _Runner:
    """One model plus its KV cache: feeds the tokens the cache has not seen and returns the last n logits."""

    def __init__(self, model, use_cache: bool = True):
        self.model = model
        self.use_cache = use_cache
        self.kw = _cache_kw(model)
        self.keep = "logits_to_keep" in inspect.signature(model.forward).parameters
        self.cache = _new_cache(model) if use_cache else None
        self.length = 0  # positions in the cache

    def logits(self, seq: Sequence[int], n: int) -> np.ndarray:
        """float32 [n, V]: logits at the last n positions of ``seq`` (the cache must hold a prefix of seq)."""
        if self.use_cache:
            new = list(seq[self.length:])
            if len(new) < n:
                raise RuntimeError(f"internal: {len(new)} uncached tokens but {n} logits asked for")
            kwargs = {self.kw: self.cache, "use_cache": True}
        else:
            new = list(seq)
            kwargs = {"use_cache": False}
        if self.keep:
            kwargs["logits_to_keep"] = n
        ids = torch.tensor([new], dtype=torch.long)
        out = self.model(ids, **kwargs)
        if self.use_cache:
            self.length = len(seq)
            got = self.cache.get_seq_length()
            if got != self.length:
                raise RuntimeError(f"internal: cache holds {got} positions, expected {self.length}")
        return out.logits[0, -n:].to(torch.float32).numpy()

    def rollback(self, length: int) -> None:
        if self.use_cache and length < self.length:
            _crop(self.cache, length)
            self.length = length


def _sample(logits_row: np.ndarray, u: float, params) -> int:
    """A token from the processed distribution of one raw logits row, by inverse CDF with the uniform u."""
    t, tk, tp, mp = params
    q = probabilities(logits_row[None], temperature=t, top_k=tk, top_p=tp, min_p=mp)[0]
    cum = np.cumsum(q)
    i = int(np.searchsorted(cum, u * cum[-1], side="right"))
    i = min(i, len(q) - 1)
    while q[i] <= 0:  # never a zero-probability token (u*total on a boundary before a zero run / end)
        i -= 1
    return i


def _params(temperature, top_k, top_p, min_p):
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature = {temperature!r} is invalid: use a number >= 0 (0 means greedy)")
    if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 0:
        raise ValueError(f"top_k = {top_k!r} is invalid: use 0 (disabled) or a positive count")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p = {top_p!r} is invalid: use a value in (0, 1]")
    if not 0 <= min_p < 1:
        raise ValueError(f"min_p = {min_p!r} is invalid: use a value in [0, 1)")
    return float(temperature), int(top_k), float(top_p), float(min_p)


def _prompt_ids(input_ids) -> list[int]:
    if isinstance(input_ids, torch.Tensor):
        input_ids = input_ids.detach().cpu().numpy()
    a = np.asarray(input_ids)
    if a.ndim == 2 and a.shape[0] == 1:
        a = a[0]
    if a.ndim != 1 or a.size == 0 or not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"input_ids must be a non-empty 1-D sequence of token ids (or shape [1, n]), got shape "
                         f"{list(a.shape)} dtype {a.dtype}")
    return [int(t) for t in a]


def _check_max_new(max_new_tokens):
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens = {max_new_tokens!r} is invalid: use an integer >= 1")
    return int(max_new_tokens)


@torch.inference_mode()
def generate(model, input_ids, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=0, max_new_tokens=128,
             eos_token_id=None, use_cache=True) -> np.ndarray:
    """Plain autoregressive sampling from ``model`` (the reference the speculative loop is compared with).

    Token i is drawn from ``fastspec.probabilities(logits)`` by inverse CDF with the i-th uniform of
    ``np.random.default_rng(seed)``; temperature 0 is greedy.  Stops after an EOS token (included).
    Returns int64 [n] generated tokens."""
    params = _params(temperature, top_k, top_p, min_p)
    seq = _prompt_ids(input_ids)
    n_new = _check_max_new(max_new_tokens)
    eos = _eos_set(eos_token_id)
    rng = np.random.default_rng(seed)
    run = _Runner(model, use_cache)
    out = []
    for _ in range(n_new):
        lg = run.logits(seq, 1)[0]
        x = _sample(lg, float(rng.random()), params)
        seq.append(x)
        out.append(x)
        if x in eos:
            break
    return np.asarray(out, dtype=np.int64)


def _eos_set(eos_token_id):
    if eos_token_id is None:
        return frozenset()
    if isinstance(eos_token_id, (int, np.integer)):
        return frozenset([int(eos_token_id)])
    return frozenset(int(i) for i in eos_token_id)


@torch.inference_mode()
def teacher_forced_logits(model, prompt_ids, continuation) -> np.ndarray:
    """float32 [T, V]: row t is the logits ``model`` gives for continuation token t given prompt + tokens < t
    (one forward pass, no cache)."""
    prompt = _prompt_ids(prompt_ids)
    cont = [int(t) for t in np.asarray(continuation).reshape(-1)]
    if not cont:
        raise ValueError("continuation is empty")
    run = _Runner(model, use_cache=False)
    return run.logits(prompt + cont[:-1], len(cont))


# ---------------------------------------------------------------------------------------------- the loop

@dataclass
class SpecResult:
    """What one :func:`speculative_generate` run produced and measured.

    tokens: int64 [n] generated tokens (EOS included if reached).  verify_steps: steps that drafted >= 1 token;
    plain_steps: target-only steps (nothing left to draft).  drafted / accepted: totals over verify steps;
    emitted: tokens produced by verify steps; accepted_per_step: int64 [verify_steps]; per_position_accepted:
    int64 [k], steps whose draft j was accepted.  Times in seconds (draft forwards + draft sampling / target
    forwards / verify_logits + cache rollback / whole call)."""

    tokens: np.ndarray
    k: int
    verify_steps: int
    plain_steps: int
    drafted: int
    accepted: int
    emitted: int
    accepted_per_step: np.ndarray
    per_position_accepted: np.ndarray
    draft_s: float
    target_s: float
    verify_s: float
    total_s: float
    trace: list | None = None

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens emitted per verify step (the bonus / recovered token included)."""
        return self.emitted / self.verify_steps if self.verify_steps else float("nan")

    @property
    def draft_acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else float("nan")

    @property
    def per_position_acceptance(self) -> np.ndarray:
        """Unconditional per-position acceptance (vLLM): steps whose draft j was accepted / verify steps."""
        return self.per_position_accepted / max(self.verify_steps, 1)

    def as_dict(self) -> dict:
        return {"tokens": self.tokens.tolist(), "k": self.k, "verify_steps": self.verify_steps,
                "plain_steps": self.plain_steps, "drafted": self.drafted, "accepted": self.accepted,
                "emitted": self.emitted, "mean_acceptance_length": self.mean_acceptance_length,
                "draft_acceptance_rate": self.draft_acceptance_rate,
                "per_position_acceptance": self.per_position_acceptance.tolist(),
                "time_s": {"draft": self.draft_s, "target": self.target_s, "verify": self.verify_s,
                           "total": self.total_s}}


@torch.inference_mode()
def speculative_generate(target, draft, input_ids, k: int = 4, temperature: float = 1.0, top_k: int = 0,
                         top_p: float = 1.0, min_p: float = 0.0, seed: int = 0, max_new_tokens: int = 128, *,
                         eos_token_id=None, use_cache: bool = True, return_trace: bool = False) -> SpecResult:
    """Speculative sampling with real models; :func:`fastspec.verify_logits` decides every step.

    Per step (batch size 1): the draft proposes ``d = min(k, max_new_tokens - generated - 1)`` tokens
    autoregressively, each sampled from ``fastspec.probabilities(draft logits)`` (the same processing the
    verifier applies) by inverse CDF with a uniform from ``np.random.default_rng(seed)``; the target scores
    the d drafts plus one position in one forward pass; ``verify_logits`` (raw float32 logits, the sampling
    params, a seed drawn from the same generator) returns the accepted drafts and the recovered / bonus token;
    both KV caches are cropped to the accepted prefix (the emitted token is fed at the next step).  When
    ``d == 0`` a plain target step emits one token (``verify_logits`` with no drafts) and is not counted.
    ``use_cache=False`` recomputes every forward from the full sequence instead (the rollback reference: same
    uniforms, so the same tokens up to floating-point ties).  Stops after ``max_new_tokens`` or an EOS token.
    """
    params = _params(temperature, top_k, top_p, min_p)
    t, tk, tp, mp = params
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= 256:
        raise ValueError(f"k = {k!r} is invalid: draft length must be an integer in [1, 256]")
    k = int(k)
    n_new = _check_max_new(max_new_tokens)
    seq = _prompt_ids(input_ids)
    n_prompt = len(seq)
    eos = _eos_set(eos_token_id)
    rng = np.random.default_rng(seed)
    trun, drun = _Runner(target, use_cache), _Runner(draft, use_cache)
    steps = plain = drafted = accepted = emitted = 0
    acc_steps: list[int] = []
    pos_acc = np.zeros(k, np.int64)
    td = tt = tv = 0.0
    trace = [] if return_trace else None
    t_start = time.perf_counter()
    done = False
    while not done:
        generated = len(seq) - n_prompt
        d = min(k, n_new - generated - 1)
        n0 = len(seq)
        if d <= 0:  # plain target step: nothing left to draft
            c0 = time.perf_counter()
            tl = trun.logits(seq, 1)
            c1 = time.perf_counter()
            res = verify_logits(tl[None], None, np.zeros((1, 0), np.int64), temperature=t, top_k=tk, top_p=tp,
                                min_p=mp, seed=int(rng.integers(0, 2 ** 62)))
            trun.rollback(n0)
            tt += c1 - c0
            tv += time.perf_counter() - c1
            x = int(res.tokens[0, 0])
            seq.append(x)
            plain += 1
            if return_trace:
                trace.append({"drafts": [], "target_logits": tl, "draft_logits": None, "emitted": [x]})
            done = x in eos or len(seq) - n_prompt >= n_new
            continue
        c0 = time.perf_counter()
        props: list[int] = []
        qrows = []
        for _ in range(d):
            lg = drun.logits(seq + props, 1)[0]
            qrows.append(lg)
            props.append(_sample(lg, float(rng.random()), params))
        c1 = time.perf_counter()
        tl = trun.logits(seq + props, d + 1)
        c2 = time.perf_counter()
        q = np.stack(qrows)
        res = verify_logits(tl[None], q[None], np.asarray([props], np.int64), temperature=t, top_k=tk, top_p=tp,
                            min_p=mp, seed=int(rng.integers(0, 2 ** 62)))
        n_acc = int(res.num_accepted[0])
        out = [int(v) for v in res.tokens[0, :n_acc + 1]]
        # rollback: keep the prompt, the old tokens and the accepted drafts; the emitted token is not cached
        trun.rollback(n0 + n_acc)
        drun.rollback(n0 + n_acc)
        tv += time.perf_counter() - c2
        td += c1 - c0
        tt += c2 - c1
        for j, x in enumerate(out):
            if x in eos:
                out = out[:j + 1]
                done = True
                break
        seq.extend(out)
        steps += 1
        drafted += d
        accepted += n_acc
        emitted += len(out)
        acc_steps.append(n_acc)
        pos_acc[:n_acc] += 1
        if return_trace:
            trace.append({"drafts": props, "target_logits": tl, "draft_logits": q, "emitted": out})
        if len(seq) - n_prompt >= n_new:
            done = True
    return SpecResult(tokens=np.asarray(seq[n_prompt:], np.int64), k=k, verify_steps=steps, plain_steps=plain,
                      drafted=drafted, accepted=accepted, emitted=emitted,
                      accepted_per_step=np.asarray(acc_steps, np.int64), per_position_accepted=pos_acc,
                      draft_s=td, target_s=tt, verify_s=tv, total_s=time.perf_counter() - t_start, trace=trace)


# ---------------------------------------------------------------------------------------------- dumps

def _topk(logits: np.ndarray, kk: int, params):
    """(ids int32 [T, kk], logprobs float32 [T, kk]) of the processed distribution, largest first."""
    t, tk, tp, mp = params
    p = probabilities(logits, temperature=t, top_k=tk, top_p=tp, min_p=mp)
    kk = min(kk, p.shape[-1])
    idx = np.argpartition(-p, kk - 1, axis=-1)[:, :kk]
    pv = np.take_along_axis(p, idx, axis=-1)
    order = np.argsort(-pv, axis=-1, kind="stable")
    idx = np.take_along_axis(idx, order, axis=-1)
    pv = np.take_along_axis(pv, order, axis=-1)
    with np.errstate(divide="ignore"):
        lp = np.log(pv)
    return idx.astype(np.int32), np.minimum(lp, 0.0).astype(np.float32)


def _seed_for(seed: int, *keys: int) -> int:
    return int(np.random.SeedSequence([int(seed) & ((1 << 63) - 1), *keys]).generate_state(1, np.uint64)[0] >> 2)


@torch.inference_mode()
def dump_logits(out, target, drafts: Mapping, prompts: Sequence[Sequence[int]], *, max_new_tokens: int = 128,
                temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
                top_k_save: int | None = None, seed: int = 0, eos_token_id=None, compressed: bool | None = None,
                progress: Callable[[int], None] | None = None, workdir=None) -> str:
    """Write a logit dump of ``target`` and ``drafts`` ({name: model}) over ``prompts`` (lists of token ids).

    For prompt i a continuation is sampled from the target (:func:`generate`, seed derived from (seed, i));
    then every model is run teacher-forced over prompt + continuation.  Dense (default): raw float16 logits
    [N, T, V].  ``top_k_save=K``: sparse top-K (ids int32, processed log-probabilities float32 under the
    sampling config).  Also written: ``tokens`` [N, T], ``lengths`` [N], temperature/top_k/top_p/min_p and
    vocab_size.  Memory: each prompt's arrays go to ``.npy`` files in a temporary directory as soon as they are
    computed; at the end they are copied into memory-mapped padded arrays and written by
    :func:`fastspec.io.save_dump` (streams from the memory maps), so peak memory is one prompt's logits plus
    the writer's buffers, not the dump.  ``compressed`` (npz only) defaults to True for sparse dumps.
    Returns the path written."""
    from .io import save_dump

    params = _params(temperature, top_k, top_p, min_p)
    n_new = _check_max_new(max_new_tokens)
    if not drafts:
        raise ValueError("drafts: give at least one draft model")
    for name in drafts:
        if not _NAME_RE.match(name) or "__" in name:
            raise ValueError(f"draft name {name!r} must be letters, digits, '_', '.', '-' (no '__')")
    if top_k_save is not None and (isinstance(top_k_save, bool) or not isinstance(top_k_save, (int, np.integer))
                                   or top_k_save < 1):
        raise ValueError(f"top_k_save = {top_k_save!r} is invalid: use a positive count (or None for dense logits)")
    if not prompts:
        raise ValueError("prompts: give at least one prompt")
    out = os.fspath(out)
    if not out.endswith(".npz") and os.path.exists(out):
        if not os.path.isdir(out):
            raise ValueError(f"out {out!r} exists and is not a directory; a dump is an .npz file or a directory")
        if os.listdir(out):
            raise ValueError(f"out {out!r} is a directory that is not empty; remove it or choose a new path "
                             "(a dump directory holds only its own .npy arrays)")
    for name, m in drafts.items():
        check_vocab_size(target, m, name)
    sparse = top_k_save is not None
    roles = {"target": target, **{f"draft:{n}": m for n, m in drafts.items()}}
    tmp = tempfile.mkdtemp(prefix="fastspec-dump-", dir=workdir)
    try:
        lengths, V = [], None
        for i, prompt in enumerate(prompts):
            cont = generate(target, prompt, temperature=params[0], top_k=params[1], top_p=params[2],
                            min_p=params[3], seed=_seed_for(seed, i), max_new_tokens=n_new, eos_token_id=eos_token_id)
            np.save(os.path.join(tmp, f"{i}_tokens.npy"), cont)
            lengths.append(len(cont))
            for r, (role, m) in enumerate(roles.items()):
                lg = teacher_forced_logits(m, prompt, cont)
                V = lg.shape[-1]
                if sparse:
                    ids, lp = _topk(lg, int(top_k_save), params)
                    np.save(os.path.join(tmp, f"{i}_{r}_ids.npy"), ids)
                    np.save(os.path.join(tmp, f"{i}_{r}_lp.npy"), lp)
                else:
                    np.save(os.path.join(tmp, f"{i}_{r}_logits.npy"), lg.astype(np.float16))
                del lg
            if progress is not None:
                progress(1)
        N, T = len(prompts), max(lengths)
        open_mm = np.lib.format.open_memmap

        def assemble(suffix, shape_tail, dtype):
            arrs = []
            for r in range(len(roles)):
                a = open_mm(os.path.join(tmp, f"all_{r}{suffix}.npy"), mode="w+", dtype=dtype,
                            shape=(N, T) + shape_tail)
                for i in range(N):
                    part = np.load(os.path.join(tmp, f"{i}_{r}{suffix}.npy"), mmap_mode="r")
                    a[i, :len(part)] = part
                    a[i, len(part):] = part[-1]  # padding: never read, but keep it valid-looking
                a.flush()
                arrs.append(a)
            return arrs

        if sparse:
            kk = min(int(top_k_save), V)
            ids = assemble("_ids", (kk,), np.int32)
            lps = assemble("_lp", (kk,), np.float32)
            values = [(a, b) for a, b in zip(ids, lps)]
        else:
            values = assemble("_logits", (V,), np.float16)
        tokens = np.zeros((N, T), np.int64)
        for i in range(N):
            c = np.load(os.path.join(tmp, f"{i}_tokens.npy"))
            tokens[i, :len(c)] = c
        names = list(drafts)
        if compressed is None:
            compressed = sparse
        save_dump(out, values[0], {n: v for n, v in zip(names, values[1:])}, tokens=tokens,
                  lengths=np.asarray(lengths, np.int64), temperature=params[0], top_k=params[1], top_p=params[2],
                  min_p=params[3], vocab_size=V, compressed=bool(compressed) and out.endswith(".npz"))
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------------------------------------- measure

def ratio_ci(num: np.ndarray, den: np.ndarray) -> tuple[float, float, float]:
    """(estimate, se, ci95 half-width) of sum(num)/sum(den) with clusters (prompts) as the unit: delta-method
    (linearized) variance, Student t with clusters - 1 degrees of freedom."""
    from .simulate import _t_quantile_975

    num = np.asarray(num, np.float64)
    den = np.asarray(den, np.float64)
    n = len(num)
    tot = den.sum()
    est = num.sum() / tot if tot > 0 else float("nan")
    if n < 2 or tot <= 0:
        return est, float("inf"), float("inf")
    r = num - est * den
    se = math.sqrt(n / (n - 1) * float((r ** 2).sum())) / tot
    return est, se, se * _t_quantile_975(n - 1)


@dataclass
class MeasureResult:
    draft: str
    k: int
    mean_acceptance_length: float
    ci95: tuple[float, float]
    standard_error: float
    verify_steps: int
    drafted: int
    accepted: int
    emitted: int
    draft_acceptance_rate: float
    per_position_acceptance: list[float]
    time_s: dict = field(default_factory=dict)
    runs: int = 0

    def as_dict(self) -> dict:
        d = {f: getattr(self, f) for f in self.__dataclass_fields__}
        d["ci95"] = list(self.ci95)
        return d


def measure(target, drafts: Mapping, prompts: Sequence[Sequence[int]], ks: Sequence[int], *, temperature=1.0,
            top_k=0, top_p=1.0, min_p=0.0, seed=0, max_new_tokens=128, eos_token_id=None, repeats: int = 1,
            progress: Callable[[int], None] | None = None) -> list[MeasureResult]:
    """Run :func:`speculative_generate` for every (draft, k) over every prompt (``repeats`` times each, seeds
    derived from (seed, draft index, k, prompt, repeat)) and aggregate: mean acceptance length = total emitted
    / total verify steps with a 95% CI from :func:`ratio_ci` over prompts (repeats of a prompt pooled)."""
    results = []
    for di, (name, dm) in enumerate(drafts.items()):
        for k in ks:
            num, den = [], []
            tot = dict(steps=0, drafted=0, accepted=0, emitted=0)
            pos = np.zeros(k, np.int64)
            times = dict(draft=0.0, target=0.0, verify=0.0, total=0.0)
            runs = 0
            for i, prompt in enumerate(prompts):
                e = s = 0
                for rep in range(repeats):
                    r = speculative_generate(target, dm, prompt, k, temperature, top_k, top_p, min_p,
                                             _seed_for(seed, di, k, i, rep), max_new_tokens, eos_token_id=eos_token_id)
                    e += r.emitted
                    s += r.verify_steps
                    tot["steps"] += r.verify_steps
                    tot["drafted"] += r.drafted
                    tot["accepted"] += r.accepted
                    tot["emitted"] += r.emitted
                    pos += r.per_position_accepted
                    times["draft"] += r.draft_s
                    times["target"] += r.target_s
                    times["verify"] += r.verify_s
                    times["total"] += r.total_s
                    runs += 1
                num.append(e)
                den.append(s)
                if progress is not None:
                    progress(1)
            est, se, half = ratio_ci(num, den)
            results.append(MeasureResult(
                draft=name, k=int(k), mean_acceptance_length=est, ci95=(est - half, est + half), standard_error=se,
                verify_steps=tot["steps"], drafted=tot["drafted"], accepted=tot["accepted"], emitted=tot["emitted"],
                draft_acceptance_rate=tot["accepted"] / tot["drafted"] if tot["drafted"] else float("nan"),
                per_position_acceptance=(pos / max(tot["steps"], 1)).tolist(), time_s=times, runs=runs))
    return results

"""Models and tokenizers from local files: loading, self-speculative early-exit drafts, the checks that a draft
scores the target's vocabulary, draft specifications, and the torch / transformers process settings.

Everything loads with ``local_files_only=True`` (no download): a Hugging Face model directory, or a GGUF file
(``from_pretrained(dir, gguf_file=name)``, dequantized to float32; transformers' own progress bar for it is kept
quiet).  A draft can also be ``exitL``: the target's embeddings and first L decoder layers, then its final norm and
LM head (:func:`early_exit`, weights shared); or ``ngram`` / ``ngramMIN-MAX``: prompt lookup
(:class:`fastspec.ngram.NgramProposer`, no model; the syntax the simulator reads).
"""
from __future__ import annotations

import contextlib
import copy
import functools
import os
import re
from typing import Callable, Mapping, Sequence

import numpy as np
import torch

from ..errors import InvalidInput, InvalidType, shown
from ..machine import available_cpus
from ..io import check_draft_name
from ..ngram import NgramProposer
from .args import MAX_K, positive_int

__all__ = ["load_model", "load_tokenizer", "early_exit", "check_same_tokenizer", "check_vocab_size",
           "parse_draft_specs", "parse_ngram_spec", "resolve_models", "model_files", "eos_ids", "set_threads",
           "quiet_logging"]

_EXIT_RE = re.compile(r"^exit(\d+)$")
_MODEL_KINDS = ("a local Hugging Face model directory, a .gguf file, or (drafts only) exitL for the target's first L "
                "layers or ngram / ngramMIN-MAX / ngram.vllm / ngram.hf for prompt lookup")


def _split_spec(spec) -> tuple[str, dict]:
    """(directory, extra from_pretrained kwargs) for a model path: a directory or a .gguf file."""
    spec = os.fspath(spec)
    if os.path.isfile(spec) and spec.lower().endswith(".gguf"):
        return os.path.dirname(os.path.abspath(spec)), {"gguf_file": os.path.basename(spec)}
    if os.path.isdir(spec):
        return spec, {}
    if not os.path.exists(spec):
        raise InvalidInput(f"model {spec!r}: no such file or directory; give {_MODEL_KINDS}")
    raise InvalidInput(f"model {spec!r} is a file but not a .gguf file; give a model directory or a .gguf file")


def load_tokenizer(spec):
    """The tokenizer of a local model directory or GGUF file (no download)."""
    from transformers import AutoTokenizer

    path, kw = _split_spec(spec)
    with _quiet_gguf() if "gguf_file" in kw else contextlib.nullcontext():
        return AutoTokenizer.from_pretrained(path, local_files_only=True, **kw)


@contextlib.contextmanager
def _quiet_gguf():
    """While loading a GGUF file: transformers' GGUF reader without its tqdm bar (it ignores transformers' own
    progress-bar switch), and its metadata-only reads (config, tokenizer) parsed once per file instead of once per
    caller.  Restored on exit; a no-op when transformers has no GGUF support."""
    try:
        from transformers import modeling_gguf_pytorch_utils as g
    except ImportError:
        yield
        return
    saved = {name: getattr(g, name) for name in ("tqdm", "load_gguf_checkpoint") if hasattr(g, name)}
    original = saved.get("load_gguf_checkpoint")
    memo: dict = {}

    def load(path, return_tensors=False, *args, **kwargs):
        if return_tensors or args or kwargs:
            return original(path, return_tensors, *args, **kwargs)
        key = (os.path.abspath(path), os.path.getmtime(path))
        if key not in memo:
            memo[key] = original(path, False)
        return copy.deepcopy(memo[key])

    if "tqdm" in saved:
        g.tqdm = functools.partial(saved["tqdm"], disable=True)
    if original is not None:
        g.load_gguf_checkpoint = load
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(g, name, value)


def load_model(spec, *, dtype=torch.float32):
    """(model, tokenizer) from a local model directory or GGUF file, in eval mode, float32 by default."""
    from transformers import AutoModelForCausalLM

    path, kw = _split_spec(spec)
    with _quiet_gguf() if "gguf_file" in kw else contextlib.nullcontext():
        try:
            model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype, **kw)
        except TypeError:  # older transformers: torch_dtype
            model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, torch_dtype=dtype, **kw)
        model.eval()
        return model, load_tokenizer(spec)


def _decoder(model):
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "norm") or not hasattr(model, "lm_head"):
        raise InvalidInput(f"early-exit drafts need a Llama-style decoder (model.model.layers, model.model.norm, "
                           f"model.lm_head); {type(model).__name__} has no such structure")
    return inner


def early_exit(model, num_layers: int):
    """Self-speculative draft: the target's embeddings and first ``num_layers`` decoder layers, then its final
    norm and LM head (Draft & Verify, LayerSkip).  Shares every weight with ``model`` (no copy); owns its own
    KV cache when run.  ``num_layers`` must be an integer in [1, number of layers]."""
    inner = _decoder(model)
    n = len(inner.layers)
    if isinstance(num_layers, bool) or not isinstance(num_layers, (int, np.integer)):
        raise InvalidType(f"exit depth {num_layers!r} must be an integer in [1, {n}]")
    if not 1 <= num_layers <= n:
        raise InvalidInput(f"exit depth {num_layers!r} is invalid: the target has {n} decoder layers; use exitL "
                           f"with 1 <= L <= {n}")
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
    """Raise InvalidInput unless the two tokenizers map every token string to the same id (same vocabulary and
    special tokens): speculative decoding compares distributions over one shared vocabulary."""
    a, b = reference.get_vocab(), other.get_vocab()
    if a != b:
        only_a = sorted(set(a) - set(b))[:3]
        diff = [t for t in a if t in b and a[t] != b[t]][:3]
        detail = (f"{len(set(a) ^ set(b))} tokens are in only one of them (e.g. {only_a})" if set(a) != set(b)
                  else f"ids differ (e.g. {diff})")
        raise InvalidInput(f"{names[1]} does not share the tokenizer of {names[0]} ({len(a)} vs {len(b)} tokens; "
                           f"{detail}); speculative decoding needs the same vocabulary: use a draft from the same "
                           "model family")
    for attr in ("bos_token_id", "eos_token_id"):
        if getattr(reference, attr, None) != getattr(other, attr, None):
            raise InvalidInput(f"{names[1]} does not share the tokenizer of {names[0]}: {attr} "
                               f"{getattr(other, attr, None)} vs {getattr(reference, attr, None)}")


def check_vocab_size(target, draft, name: str = "draft") -> None:
    """Raise InvalidInput unless the LM heads of ``target`` and ``draft`` have the same number of outputs."""
    vt = target.get_output_embeddings().weight.shape[0]
    vd = draft.get_output_embeddings().weight.shape[0]
    if vt != vd:
        raise InvalidInput(f"draft {name}: its LM head has {vd} outputs but the target's has {vt}; the two models "
                           "must score the same vocabulary")


def parse_draft_specs(drafts: Mapping[str, str] | Sequence[str]) -> dict[str, str]:
    """{name: MODEL} from a mapping, or from ``NAME=MODEL`` / ``MODEL`` strings (the name of a bare MODEL is
    ``exitL`` itself, ``ngram`` / ``ngramMIN-MAX`` (``ngram:MIN-MAX`` is named ``ngramMIN-MAX``; a named rule
    by :func:`fastspec.ngram.ngram_name`, e.g. ``ngram.vllm`` -> ``ngram.vllm5-5``), or the file /
    directory name without extension).  Names follow
    :func:`fastspec.io.check_draft_name` and must be distinct; an ``ngram...`` MODEL must parse
    (:func:`parse_ngram_spec`)."""
    if isinstance(drafts, Mapping):
        items = [(str(k), str(v)) for k, v in drafts.items()]
    elif isinstance(drafts, (str, bytes)):
        raise InvalidType("drafts must be a mapping or a list of NAME=MODEL strings, not one string")
    else:
        items = []
        for s in drafts:
            s = str(s)
            if "=" in s:
                name, spec = s.split("=", 1)
            else:
                spec = s
                name = _bare_name(spec)
            items.append((name.strip(), spec.strip()))
    if not items:
        raise InvalidInput(f"drafts: give at least one draft as NAME=MODEL (MODEL: {_MODEL_KINDS})")
    out = {}
    for name, spec in items:
        check_draft_name(name)
        if name in out:
            raise InvalidInput(f"draft name {name!r} is given twice; names must be distinct")
        if not spec:
            raise InvalidInput(f"draft {name!r} has an empty MODEL; write NAME=MODEL")
        try:  # an ngram... spec that does not parse is refused here, before any model loads
            parse_ngram_spec(spec)
        except InvalidInput as exc:
            raise InvalidInput(str(exc) if shown(spec) in str(exc) else f"draft {shown(spec)}: {exc}") from None
        out[name] = spec
    return out


def parse_ngram_spec(spec: str) -> NgramProposer | None:
    """The prompt-lookup proposer (:mod:`fastspec.ngram`) of ``ngram`` (n-grams of 1..3 tokens, latest
    occurrence), ``ngramMIN-MAX`` (also ``ngram:MIN-MAX``, ``ngram[MIN-MAX]``) or a named rule (``ngram.vllm``,
    ``ngram.vllmMIN-MAX``, ``ngram.hf``, ``ngram.hfMAX``; the table in :mod:`fastspec.ngram`): the simulator's
    parser (:func:`fastspec.ngram.parse_ngram_draft`); None when ``spec`` does not start with
    ``ngram``.  Its ``k`` is the largest draft length (:data:`fastspec.hf.args.MAX_K`): a loop proposing d tokens
    takes the first d (``dataclasses.replace(p, k=d)`` gives the same tokens)."""
    from ..ngram import parse_ngram_draft

    return parse_ngram_draft(str(spec).strip(), MAX_K)


def _bare_name(spec: str) -> str:
    """The draft name of a MODEL given without NAME=: exitL, ngram / ngramMIN-MAX, else the file name's stem."""
    if _EXIT_RE.match(spec):
        return spec
    try:
        ngram = parse_ngram_spec(spec)
    except InvalidInput:  # refused with its message when the specifications are checked
        return "ngram"
    if ngram is not None:
        from ..ngram import ngram_name

        return "ngram" if spec.strip() == "ngram" else ngram_name(ngram)
    return os.path.splitext(os.path.basename(spec.rstrip("/")))[0]


def resolve_models(target, drafts: Mapping[str, str] | Sequence[str] = (), *,
                   progress: Callable[[int], None] | None = None):
    """Load ``target`` and every draft: (target_model, tokenizer, {name: draft}).

    ``drafts``: as :func:`parse_draft_specs` takes them (none: a target alone); MODEL is a local model directory,
    a .gguf file, ``exitL`` (a model sharing the target's weights) or ``ngram`` / ``ngramMIN-MAX`` (a
    :class:`fastspec.ngram.NgramProposer`, no model).  Drafts with another tokenizer or vocabulary size are
    refused (InvalidInput).  ``progress(1)`` is called after each model file is loaded."""
    specs = parse_draft_specs(drafts) if drafts else {}
    tmodel, tok = load_model(target)
    if progress is not None:
        progress(1)
    out = {}
    for name, spec in specs.items():
        m = _EXIT_RE.match(spec)
        if m:
            out[name] = early_exit(tmodel, int(m.group(1)))
            continue
        ngram = parse_ngram_spec(spec)
        if ngram is not None:
            out[name] = ngram
            continue
        dtok = load_tokenizer(spec)
        check_same_tokenizer(tok, dtok, names=(f"target {target}", f"draft {name} ({spec})"))
        out[name], _ = load_model(spec)
        check_vocab_size(tmodel, out[name], name)
        if progress is not None:
            progress(1)
    return tmodel, tok, out


def model_files(drafts: Mapping[str, str]) -> int:
    """How many model files :func:`resolve_models` loads for these draft specifications (the target included)."""
    return 1 + sum(1 for spec in drafts.values() if not _EXIT_RE.match(spec) and parse_ngram_spec(spec) is None)


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


def set_threads(threads: int | None = None) -> int:
    """Set torch's intra-op thread count, and Numba's (fastspec's kernels), to ``threads`` (at most the CPUs this
    process may run on: more only oversubscribes them, and a huge count crashed OpenBLAS), or min(2, CPUs) when
    None (Numba's never above its pool size).  Returns the count.

    Numba's thread pool is started first: both use the OpenMP runtime, and the pool's start (at fastspec's first
    parallel kernel, e.g. in ``verify_logits``) would otherwise reset torch's count to Numba's."""
    cpus = available_cpus()
    n = min(2, cpus) if threads is None else positive_int("threads", threads, cpus)
    try:
        import numba
        from numba.np.ufunc.parallel import _launch_threads

        _launch_threads()
        numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    except (ImportError, AttributeError, RuntimeError, ValueError):  # a Numba without these: counts may drift
        pass
    torch.set_num_threads(n)
    return n


def quiet_logging() -> None:
    """Silence transformers' informational logging and progress bars (errors are still raised)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()

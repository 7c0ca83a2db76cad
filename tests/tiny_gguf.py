"""Tiny llama-architecture GGUF models made in the tests (for the tests marked ``llamacpp``), written with gguf-py
(the ``gguf`` package; llama.cpp's tree ships it as ``gguf-py/``, which :func:`import_gguf` falls back to).

:func:`write_llama` writes a float32 model of a few hundred thousand weights: seeded random weights (numpy's
``default_rng``) scaled so the next-token distribution is peaked (greedy continuations that depend on the context,
not near-flat logits), and a SentencePiece vocabulary llama.cpp tokenizes (``<unk>``, ``<s>``, ``</s>``, the 128
ASCII byte tokens ``<0x00>``..``<0x7F>`` and whole-character and word pieces).  Every token is ASCII, so every
generated token is whole UTF-8 and llama-server reports its probabilities.  A draft is the target's weights plus
seeded noise (``noise``): it shares the vocabulary and agrees with the target often but not always.
``extra_words`` adds pieces at the end of the vocabulary: a model with another vocabulary.
"""
from __future__ import annotations

import importlib
import os
import string
import sys

import numpy as np

__all__ = ["import_gguf", "vocabulary", "write_llama"]

WORDS = ("the", "The", "capital", "of", "France", "is", "Once", "upon", "a", "time", "there", "was", "little",
         "and", "to", "in", "it", "he", "she", "they", "on", "at", "with", "for", "as", "by", "from", "that", "this",
         "big", "small", "red", "blue", "cat", "dog", "bird", "tree", "house", "city", "river", "day", "night", "sun",
         "moon", "said", "went", "saw", "had", "not", "one", "two", "three", "girl", "boy", "king", "queen")
#: gguf's token types (gguf.TokenType): NORMAL, UNKNOWN, CONTROL, BYTE
NORMAL, UNKNOWN, CONTROL, BYTE = 1, 2, 3, 6


def import_gguf():
    """The ``gguf`` module: the installed package, else ``gguf-py`` of the llama.cpp tree next to the build's
    ``bin`` directory (``scripts/llamacpp_build.sh`` links it there); None when neither is there."""
    try:
        return importlib.import_module("gguf")
    except ImportError:
        pass
    bin_dir = os.environ.get("FASTSPEC_LLAMACPP_BIN") or os.path.expanduser("~/.cache/fastspec/llama.cpp-11434/bin")
    tree = os.path.join(os.path.dirname(os.path.abspath(bin_dir)), "gguf-py")
    if os.path.isdir(tree):
        sys.path.insert(0, tree)
        try:
            return importlib.import_module("gguf")
        except ImportError:
            return None
    return None


def vocabulary(extra_words: int = 0):
    """(tokens, scores, types) of the SentencePiece vocabulary; ``extra_words`` more pieces at the end."""
    tokens, scores, types = ["<unk>", "<s>", "</s>"], [0.0, 0.0, 0.0], [UNKNOWN, CONTROL, CONTROL]
    for b in range(128):
        tokens.append(f"<0x{b:02X}>")
        scores.append(0.0)
        types.append(BYTE)
    pieces = ["\u2581"] + [c for c in string.printable[:94]] + [f"\u2581{c}" for c in string.ascii_letters]
    pieces += [f"\u2581{w}" for w in WORDS] + [w for w in WORDS if len(w) > 1]
    pieces += [f"\u2581x{i}" for i in range(extra_words)]
    seen = set(tokens)
    for p in pieces:
        if p not in seen:
            seen.add(p)
            tokens.append(p)
            scores.append(-100.0 + 10.0 * len(p))  # SentencePiece merges the best-scored pair first: longer pieces
            types.append(NORMAL)
    return tokens, scores, types


def write_llama(path, *, seed: int = 0, noise: float = 0.0, noise_seed: int = 1, extra_words: int = 0,
                n_embd: int = 128, n_layer: int = 2, n_head: int = 4, n_head_kv: int = 2, n_ff: int = 256,
                n_ctx: int = 4096, scale: float = 1.0, bigram: bool = False) -> str:
    """Write a tiny llama GGUF (float32) at ``path`` and return it.  The weights come from ``seed``; ``noise``
    adds ``noise`` times a standard normal (from ``noise_seed``) relative to each tensor's scale (a draft).
    ``bigram``: every attention output projection is zero, so the next-token distribution is a function of the
    current token alone -- greedy output is eventually periodic, and an n-gram lookup's drafts are accepted."""
    gguf = import_gguf()
    if gguf is None:
        raise RuntimeError("the gguf package is not installed and llama.cpp's gguf-py is not found")
    tokens, scores, types = vocabulary(extra_words)
    n_vocab = len(tokens)
    head = n_embd // n_head
    rng = np.random.default_rng(seed)
    jitter = np.random.default_rng(noise_seed)
    tensors = {}

    def add(name, shape, std, mean=0.0):
        w = mean + std * rng.standard_normal(shape)
        if noise:
            w = w + noise * std * jitter.standard_normal(shape)
        tensors[name] = w.astype(np.float32)

    add("token_embd.weight", (n_vocab, n_embd), 1.0)
    for i in range(n_layer):
        add(f"blk.{i}.attn_norm.weight", (n_embd,), 0.1, 1.0)
        add(f"blk.{i}.attn_q.weight", (n_head * head, n_embd), 2.0 / np.sqrt(n_embd))
        add(f"blk.{i}.attn_k.weight", (n_head_kv * head, n_embd), 2.0 / np.sqrt(n_embd))
        add(f"blk.{i}.attn_v.weight", (n_head_kv * head, n_embd), 1.0 / np.sqrt(n_embd))
        add(f"blk.{i}.attn_output.weight", (n_embd, n_head * head), 0.0 if bigram else 2.0 / np.sqrt(n_head * head))
        add(f"blk.{i}.ffn_norm.weight", (n_embd,), 0.1, 1.0)
        add(f"blk.{i}.ffn_gate.weight", (n_ff, n_embd), 1.0 / np.sqrt(n_embd))
        add(f"blk.{i}.ffn_up.weight", (n_ff, n_embd), 1.0 / np.sqrt(n_embd))
        add(f"blk.{i}.ffn_down.weight", (n_embd, n_ff), 2.0 / np.sqrt(n_ff))
    add("output_norm.weight", (n_embd,), 0.1, 1.0)
    add("output.weight", (n_vocab, n_embd), scale * 4.0 / np.sqrt(n_embd))

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(f"fastspec tiny llama seed {seed} noise {noise:g}")
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_dimension_count(head)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_file_type(0)  # all float32
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    for name, t in tensors.items():
        w.add_tensor(name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)

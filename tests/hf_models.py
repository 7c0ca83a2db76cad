"""Tiny random Llama models and a word-level tokenizer for the tests of the ``hf`` extra.

Importing this module skips the importing test module when torch or transformers is missing; it also keeps
the Hugging Face hub offline and torch on one thread (the tests' models are tiny)."""
from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(1)

V = 8
WORDS = ["<s>", "</s>", "a", "b", "c", "d", "e", "f"]


def tiny(seed: int, vocab: int = V, layers: int = 2, eos: int | None = None):
    """A tiny randomly initialized Llama; initializer_range 0.3 gives peaked, context-dependent distributions."""
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=layers, num_attention_heads=2,
                                   num_key_value_heads=2, intermediate_size=64, max_position_embeddings=128,
                                   initializer_range=0.3, tie_word_embeddings=False, bos_token_id=0,
                                   eos_token_id=eos, pad_token_id=None)
    return transformers.LlamaForCausalLM(cfg).eval()


def save_model(path, seed, words=WORDS, layers=2) -> str:
    """A model directory: :func:`tiny` (EOS = id 1) with a whitespace word-level tokenizer over ``words``."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="a"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", unk_token="a")
    tiny(seed, vocab=len(words), layers=layers, eos=1).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)

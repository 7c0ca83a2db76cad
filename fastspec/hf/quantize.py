"""Fake-quantized copies of a model: drafts that are cheap to make and close to the target.

``fake_quantize(model, bits, group_size)`` rounds every linear layer's weight (and the tied embedding / LM head)
to ``bits``-bit integers per group of ``group_size`` consecutive input columns, asymmetric min-max round-to-nearest
(the Q4_1 / GPTQ-without-calibration recipe), and stores the dequantized float32 values back.  The model keeps its
architecture and runs in any engine (saved with ``save_pretrained`` it is an ordinary Hugging Face directory that
vLLM serves), so the copy is a draft of the same tokenizer whose distance from the target is set by ``bits``: it
costs as much as the target to run (the point is its acceptance, not its speed).
"""
from __future__ import annotations

import torch

from ..errors import InvalidInput

__all__ = ["fake_quantize", "quantize_tensor"]

MIN_BITS, MAX_BITS = 2, 8


def quantize_tensor(w: torch.Tensor, bits: int, group_size: int) -> torch.Tensor:
    """``w`` [rows, cols] rounded to ``bits`` bits per group of ``group_size`` columns (min-max, asymmetric)."""
    rows, cols = w.shape
    pad = (-cols) % group_size
    x = torch.nn.functional.pad(w.detach().to(torch.float32), (0, pad)).reshape(rows, -1, group_size)
    lo = x.amin(dim=-1, keepdim=True)
    hi = x.amax(dim=-1, keepdim=True)
    levels = (1 << bits) - 1
    scale = torch.where(hi > lo, (hi - lo) / levels, torch.ones_like(hi))
    q = torch.clamp(torch.round((x - lo) / scale), 0, levels)
    return (q * scale + lo).reshape(rows, -1)[:, :cols].to(w.dtype)


@torch.no_grad()
def fake_quantize(model, bits: int, group_size: int = 32):
    """Quantize ``model``'s 2-D weights (linear layers and embeddings) in place; returns ``model``."""
    if isinstance(bits, bool) or not isinstance(bits, int) or not MIN_BITS <= bits <= MAX_BITS:
        raise InvalidInput(f"bits={bits!r} is invalid: give an integer in [{MIN_BITS}, {MAX_BITS}]")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or not 1 <= group_size <= 1 << 16:
        raise InvalidInput(f"group_size={group_size!r} is invalid: give an integer in [1, 65536]")
    seen = set()
    for module in model.modules():
        w = getattr(module, "weight", None)
        if isinstance(w, torch.nn.Parameter) and w.dim() == 2 and id(w) not in seen:
            seen.add(id(w))
            w.copy_(quantize_tensor(w, bits, group_size))
    return model

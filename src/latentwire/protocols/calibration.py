"""Background calibration of CacheBack scores (docs/methods.md#cacheback-calibration): how much more this question
reads a row than a content-free query does."""
from __future__ import annotations

import re

import torch

# Background calibration: divide the question's scores by those of a content-free query in the same
# template, so rows that every query attends to (the opening rows, recent rows) stop spending budget.
GENERIC_QUESTION = "What is this document about?"
_FUNCTION_WORDS = frozenset(
    "a an the of in on at to for from by with and or not no is are was were be been do does did has have had "
    "what which who whom whose where when why how many much this that these those it its their there than "
    "as into about after before under over between".split())


def calibrate(scores: torch.Tensor, background: torch.Tensor, floor: float = 0.05) -> torch.Tensor:
    """S_t / max(B_t, κ·mean(B)): how much more this question reads row t than a content-free query does.

    Rows every query attends to (high B_t) lose budget to rows only this question attends to; the floor
    κ·mean(B) keeps rows that neither query reads (B_t ≈ 0) from winning on a ratio of two tiny numbers.
    """
    if scores.shape != background.shape:
        raise ValueError(f"scores {tuple(scores.shape)} and background {tuple(background.shape)} differ")
    b = background.to(scores.dtype)
    return scores / b.clamp_min(floor * float(b.mean()) + 1e-30)


def masked_question(question: str) -> str:
    """The question with every content word replaced by "thing" (function words, punctuation and the
    word count kept): a query in the same template and shape that asks for nothing in particular."""
    return re.sub(r"[^\W_]+", lambda m: m.group(0) if m.group(0).lower() in _FUNCTION_WORDS else "thing", question)

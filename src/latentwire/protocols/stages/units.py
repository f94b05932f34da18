"""Unit stages: what a selection ranks and keeps whole — the document cut into sentences, or into fixed spans.

    sentences(span=16, context='none', fill='cut', floor=True)   sentence and line units of at most 2·span rows
    fixed_spans(16)                                              consecutive spans of `span` document rows (the paper)

Sentence units: measured on 48 episodes per (task, model), 8× / 16× evidence recall +8 / +13 points over fixed spans
on Qwen `facts`, +0 / +11 on Qwen `code`, +8 / +13 on Gemma3 `facts`. `context`: the rows a kept sentence takes
along (spending budget): "lead" = its paragraph's first sentence (which names whom a "he" means), "previous" = the
sentence before it. `fill`: "cut" fills the budget left after whole units with the best piece of the next one,
"whole" leaves it unspent. `floor`: a budget below one span whose best sentence does not fit sends that sentence
whole and alone, not a piece of it ("Biscuit" cut to "B").
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ...errors import UnknownNameError
from ...select import CONTEXTS, FILLS, SPAN, context_rows, select_rows, sentence_groups, span_units
from .base import STAGES, Stage


@dataclass(repr=False)
class Units(Stage):
    kind = "units"
    positional = True
    span: int = SPAN

    def __post_init__(self):
        if isinstance(self.span, bool) or not isinstance(self.span, int) or self.span < 1:
            raise self.refuse(f"span must be an integer ≥ 1, got {self.span!r}")

    takes_context = False  # a unit may carry rows beyond its own (an adaptive budget cannot count them)
    floor = False  # fixed spans: no unit floor (`select_rows` ignores it without groups)
    fill = "cut"

    def groups(self, per_row: list, document: str) -> list[list[int]] | None:
        """The document's units as rows of its prompt (None: fixed spans of the candidate rows)."""
        return None

    def units(self, keep: torch.Tensor, eligible: torch.Tensor | None, groups) -> list[list[int]]:
        """The units ranked: `groups`, or the candidate rows cut into spans of `span`."""
        return span_units(keep, eligible, self.span, groups)

    def carried(self, groups, per_row: list | None, document: str | None) -> list[list[int]] | None:
        """Per unit, the rows it takes along (None: none)."""
        return None

    def select(self, scores: torch.Tensor, budget: int, keep: torch.Tensor, eligible, groups, ctx) -> torch.Tensor:
        """Row indices to send: the kept rows plus the best units within `budget` (`select_rows`)."""
        return select_rows(scores, budget, keep, self.span, eligible, groups, self.floor, ctx, self.fill)

    def most(self, budget: int) -> int:
        """The most document rows `select` may send for `budget`: the unit floor may exceed a small one."""
        return budget


@STAGES.register
@dataclass(repr=False)
class FixedSpans(Units):
    """Consecutive spans of `span` candidate rows."""
    name = "fixed_spans"


@STAGES.register
@dataclass(repr=False)
class Sentences(Units):
    """Sentence and line units of at most 2·span rows, with what each takes along and how the budget is filled."""
    name = "sentences"
    context: str = "none"
    fill: str = "cut"
    floor: bool = True

    def __post_init__(self):
        super().__post_init__()
        if self.context not in CONTEXTS:
            raise UnknownNameError("context", self.context, CONTEXTS)
        if self.fill not in FILLS:
            raise UnknownNameError("fill", self.fill, FILLS)
        if not isinstance(self.floor, bool):
            raise self.refuse(f"floor (flat: unit_floor) must be True or False, got {self.floor!r}")

    @property
    def takes_context(self) -> bool:
        return self.context != "none"

    def groups(self, per_row: list, document: str) -> list[list[int]]:
        return sentence_groups(per_row, document, 2 * self.span)

    def carried(self, groups, per_row: list | None, document: str | None) -> list[list[int]] | None:
        if self.context == "none" or groups is None:
            return None
        if per_row is None or document is None:
            raise ValueError(f"context {self.context!r} reads the document's paragraphs: pass per_row and document")
        return context_rows(groups, per_row, document, self.context)

    def most(self, budget: int) -> int:
        if self.floor and (budget < self.span or self.fill == "whole"):
            return max(budget, 2 * self.span)  # the unit floor may send one whole sentence of up to 2·span rows
        return budget

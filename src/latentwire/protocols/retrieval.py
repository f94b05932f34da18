"""Retrieval sent as text: the honest rival of CacheBack, with no sender LLM at all.

Each sender cuts its document into the same units CacheBack ranks (sentences and lines, or fixed spans of
`span` tokens), scores them against the question with a text selector (`lexical`, `bm25`, `dense`), keeps
the best within CacheBack's budget at `ratio` (ceil(T / ratio) tokens, T = the sender's prompt tokens, as
`text(ratio=r)` counts them; CacheBack's T also counts its G latent rows, one row more at G = 8, r = 8)
through the same `select_rows`, and sends the kept text, in document order, one contiguous piece per line.
Selection runs on the host (`placement.HOST`): it is text work, whatever device the models use. The receiver reads it like a text report. A sender's seconds are what it really
spends: tokenising its prompt, scoring and selecting (the encoder's one-time load is not charged).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import torch

from ..agent import Agent
from ..errors import ConfigError, UnknownNameError
from ..message import merge_spans
from ..placement import HOST
from ..select import (SELECTORS, SPAN, TextSelector, check_sentence_options, context_rows, fanin_budget,
                      get_selector, select_rows, span_units, sentence_groups, unit_row_scores)
from .base import after_first, SENDER_PROMPT, Outcome, Protocol, register
from .cacheback import SPAN_MODES
from .documents import kept_document_spans, token_document_spans


@dataclass(frozen=True)
class Picked:
    """One sender's retrieval: the text it sends, the document spans of its kept tokens, its seconds and budget."""
    text: str
    kept: tuple[tuple[int, int], ...]
    seconds: float
    budget: int
    tokens: int  # document tokens kept


@register
@dataclass
class Retrieval(Protocol):
    """Each sender sends, as text, the document units a retriever ranks best for the question, within CacheBack's
    budget at `ratio`; key parameters: `selector` (lexical, bm25, dense), `ratio`, `span_mode`."""
    name = "retrieval"
    selector: str = "bm25"
    selector_params: dict = field(default_factory=dict)
    ratio: float = 8.0  # each sender keeps ceil(T / ratio) document tokens
    span_mode: str = "sentence"  # the units ranked: "sentence" (sentences and lines) or "fixed" (spans of `span`)
    span: int = SPAN
    unit_floor: bool = True  # as CacheBack's: a budget below every sentence sends the best sentence whole
    context: str = "none"  # as CacheBack's: "lead" or "previous" sentence of the paragraph taken along
    fill: str = "cut"  # as CacheBack's: "whole" leaves the budget after whole units unspent instead of cutting one

    def __post_init__(self):
        super().__post_init__()
        if self.ratio < 1:
            raise ConfigError(f"ratio must be ≥ 1, got {self.ratio}")
        if self.span_mode not in SPAN_MODES:
            raise UnknownNameError("span mode", self.span_mode, SPAN_MODES)
        if self.span < 1:
            raise ConfigError(f"span must be ≥ 1, got {self.span}")
        if self.selector not in SELECTORS:
            raise UnknownNameError("selector", self.selector, SELECTORS)
        if not issubclass(SELECTORS[self.selector], TextSelector):
            text = [n for n in SELECTORS.names() if issubclass(SELECTORS[n], TextSelector)]
            raise ConfigError(f"retrieval needs a text selector (one that reads no KV state): {', '.join(text)}; "
                              f"{self.selector!r} scores states: use cacheback(selector={self.selector!r})")
        check_sentence_options(self.span_mode, self.context, self.fill)
        self._selector = get_selector(self.selector, **self.selector_params)

    def pick(self, sender: Agent, document: str, question: str) -> Picked:
        """The text one sender sends for `question`, timed from the question's arrival."""
        self._selector.prepare()
        t0 = time.perf_counter()
        per_row = token_document_spans(sender, sender.chat_text(SENDER_PROMPT.format(document=document)), document)
        eligible = torch.tensor([sp is not None for sp in per_row], dtype=torch.bool, device=HOST)  # (T,) text work
        keep = torch.zeros_like(eligible)  # nothing is always sent: no first or latent rows in text
        groups = sentence_groups(per_row, document, 2 * self.span) if self.span_mode == "sentence" else None
        units = span_units(keep, eligible, self.span, groups)
        scores = unit_row_scores(self._selector, question, per_row, document, len(per_row), units, HOST)
        budget = fanin_budget(len(per_row), self.ratio)
        ctx = context_rows(groups, per_row, document, self.context) if groups and self.context != "none" else None
        rows = select_rows(scores, budget, keep, self.span, eligible, groups, self.unit_floor, ctx, self.fill)
        kept = kept_document_spans(per_row, rows)
        text = "\n".join(document[a:b].strip() for a, b in merge_spans(kept))
        return Picked(text, kept, time.perf_counter() - t0, budget, len(kept))

    def run(self, senders: Sequence[Agent], documents: Sequence[str], receiver: Agent, question: str) -> Outcome:
        picked = [self.pick(sender, doc, question) for sender, doc in self._pair(senders, documents)]
        message = "\n".join(p.text for p in picked if p.text)
        reply = receiver.answer(question, message=message, max_new_tokens=self.max_new_tokens)
        return Outcome(self.name, reply.text, len(message.encode()), reply.context,
                       tuple(p.seconds for p in picked), reply.seconds,
                       {"pieces": [p.text for p in picked], "budgets": [p.budget for p in picked],
                        "kept_tokens": [p.tokens for p in picked]}, kept_spans=tuple(p.kept for p in picked),
                       read_seconds=tuple(0.0 for _ in picked),  # no read: all of its work follows the question
                       after_first=after_first(reply))

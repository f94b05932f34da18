"""Retrieval sent as text: the honest rival of CacheBack, with no sender LLM at all.

Each sender cuts its document into the same units CacheBack ranks (sentences and lines, or fixed spans of
`span` tokens), scores them against the question with a text selector (`lexical`, `bm25`, `dense`), keeps
the best within CacheBack's budget at `ratio` (ceil(T / ratio) tokens, T = the sender's prompt tokens, as
`text(ratio=r)` counts them; CacheBack's T also counts its G latent rows, one row more at G = 8, r = 8)
through the same `select_rows`, and sends the kept text, in document order, one contiguous piece per line.
Selection runs on the host (`placement.HOST`): it is text work, whatever device the models use. The receiver
reads it like a text report. A sender's seconds are what it really spends: tokenising its prompt, scoring and
selecting (the encoder's one-time load is not charged).

`read="held"`: the sender holds its document as an agent holds its read. Everything that does not depend on the
question (tokenising, cutting units, the selector's `index`: a dense encoder's unit embeddings) was done before
the question and is charged as its read, so its question-time TTEOA counts only scoring the question and
selecting; inside `shared_reads(HeldReads)` the index is kept across questions, as reads are. The default,
`read="with_question"`, does all of it after the question (question-time TTEOA = TTEOA).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Sequence

import torch

from ..agent import Agent
from ..clock import now
from ..errors import ConfigError, UnknownNameError
from ..message import Spans
from ..placement import HOST
from ..select import (SELECTORS, SPAN, TextSelector, check_sentence_options, context_rows, fanin_budget,
                      get_selector, rows_from_units, select_rows, span_units, sentence_groups, unit_row_scores,
                      unit_texts)
from .base import after_first, SENDER_PROMPT, Outcome, Protocol, register
from .cacheback import SPAN_MODES
from .cacheback_x import SENDER_SEPARATOR
from .documents import chat_document, kept_document_spans, sent_spans, token_document_spans
from .reads import held_value, text_key


READS = ("with_question", "held")  # when the query-blind work is done: after the question, or before it (held)


@dataclass(frozen=True)
class Picked:
    """One sender's retrieval: the text it sends, the document spans of its kept tokens, its seconds and budget."""
    text: str
    kept: tuple[tuple[int, int], ...]
    seconds: float
    budget: int
    tokens: int  # document tokens kept
    read_s: float = 0.0  # of `seconds`, the query-blind work done before the question (read="held")
    held: bool = False  # its units and index were built for an earlier question (read="held", `HeldReads`)


class Units(NamedTuple):
    """The query-blind part of one sender's retrieval: its prompt's rows (document span per row), which rows may be
    sent, the units ranked, their context rows, and (held) the selector's index of the units' text."""
    per_row: list  # (T,) document (start, end) per row, None outside the document
    eligible: torch.Tensor  # (T,) bool
    groups: list[list[int]] | None
    units: list[list[int]]
    ctx: list[list[int]] | None  # context_rows: per unit, the rows it takes along
    built: Any = None  # TextSelector.index of the units' text (held), else None


@register
@dataclass
class Retrieval(Protocol):
    """Each sender sends, as text, the document units a retriever ranks best for the question, within CacheBack's
    budget at `ratio`; key parameters: `selector` (lexical, bm25, dense), `ratio`, `span_mode`, `read`."""
    name = "retrieval"
    selector: str = "bm25"
    selector_params: dict = field(default_factory=dict)
    ratio: float = 8.0  # each sender keeps ceil(T / ratio) document tokens
    span_mode: str = "sentence"  # the units ranked: "sentence" (sentences and lines) or "fixed" (spans of `span`)
    span: int = SPAN
    unit_floor: bool = True  # as CacheBack's: a budget below every sentence sends the best sentence whole
    context: str = "none"  # as CacheBack's: "lead" or "previous" sentence of the paragraph taken along
    fill: str = "cut"  # as CacheBack's: "whole" leaves the budget after whole units unspent instead of cutting one
    read: str = "with_question"  # or "held": tokenising, units and the selector's index done before the question

    def __post_init__(self):
        super().__post_init__()
        if not 1 <= self.ratio < math.inf:  # also refuses NaN
            raise ConfigError(f"ratio must be a finite number ≥ 1, got {self.ratio}")
        if self.span_mode not in SPAN_MODES:
            raise UnknownNameError("span mode", self.span_mode, SPAN_MODES)
        if isinstance(self.span, bool) or not isinstance(self.span, int) or self.span < 1:
            raise ConfigError(f"span must be an integer ≥ 1, got {self.span!r}")
        if not isinstance(self.unit_floor, bool):
            raise ConfigError(f"unit_floor must be True or False, got {self.unit_floor!r}")
        if self.selector not in SELECTORS:
            raise UnknownNameError("selector", self.selector, SELECTORS)
        if not issubclass(SELECTORS[self.selector], TextSelector):
            text = [n for n in SELECTORS.names() if issubclass(SELECTORS[n], TextSelector)]
            raise ConfigError(f"retrieval needs a text selector (one that reads no KV state): {', '.join(text)}; "
                              f"{self.selector!r} scores states: use cacheback(selector={self.selector!r})")
        if self.read not in READS:
            raise UnknownNameError("retrieval read", self.read, READS)
        check_sentence_options(self.span_mode, self.context, self.fill)
        self._selector = get_selector(self.selector, **self.selector_params)

    def units(self, sender: Agent, document: str, index: bool = False) -> Units:
        """The query-blind part of a sender's pick (`Units`); with `index`, the selector's index of the units too."""
        text, start = chat_document(sender, SENDER_PROMPT.format(document=document), document)
        per_row = token_document_spans(sender, text, document, start)
        eligible = torch.tensor([sp is not None for sp in per_row], dtype=torch.bool, device=HOST)  # (T,) text work
        keep = torch.zeros_like(eligible)  # nothing is always sent: no first or latent rows in text
        groups = sentence_groups(per_row, document, 2 * self.span) if self.span_mode == "sentence" else None
        units = span_units(keep, eligible, self.span, groups)
        ctx = context_rows(groups, per_row, document, self.context) if groups and self.context != "none" else None
        built = self._selector.index(unit_texts(per_row, document, units)) if index else None
        return Units(per_row, eligible, groups, units, ctx, built)

    def pick(self, sender: Agent, document: str, question: str) -> Picked:
        """The text one sender sends for `question`, timed from the question's arrival (read="held": plus its
        query-blind work, charged as its read: measured when done now, 0 s when held from an earlier question)."""
        self._selector.prepare()
        read_s, held = 0.0, False
        if self.read == "held":  # before the question: the clock below starts after it
            u, read_s, held = held_value(self._index_key(sender, document),
                                         lambda: self.units(sender, document, index=True), sender.device)
        t0 = now(sender.device)
        if self.read == "held":
            unit_scores = (self._selector.score_index(u.built, question) if u.units
                           else torch.zeros(0, dtype=torch.float64, device=HOST))  # (U,)
            scores = rows_from_units(unit_scores, u.units, len(u.per_row), HOST)
        else:
            u = self.units(sender, document)
            scores = unit_row_scores(self._selector, question, u.per_row, document, len(u.per_row), u.units, HOST)
        budget = fanin_budget(len(u.per_row), self.ratio)
        keep = torch.zeros_like(u.eligible)
        rows = select_rows(scores, budget, keep, self.span, u.eligible, u.groups, self.unit_floor, u.ctx, self.fill)
        kept = kept_document_spans(u.per_row, rows)
        text = Spans.of(document, sent_spans(u.per_row, rows, document)).text  # as cacheback_x sends spans: the same text
        return Picked(text, kept, now(sender.device) - t0 + read_s, budget, len(kept), read_s, held)

    def _index_key(self, sender: Agent, document: str) -> tuple:
        """What a held index depends on: the sender and its templated prompt (so a changed chat template is a new
        index), the units (span mode, span, context) and the selector with its parameters (its dataclass repr); not
        the budget or the fill."""
        return ("index", sender.uid, sender.model_name, repr(self._selector), self.span_mode, self.span,
                self.context, text_key(sender.chat_text(SENDER_PROMPT.format(document=document))))

    def run(self, senders: Sequence[Agent], documents: Sequence[str], receiver: Agent, question: str) -> Outcome:
        picked = [self.pick(sender, doc, question) for sender, doc in self._pair(senders, documents)]
        message = SENDER_SEPARATOR.join(p.text for p in picked if p.text)
        reply = receiver.answer(question, message=message, max_new_tokens=self.max_new_tokens)
        return Outcome(self.name, reply.text, len(message.encode()), reply.context,
                       tuple(p.seconds for p in picked), reply.seconds,
                       {"pieces": [p.text for p in picked], "budgets": [p.budget for p in picked],
                        "kept_tokens": [p.tokens for p in picked]}
                       | ({"held_index": [p.held for p in picked]} if self.read == "held" else {}),
                       kept_spans=tuple(p.kept for p in picked),
                       read_seconds=tuple(p.read_s for p in picked),  # with_question: 0, all its work follows it
                       after_first=after_first(reply))

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

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Sequence

import torch

from ..agent import Agent
from ..clock import now
from ..errors import ConfigError, UnknownNameError
from ..message import Spans
from ..placement import HOST
from ..select import unit_texts
from .base import after_first, SENDER_PROMPT, Outcome, Protocol, register
from .stages.cross import SENDER_SEPARATOR
from .documents import chat_document, kept_document_spans, sent_spans, token_document_spans
from .reads import held_value, text_key
from .stages import Held, Ratio, Sentences, Stage, Text, flat_keywords, stage


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
@flat_keywords
@dataclass
class Retrieval(Protocol):
    """Each sender sends, as text, the document units a retriever ranks best for the question, within CacheBack's
    budget at `ratio`; key parameters: `score` (text('bm25'), text('dense'), text('lexical'), or a fusion of two),
    `ratio`, `units`, `read`. The flat keywords `selector=`, `span_mode=`, `context=`, ... build the same stages."""
    name = "retrieval"
    default_selector = "bm25"
    score: Stage = field(default_factory=Text)
    units: Stage = field(default_factory=Sentences)
    budget: Stage = field(default_factory=Ratio)
    read: str = "with_question"  # or "held": tokenising, units and the selector's index done before the question

    def __post_init__(self):
        super().__post_init__()
        for kind in ("score", "units", "budget"):
            setattr(self, kind, stage(kind, getattr(self, kind)))
        for part in (self.score, self.units, self.budget):
            part.check(self)  # a scorer that needs a sender's read refuses: retrieval reads nothing
        if self.read not in READS:
            raise UnknownNameError("retrieval read", self.read, READS)
        if self.read == "held" and not isinstance(self.score, Text):
            raise ConfigError(f"read 'held' holds a text scorer's index of the units; {self.score!r} has none")

    @property
    def ratio(self) -> float:
        return self.budget.ratio

    @property
    def selector(self) -> str:
        return getattr(self.score, "selector", repr(self.score))

    def units_of(self, sender: Agent, document: str, index: bool = False) -> Units:
        """The query-blind part of a sender's pick (`Units`); with `index`, the selector's index of the units too."""
        text, start = chat_document(sender, SENDER_PROMPT.format(document=document), document)
        per_row = token_document_spans(sender, text, document, start)
        eligible = torch.tensor([sp is not None for sp in per_row], dtype=torch.bool, device=HOST)  # (T,) text work
        keep = torch.zeros_like(eligible)  # nothing is always sent: no first or latent rows in text
        groups = self.units.groups(per_row, document)
        units = self.units.units(keep, eligible, groups)
        ctx = self.units.carried(groups, per_row, document) if groups else None
        built = self.score._selector.index(unit_texts(per_row, document, units)) if index else None
        return Units(per_row, eligible, groups, units, ctx, built)

    def pick(self, sender: Agent, document: str, question: str) -> Picked:
        """The text one sender sends for `question`, timed from the question's arrival (read="held": plus its
        query-blind work, charged as its read: measured when done now, 0 s when held from an earlier question)."""
        self.score.prepare()
        read_s, held = 0.0, False
        if self.read == "held":  # before the question: the clock below starts after it
            u, read_s, held = held_value(self._index_key(sender, document),
                                         lambda: self.units_of(sender, document, index=True), sender.device)
        t0 = now(sender.device)
        if self.read != "held":
            u = self.units_of(sender, document)
        keep = torch.zeros_like(u.eligible)
        h = Held(sender, None, u.per_row, document, u.eligible, keep, u.groups, u.units, {}, index=u.built)
        scores = self.score.scores(h, question)
        budget = self.budget.rows(scores, keep, self.units, u.eligible, u.groups)
        rows = self.units.select(scores, budget, keep, u.eligible, u.groups, u.ctx)
        kept = kept_document_spans(u.per_row, rows)
        text = Spans.of(document, sent_spans(u.per_row, rows, document)).text  # as cacheback_x sends spans: the same text
        return Picked(text, kept, now(sender.device) - t0 + read_s, budget, len(kept), read_s, held)

    def _index_key(self, sender: Agent, document: str) -> tuple:
        """What a held index depends on: the sender and its templated prompt (so a changed chat template is a new
        index), the units stage and the selector with its parameters (its dataclass repr); not the budget."""
        units = (type(self.units).__name__, self.units.span, getattr(self.units, "context", "none"))  # not fill, floor
        return ("index", sender.uid, sender.model_name, repr(self.score._selector), units,
                text_key(sender.chat_text(SENDER_PROMPT.format(document=document))))

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

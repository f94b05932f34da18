"""CacheBack (docs/methods.md#cacheback): each sender scores its finished read against the receiver's question and
sends only the best positions, as rows the receiver re-prefills inside its chat template (or as their K/V).

A sender reads query-blind (prefill + G latent steps), so one held read answers many questions; then four stages
(protocols/stages/) make its message: `score` ranks the read's rows for the question, `units` cuts the document
into what is kept whole, `budget` says how many rows, `encoding` what travels and how the receiver takes it in.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Sequence

import torch

from ..agent import LATENT_MODES, Agent
from ..clock import now
from ..errors import ConfigError, UnknownNameError
from ..message import Rows
from ..registry import construct
from ..select import always_kept
from ..state import KVState
from .base import after_first, QUESTION_SUFFIX, SENDER_PROMPT, Outcome, Protocol, register
from .documents import document_rows, kept_document_spans
from .reads import Read, held_value, read, text_key
from .stages import Attention, Held, RowsEncoding, Sentences, Stage, Ratio, draft, flat_keywords, stage, to_flat
from .stages.wrappers import innermost
from .variants import SCORING_PRESETS, variant_fields
from .windows import FanInWindow

ENCODINGS = ("rows", "token_ids", "kv", "kv_reencoded", "kv_blend")  # stages/encoding.py describes each
KV_ENCODINGS = ("kv", "kv_reencoded", "kv_blend")  # K/V states: attached by the receiver, not re-prefilled
RECOMPUTE = 0.15  # kv_blend's default share, CacheBlend's operating point (not tuned on our tasks)


@dataclass(frozen=True)
class Sent:
    """One CacheBack sender's contribution: its message (`CacheBack.pack`), its seconds (read + selection),
    the document spans of its selected rows, its timing record and the positions of the rows it selected."""
    part: object  # Rows for CacheBack; Spans, or a translated KVState, for CacheBackX
    seconds: float
    kept: tuple
    timing: dict
    positions: list[int]


@register
@flat_keywords
@dataclass
class CacheBack(FanInWindow, Protocol):
    """Each sender sends its best-scoring document rows (B = ceil(T / 8) by default, plus its first and latent rows)
    for the receiver to re-prefill; key parameters: `ratio`, `latent_steps`, `score`, `units`, `encoding`. The flat
    keywords of earlier versions (`probe=16`, `span_mode='fixed'`, ...) build the same stages (stages/spec.py)."""
    name = "cacheback"
    latent_steps: int = 8  # G; the measured studies all use 8 (docs/methods.md#latentmas, "Default G")
    latent_mode: str = "rescale"
    score: Stage = field(default_factory=Attention)
    units: Stage = field(default_factory=Sentences)
    budget: Stage = field(default_factory=Ratio)
    encoding: Stage = field(default_factory=RowsEncoding)
    # The sender reads the question with its document (kvpress's query-aware setting): with a receiver-agnostic
    # selector (snapkv) the strongest baseline that sees the question; its read then serves that question only.
    query_aware: bool = False

    def __post_init__(self):
        super().__post_init__()
        if isinstance(self.latent_steps, bool) or self.latent_steps < 0:
            raise ConfigError(f"latent_steps must be ≥ 0, got {self.latent_steps}")
        if self.latent_mode not in LATENT_MODES:
            raise UnknownNameError("latent mode", self.latent_mode, LATENT_MODES)
        for kind in ("score", "units", "budget", "encoding"):
            setattr(self, kind, stage(kind, getattr(self, kind)))
        for part in (self.score, self.units, self.budget, self.encoding):
            part.check(self)  # each stage refuses what it cannot serve
        self._memo: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # read -> its drafts and backgrounds

    @property
    def ratio(self) -> float:
        return self.budget.ratio

    @property
    def span(self) -> int:
        return self.units.span

    @property
    def selector(self) -> str:
        """The name of the selector that ranks the rows (the attention scorer's, inside any wrapper)."""
        return innermost(self.score).selector

    @property
    def attention(self) -> Attention | None:
        """The attention stage inside the score stage (None: text scores alone)."""
        inner = innermost(self.score)
        return inner if isinstance(inner, Attention) else None

    @property
    def flat(self) -> dict:
        """The stages as the flat keywords of earlier versions (`to_flat`): {"probe": 16, "span_mode": ...}."""
        return to_flat(self)

    @classmethod
    def variant(cls, spec: str, **fields) -> "CacheBack":
        """A CacheBack from a short variant name (`variants.py`): "cacheback@deep+generic/sentence:probe=16"."""
        return construct("protocol", cls.name, cls, **variant_fields(spec, **fields))  # typed errors, as get_protocol

    def __getstate__(self):  # picklable (protocols travel to Ray actors): the memo stays behind
        return self.__dict__ | {"_memo": None}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._memo = weakref.WeakKeyDictionary()

    def sender_prompt(self, document: str, question: str | None = None) -> str:
        if not self.query_aware:
            return SENDER_PROMPT.format(document=document)
        if question is None:
            raise ValueError("a query_aware sender reads the question with its document: pass question=")
        return SENDER_PROMPT.format(document=document) + QUESTION_SUFFIX.format(question=question)

    def read(self, sender: Agent, document: str, question: str | None = None) -> KVState:
        """The sender's finished state: prefill + latent steps (query-blind unless `query_aware`)."""
        return self.sender_read(sender, document, question).state

    def sender_read(self, sender: Agent, document: str, question: str | None = None) -> Read:
        """`read` with its measured seconds; inside `shared_reads()` one read serves every protocol."""
        return read(sender, self.sender_prompt(document, question), self.latent_steps, self.latent_mode,
                    full_history=self.encoding.full_history)  # K/V of any selected row, sliding layers included

    def held(self, sender: Agent, state: KVState, eligible=None, groups=None, per_row=None, document=None) -> Held:
        """What the stages see of one sender's read for a question (`Held`)."""
        keep = always_kept(state)
        return Held(sender, state, per_row, document, eligible, keep, groups, self.units.units(keep, eligible, groups),
                    self._memo.setdefault(state, {}), self.query_aware)

    def scores(self, sender: Agent, state: KVState, question: str, per_row: list | None = None) -> torch.Tensor:
        """(T,) the score stage's row scores of `state` for `question` (`per_row`: where the document sits)."""
        return self.score.scores(self.held(sender, state, per_row=per_row), question)

    def said(self, sender: Agent, state: KVState, question: str) -> str | None:
        """The sender's answer draft the score stage decodes for `question` (None: it decodes none)."""
        n = self.score.drafts()
        return draft(self.held(sender, state), question, n) if n else None

    def choose(self, sender: Agent, state: KVState, question: str, eligible: torch.Tensor | None = None,
               groups: list[list[int]] | None = None, per_row: list | None = None,
               document: str | None = None) -> torch.Tensor:
        """Row indices to send for this question (re-scoring a held read; the sender is not re-run). `groups`: the
        document's units (`span_groups`); text scorers and carried context also need `per_row` and `document`."""
        h = self.held(sender, state, eligible, groups, per_row, document)
        scores = self.score.scores(h, question)
        budget = self.budget.rows(scores, h.keep, self.units, eligible, groups)
        return self.units.select(scores, budget, h.keep, eligible, groups, self.units.carried(groups, per_row, document))

    def layout(self, sender: Agent, document: str, n_rows: int, prompt: str) -> tuple:
        """(per_row, eligible, groups) of a state of `n_rows` read from `prompt`: `document_rows` and `span_groups`."""
        per_row, eligible = document_rows(sender, document, n_rows, prompt)
        return per_row, eligible, self.span_groups(per_row, document)

    def span_groups(self, per_row: list, document: str) -> list[list[int]] | None:
        """The units stage's groups for this document: None (fixed spans) or its sentences and lines."""
        return self.units.groups(per_row, document)

    def run(self, senders: Sequence[Agent], documents: Sequence[str], receiver: Agent, question: str) -> Outcome:
        self.check_window(senders, documents, receiver, question)
        parts, seconds, kept, timing = self.send(senders, documents, question)
        where = {receiver.device, *(p.device for p in parts if isinstance(p, KVState))}  # K/V placed where they lie
        t0 = now(*where)
        message = self.receive(receiver, question, parts)
        key = self.encoding.receive_key  # placing K/V, or re-tokenising spans: the receiver's work
        receive_s = now(*where) - t0 if key else 0.0
        nbytes, details = self.encoding.cost(parts, message)
        reply = self.reply(receiver, question, message)
        return Outcome(self.name, reply.text, nbytes, reply.context, tuple(seconds), reply.seconds + receive_s,
                       {"senders": timing} | details | ({key: receive_s} if key else {}),
                       kept_spans=self.encoding.kept(parts, tuple(kept)), read_seconds=self.reads_of(timing),
                       after_first=after_first(reply))

    def reads_of(self, timing: list[dict]) -> tuple[float, ...] | None:
        """Each sender's read seconds (`Outcome.read_seconds`): None when it read the question too (query-aware)."""
        return None if self.query_aware else tuple(t["read_s"] for t in timing)

    def receive(self, receiver: Agent, question: str, parts: Sequence) -> Rows | KVState:
        """The receiver's input from the senders' messages, in sender order (the encoding's `receive`)."""
        return self.encoding.receive(receiver, question, parts, self.max_new_tokens)

    @property
    def recompute_share(self) -> float:
        """The share of attached rows the receiver recomputes (the encoding's; 0 for rows)."""
        return self.encoding.recompute

    def reply(self, receiver: Agent, question: str, message: Rows | KVState):
        """The receiver's answer over `receive`'s message, as the encoding takes it in."""
        return self.encoding.reply(receiver, question, message, self.max_new_tokens)

    def pack(self, sender: Agent, state: KVState, rows: torch.Tensor, per_row: list, document: str, index: int):
        """What sender `index` sends for its selected `rows` (timed as its selection): the encoding's `pack`."""
        return self.encoding.pack(sender, state, rows, per_row, document, index)

    def send(self, senders: Sequence[Agent], documents: Sequence[str], question: str) -> tuple[list, list, list, list]:
        """Each sender reads, scores and selects: (what each sends (`pack`), its seconds, its kept document
        spans per row, its timing record)."""
        sent = [self.send_one(sender, doc, question, i) for i, (sender, doc) in enumerate(self._pair(senders, documents))]
        return [x.part for x in sent], [x.seconds for x in sent], [x.kept for x in sent], [x.timing for x in sent]

    def send_one(self, sender: Agent, document: str, question: str, index: int) -> Sent:
        """Sender `index` reads, scores and selects (`Sent`). The distributed runner calls this where the sender
        lives, so a sender does the same work in process and on a node."""
        self.score.prepare()  # an encoder loads once, before any question's clock
        self.encoding.prepare(sender)  # a translator too
        r = self.sender_read(sender, document, question)
        state, tb = r.state, now(sender.device)
        worked = self.score.before_question(self.held(sender, state))  # query-blind (a background): part of the read
        background_s = now(sender.device) - tb if worked else 0.0
        # Where the document sits in the read's rows and its units depend on the prompt, not on the question
        # (unless it is in the prompt: query_aware): part of the read, held with it across questions.
        prompt = self.sender_prompt(document, question)
        (per_row, eligible, groups), layout_s, _ = held_value(
            ("index", "layout", sender.uid, len(state), self.units.name, self.span, text_key(prompt),
             text_key(document)),  # the agent (uid) fixes its chat template: no render needed to key it
            lambda: self.layout(sender, document, len(state), prompt), sender.device)
        t1 = now(sender.device)
        t0 = t1 - r.seconds - background_s - layout_s  # charged the read it would pay alone, shared or not
        rows = self.choose(sender, state, question, eligible, groups, per_row, document)
        part = self.pack(sender, state, rows, per_row, document, index)
        # Press baselines re-run the prefill to record scores a deployed sender records while reading:
        # that re-run is not charged, the scoring inside it is.
        t2 = now(sender.device) - self.score.rerun_seconds(self.held(sender, state, per_row=per_row))
        doc_rows = sum(1 for x in rows.tolist() if x < len(per_row) and per_row[x] is not None)
        timing = {"read_s": r.seconds + background_s + layout_s, "background_s": background_s, "layout_s": layout_s,
                  "select_s": t2 - t1, "rows": len(state), "sent": len(rows), "sent_document_rows": doc_rows,
                  "shared_read": r.shared} | self.encoding.sent(part)  # sent: + first, latent
        if self.score.drafts():
            timing["probe"] = self.said(sender, state, question)  # what the sender began to answer
        return Sent(part, t2 - t0, kept_document_spans(per_row, rows), timing, state.positions[rows].tolist())


__all__ = ["CacheBack", "Sent", "ENCODINGS", "KV_ENCODINGS", "RECOMPUTE", "SCORING_PRESETS", "document_rows",
           "kept_document_spans"]

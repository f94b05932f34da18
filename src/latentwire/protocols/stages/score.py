"""Scoring stages: (T,) row scores of one sender's held read for a question; higher = send.

    attention(selector='cacheback', params={}, query='turn')   a state selector over the read (the paper's Q·C²)
    text('bm25', params={}, draft=0)                           a retriever over the document's units, no LLM
    fuse(attention(), text('dense'), k=60.0)                   reciprocal rank fusion of two scorers' unit ranks

The probe and calibration wrap an attention scorer (wrappers.py). Each stage refuses what it cannot serve (a probe
needs attention to pool, a calibration scores to divide, a draft a sender that read the document).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from ...select import SELECTORS, TextSelector, fused_row_scores, get_selector, rows_from_units, unit_ranks
from ...select import unit_row_scores
from ...select.presses import rerun_seconds
from ...templates import KV_PROMPT
from ...errors import UnknownNameError
from .base import STAGES, Held, Stage

QUERY_FORMATS = ("turn", "raw")  # the question as the receiver's next chat turn, or its tokens alone
PROBE_MIXES = ("join", "and")  # one query (turn + draft), or √(turn's scores × (turn + draft)'s)
CALIBRATIONS = ("generic", "masked")  # ÷ a generic question's scores (once per read), or the masked question's
DEEP = {"p": 0.0, "min_depth": 0.5}  # mean query attention over the deeper half of the layers (contrastive scores)


def text_selectors() -> list[str]:
    return [n for n in SELECTORS.names() if issubclass(SELECTORS[n], TextSelector)]


def draft(h: Held, question: str, tokens: int) -> str:
    """The sender's first `tokens` greedy answer tokens to the question's turn, decoded on its read (which is not
    changed) once per read, question and length: what the probe and a draft query share."""
    key = ("probe", h.sender.uid, question, tokens)
    if key not in h.memo:
        answer = h.sender.answer_after(h.state, KV_PROMPT.format(question=question), max_new_tokens=tokens)
        h.memo[key] = h.sender.tokenizer.decode(list(answer.token_ids), skip_special_tokens=True)
    return h.memo[key]


@dataclass(repr=False)
class Score(Stage):
    kind = "score"
    has_mass = True  # scores whose positive mass means something (an adaptive budget reads it)
    reads_text = False  # scores the document's text: needs per_row and document

    def prepare(self) -> None:
        """Load what scoring needs (an encoder) before any question's clock; nothing by default."""

    def before_question(self, h: Held) -> bool:
        """Query-blind work on a held read (charged to the read, held with it); False: this scorer has none."""
        return False

    def scores(self, h: Held, question: str) -> torch.Tensor:
        """(T,) row scores of `h` for `question`."""
        raise NotImplementedError

    def rerun_seconds(self, h: Held) -> float:
        """Seconds inside the last `scores` a benchmark does not charge (a press's recording re-run)."""
        return 0.0

    def drafts(self) -> int:
        """The answer draft's length in tokens that this scorer decodes (0: none)."""
        return 0


@STAGES.register
@dataclass(repr=False)
class Attention(Score):
    """A state selector's scores of the read for the question's query (`query`: "turn" = the receiver's next chat
    turn asking it, "raw" = its tokens alone)."""
    name = "attention"
    positional = True
    selector: str = "cacheback"
    params: dict = field(default_factory=dict)
    query: str = "turn"

    def __post_init__(self):
        if self.selector in SELECTORS and issubclass(SELECTORS[self.selector], TextSelector):
            raise self.refuse(f"{self.selector!r} scores text, not a read: use text({self.selector!r})")
        if self.query not in QUERY_FORMATS:
            raise UnknownNameError("attention query format", self.query, QUERY_FORMATS)
        self._selector = get_selector(self.selector, **self.params)
        self._windowed: dict = {}

    @property
    def query_conditioned(self) -> bool:
        return self._selector.query_conditioned

    def check(self, protocol) -> None:
        if getattr(protocol, "latent_steps", None) is None:
            raise self.refuse(f"scores a sender's read; this protocol has none: use a text selector, "
                              f"text(...) of {', '.join(text_selectors())}")
        self._selector.check_installed()  # a kvpress selector without the extra: refused before any compute

    def query_text(self, sender, question: str) -> str:
        return sender.continuation_text(KV_PROMPT.format(question=question)) if self.query == "turn" else question

    def selector_for(self, h: Held | None):
        """The selector that scores `h`: query-aware SnapKV gets the question (the rows after the document) as its
        observation window, unless `params` fixes `window_size`."""
        per_row = h.per_row if h is not None else None
        if not (h is not None and h.query_aware and per_row and hasattr(self._selector, "window_size")
                and "window_size" not in self.params):
            return self._selector
        last = max((i for i, span in enumerate(per_row) if span is not None), default=len(per_row) - 1)
        window = max(1, len(per_row) - 1 - last)
        if window not in self._windowed:  # one instance per window: its timing fields stay readable
            self._windowed[window] = replace(self._selector, window_size=window)
        return self._windowed[window]

    def score_query(self, h: Held, query: str) -> torch.Tensor:
        return self.selector_for(h).score(h.sender, h.state, query)

    def scores(self, h: Held, question: str) -> torch.Tensor:
        return self.score_query(h, self.query_text(h.sender, question))

    def rerun_seconds(self, h: Held) -> float:
        return rerun_seconds(self.selector_for(h))

    def __getstate__(self):
        return self.__dict__ | {"_windowed": {}}


@STAGES.register
@dataclass(repr=False)
class Text(Score):
    """A retriever's scores of the document's units (each row takes its unit's); with `draft` = n, the query is the
    question followed by the sender's first n answer tokens (which name whom a pronoun means, in the document's
    words)."""
    name = "text"
    positional = True
    selector: str = "bm25"
    params: dict = field(default_factory=dict)
    draft: int = 0
    reads_text = True

    def __post_init__(self):
        if self.selector not in text_selectors():
            raise UnknownNameError("text selector", self.selector, text_selectors())
        if isinstance(self.draft, bool) or not isinstance(self.draft, int) or self.draft < 0:
            raise self.refuse(f"draft must be an int ≥ 0 (answer tokens the sender decodes), got {self.draft!r}")
        self._selector = get_selector(self.selector, **self.params)

    def check(self, protocol) -> None:
        if self.draft and getattr(protocol, "latent_steps", None) is None:
            raise self.refuse("the draft is decoded by a sender on its read; this protocol's senders read nothing")

    def drafts(self) -> int:
        return self.draft

    def prepare(self) -> None:
        self._selector.prepare()

    def query(self, h: Held, question: str) -> str:
        return question if not self.draft else f"{question} {draft(h, question, self.draft)}"

    def scores(self, h: Held, question: str) -> torch.Tensor:
        if h.per_row is None or h.document is None:
            raise ValueError(f"selector {self.selector!r} scores the document's text: pass per_row and document")
        query = self.query(h, question)
        if h.index is None:
            return unit_row_scores(self._selector, query, h.per_row, h.document, h.n_rows, h.units, h.device)
        unit_scores = (self._selector.score_index(h.index, query) if h.units
                       else torch.zeros(0, dtype=torch.float64, device=h.device))  # (U,)
        return rows_from_units(unit_scores, h.units, h.n_rows, h.device)


@STAGES.register
@dataclass(repr=False)
class Fuse(Score):
    """Reciprocal rank fusion of two scorers' unit ranks (constant `k`): attention breaks the ties word overlap
    cannot (whose "she"), a retriever finds what a small model's attention misses (paraphrase)."""
    name = "fuse"
    positional = True
    first: Stage = field(default_factory=Attention)
    second: Stage = field(default_factory=lambda: Text("dense"))
    k: float = 60.0
    has_mass = False  # rank-fused scores are near flat: their mass means nothing

    def __post_init__(self):
        for part in (self.first, self.second):
            if not isinstance(part, Score) or isinstance(part, Fuse):
                raise self.refuse(f"fuses two scorers (not fusions), got {part!r}")
        if not self.k > 0:
            raise self.refuse(f"k must be > 0, got {self.k!r}")

    @property
    def reads_text(self) -> bool:
        return self.first.reads_text or self.second.reads_text

    def check(self, protocol) -> None:
        self.first.check(protocol)
        self.second.check(protocol)

    def drafts(self) -> int:
        return max(self.first.drafts(), self.second.drafts())

    def prepare(self) -> None:
        self.second.prepare()
        self.first.prepare()

    def before_question(self, h: Held) -> bool:
        return self.first.before_question(h) | self.second.before_question(h)

    def scores(self, h: Held, question: str) -> torch.Tensor:
        second = self.second.scores(h, question)
        first = self.first.scores(h, question)
        return fused_row_scores([unit_ranks(first, h.units), unit_ranks(second, h.units)], h.units, h.n_rows,
                                self.k, h.device)

    def rerun_seconds(self, h: Held) -> float:
        return self.first.rerun_seconds(h) + self.second.rerun_seconds(h)

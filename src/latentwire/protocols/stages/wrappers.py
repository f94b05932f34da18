"""Score wrappers: what reads through an attention scorer's query — the answer probe and background calibration.

    probe(16, mix='join', of=attention())                + the sender's own first answer tokens
    calibrated('generic', floor=0.05, of=attention())    ÷ the scores of a content-free query
    contrastive()                                        calibrated('generic', of=attention(params={'p': 0.0,
                                                         'min_depth': 0.5})): deep layers, calibrated
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..calibration import GENERIC_QUESTION, calibrate, masked_question
from ...errors import UnknownNameError
from .base import STAGES, Held, Stage
from .score import CALIBRATIONS, DEEP, PROBE_MIXES, Attention, Fuse, Score, Text, draft


def _attention_of(stage: Stage, what: str) -> Attention:
    """The query-conditioned attention scorer a wrapper reads through (itself maybe wrapped by a probe)."""
    inner = stage.of.of if isinstance(stage.of, Probe) else stage.of
    if not isinstance(inner, Attention) or not inner.query_conditioned:
        raise stage.refuse(f"{what} needs a query-conditioned state selector's scores, not {stage.of!r}")
    return inner


@STAGES.register
@dataclass(repr=False)
class Probe(Score):
    """The sender decodes its first `tokens` greedy answer tokens on its read (not kept, not sent), and their
    attention joins the question's: the rows a model reads as it starts to answer. `mix`: "join" = one query, the
    turn then the draft; "and" = √(turn's scores × joined scores), a row read for the question and while answering."""
    name = "probe"
    positional = True
    tokens: int = 16
    mix: str = "join"
    of: Stage = field(default_factory=Attention)

    def __post_init__(self):
        if isinstance(self.tokens, bool) or not isinstance(self.tokens, int) or self.tokens < 1:
            raise self.refuse(f"tokens must be an int ≥ 1 (answer tokens decoded to score with), got {self.tokens!r}")
        if self.mix not in PROBE_MIXES:
            raise UnknownNameError("probe mix", self.mix, PROBE_MIXES)
        if _attention_of(self, "probe") is not self.of:
            raise self.refuse("wraps attention(...) directly")
        if self.of.query != "turn":
            raise self.refuse("decodes the sender's answer to the question's turn: it needs attention(query='turn')")

    def check(self, protocol) -> None:
        self.of.check(protocol)

    def drafts(self) -> int:
        return self.tokens

    def query_for(self, h: Held, question: str) -> str:
        return self.of.query_text(h.sender, question) + draft(h, question, self.tokens)

    def scores(self, h: Held, question: str) -> torch.Tensor:
        scores = self.of.score_query(h, self.query_for(h, question))
        if self.mix == "and":
            scores = (scores * self.of.score_query(h, self.of.query_text(h.sender, question))).sqrt()
        return scores

    def rerun_seconds(self, h: Held) -> float:
        return self.of.rerun_seconds(h)


@STAGES.register
@dataclass(repr=False)
class Calibrated(Score):
    """Background calibration: the question's scores ÷ those of a content-free query, floored at κ·mean
    (`calibrate`): "generic" = a generic question, scored once per held read; "masked" = the question with its
    content words replaced (one more pass per question)."""
    name = "calibrated"
    positional = True
    background: str = "generic"
    floor: float = 0.05
    of: Stage = field(default_factory=Attention)

    def __post_init__(self):
        if self.background not in CALIBRATIONS:
            raise UnknownNameError("calibration", self.background, CALIBRATIONS)
        if not self.floor > 0:
            raise self.refuse(f"floor (flat: calibration_floor) must be > 0, got {self.floor!r}")
        _attention_of(self, "calibration")

    def check(self, protocol) -> None:
        self.of.check(protocol)

    def drafts(self) -> int:
        return self.of.drafts()

    def before_question(self, h: Held) -> bool:
        return self.generic(h) is not None

    def generic(self, h: Held) -> torch.Tensor | None:
        """(T,) the generic background of a held read (None under "masked"), scored once and kept in its memo."""
        if self.background != "generic":
            return None
        key = ("background", h.sender.uid, repr(self.of))
        if key not in h.memo:
            h.memo[key] = self.of.scores(h, GENERIC_QUESTION)
        return h.memo[key]

    def scores(self, h: Held, question: str) -> torch.Tensor:
        scores = self.of.scores(h, question)
        background = self.generic(h) if self.background == "generic" else self.of.scores(h, masked_question(question))
        return calibrate(scores, background, self.floor)

    def rerun_seconds(self, h: Held) -> float:
        return self.of.rerun_seconds(h)


def innermost(score: Stage) -> Stage:
    """The scorer at the core of wrappers (`of`) and fusions (their first part): whose selector ranks the rows."""
    while isinstance(score, (Probe, Calibrated, Fuse)):
        score = score.first if isinstance(score, Fuse) else score.of
    return score


def contrastive(floor: float = 0.05, query: str = "turn") -> Calibrated:
    """Contrastive CacheBack: mean query attention over the deeper half of the layers, generic-calibrated."""
    return Calibrated("generic", floor, Attention("cacheback", dict(DEEP), query))


SCORES = {"attention": Attention, "text": Text, "probe": Probe, "calibrated": Calibrated, "fuse": Fuse,
          "contrastive": contrastive}

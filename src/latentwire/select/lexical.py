"""Lexical: a unit scores the number of distinct question content words it contains. No model, no weights.

The simplest retriever a user would write: lower-case word tokens, English function words (and question
words) removed, exact forms (no stemming: "plays" and "play" differ; BM25 has the stemmer). Ties are
left to `select_rows`, which takes the earlier unit first.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from ..placement import HOST
from .base import TextSelector, register

STOPWORDS = frozenset("""
a about above after again against all also am an and any are as at be because been before being below between
both but by can could did do does doing down during each either few for from further had has have having he her
here hers herself him himself his how i if in into is it its itself just me might more most must my myself no nor
not now of off on once only or other ought our ours ourselves out over own same shall she should so some such
than that the their theirs them themselves then there these they this those through to too under until up upon us
very was we were what when where which while who whom whose why will with would yet you your yours yourself
yourselves s t d ll m re ve
""".split())
_WORD = re.compile(r"[^\W_]+")


def words(text: str) -> list[str]:
    """Lower-case word tokens (letters and digits; punctuation and "'s" split off)."""
    return _WORD.findall(text.lower())


def content_words(text: str) -> set[str]:
    """The distinct lower-case words of `text` that are not function words (`STOPWORDS`)."""
    return {w for w in words(text) if w not in STOPWORDS}


@register
@dataclass
class LexicalSelector(TextSelector):
    name = "lexical"

    def score_units(self, units: list[str], query: str) -> torch.Tensor:
        return self.score_index(self.index(units), query)

    def index(self, units: list[str]) -> list[set[str]]:
        """Each unit's content words."""
        return [content_words(u) for u in units]

    def score_index(self, index: list[set[str]], query: str) -> torch.Tensor:
        q = content_words(query)
        return torch.tensor([float(len(q & u)) for u in index], dtype=torch.float64, device=HOST)

"""BM25 (Okapi, Lucene variant, via `bm25s`): the units of one document are the corpus, the question the query.

Terms are `lexical.words` minus `lexical.STOPWORDS`, Snowball-stemmed ("plays" and "play" meet), so the
only difference from the lexical selector is term weighting (IDF over the document's own units, term
frequency saturation `k1`, length normalisation `b`) and stemming. Ties are left to `select_rows`.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from ..placement import HOST
from .base import TextSelector, register
from .lexical import STOPWORDS, words
from ..errors import ConfigError


@lru_cache(maxsize=4)
def _stemmer(language: str):
    import Stemmer  # PyStemmer, a dependency of latentwire

    return Stemmer.Stemmer(language)


def terms(text: str, stem: bool = True) -> list[str]:
    """BM25 terms of `text`: content words, stemmed (English Snowball) when `stem`."""
    ws = [w for w in words(text) if w not in STOPWORDS]
    return _stemmer("english").stemWords(ws) if stem and ws else ws


@lru_cache(maxsize=1)
def _bm25s():
    """bm25s, imported once. It sets its own logger to DEBUG, so under any root handler (the CLI's) every index
    printed "Building index from tokens": its level goes back to WARNING (`--verbose` shows INFO elsewhere)."""
    import logging

    import bm25s

    logging.getLogger("bm25s").setLevel(logging.WARNING)
    return bm25s


@register
@dataclass
class BM25Selector(TextSelector):
    name = "bm25"
    k1: float = 1.5  # term-frequency saturation
    b: float = 0.75  # length normalisation (0 = none, 1 = full)
    stem: bool = True

    def __post_init__(self):
        if not 0 <= self.k1 < float("inf"):
            raise ConfigError(f"k1 must be a finite number ≥ 0, got {self.k1!r}")
        if not 0 <= self.b <= 1:
            raise ConfigError(f"b must be in [0, 1], got {self.b!r}")

    def prepare(self) -> None:
        _bm25s()  # its first import takes most of a second: not a question's cost
        _stemmer("english")

    def score_units(self, units: list[str], query: str) -> torch.Tensor:
        return self.score_index(self.index(units), query)

    def index(self, units: list[str]) -> tuple[int, object]:
        """(number of units, the bm25s index of their stemmed terms); None for a corpus without a term, which
        bm25s cannot index."""
        corpus = [terms(u, self.stem) for u in units]
        if not any(corpus):
            return len(units), None
        index = _bm25s().BM25(k1=self.k1, b=self.b, method="lucene")
        index.index(corpus, show_progress=False)
        return len(units), index

    def score_index(self, index: tuple[int, object], query: str) -> torch.Tensor:
        n, built = index
        q = terms(query, self.stem)
        if built is None or not q:  # bm25s cannot score an empty query
            return torch.zeros(n, dtype=torch.float64, device=HOST)
        return torch.as_tensor(built.get_scores(q), dtype=torch.float64, device=HOST)

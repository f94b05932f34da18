"""Renders turn fragments into one cache a judger answers over (docs/methods.md#merging).

A render is a dataclass (its hyper-parameters are fields, validated in `__post_init__`) with one
method, `order(fragments) -> list`, a permutation of its input. `render` then concatenates the
states in that order along the sequence axis, each block's keys re-rotated exactly to its new
positions (`KVState.concat`), and returns a compact state (positions 0..T-1). Renders are pure:
the same fragments in the same order give the same bytes. A render whose `repeats` is True (BagMerge)
concatenates a repeated fragment once per copy; the others refuse repeats (a FragmentSet absorbs them).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Iterable, Sequence

from ..errors import ConfigError
from ..registry import Registry
from ..state import KVState
from .fragments import Fragment


@dataclass
class Render(ABC):
    name: ClassVar[str]
    repeats: ClassVar[bool] = False  # True: a fragment given twice is rendered twice; False: refused

    @abstractmethod
    def order(self, fragments: Sequence[Fragment]) -> list[Fragment]:
        """The fragments in the order their blocks appear in the merged cache (a permutation of the input)."""

    def render(self, fragments: Iterable[Fragment | KVState]) -> KVState:
        """One compact state: the fragments' states concatenated in `order`, keys re-rotated exactly.

        Takes fragments (a FragmentSet iterates its fragments in digest order) or bare states, which are
        wrapped with `Fragment.of`. Raises ValueError on no fragments or, unless `repeats`, a repeated
        digest (put them in a FragmentSet to absorb duplicates), GeometryMismatchError on fragments of
        different geometry.
        """
        frags = [f if isinstance(f, Fragment) else Fragment.of(f) for f in fragments]
        if not frags:
            raise ConfigError("nothing to render: no fragments")
        seen = set()
        for f in frags:
            if f.digest in seen and not self.repeats:
                raise ConfigError(f"fragment {f.digest[:12]}… given twice; a FragmentSet absorbs duplicates "
                                 f"({type(self).__name__} renders each fragment once)")
            seen.add(f.digest)
            frags[0].geometry.check_same(f.geometry)
        ordered = self.order(frags)
        if sorted(f.digest for f in ordered) != sorted(f.digest for f in frags):  # the same multiset
            raise ConfigError(f"{type(self).__name__}.order did not return a permutation of its input")
        state = KVState.concat([f.state for f in ordered])
        return state if state.is_compact else state.compact()

    __call__ = render


RENDERS = Registry("render")
register = RENDERS.register


def get_render(name: str, **params) -> Render:
    """The render `name` ("bag" or "canonical") built from `params`, e.g. `get_render("bag", order=(1, 0))`;
    an unknown name or parameter raises UnknownNameError / UnknownParameterError listing the valid ones."""
    return RENDERS.create(name, **params)

"""BagMerge (Agent Primitives): concatenate the caches in the given input order, repeats included.
Not commutative, not idempotent: a re-delivered fragment is concatenated again."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .base import Render, register
from .fragments import Fragment
from ..errors import ConfigError


@register
@dataclass(init=False)
class BagMerge(Render):
    """`BagMerge(order)`: slot i holds input fragment `order[i]`; `order=None` keeps the input order.

    The permutation is stored as `permutation` (`order` is the Render method). On a FragmentSet the
    input order is digest order: the render is then arrival-independent, but which fragment lands in
    the prefix slot is a hash, not a choice. A sequence may repeat a fragment: each copy is a block
    (N fragments of T_i rows render sum(T_i) rows), where a FragmentSet would have absorbed it.
    """

    name = "bag"
    repeats = True
    permutation: tuple[int, ...] | None  # a permutation of range(N), or None = as given

    def __init__(self, order: Sequence[int] | None = None):
        self.permutation = None if order is None else tuple(order)
        self.__post_init__()

    def __post_init__(self):
        p = self.permutation
        if p is None:
            return
        if not all(type(i) is int for i in p):
            raise ConfigError(f"order must hold ints, got {p!r}")
        if sorted(p) != list(range(len(p))):
            raise ConfigError(f"order must be a permutation of 0..N-1, got {p!r}")

    def order(self, fragments: Sequence[Fragment]) -> list[Fragment]:
        if self.permutation is None:
            return list(fragments)
        if len(self.permutation) != len(fragments):
            raise ConfigError(f"order {self.permutation!r} is for {len(self.permutation)} fragments, "
                             f"got {len(fragments)}")
        return [fragments[i] for i in self.permutation]

"""Budget stages: how many document rows one sender sends for a question.

    ratio(8)                        B = ceil(T / ratio), T = the sender's read rows
    mass(0.5, ratio=4, floor=64)    the fewest best units holding 0.5 of the score mass, between ceil(T / floor) and
                                    ceil(T / ratio) rows: a question whose evidence draws the scores sends little
    chain('relative', ratio=8)      cacheback_chain's per-hop budgets (relative, or 'fixed' at max_rows)
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ...errors import UnknownNameError
from ...select import fanin_budget, fixed_chain_budget, mass_budget, relative_chain_budget
from .base import STAGES, Stage


def _check_ratio(stage: Stage, name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 1 <= value < math.inf:
        raise stage.refuse(f"{name} must be a finite number ≥ 1, got {value!r}")


@dataclass(repr=False)
class Budget(Stage):
    """Every budget has `ratio`, its cap: B = ceil(T / ratio) at most."""
    kind = "budget"
    positional = True
    ratio = 8.0  # a field of each budget, where its place among the fields is its own

    def __post_init__(self):
        _check_ratio(self, "ratio", self.ratio)

    def cap(self, n_rows: int) -> int:
        """The most rows `rows` may give a read of `n_rows` rows."""
        return fanin_budget(n_rows, self.ratio)

    def rows(self, scores: torch.Tensor, keep: torch.Tensor, units, eligible, groups) -> int:
        """This question's budget over a read of len(scores) rows scored `scores`."""
        return self.cap(len(scores))


@STAGES.register
@dataclass(repr=False)
class Ratio(Budget):
    """A fixed compression ratio: B = ceil(T / ratio)."""
    name = "ratio"
    ratio: float = 8.0


@STAGES.register
@dataclass(repr=False)
class Mass(Budget):
    """An adaptive budget (`mass_budget`): the fewest best units holding `mass` of the positive score mass, at most
    ceil(T / ratio) rows (the cap) and at least ceil(T / floor) (the floor)."""
    name = "mass"
    mass: float = 0.5
    ratio: float = 8.0
    floor: float = 64.0

    def __post_init__(self):
        super().__post_init__()
        if isinstance(self.mass, bool) or not isinstance(self.mass, (int, float)) or not 0 < self.mass <= 1:
            raise self.refuse(f"mass must be in (0, 1], got {self.mass!r}")
        _check_ratio(self, "floor", self.floor)
        if not self.ratio <= self.floor:
            raise self.refuse(f"floor (flat: max_ratio, the ratio of the fewest rows) must be ≥ ratio (the cap), got "
                              f"floor {self.floor} with ratio {self.ratio}")

    def check(self, protocol) -> None:
        if not protocol.score.has_mass:
            raise self.refuse(f"reads the scores' mass; {protocol.score!r} gives rank scores with none to speak of")
        if protocol.units.takes_context:
            raise self.refuse(f"does not count the context rows a unit takes along ({protocol.units!r})")

    def rows(self, scores: torch.Tensor, keep: torch.Tensor, units, eligible, groups) -> int:
        cap = self.cap(len(scores))
        return mass_budget(scores, keep, self.mass, min(cap, fanin_budget(len(scores), self.floor)), cap, units.span,
                           eligible, groups)


CHAIN_KINDS = ("relative", "fixed")


@STAGES.register
@dataclass(repr=False)
class Chain(Budget):
    """cacheback_chain's budgets: the first hop ceil(T / ratio); each later hop "relative" to what it inherited and
    read (`relative_chain_budget`), or "fixed" at `max_rows` (`fixed_chain_budget`)."""
    name = "chain"
    hops: str = "relative"
    ratio: float = 8.0
    max_rows: int = 512

    def __post_init__(self):
        super().__post_init__()
        if self.hops not in CHAIN_KINDS:
            raise UnknownNameError("chain budget", self.hops, CHAIN_KINDS)
        if isinstance(self.max_rows, bool) or not isinstance(self.max_rows, int) or self.max_rows < 1:
            raise self.refuse(f"max_rows must be an integer ≥ 1, got {self.max_rows!r}")

    def check(self, protocol) -> None:
        if not hasattr(protocol, "hop"):
            raise self.refuse("sets the budgets of a chain's hops: use it with cacheback_chain")

    def hop(self, t_old: int, t_new: int) -> int:
        """A later hop's budget: it inherited `t_old` rows and read `t_new` of its own."""
        if self.hops == "relative":
            return relative_chain_budget(t_old, t_new, self.ratio)
        return fixed_chain_budget(t_old, t_new, self.max_rows)

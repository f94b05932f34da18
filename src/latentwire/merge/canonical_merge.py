"""CanonicalMerge: order the caches by content, then concatenate as BagMerge does (docs/methods.md#canonicalmerge)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from ..errors import ConfigError
from .base import Render, register
from .fragments import Fragment

DIRECTIONS = ("ascending", "descending")


@register
@dataclass
class CanonicalMerge(Render):
    """Blocks in ascending order of (mean K-norm at `layer`, digest); `direction="descending"` is the
    exact reverse of that order (largest norm first, ties: the larger digest first).

    Why the render is independent of arrival order: the sort key of a fragment is a function of its
    bytes alone (its own keys at one layer, and its digest), never of its position in the input or
    of the other fragments. Digests are distinct within a render, so the keys are distinct and the
    sorted order is the same total order for every permutation of the input; the concatenation that
    follows is a pure function of that order, so every permutation gives the same bytes. Ties in the
    norm (equal up to the last bit) fall to the digest, never to input order; that is what
    a stable sort on the norm alone would get wrong.

    The key: the L2 norm of every cached key vector (each head, each row the layer holds: a sliding
    layer holds only the state's last rows) at `layer`, in float64, each norm and their mean summed with
    `math.fsum` (correctly rounded, so it depends neither on reduction order, thread count or SIMD width nor
    on the device the fragment was decoded onto). A layer holding no
    rows has key 0.0. `layer=None` is the middle layer, num_layers // 2. The direction only reverses
    that total order, so both directions are independent of arrival order (docs/methods.md,
    "CanonicalMerge"); it is an ablation of which block lands in the prefix slot.
    """

    name = "canonical"
    layer: int | None = None
    direction: str = "ascending"  # or "descending": the reverse order

    def __post_init__(self):
        if self.layer is not None and (type(self.layer) is not int or self.layer < 0):
            raise ConfigError(f"layer must be a non-negative int or None (the middle layer), got {self.layer!r}")
        if self.direction not in DIRECTIONS:
            raise ConfigError(f"direction must be one of {DIRECTIONS}, got {self.direction!r}")

    def layer_for(self, num_layers: int) -> int:
        layer = num_layers // 2 if self.layer is None else self.layer
        if layer >= num_layers:
            raise ConfigError(f"CanonicalMerge(layer={layer}) but the fragments' model has {num_layers} layers "
                              f"(valid: 0..{num_layers - 1}, or None for the middle one)")
        return layer

    def key(self, fragment: Fragment) -> float:
        """Mean K-norm of the fragment at this render's layer."""
        keys = fragment.state.layers[self.layer_for(fragment.geometry.num_layers)].keys  # (H, T_l, D)
        rows = keys.detach().cpu().double().reshape(-1, keys.shape[-1]).tolist()  # H * T_l rows of D floats
        norms = [math.sqrt(math.fsum(x * x for x in row)) for row in rows]  # squares rounded once, summed exactly
        return math.fsum(norms) / len(norms) if norms else 0.0

    def order(self, fragments: Sequence[Fragment]) -> list[Fragment]:
        return sorted(fragments, key=lambda f: (self.key(f), f.digest), reverse=self.direction == "descending")

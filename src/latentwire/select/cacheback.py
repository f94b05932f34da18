"""CacheBack: receiver-conditioned scores from the attention of the receiver's query (docs/methods.md#cacheback-scores).

b[s, r, t]: attention of query token r on row t, averaged over the scoring layers (the global layers at relative
depth in [min_depth, max_depth): every global layer by default) and over the query heads that share KV head s.  Q_t = Pool(mean_{s,r} b) is mean query attention. The concentration
correction compares "pool each query token, then average its square" with "average, then pool and
square", per KV-head group:

    C_t = Σ_s mean_r Pool(b[s, r])_t² / Σ_s Pool(mean_r b[s, r])_t²        S_t = Q_t · C_t^p

Without pooling C_t = 1 + Σ_s Var_r(b) / Σ_s (mean_r b)²: rows attended strongly by a few query
tokens beat rows attended weakly by all. p = 0 is mean query attention.

Two ablations of the correction (docs/methods.md, "CacheBack scores"); the defaults are the formula above:

- `inner_power` (default 2): the power inside C_t, Σ mean_r Pool(b)^q / Σ Pool(mean_r b)^q, separate
  from the outer exponent `p` (default 2) on C_t. q = 1 with avg or no pooling gives C_t = 1.
- `correction_over` (default "kv_head"): the groups C_t sums over. "kv_head" is the KV heads s of b,
  layers averaged first; "layer_kv_head" sums over every (global layer l, KV head s) pair of the
  un-averaged b[l, s, r, t], so a row that different query tokens attend to in different layers
  counts as concentrated even when the layer average is flat. Q_t is the same in both.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..agent import Agent
from ..state import KVState
from .base import Selector, register
from ..attention import attend_grouped, query_attention
from ..errors import ConfigError

POOLINGS = ("avg", "max", "none")
CORRECTION_GROUPS = ("kv_head", "layer_kv_head")


def pool(x: torch.Tensor, kind: str, window: int) -> torch.Tensor:
    """Pool along the last axis with a centred window (same length out)."""
    if kind == "none" or window == 1:
        return x
    shape = x.shape
    flat = x.reshape(-1, 1, shape[-1])
    fn = F.avg_pool1d if kind == "avg" else F.max_pool1d
    kw = {"count_include_pad": False} if kind == "avg" else {}
    return fn(flat, window, stride=1, padding=window // 2, **kw).reshape(shape)


def grouped_attention(attn: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """(L, H_q, m, T) -> (S, m, T): mean over layers and over the query heads of each KV head."""
    L, H, m, T = attn.shape
    # Layers first (a contiguous reduction), then heads, in the attention's own dtype: reducing over
    # dims (0, 2) at once, or in float64, was most of the scoring time at T = 4k.
    return attn.mean(dim=0).reshape(num_kv_heads, H // num_kv_heads, m, T).mean(dim=1).double()


@torch.inference_mode()
def grouped_attention_by_layer(agent: Agent, state: KVState, query: str, min_depth: float = 0.0,
                               max_depth: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer-averaged (S, m, T) grouped attention, exactly as `attention.attend_grouped` returns it, and
    the (L_g, S, m, T) per-layer grouped attention it averages, from one pass of the query."""
    per_layer, total, n, S, T = [], None, 0, state.geometry.num_kv_heads, len(state)
    for _, w in query_attention(agent, state, query, min_depth, max_depth):  # (H_q, m, T + m)
        g = w.view(S, -1, *w.shape[-2:]).mean(dim=1)  # (S, m, T + m)
        per_layer.append(g[..., :T].clone())
        total, n = (g if total is None else total.add_(g)), n + 1
    return total[..., :T] / n, torch.stack(per_layer)


def cacheback_scores(b: torch.Tensor, p: float, pooling: str, window: int, inner_power: float = 2.0,
                     groups: torch.Tensor | None = None) -> torch.Tensor:
    """Scores (T,) from grouped attention b: (S, m, T).

    `groups` (G, m, T): the groups the correction C_t sums over instead of b's KV heads (e.g. every
    (layer, KV head) pair, flattened); Q_t always comes from b. `inner_power`: the power inside C_t.
    """
    mean_r = b.mean(dim=1)  # (S, T)
    q = pool(mean_r.mean(dim=0), pooling, window)  # (T,)
    if p == 0:
        return q
    if groups is not None:
        b, mean_r = groups, groups.mean(dim=1)
    num = pool(b, pooling, window).pow(inner_power).mean(dim=1).sum(dim=0)  # (T,)
    den = pool(mean_r, pooling, window).pow(inner_power).sum(dim=0).clamp_min(1e-30)  # (T,)
    return q * (num / den).pow(p)


@register
@dataclass
class CacheBackSelector(Selector):
    name = "cacheback"
    query_conditioned = True
    p: float = 2.0  # outer exponent: S_t = Q_t · C_t^p; 0 = mean query attention
    pooling: str = "avg"  # Pool7: "avg" or "max" along positions, or "none"
    window: int = 7
    inner_power: float = 2.0  # the power inside C_t (the squares of the formula)
    correction_over: str = "kv_head"  # C_t summed over KV heads (layers averaged) or "layer_kv_head"
    # Score on the global layers at relative depth i / L ≥ min_depth only (0: every global layer). Deeper layers'
    # keys carry more of each row's context (whose drink "he drinks ..." is), shallow ones more of its surface.
    min_depth: float = 0.0
    # ... and < max_depth (1: no bound). The question's forward stops after the deepest scoring layer, so 0.5 halves
    # what scoring a held state costs once the question arrives (the selection may change: measure it).
    max_depth: float = 1.0

    def __post_init__(self):
        if isinstance(self.p, bool) or not isinstance(self.p, (int, float)) or not 0 <= self.p < math.inf:
            raise ConfigError(f"p must be a finite number ≥ 0, got {self.p!r}")
        if isinstance(self.inner_power, bool) or not isinstance(self.inner_power, (int, float)) \
                or not 0 < self.inner_power < math.inf:
            raise ConfigError(f"inner_power must be a finite number > 0, got {self.inner_power!r}")
        if self.correction_over not in CORRECTION_GROUPS:
            raise ConfigError(f"correction_over must be one of {CORRECTION_GROUPS}, got {self.correction_over!r}")
        if self.pooling not in POOLINGS:
            raise ConfigError(f"pooling must be one of {POOLINGS}, got {self.pooling!r}")
        if self.window < 1 or self.window % 2 == 0:
            raise ConfigError(f"window must be a positive odd number, got {self.window}")
        if isinstance(self.min_depth, bool) or not isinstance(self.min_depth, (int, float)) \
                or not 0 <= self.min_depth < 1:
            raise ConfigError(f"min_depth must be a number in [0, 1), got {self.min_depth!r}")
        if isinstance(self.max_depth, bool) or not isinstance(self.max_depth, (int, float)) \
                or not self.min_depth < self.max_depth <= 1:
            raise ConfigError(f"max_depth must be a number in (min_depth, 1] = ({self.min_depth}, 1], "
                              f"got {self.max_depth!r}")

    def score(self, agent: Agent, state: KVState, query: str) -> torch.Tensor:
        if self.correction_over == "kv_head" or self.p == 0:
            b = attend_grouped(agent, state, query, self.min_depth, self.max_depth).double()  # (S, m, T)
            return cacheback_scores(b, self.p, self.pooling, self.window, self.inner_power)
        b, per_layer = grouped_attention_by_layer(agent, state, query, self.min_depth, self.max_depth)
        # b: (S, m, T), per_layer: (L_g, S, m, T)
        groups = per_layer.double().flatten(0, 1)  # (L_g · S, m, T)
        return cacheback_scores(b.double(), self.p, self.pooling, self.window, self.inner_power, groups)

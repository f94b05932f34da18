"""CacheBack: receiver-conditioned scores from the attention of the receiver's query (SPEC §1).

b[s, r, t]: attention of query token r on row t, averaged over global layers and over the query heads
that share KV head s.  Q_t = Pool(mean_{s,r} b) is mean query attention. The concentration
correction compares "pool each query token, then average its square" with "average, then pool and
square", per KV-head group:

    C_t = Σ_s mean_r Pool(b[s, r])_t² / Σ_s Pool(mean_r b[s, r])_t²        S_t = Q_t · C_t^p

Without pooling C_t = 1 + Σ_s Var_r(b) / Σ_s (mean_r b)²: rows attended strongly by a few query
tokens beat rows attended weakly by all. p = 0 is mean query attention.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..agent import Agent
from ..state import KVState
from .base import Selector, register

POOLINGS = ("avg", "max", "none")


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


def cacheback_scores(b: torch.Tensor, p: float, pooling: str, window: int) -> torch.Tensor:
    """Scores (T,) from grouped attention b: (S, m, T)."""
    mean_r = b.mean(dim=1)  # (S, T)
    q = pool(mean_r.mean(dim=0), pooling, window)  # (T,)
    if p == 0:
        return q
    num = pool(b, pooling, window).pow(2).mean(dim=1).sum(dim=0)  # (T,)
    den = pool(mean_r, pooling, window).pow(2).sum(dim=0).clamp_min(1e-30)  # (T,)
    return q * (num / den).pow(p)


@register
@dataclass
class CacheBackSelector(Selector):
    name = "cacheback"
    query_conditioned = True
    p: float = 2.0  # exponent of the concentration correction; 0 = mean query attention
    pooling: str = "avg"  # Pool7: "avg" or "max" along positions, or "none"
    window: int = 7

    def __post_init__(self):
        if self.p < 0:
            raise ValueError(f"p must be ≥ 0, got {self.p}")
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {self.pooling!r}")
        if self.window < 1 or self.window % 2 == 0:
            raise ValueError(f"window must be a positive odd number, got {self.window}")

    def score(self, agent: Agent, state: KVState, query: str) -> torch.Tensor:
        b = agent.attend_grouped(state, query).double()  # (S, m, T)
        return cacheback_scores(b, self.p, self.pooling, self.window)

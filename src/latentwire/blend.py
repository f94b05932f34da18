"""Selective recompute of attached K/V (CacheBlend's idea, arXiv 2405.16444; docs/methods.md#kv-delivery).

A sender's K/V for the rows it selected were computed in *its* context: the whole document, before the question.
Attached in a receiver's prompt they are stale: each row's deeper layers still carry what the rows it no longer sees
wrote into it. Re-prefilling every row (CacheBack's "rows") removes that and costs a full prefill. Between the two,
the receiver recomputes only the rows whose K/V its own context changes most:

1. `deviation`: re-read every attached row through the first two layers only (layer 0's K/V depend on the token
   and its position alone, so they are exact; layer 1 is the first that moves) and score each row by how far its
   fresh layer-1 K/V sit from the attached ones.
2. `blend_mask`: one forward of the chosen rows alone, appended after the cache, each attending to everything at
   or before its position except the stale copies of the chosen rows (their fresh copies replace them).
3. `reassemble`: the fresh rows take their stale copies' places, so the cache is in position order again.

Recomputing every row is exactly the re-prefill; recomputing none is the plain attachment.
"""
from __future__ import annotations

import math

import torch

from .errors import ConfigError
from .state import Geometry


def recompute_count(fraction: float, rows: int) -> int:
    """How many of `rows` attached rows a fraction recomputes: ceil(fraction · rows) (0.07 · 100 is 7, not the 8 that
    its float product would round up to)."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction <= 1:
        raise ConfigError(f"recompute must be a fraction in [0, 1], got {fraction!r}")
    return min(rows, math.ceil(fraction * rows - 1e-9))


def deviation(fresh: tuple[torch.Tensor, torch.Tensor], stale: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Per row, the squared distance between fresh and attached (keys, values) of one layer, each relative to the
    attached tensors' mean squared norm so that keys and values weigh alike. Tensors (H, M, D); returns (M,) float32."""
    total = torch.zeros(fresh[0].shape[1], dtype=torch.float32, device=fresh[0].device)
    for f, s in zip(fresh, stale):
        f, s = f.float(), s.float()
        total += (f - s).pow(2).sum(dim=(0, 2)) / s.pow(2).sum(dim=(0, 2)).mean().clamp_min(1e-12)
    return total


def blend_mask(pick: torch.Tensor, n: int, geometry: Geometry, dtype: torch.dtype) -> torch.Tensor | dict:
    """Additive attention mask for the recompute forward: queries are the rows at positions `pick` (sorted, (S,)),
    keys are the n cached rows (positions 0..n−1) and then the S fresh rows. A query sees a cached row at or before
    its position unless that row is being recomputed, and the fresh rows at or before it; on sliding layers only the
    last `window` positions (query included). (1, 1, S, n + S); a dict by layer type where the model mixes sliding
    and global layers (how transformers' Gemma 3 and Qwen 2 take per-type masks), the sliding mask alone where every
    layer slides (Mistral, Phi-3: their models take one mask)."""
    device = pick.device
    key_pos = torch.cat([torch.arange(n, device=device), pick])  # (n + S,)
    recomputed = torch.zeros(n + pick.numel(), dtype=torch.bool, device=device)
    recomputed[pick] = True  # the stale copies
    ok = (key_pos[None] <= pick[:, None]) & ~recomputed[None]  # (S, n + S)
    neg = torch.finfo(dtype).min

    def additive(allowed: torch.Tensor) -> torch.Tensor:
        zero = torch.zeros((), dtype=dtype, device=device)
        return torch.where(allowed, zero, torch.full((), neg, dtype=dtype, device=device))[None, None]

    kinds = set(geometry.layer_types)
    if "sliding" not in kinds:
        return additive(ok)
    near = pick[:, None] - key_pos[None] < geometry.sliding_window
    if kinds == {"sliding"}:
        return additive(ok & near)
    return {"full_attention": additive(ok), "sliding_attention": additive(ok & near)}


def reassemble(cache, pick: torch.Tensor, n: int) -> None:
    """In place: a cache of n rows followed by the fresh copies of rows `pick` becomes n rows in position order, each
    recomputed row's fresh K/V in its stale copy's place."""
    order = torch.arange(n, device=pick.device)
    order[pick] = n + torch.arange(pick.numel(), device=pick.device)
    for layer in cache.layers:  # (1, H, n + S, D) -> (1, H, n, D)
        layer.keys, layer.values = layer.keys[:, :, order], layer.values[:, :, order]

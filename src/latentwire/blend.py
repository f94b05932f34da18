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

Recomputing every row is exactly the re-prefill; recomputing none is the plain attachment. `Agent.answer_attached`
calls `check_blend` and `blended_cache`.
"""
from __future__ import annotations

import math
import threading
from typing import Protocol

import torch

from .errors import ConfigError, StateFormatError
from .state import Geometry, KVState


class Runner(Protocol):
    """What the recompute needs of the agent that calls it (`Agent` is one; declared here so that this module,
    which `agent.py` imports, imports nothing back)."""
    model: torch.nn.Module
    decoder: torch.nn.Module
    geometry: Geometry
    device: torch.device
    dtype: torch.dtype

    def rows(self, state: KVState): ...

    def _forward(self, cache, start: int, ids=None, embeds=None, positions=None, mask=None) -> torch.Tensor: ...


class _Stop(Exception):
    """Raised by a forward hook to end a forward after the layers it needs (`layer_kv`)."""


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


def layer_kv(agent: Runner, cache, start: int, embeds: torch.Tensor, layer: int) -> tuple:
    """The K/V layer `layer` computes for rows `embeds` (n, d) at positions start.. after `cache`, running only
    the layers up to it: ((H, n, D), (H, n, D)). `cache` is left holding them on those layers only."""
    owner = threading.get_ident()

    def stop(*_):  # only this call's forward: another thread may run the same model meanwhile
        if threading.get_ident() == owner:
            raise _Stop
    hook = agent.decoder.layers[layer].register_forward_hook(stop)
    try:
        agent._forward(cache, start, embeds=embeds)
    except _Stop:
        pass
    finally:
        hook.remove()
    return cache.layers[layer].keys[0, :, start:], cache.layers[layer].values[0, :, start:]


def check_blend(agent: Runner, message: KVState | None = None) -> None:
    """What recomputing attached rows needs: an attention implementation that takes a prepared mask and, for a
    `message`, every row's K/V on every layer (a full-history state on sliding layers)."""
    if message is not None and any(layer.positions.numel() != len(message) for layer in message.layers):
        raise StateFormatError("recompute needs every row's K/V on sliding layers too (a full-history state, as "
                               "CacheBack's kv reads and `encode_rows` give); this one holds only the last window")
    if (impl := agent.model.config._attn_implementation) not in ("eager", "sdpa"):
        raise ConfigError(f"recompute passes a prepared attention mask: it needs attention 'eager' or 'sdpa', "
                          f"not {impl!r}")


def blended_cache(agent: Runner, placed: KVState, first: int, recompute: float, pick: torch.Tensor | None = None):
    """A cache of `placed` (compact, every row on sliding layers) in which `agent` recomputes the share
    `recompute` of rows first.. (an attached message) that its own context changes most (the steps above), or the
    message rows `pick` ((k,) sorted indices into rows first..: e.g. each attached document's first rows, EPIC's
    choice) when given."""
    n, m = len(placed), len(placed) - first
    k = recompute_count(recompute, m) if pick is None else len(pick)
    embeds = agent.rows(placed.select(torch.arange(first, n, device=agent.device))).embeds  # (M, d)
    if pick is not None:
        pick = torch.as_tensor(pick, dtype=torch.int64, device=agent.device)
    elif k < m:  # score every attached row by its layer-1 K/V re-read here
        layer = min(1, agent.geometry.num_layers - 1)
        head = placed.select(torch.arange(first, device=agent.device)).to_cache(full_history=True)
        fresh = layer_kv(agent, head, first, embeds, layer)
        stale = (placed.layers[layer].keys[:, first:], placed.layers[layer].values[:, first:])
        pick = deviation(fresh, stale).topk(k).indices.sort().values  # (k,) message rows
    else:
        pick = torch.arange(m, device=agent.device)
    cache = placed.to_cache(full_history=True)
    if k:
        at = pick + first  # (k,) positions
        agent._forward(cache, 0, embeds=embeds[pick], positions=at,
                       mask=blend_mask(at, n, agent.geometry, agent.dtype))
        reassemble(cache, at, n)
    return cache

"""Building blocks shared by the translators: position-free K/V views, slot pooling, layer maps, residuals.

Two forms of the same views: per layer (`unrotated`, `SlotPool.forward`, `add_residuals`), and stacked
per layer group (`layer_groups`, `SlotPool.pool_groups`, `add_group_residuals`), where the layers of one
attention type and row count form one tensor, so each step is one op per group instead of one per layer.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..rope import RopeSpec, half_split, interleave, rotate_keys
from ..state import Geometry, KVState, LayerKV


def unrotated(state: KVState) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer (keys with RoPE removed, values), each (H, T_l, D) in float32: position-free content."""
    out = []
    for i, layer in enumerate(state.layers):
        keys = rotate_keys(layer.keys.float(), -layer.positions, state.geometry.layer(i).rope)
        out.append((keys, layer.values.float()))
    return out


def rms(x: torch.Tensor, dim=-1, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(dim, keepdim=True) + eps)


def depth_map(n_out: int, n_in: int) -> list[int]:
    """Depth-proportional alignment: output layer i <- input layer round(i (n_in - 1) / (n_out - 1))."""
    if n_out == 1:
        return [n_in - 1]
    return [round(i * (n_in - 1) / (n_out - 1)) for i in range(n_out)]


class SlotPool(nn.Module):
    """Learned-query attention pooling of one cache, per layer and KV head, from T_l rows to `slots` slots.

    Reads un-rotated keys (content, not position) and returns (L, H * slots * 2D): per layer the pooled
    [key; value] of every head and slot, RMS-normalised (K/V scales differ by orders of magnitude
    across layers), whatever the number of rows.
    """

    def __init__(self, geometry: Geometry, slots: int):
        super().__init__()
        L, H, D = geometry.num_layers, geometry.num_kv_heads, geometry.head_dim
        self.queries = nn.Parameter(torch.randn(L, H, slots, D) / math.sqrt(D))  # (L, H, k, D)
        self.out_dim = H * slots * 2 * D

    def forward(self, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        pooled = []
        for (keys, values), q in zip(kv, self.queries):
            k, v = rms(keys), rms(values)  # (H, T, D): scale-free, so pooling sees directions
            att = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(k.shape[-1]), dim=-1)  # (H, k, T)
            pooled.append(torch.cat([att @ k, att @ v], dim=-1).flatten())  # (H * k * 2D,)
        return rms(torch.stack(pooled))  # (L, H * k * 2D)

    def pool_groups(self, groups: list[LayerGroup]) -> torch.Tensor:
        """`forward` on stacked layer groups: (L, H * k * 2D) in layer order, one batched attention per group."""
        parts = []
        for g in groups:
            D = g.kv.shape[-1] // 2
            kv = rms(g.kv.unflatten(-1, (2, D))).flatten(-2)  # (L_g, H, T, 2D): keys and values each RMS-normalised
            scores = torch.einsum("lhsd,lhtd->lhst", self.queries[g.index], kv[..., :D]) / math.sqrt(D)
            att = torch.softmax(scores, dim=-1)  # (L_g, H, k, T)
            parts.append(torch.einsum("lhst,lhtc->lhsc", att, kv).flatten(1))  # (L_g, H * k * 2D)
        order = torch.cat([g.index for g in groups])  # (L,) the layer behind each stacked row
        return rms(torch.cat(parts)[torch.argsort(order)])  # (L, H * k * 2D)


class LayerMap(nn.Module):
    """Learned soft map from n_in layers to n_out layers: rows of softmax(logits), initialised to depth order."""

    def __init__(self, n_out: int, n_in: int, sharpness: float = 4.0):
        super().__init__()
        i = torch.linspace(0, 1, n_out)[:, None]
        j = torch.linspace(0, 1, n_in)[None, :]
        self.logits = nn.Parameter(-sharpness * (n_in - 1) * (i - j).abs())  # (n_out, n_in)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (n_in, ...) -> (n_out, ...)
        return torch.einsum("oi,i...->o...", torch.softmax(self.logits, dim=-1), x)


def add_residuals(state: KVState, kv: list[tuple[torch.Tensor, torch.Tensor]],
                  deltas: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[LayerKV, ...]:
    """The state's layers with K/V residuals added. kv: the un-rotated (keys, values) the residuals were
    computed from; deltas: per layer (dK, dV), each (H, T_l, D), dK in the un-rotated space. Keys are
    re-rotated at each row's own position, so a zero residual returns the keys exactly (in the state's dtype)."""
    layers = []
    for i, (layer, (dk, dv)) in enumerate(zip(state.layers, deltas)):
        dk = rotate_keys(dk, layer.positions.clone(), state.geometry.layer(i).rope)  # content -> at positions
        layers.append(LayerKV((layer.keys.float() + dk).to(layer.keys.dtype),
                              (layer.values.float() + dv).to(layer.values.dtype), layer.positions))
    return tuple(layers)


# -- stacked layer groups --------------------------------------------------------------------------
MAX_ROPE_TABLES = 8
_ROPE_TABLES: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}  # (inv_freq, dtype, device) -> cos, sin


def rope_table(spec: RopeSpec, end: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (n, R) of `spec`'s rotation at positions 0..n-1, n ≥ end, angles taken in float64.

    Cached per (frequencies, dtype, device) and reused across calls; a call that needs more rows
    regrows it to the next power of two. At most MAX_ROPE_TABLES are kept (oldest dropped first).
    """
    key = (spec.inv_freq, dtype, device)
    table = _ROPE_TABLES.get(key)
    if table is not None and table[0].shape[0] >= end:
        return table
    n = max(256, 1 << (end - 1).bit_length())
    inv_freq = torch.tensor(spec.inv_freq, dtype=torch.float64, device=device)  # (R/2,)
    angles = torch.arange(n, dtype=torch.float64, device=device)[:, None] * inv_freq  # (n, R/2)
    angles = torch.cat((angles, angles), dim=-1)  # (n, R)
    _ROPE_TABLES.pop(key, None)
    while len(_ROPE_TABLES) >= MAX_ROPE_TABLES:
        _ROPE_TABLES.pop(next(iter(_ROPE_TABLES)))
    _ROPE_TABLES[key] = table = (angles.cos().to(dtype), angles.sin().to(dtype))
    return table


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    """x (..., T, D) rotated by the angles of cos, sin (..., T, R); channels past R pass through. `interleaved`:
    x's pairs are (2i, 2i+1) (`RopeSpec.interleaved`), rotated in the half-split layout and put back."""
    if interleaved:
        rd = cos.shape[-1]
        return interleave(_rotate(half_split(x, rd), cos, sin), rd)
    rd, half = cos.shape[-1], cos.shape[-1] // 2
    r = x[..., :rd]
    out = r * cos + torch.cat((-r[..., half:], r[..., :half]), dim=-1) * sin
    return out if rd == x.shape[-1] else torch.cat((out, x[..., rd:]), dim=-1)


@dataclass(frozen=True, eq=False)
class LayerGroup:
    """The layers of one attention type and row count, stacked along a leading layer axis."""

    layers: tuple[int, ...]  # the state's layer indices, in order
    index: torch.Tensor  # (L_g,) int64, the same on the state's device
    keys: torch.Tensor  # (L_g, H, T, D) as cached: RoPE on, the state's dtype
    values: torch.Tensor  # (L_g, H, T, D) the state's dtype
    kv: torch.Tensor  # (L_g, H, T, 2D) float32: [keys with RoPE removed ; values], position-free content
    cos: torch.Tensor  # (L_g or 1, 1, T, R) float32: RoPE of each row at its position (1: shared by all)
    sin: torch.Tensor  # (L_g or 1, 1, T, R)
    interleaved: bool = False  # the rotation's channel pairs (RopeSpec.interleaved)


def layer_groups(state: KVState) -> list[LayerGroup]:
    """`unrotated` stacked: one LayerGroup per (attention type, row count), in order of first layer."""
    g, members = state.geometry, {}
    for i, layer in enumerate(state.layers):
        members.setdefault((g.layer_types[i], layer.keys.shape[1]), []).append(i)
    ends = torch.stack((state.positions[0], state.positions[-1])) if len(state) else state.positions.new_zeros(2)
    lo, hi = ends.tolist()  # the one host sync: positions are increasing, every layer's lie within these
    groups = []
    for (kind, _), ids in members.items():
        keys = torch.stack([state.layers[i].keys for i in ids])  # (L_g, H, T, D)
        values = torch.stack([state.layers[i].values for i in ids])  # (L_g, H, T, D)
        # (1 or L_g, T): global layers hold every row (checked by KVState), sliding ones may differ
        pos = state.positions[None] if kind == "global" else torch.stack([state.layers[i].positions for i in ids])
        spec = dict(g.rope)[kind]
        cos, sin = rope_table(spec, max(hi, -lo) + 1, torch.float32, state.device)
        at = pos.abs() if lo < 0 else pos  # table rows: cos is even, sin odd
        cos, sin = cos[at].unsqueeze(1), sin[at].unsqueeze(1)  # (1 or L_g, 1, T, R)
        if lo < 0:
            sin = sin * pos.sign().to(torch.float32)[:, None, :, None]
        kv = torch.cat((_rotate(keys.float(), cos, -sin, spec.interleaved), values.float()), dim=-1)  # (L_g, H, T, 2D)
        index = torch.tensor(ids, dtype=torch.int64, device=state.device)
        groups.append(LayerGroup(tuple(ids), index, keys, values, kv, cos, sin, spec.interleaved))
    return groups


def add_group_residuals(state: KVState, groups: list[LayerGroup],
                        deltas: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[LayerKV, ...]:
    """`add_residuals` stacked: deltas per group (dK, dV), each (L_g, H, T, D), dK un-rotated; one add per
    group. A zero residual returns the keys and values exactly (in the state's dtype)."""
    layers = list(state.layers)
    for grp, (dk, dv) in zip(groups, deltas, strict=True):
        keys = (grp.keys.float() + _rotate(dk, grp.cos, grp.sin, grp.interleaved)).to(grp.keys.dtype)  # (L_g, H, T, D)
        values = (grp.values.float() + dv).to(grp.values.dtype)  # (L_g, H, T, D)
        for i, k, v in zip(grp.layers, keys, values):
            layers[i] = LayerKV(k, v, state.layers[i].positions)
    return tuple(layers)

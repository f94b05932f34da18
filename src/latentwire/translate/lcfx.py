"""LCF-X baseline (SPEC §3): a sharer-only summary fused into each receiver layer by a layer-local projector.

    SlotPool(sharer) (L_S, .) -> fixed depth map -> (L_R, .) -> shared linear -> s_l (d,)   position-independent
    for each receiver layer l, row t:  MLP_l([K;V]_t, s_l) -> gated dK, dV (zero-initialised output)

Unlike XKV it never looks at the receiver's cache as a whole (no receiver pooling, no cross-layer memory)
and its fuser is local to each layer (one MLP per receiver layer), which is how it extends to unequal
depth (depth-proportional layer map) and KV geometry (the fuser reads and writes the receiver's own
H_R x D_R rows). At init the receiver's state comes back bit-identical.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..state import Geometry, KVState
from .base import Translator, TranslatorConfig, register, with_layers
from .layers import SlotPool, add_residuals, depth_map, rms, unrotated


@dataclass(frozen=True)
class LCFXConfig(TranslatorConfig):
    slots: int = 4  # pooled slots per sharer layer and head
    dim: int = 256  # width of the per-layer summary s_l
    hidden: int = 512  # width of each layer's fuser MLP

    def __post_init__(self):
        for name in ("slots", "dim", "hidden"):
            if getattr(self, name) < 1:
                raise ValueError(f"lcfx: {name} must be ≥ 1, got {getattr(self, name)}")


class LayerFuser(nn.Module):
    def __init__(self, row: int, dim: int, hidden: int, heads: int):
        super().__init__()
        self.inp = nn.Linear(row + dim, hidden)
        self.out = nn.Linear(hidden, row)  # zero-initialised: no residual at init
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)
        self.gate = nn.Parameter(torch.zeros(2, heads))  # sigmoid -> 0.5 at init

    def forward(self, rows: torch.Tensor, summary: torch.Tensor) -> torch.Tensor:  # (T, H 2D), (d,) -> (T, H 2D)
        x = torch.cat([rows, summary.expand(rows.shape[0], -1)], dim=-1)
        return self.out(torch.nn.functional.gelu(self.inp(x)))


@register
class LCFX(Translator):
    name = "lcfx"
    Config = LCFXConfig

    def __init__(self, sharer: Geometry, receiver: Geometry, config: LCFXConfig | None = None):
        super().__init__(sharer, receiver, config)
        c, L, H, D = self.config, receiver.num_layers, receiver.num_kv_heads, receiver.head_dim
        self.pool = SlotPool(sharer, c.slots)
        self.register_buffer("source", torch.tensor(depth_map(L, sharer.num_layers)), persistent=False)
        self.summary = nn.Linear(self.pool.out_dim, c.dim)
        self.fusers = nn.ModuleList(LayerFuser(H * 2 * D, c.dim, c.hidden, H) for _ in range(L))

    def forward(self, sharer: KVState, receiver: KVState, **kw) -> KVState:
        H, D = self.receiver.num_kv_heads, self.receiver.head_dim
        s = self.summary(self.pool(unrotated(sharer))[self.source])  # (L_R, d)
        kv_r = unrotated(receiver)
        deltas = []
        for (k, v), fuser, s_l in zip(kv_r, self.fusers, s):
            rows = rms(torch.cat([k, v], -1).transpose(0, 1).flatten(1))  # (T_l, H 2D)
            d = fuser(rows, s_l).view(-1, H, 2, D).permute(2, 1, 0, 3)  # (2, H, T_l, D)
            gate = torch.sigmoid(fuser.gate)[:, :, None, None]  # (2, H, 1, 1)
            scale_k, scale_v = k.pow(2).mean().sqrt().detach(), v.pow(2).mean().sqrt().detach()
            deltas.append((d[0] * gate[0] * scale_k, d[1] * gate[1] * scale_v))
        return with_layers(receiver, add_residuals(receiver, kv_r, deltas))

"""LCF-X baseline (docs/methods.md#lcf-x): a sharer-only summary fused into each receiver
layer by a layer-local projector.

    LCF's two-stage pooler (lcf_pool.SpanSlotPool) on the sharer:
        rows -> variable-length spans -> one summary per span -> k slots        (L_S, H_S k 2D_S)
    -> fixed depth map -> (L_R, .) -> shared linear -> s_l (d,)                 position-independent
    for each receiver layer l, row t:  MLP_l([K;V]_t, s_l) -> gated dK, dV (zero-initialised output)

Unlike XKV it never looks at the receiver's cache as a whole (no receiver pooling, no cross-layer memory),
its pooler is LCF's (two stages over variable-length spans, not XKV's one-step slot pooling), and its
fuser is local to each layer (one MLP per receiver layer), which is how it extends to unequal depth
(depth-proportional layer map) and KV geometry (the fuser reads and writes the receiver's own
H_R x D_R rows). At init the receiver's state comes back bit-identical.

Checkpoints saved before the two-stage pooler (one `pool.queries` tensor) are refused with a
StateFormatError: their pooler parameters have no counterpart here.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..errors import ConfigError, StateFormatError
from ..state import Geometry, KVState
from .base import Translator, TranslatorConfig, register, with_layers
from .layers import add_residuals, depth_map, layer_groups, rms, unrotated
from .lcf_pool import SpanSlotPool, n_params


@dataclass(frozen=True)
class LCFXConfig(TranslatorConfig):
    slots: int = 4  # k: pooled slots per sharer layer and head (stage 2)
    dim: int = 256  # width of the per-layer summary s_l
    hidden: int = 512  # width of each layer's fuser MLP
    span: int = 16  # most rows in one stage-1 span (runs of consecutive positions are cut to this)

    def __post_init__(self):
        for name in ("slots", "dim", "hidden", "span"):
            if getattr(self, name) < 1:
                raise ConfigError(f"lcfx: {name} must be ≥ 1, got {getattr(self, name)}")


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
        self.pool = SpanSlotPool(sharer, c.slots, c.span)
        self.register_buffer("source", torch.tensor(depth_map(L, sharer.num_layers)), persistent=False)
        self.summary = nn.Linear(self.pool.out_dim, c.dim)
        self.fusers = nn.ModuleList(LayerFuser(H * 2 * D, c.dim, c.hidden, H) for _ in range(L))

    def n_params(self) -> dict[str, int]:
        """Trainable parameters per part and in total (the benchmark prints LCF-X ÷ XKV from `total`)."""
        parts = {"pool": n_params(self.pool), "summary": n_params(self.summary), "fusers": n_params(self.fusers)}
        return parts | {"total": sum(parts.values())}

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        if "pool.queries" in state_dict:
            raise StateFormatError(
                "lcfx checkpoint has the old one-step slot pooler (pool.queries); LCF-X now pools with LCF's "
                "two-stage span pooler (pool.span_queries, pool.slot_queries): retrain it")
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def forward(self, sharer: KVState, receiver: KVState, **kw) -> KVState:
        H, D = self.receiver.num_kv_heads, self.receiver.head_dim
        s = self.summary(self.pool(sharer, layer_groups(sharer))[self.source])  # (L_R, d)
        kv_r = unrotated(receiver)
        deltas = []
        for (k, v), fuser, s_l in zip(kv_r, self.fusers, s):
            rows = rms(torch.cat([k, v], -1).transpose(0, 1).flatten(1))  # (T_l, H 2D)
            d = fuser(rows, s_l).view(-1, H, 2, D).permute(2, 1, 0, 3)  # (2, H, T_l, D)
            gate = torch.sigmoid(fuser.gate)[:, :, None, None]  # (2, H, 1, 1)
            scale_k, scale_v = k.pow(2).mean().sqrt().detach(), v.pow(2).mean().sqrt().detach()
            deltas.append((d[0] * gate[0] * scale_k, d[1] * gate[1] * scale_v))
        return with_layers(receiver, add_residuals(receiver, kv_r, deltas))

"""XKV (docs/methods.md#xkv): dual-cache translation into per-head gated K/V residuals on the receiver's own cache.

    what to pass:  SlotPool(sharer) (L_S, .) --LayerMap--> (L_R, .)  } bottleneck to d, + layer embedding,
                   SlotPool(receiver)          (L_R, .)              } self-attention -> memory (L_R, d)
    where to write: every receiver row of every layer (its [K; V] over heads, + a layer embedding) queries
                   the memory through ONE shared cross-attention decoder; ONE shared zero-initialised
                   head emits dK, dV per head, scaled by a per-head sigmoid gate and the layer's K/V RMS.

The memory has one token per receiver layer whatever the prompt lengths. Decoder, gates and head are
shared across receiver layers; rows of all layers go through the decoder as one batch. Key residuals
live in the un-rotated (content) space and are rotated to each row's position, so at init (head = 0)
the receiver's state comes back bit-identical.

Layers are stacked per group (attention type and row count: Llama/Qwen2 one global group, Gemma3 a
global and a sliding one), so un-rotation, pooling, rows, scaling and the residual add are one op
per group, not per layer; the RoPE cos/sin come from a cached table (`layers.rope_table`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..state import Geometry, KVState
from .base import Translator, TranslatorConfig, register, with_layers
from .layers import LayerGroup, LayerMap, SlotPool, add_group_residuals, layer_groups, rms
from ..errors import ConfigError


@dataclass(frozen=True)
class XKVConfig(TranslatorConfig):
    slots: int = 4  # k: pooled slots per layer and head, for each cache
    dim: int = 256  # d: bottleneck width of the joint memory and the decoder
    heads: int = 4  # attention heads in the mixer and the decoder
    mixer_layers: int = 1  # self-attention blocks over the L_R layer tokens

    def __post_init__(self):
        for name in ("slots", "dim", "heads", "mixer_layers"):
            if getattr(self, name) < 1:
                raise ConfigError(f"xkv: {name} must be ≥ 1, got {getattr(self, name)}")
        if self.dim % self.heads:
            raise ConfigError(f"xkv: dim {self.dim} is not divisible by heads {self.heads}")


@register
class XKV(Translator):
    name = "xkv"
    Config = XKVConfig

    def __init__(self, sharer: Geometry, receiver: Geometry, config: XKVConfig | None = None):
        super().__init__(sharer, receiver, config)
        c, L, H, D = self.config, receiver.num_layers, receiver.num_kv_heads, receiver.head_dim
        self.pool_s, self.pool_r = SlotPool(sharer, c.slots), SlotPool(receiver, c.slots)
        self.layer_map = LayerMap(L, sharer.num_layers)
        self.in_s = nn.Linear(self.pool_s.out_dim, c.dim)
        self.in_r = nn.Linear(self.pool_r.out_dim, c.dim)
        self.layer_emb = nn.Parameter(torch.randn(L, c.dim) * 0.02)  # (L_R, d)
        block = nn.TransformerEncoderLayer(c.dim, c.heads, 2 * c.dim, dropout=0.0, batch_first=True, norm_first=True)
        self.mixer = nn.TransformerEncoder(block, c.mixer_layers, enable_nested_tensor=False)
        self.query = nn.Linear(H * 2 * D, c.dim)
        self.decoder = nn.MultiheadAttention(c.dim, c.heads, dropout=0.0, batch_first=True)
        self.norm = nn.LayerNorm(c.dim)
        self.head = nn.Linear(c.dim, H * 2 * D)  # shared output head, zero-initialised
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        self.gate = nn.Linear(c.dim, 2 * H)  # per-head gates for dK and dV
        nn.init.zeros_(self.gate.weight)
        nn.init.zeros_(self.gate.bias)

    def memory(self, sharer: KVState, groups: list[LayerGroup]) -> torch.Tensor:
        """The joint memory (1, L_R, d): one token per receiver layer. groups: the receiver's layer groups."""
        zs = self.layer_map(self.pool_s.pool_groups(layer_groups(sharer)))  # (L_R, H_S k 2D_S)
        zr = self.pool_r.pool_groups(groups)  # (L_R, H_R k 2D_R)
        tokens = self.in_s(zs) + self.in_r(zr) + self.layer_emb  # (L_R, d)
        return self.mixer(tokens[None])  # (1, L_R, d)

    def forward(self, sharer: KVState, receiver: KVState, **kw) -> KVState:
        H, D = self.receiver.num_kv_heads, self.receiver.head_dim
        groups = layer_groups(receiver)  # stacked per (attention type, row count), keys without RoPE
        memory = self.memory(sharer, groups)
        rows = [rms(g.kv.transpose(1, 2).flatten(2)) for g in groups]  # (L_g, T_g, H 2D)
        q = [self.query(r) + self.layer_emb[g.index][:, None] for r, g in zip(rows, groups)]  # (L_g, T_g, d)
        sizes = [x.shape[0] * x.shape[1] for x in q]
        q = torch.cat([x.flatten(0, 1) for x in q])  # (Σ L_g T_g, d): every row of every layer, one batch
        h, _ = self.decoder(q[None], memory, memory, need_weights=False)
        h = self.norm(h[0] + q)  # (Σ L_g T_g, d)
        out = self.head(h).view(-1, H, 2, D) * torch.sigmoid(self.gate(h)).view(-1, H, 2, 1)  # (Σ L_g T_g, H, 2, D)
        deltas = []
        for g, d in zip(groups, out.split(sizes)):
            scale = g.kv.unflatten(-1, (2, D)).pow(2).mean((1, 2, 4)).sqrt().detach()  # (L_g, 2): K, V RMS per layer
            d = d.view(g.kv.shape[0], g.kv.shape[2], H, 2, D).permute(3, 0, 2, 1, 4)  # (2, L_g, H, T_g, D)
            d = d * scale.T[:, :, None, None, None]
            deltas.append((d[0], d[1]))  # (L_g, H, T_g, D) each
        return with_layers(receiver, add_group_residuals(receiver, groups, deltas))

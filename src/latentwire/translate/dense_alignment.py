"""Dense latent alignment (SPEC §4): the sharer's rows translated into compact receiver K/V.

    sharer layer j in sources: keys --un-rotate (sharer RoPE of j, at the rows' positions)--> content
        keys, values: (H_S, T, D_S) -> rows (T, H_S D_S), RMS-normalised per row and layer
    --layer map A (L_R x L_src, softmax rows, init depth-proportional)--> (L_R, T, H_S D_S)
    --per receiver KV-head group g:  y = σ(γ[l, g]) * s[l] ⊙ (W_g x) + b[l]--> (L_R, H_R, T, D_R)
    --re-rotate keys (receiver RoPE of each layer) at 0..T-1--> receiver state of T latent rows

Keys and values take the same path (values skip the rotations) with their own W, s, b, γ.
The group maps W_g (H_S D_S -> H_R/G D_R) are shared across receiver layers; each receiver layer has
its own output scale s[l] and bias b[l] (per channel) and one gate per group. The gate weighs the
sharer's content against the content-free prior b[l]: a closed gate leaves learned "null" rows.
Parameters: L_R L_src + 2 (H_S D_S)(H_R D_R) + 2 L_R (2 H_R D_R + G).

Sources are the sharer's global layers: sliding layers hold only the last `window - 1` rows, and
using them only when a state is short would make the translator behave differently with length. A
sharer with no global layer uses all its layers and needs states short enough that each holds
every row (StateFormatError otherwise). The output is in the sharer state's dtype (computed in fp32).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import StateFormatError
from ..rope import rotate_keys
from ..state import Geometry, KVState
from .base import Translator, TranslatorConfig, cast, register, translated_state
from .layers import depth_map, rms


@dataclass(frozen=True)
class DenseAlignmentConfig(TranslatorConfig):
    groups: int = 0  # KV-head groups on the receiver side (must divide its KV heads); 0: one per head
    init_gate: float = 0.5  # initial gate value σ(γ), in (0, 1)
    map_init: float = 0.9  # initial weight of the depth-proportional sharer layer in each layer-map row

    def __post_init__(self):
        if not isinstance(self.groups, int) or isinstance(self.groups, bool) or self.groups < 0:
            raise ValueError(f"dense: groups must be an int ≥ 0 (0: one group per KV head), got {self.groups!r}")
        for name in ("init_gate", "map_init"):
            if not 0 < getattr(self, name) < 1:
                raise ValueError(f"dense: {name} must be in (0, 1), got {getattr(self, name)!r}")


@register
class DenseAlignment(Translator):
    name = "dense"
    Config = DenseAlignmentConfig
    needs_receiver = False

    def __init__(self, sharer: Geometry, receiver: Geometry, config: DenseAlignmentConfig | None = None):
        super().__init__(sharer, receiver, config)
        c, L, H, D = self.config, receiver.num_layers, receiver.num_kv_heads, receiver.head_dim
        G = c.groups or H
        if H % G:
            raise ValueError(f"dense: groups={G} does not divide the {H} KV heads of receiver {receiver.model}")
        self.groups = G
        self.sources = tuple(i for i, t in enumerate(sharer.layer_types) if t == "global") \
            or tuple(range(sharer.num_layers))
        n = len(self.sources)
        # depth-proportional sharer layer of each receiver layer, snapped to the nearest source layer
        target = [min(range(n), key=lambda j: abs(self.sources[j] - d)) for d in depth_map(L, sharer.num_layers)]
        logits = torch.zeros(L, n)
        if n > 1:  # softmax puts exactly map_init on the target, the rest evenly
            logits[torch.arange(L), target] = math.log(c.map_init / (1 - c.map_init) * (n - 1))
        self.map_logits = nn.Parameter(logits)  # (L_R, L_src)
        d_in, d_out = sharer.num_kv_heads * sharer.head_dim, H // G * D
        self.w = nn.Parameter(torch.randn(2, G, d_out, d_in) / math.sqrt(d_in))  # [K, V] x groups
        self.scale = nn.Parameter(torch.ones(2, L, G, d_out))
        self.bias = nn.Parameter(torch.zeros(2, L, G, d_out))
        self.gate = nn.Parameter(torch.full((2, L, G), math.log(c.init_gate / (1 - c.init_gate))))

    def layer_map(self) -> torch.Tensor:
        """(L_R, L_src): row i mixes the source layers (`self.sources`) into receiver layer i."""
        return torch.softmax(self.map_logits, dim=-1)

    def content(self, sharer: KVState) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Translated position-free keys and values per receiver layer, each (H_R, T_s, D_R) float32."""
        sharer, T = cast(sharer, torch.float32, self.w.device), len(sharer)
        xs = []
        for j in self.sources:
            layer = sharer.layers[j]
            if layer.keys.shape[1] != T:
                raise StateFormatError(
                    f"dense: sharer {sharer.geometry.model} has no global layer and its sliding layer {j} holds "
                    f"{layer.keys.shape[1]} of {T} rows; translate states shorter than its window")
            k = rotate_keys(layer.keys, -layer.positions, sharer.geometry.layer(j).rope)  # (H_S, T, D_S) at 0
            xs.append(torch.stack([k, layer.values]).transpose(1, 2).flatten(2))  # (2, T, H_S D_S)
        x = rms(torch.stack(xs, dim=1))  # (2, L_src, T, H_S D_S)
        x = torch.einsum("ln,kntd->kltd", self.layer_map(), x)  # (2, L_R, T, H_S D_S)
        y = torch.einsum("kltd,kgod->kltgo", x, self.w)  # (2, L_R, T, G, H_R/G D_R)
        y = torch.sigmoid(self.gate)[:, :, None, :, None] * self.scale[:, :, None] * y + self.bias[:, :, None]
        g = self.receiver
        y = y.reshape(2, g.num_layers, T, g.num_kv_heads, g.head_dim).transpose(2, 3)  # (2, L_R, H_R, T, D_R)
        return list(y[0].unbind()), list(y[1].unbind())

    def forward(self, sharer: KVState, receiver: KVState | None = None, **kw) -> KVState:
        """The sharer's T rows as a compact receiver state (positions 0..T-1, latent rows); `receiver` unused."""
        keys, values = self.content(sharer)
        pos = torch.arange(len(sharer), device=self.w.device)
        keys = [rotate_keys(k, pos, self.receiver.layer(i).rope) for i, k in enumerate(keys)]  # (H_R, T, D_R)
        return translated_state(self.receiver, [k.to(sharer.dtype) for k in keys],
                                [v.to(sharer.dtype) for v in values])

    def reconstruction_loss(self, sharer: KVState, target: KVState, probes: int = 64) -> torch.Tensor:
        """Stage I: how well the translated cache stands in for `target`, the receiver's own state of the text.

        Per receiver layer and KV head, probe queries P (up to `probes` evenly spaced rows of the target's
        un-rotated keys) attend once over the translated K/V and once over the target's, both un-rotated:
        loss = mean ||softmax(P K~ᵀ/√D) V~ - softmax(P Kᵀ/√D) V||² / mean ||softmax(P Kᵀ/√D) V||², averaged
        over layers (1 for a translator that outputs zeros).

        No token alignment is needed: with RoPE removed, attention is a function of the *set* of (key,
        value) rows, invariant to their order and count, so two caches of the same text under different
        tokenizers (T_s ≠ T_r rows) are compared by what they answer to the same queries, never row by
        row. (It ignores relative-position effects; stage II's answer loss sees those.) Receiver layers
        that hold only a window of the target (sliding layers of long targets) are left out.
        """
        self.check_pair(sharer.geometry, target.geometry)
        if probes < 1:
            raise ValueError(f"dense: probes must be ≥ 1, got {probes}")
        if len(sharer) == 0 or len(target) == 0:
            raise ValueError("dense: reconstruction needs non-empty sharer and target states")
        keys, values = self.content(sharer)
        target, T = cast(target, torch.float32, self.w.device), len(target)
        rows = torch.linspace(0, T - 1, min(probes, T), device=target.device).round().long()
        losses = []
        for i, layer in enumerate(target.layers):
            if layer.keys.shape[1] != T:
                continue
            k = rotate_keys(layer.keys, -layer.positions, self.receiver.layer(i).rope)  # (H_R, T_r, D_R)
            p = k[:, rows]  # (H_R, P, D_R)
            ref = _attend(p, k, layer.values)  # (H_R, P, D_R)
            out = _attend(p, keys[i], values[i])
            losses.append((out - ref).pow(2).mean() / ref.pow(2).mean().clamp_min(1e-12))
        if not losses:
            raise StateFormatError(f"dense: no layer of the target ({target.geometry.model}) holds all its rows")
        return torch.stack(losses).mean()


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q kᵀ / √D) v per head: (H, P, D), (H, T, D), (H, T, D) -> (H, P, D)."""
    return torch.softmax(q @ k.transpose(1, 2) / math.sqrt(q.shape[-1]), dim=-1) @ v

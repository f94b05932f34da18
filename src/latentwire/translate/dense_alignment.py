"""Dense latent alignment (docs/methods.md#dense-alignment): the sharer's rows translated into compact receiver K/V.

    sharer layer j in sources: keys --un-rotate (sharer RoPE of j, at the rows' positions)--> content
        keys, values: (H_S, T, D_S) -> rows (T, H_S D_S), RMS-normalised per row and layer
    --layer map A (L_R x L_src, softmax rows, init depth-proportional)--> (L_R, T, H_S D_S)
    --per receiver KV-head group g:  y = σ(γ[l, g]) * s[l] ⊙ (W_{l,g} x) + b[l]--> (L_R, H_R, T, D_R)
        with W_{l,g} = W_g + A_{l,g} B_{l,g}   (rank r per layer; r = 0: W_g alone)
    --re-rotate keys (receiver RoPE of each layer) at 0..T-1--> receiver state of T latent rows

Keys and values take the same path (values skip the rotations) with their own W, A, B, s, b, γ.
The group maps W_g (H_S D_S -> H_R/G D_R) are shared across receiver layers; with `rank` r > 0 each
receiver layer adds its own low-rank correction A_{l,g} B_{l,g} (A zero-initialised, so a fresh
translator computes exactly the shared map). Each receiver layer also has its own output scale s[l]
and bias b[l] (per channel) and one gate per group. The gate weighs the sharer's content against
the content-free prior b[l]: a closed gate leaves learned "null" rows.
Parameters: L_R L_src + 2 (H_S D_S)(H_R D_R) + 2 L_R (2 H_R D_R + G) + 2 L_R G r (H_S D_S + H_R/G D_R).

Training (`reconstruction_loss`, then the answer loss) and use come in two modes: context-unaware
(the receiver answers over the translated rows and its own document) and context-aware (over the
translated rows and its own read of both documents). `config.context_aware` records the mode a
checkpoint was trained for (None: untrained or unrecorded); `check_mode` refuses the other one.

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

from ..errors import ConfigError, StateFormatError
from ..rope import rotate_keys
from ..state import Geometry, KVState
from .base import Translator, TranslatorConfig, cast, register, translated_state
from .layers import depth_map, rms
from .token_alignment import TokenAlignment


class ContextModeError(ConfigError):
    """A dense translator used in the other context mode than the one it was trained for."""


@dataclass(frozen=True)
class DenseAlignmentConfig(TranslatorConfig):
    groups: int = 0  # KV-head groups on the receiver side (must divide its KV heads); 0: one per head
    init_gate: float = 0.5  # initial gate value σ(γ), in (0, 1)
    map_init: float = 0.9  # initial weight of the depth-proportional sharer layer in each layer-map row
    rank: int = 0  # per-layer low-rank correction of the shared group maps (0: shared maps only)
    context_aware: bool | None = None  # the mode it was trained for; None: untrained / unrecorded (either)

    def __post_init__(self):
        for name in ("groups", "rank"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ConfigError(f"dense: {name} must be an int ≥ 0, got {v!r}")
        if self.context_aware is not None and not isinstance(self.context_aware, bool):
            raise ConfigError(f"dense: context_aware must be True, False or None, got {self.context_aware!r}")
        for name in ("init_gate", "map_init"):
            if not 0 < getattr(self, name) < 1:
                raise ConfigError(f"dense: {name} must be in (0, 1), got {getattr(self, name)!r}")


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
            raise ConfigError(f"dense: groups={G} does not divide the {H} KV heads of receiver {receiver.model}")
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
        if c.rank:  # drawn after w, so w is the same for every rank; A = 0: the shared map at init
            self.adapter_a = nn.Parameter(torch.zeros(2, L, G, d_out, c.rank))  # [K, V] x layers x groups
            self.adapter_b = nn.Parameter(torch.randn(2, L, G, c.rank, d_in) / math.sqrt(d_in))

    def check_mode(self, context_aware: bool) -> None:
        """ContextModeError unless this translator was trained for `context_aware` (or for no mode yet)."""
        trained = self.config.context_aware
        if trained is not None and trained != context_aware:
            word = {True: "context-aware", False: "context-unaware"}
            raise ContextModeError(
                f"dense: this translator ({self.sharer.model} -> {self.receiver.model}) was trained {word[trained]}; "
                f"use it with context_aware={trained}, or train one {word[bool(context_aware)]}")

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
        if self.config.rank:  # + A_l (B_l x): exactly + 0 while A is zero
            z = torch.einsum("kltd,klgrd->kltgr", x, self.adapter_b)  # (2, L_R, T, G, r)
            y = y + torch.einsum("kltgr,klgor->kltgo", z, self.adapter_a)
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

    def reconstruction_loss(self, sharer: KVState, target: KVState, align: torch.Tensor | TokenAlignment | None = None,
                            mask: torch.Tensor | None = None, *, probes: int | None = None) -> torch.Tensor:
        """Stage I: how far the translated cache is from `target`, the receiver's own cache of the same text.

        Row by row, per receiver layer: relative L2 of the position-free keys (target keys un-rotated
        with the receiver's RoPE, translated keys before re-rotation) and of the values,
        ||K~ - K|| / ||K|| and ||V~ - V|| / ||V|| over the compared rows, all heads; the layer's loss is
        their mean, the loss the mean over layers. Exactly 0 when the translated rows equal the
        target's; 1 for a translator that outputs zeros.

        Which rows are compared: target row t with translated (sharer) row `align[t]` where `mask[t]`
        (a `TokenAlignment` from `token_alignment.align(receiver, sharer, chat)` of the chat both
        prefilled: tokenizers or templates that differ). Without `align` the two must share a
        tokenizer and their common rows 0..min(T_s, T_r)-1 must hold the same tokens: row t with row t.
        `probes`: compare at most this many of those rows (evenly spaced); None: all. Receiver layers
        that hold only a window of the target (sliding layers of long targets) are left out.
        """
        self.check_pair(sharer.geometry, target.geometry)
        if probes is not None and probes < 1:
            raise ConfigError(f"dense: probes must be ≥ 1 or None, got {probes}")
        if len(sharer) == 0 or len(target) == 0:
            raise StateFormatError("dense: reconstruction needs non-empty sharer and target states")
        rows, src = self.row_pairs(sharer, target, align, mask)  # (N,), (N,) int64 target / sharer rows
        if probes is not None and len(rows) > probes:
            pick = torch.linspace(0, len(rows) - 1, probes, device=rows.device).round().long()
            rows, src = rows[pick], src[pick]
        keys, values = self.content(sharer)  # per receiver layer (H_R, T_s, D_R) float32
        target, T = cast(target, torch.float32, self.w.device), len(target)
        losses = []
        for i, layer in enumerate(target.layers):
            if layer.keys.shape[1] != T:
                continue
            k = rotate_keys(layer.keys, -layer.positions, self.receiver.layer(i).rope)  # (H_R, T_r, D_R)
            rel_k = _relative(keys[i][:, src], k[:, rows])  # translated row src[n] vs target row rows[n]
            losses.append((rel_k + _relative(values[i][:, src], layer.values[:, rows])) / 2)
        if not losses:
            raise StateFormatError(f"dense: no layer of the target ({target.geometry.model}) holds all its rows")
        return torch.stack(losses).mean()

    def row_pairs(self, sharer: KVState, target: KVState, align: torch.Tensor | TokenAlignment | None = None,
                  mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(target rows, sharer rows): two (N,) int64 tensors on the translator's device, N ≥ 1 (see
        `reconstruction_loss` for the rule)."""
        dev, T_s, T_r = self.w.device, len(sharer), len(target)
        if align is None:
            if sharer.geometry.tokenizer != target.geometry.tokenizer:
                raise StateFormatError(f"dense: {sharer.geometry.model} and {target.geometry.model} tokenize differently: "
                                 "pass align= (token_alignment.align of the chat both prefilled)")
            n = min(T_s, T_r)
            if not torch.equal(sharer.token_ids[:n].to(dev), target.token_ids[:n].to(dev)):
                raise StateFormatError(f"dense: the sharer's and the target's first {n} tokens differ (another text or "
                                 "template): pass align= (token_alignment.align of the chat both prefilled)")
            rows = torch.arange(n, device=dev)
            return rows, rows
        if isinstance(align, TokenAlignment):
            align, mask = align.index, align.mask if mask is None else mask
        align = torch.as_tensor(align, dtype=torch.int64, device=dev)  # (T_r,)
        mask = (align >= 0) if mask is None else torch.as_tensor(mask, dtype=torch.bool, device=dev)  # (T_r,)
        if align.shape != (T_r,) or mask.shape != (T_r,):
            raise StateFormatError(f"dense: align and mask need one entry per target row ({T_r}); got "
                             f"{tuple(align.shape)} and {tuple(mask.shape)}")
        if bool(torch.any(mask & ((align < 0) | (align >= T_s)))):
            raise StateFormatError(f"dense: a masked-in target row aligns outside the sharer's {T_s} rows")
        rows = torch.nonzero(mask).flatten()  # (N,)
        if len(rows) == 0:
            raise StateFormatError("dense: no target row is aligned to a sharer row")
        return rows, align[rows]


def _relative(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """||pred - target|| / ||target|| over every element (a 0-dim float32 tensor on their device)."""
    return torch.linalg.vector_norm(pred - target) / torch.linalg.vector_norm(target).clamp_min(1e-12)

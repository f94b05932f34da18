"""Building blocks shared by the translators: position-free K/V views, slot pooling, layer maps, residuals."""
from __future__ import annotations

import math

import torch
from torch import nn

from ..rope import rotate_keys
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

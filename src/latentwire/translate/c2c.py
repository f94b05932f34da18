"""C2C (Cache-to-Cache) baseline (docs/methods.md#c2c): fuse the sharer's K/V into the receiver's, token by token.

Both models read the *same* input. Receiver prompt token t is aligned to a sharer token `align[t]`
(see `token_alignment.align`); for every receiver layer l a projector of its own reads the aligned
sharer K/V row of one sharer layer together with the receiver's own K/V row and writes a K/V residual
in the receiver's geometry:

    x        = [LN(k_S), LN(v_S), LN(k_R), LN(v_R)]          rows flattened over heads, keys un-rotated
    h        = GELU(W2 GELU(W1 x + b1) + b2)                  (hidden = config.hidden)
    Δk, Δv   = W_k h + b_k, W_v h + b_v                        (H_R, D_R) each, zero-initialised
    K'_R     = K_R + R(p) (σ(g^k_{l,h}) Δk)                    per-layer, per-head learned gates
    V'_R     = V_R + σ(g^v_{l,h}) Δv

Keys enter the projector un-rotated (`rotate_keys(k, -p)`), so the projector is position-free on both
sides, and the key residual is rotated to the receiver row's position `p` before it is added to the
cached (rotated) key: the same as un-rotating, adding and re-rotating, without touching the cached key
when the residual is zero. The output heads start at zero, so an untrained C2C returns the receiver
state bit for bit. Rows whose mask is False (template tokens, unaligned tokens) are left exactly as
they were.

Layer map (fixed, depth-proportional): receiver layer i reads sharer layer
`floor(i (L_S - 1) / (L_R - 1) + 1/2)` (round half up; layer 0 when L_R = 1). A sliding-window sharer
layer holds only its last window of rows, so when the mapped layer slides and the sharer has global
layers, the nearest global sharer layer is used instead (ties: the shallower one). If the sharer has
no global layer, receiver rows whose aligned sharer row the sliding layer no longer holds get no residual.
Receiver sliding layers hold only their last rows: each is fused at the rows it holds (by position).

Trainable parameters, with I = 2 (H_S D_S + H_R D_R) inputs per row, h = hidden, O = H_R D_R:
    L_R * (2 I  +  (I + 1) h  +  (h + 1) h  +  2 (h + 1) O  +  2 H_R)
(input LayerNorms, two hidden layers, the K and V output heads, the K and V gates).

Gate (`config.gate`): "static" (default) is the per-layer, per-head parameter above. "input" makes it
a function of the input, closer to the paper's input-dependent layer gating: per receiver layer,

    z          = [mean_t LN(k_S), mean_t LN(v_S)]            over the rows the layer fuses (2 H_S D_S)
    g^k, g^v   = g^k_{l}, g^v_{l}  +  W^g_l z                  W^g_l: (2 H_R, 2 H_S D_S), zero-initialised

so at init the gates equal the static ones (σ(0) = 1/2) and the output heads are still zero: an
untrained C2C is the identity bit for bit in both modes. "input" adds L_R * 4 H_R H_S D_S parameters.
"""
from __future__ import annotations

import dataclasses

import torch
from torch import nn

from ..errors import ConfigError, StateFormatError
from ..rope import rotate_keys
from ..state import Geometry, KVState, LayerKV
from .base import Translator, TranslatorConfig, register, with_layers
from .token_alignment import TokenAlignment

GATES = ("static", "input")


@dataclasses.dataclass(frozen=True)
class C2CConfig(TranslatorConfig):
    hidden: int = 256  # width of each layer's projector
    gate: str = "static"  # "static": learned per-layer, per-head gates; "input": computed from the sharer's rows

    def __post_init__(self):
        if isinstance(self.hidden, bool) or not isinstance(self.hidden, int) or self.hidden < 1:
            raise ConfigError(f"c2c: hidden must be an integer >= 1, got {self.hidden!r}")
        if self.gate not in GATES:
            raise ConfigError(f"c2c: gate must be one of {GATES}, got {self.gate!r}")


def layer_map(sharer: Geometry, receiver: Geometry) -> list[int]:
    """Receiver layer -> the sharer layer its projector reads (depth-proportional, global layers preferred)."""
    ls, lr = sharer.num_layers, receiver.num_layers
    glob = [j for j, t in enumerate(sharer.layer_types) if t == "global"]
    out = []
    for i in range(lr):
        j = int(i * (ls - 1) / (lr - 1) + 0.5) if lr > 1 else 0
        if sharer.layer_types[j] == "sliding" and glob:
            j = min(glob, key=lambda g: (abs(g - j), g))
        out.append(j)
    return out


class _Projector(nn.Module):
    """One receiver layer's fuser: [sharer K/V row, receiver K/V row] -> gated K/V residual."""

    def __init__(self, sharer_width: int, receiver_width: int, heads: int, hidden: int, gate: str = "static"):
        super().__init__()
        self.norms = nn.ModuleList([nn.LayerNorm(w) for w in (sharer_width, sharer_width,
                                                              receiver_width, receiver_width)])
        self.mlp = nn.Sequential(nn.Linear(2 * (sharer_width + receiver_width), hidden), nn.GELU(),
                                 nn.Linear(hidden, hidden), nn.GELU())
        self.out_k = nn.Linear(hidden, receiver_width)
        self.out_v = nn.Linear(hidden, receiver_width)
        for head in (self.out_k, self.out_v):  # zero-initialised: an untrained C2C changes nothing
            nn.init.zeros_(head.weight)
            nn.init.zeros_(head.bias)
        self.gate_k = nn.Parameter(torch.zeros(heads))  # σ(0) = 1/2: open enough for gradients to flow
        self.gate_v = nn.Parameter(torch.zeros(heads))
        self.heads = heads
        self.gate_in = None
        if gate == "input":  # input-conditioned gates: the static ones plus a zero-initialised linear map
            self.gate_in = nn.Linear(2 * sharer_width, 2 * heads, bias=False)
            nn.init.zeros_(self.gate_in.weight)

    def forward(self, ks, vs, kr, vr, rows: torch.Tensor | None = None):
        """(T, H_S D_S) x2, (T, H_R D_R) x2 -> key and value residuals (H_R, T, D_R).

        rows: (T,) bool, the rows that will be fused; the input-conditioned gate pools the sharer's
        normalised rows over them (default: all rows)."""
        normed = [n(t) for n, t in zip(self.norms, (ks, vs, kr, vr))]
        x = torch.cat(normed, dim=-1)
        h = self.mlp(x)
        T = x.shape[0]
        dk = self.out_k(h).reshape(T, self.heads, -1).transpose(0, 1)
        dv = self.out_v(h).reshape(T, self.heads, -1).transpose(0, 1)
        gate_k, gate_v = self.gate_k, self.gate_v
        if self.gate_in is not None:
            z = torch.cat(normed[:2], dim=-1)  # (T, 2 H_S D_S)
            z = z.mean(dim=0) if rows is None else z[rows].mean(dim=0)
            g = self.gate_in(z)
            gate_k, gate_v = gate_k + g[:self.heads], gate_v + g[self.heads:]
        return torch.sigmoid(gate_k)[:, None, None] * dk, torch.sigmoid(gate_v)[:, None, None] * dv


@register
class C2C(Translator):
    """Cache-to-Cache fuser for two models reading the same input (token-aligned)."""

    name = "c2c"
    Config = C2CConfig
    needs_receiver = True

    def __init__(self, sharer: Geometry, receiver: Geometry, config: C2CConfig | None = None):
        super().__init__(sharer, receiver, config)
        self.layer_map = layer_map(sharer, receiver)
        ws, wr = sharer.num_kv_heads * sharer.head_dim, receiver.num_kv_heads * receiver.head_dim
        self.projectors = nn.ModuleList(_Projector(ws, wr, receiver.num_kv_heads, self.config.hidden, self.config.gate)
                                        for _ in range(receiver.num_layers))

    @staticmethod
    def parameter_count(sharer: Geometry, receiver: Geometry, hidden: int, gate: str = "static") -> int:
        """Trainable parameters of a C2C for this pair (the formula in the module docstring)."""
        ws = sharer.num_kv_heads * sharer.head_dim
        i = 2 * (ws + receiver.num_kv_heads * receiver.head_dim)
        o = receiver.num_kv_heads * receiver.head_dim
        extra = 4 * receiver.num_kv_heads * ws if gate == "input" else 0
        return receiver.num_layers * (2 * i + (i + 1) * hidden + (hidden + 1) * hidden + 2 * (hidden + 1) * o
                                      + 2 * receiver.num_kv_heads + extra)

    def forward(self, sharer: KVState, receiver: KVState, align: torch.Tensor | TokenAlignment,
                mask: torch.Tensor | None = None) -> KVState:
        """The receiver state with every aligned row fused with its sharer row (same rows, same positions).

        align: (T_R,) int64, the sharer row (index into `sharer`'s rows) of each receiver row, or a
            `TokenAlignment` (its index and mask are used). mask: (T_R,) bool, rows to fuse; default
            `align >= 0`. Rows with mask False come back unchanged.
        """
        if isinstance(align, TokenAlignment):
            align, mask = align.index, align.mask if mask is None else mask
        align = torch.as_tensor(align, dtype=torch.int64, device=receiver.device)
        mask = (align >= 0) if mask is None else torch.as_tensor(mask, dtype=torch.bool, device=receiver.device)
        T_r, T_s = len(receiver), len(sharer)
        if align.shape != (T_r,) or mask.shape != (T_r,):
            raise StateFormatError(f"c2c: align and mask need one entry per receiver row ({T_r}); got "
                             f"{tuple(align.shape)} and {tuple(mask.shape)}")
        if bool(torch.any(mask & ((align < 0) | (align >= T_s)))):
            raise StateFormatError(f"c2c: a masked-in receiver row aligns outside the sharer's {T_s} rows")
        param = self.projectors[0].out_k.weight
        layers, unrotated = [], {}  # sharer layer -> its keys without RoPE (shared by receiver layers)
        for i, layer in enumerate(receiver.layers):
            rows = torch.searchsorted(receiver.positions, layer.positions)  # receiver rows this layer holds
            src = self.layer_map[i]
            s_layer = sharer.layers[src]
            if s_layer.positions.numel() == 0:
                layers.append(layer)
                continue
            want = sharer.positions[align[rows].clamp(0, T_s - 1)]  # position of each aligned sharer row
            at = torch.searchsorted(s_layer.positions, want).clamp_max(s_layer.positions.shape[0] - 1)
            fuse = mask[rows] & (s_layer.positions[at] == want)  # (T_l,): aligned, and the sharer layer holds it
            if not bool(fuse.any()):
                layers.append(layer)
                continue
            s_spec, r_spec = sharer.geometry.layer(src).rope, receiver.geometry.layer(i).rope
            if src not in unrotated:
                unrotated[src] = rotate_keys(_usable(s_layer.keys), -s_layer.positions, s_spec)
            ks = unrotated[src][:, at]  # (H_S, T_l, D_S), position-free
            vs = _usable(s_layer.values)[:, at]
            r_keys, r_values = _usable(layer.keys), _usable(layer.values)
            kr = rotate_keys(r_keys, -layer.positions, r_spec)
            dk, dv = self.projectors[i](_flat(ks, param), _flat(vs, param), _flat(kr, param), _flat(r_values, param),
                                        fuse.to(param.device))
            dk = rotate_keys(dk.to(r_keys.device), layer.positions, r_spec)  # rotated to each row's position
            keep = fuse[None, :, None]
            keys = torch.where(keep, r_keys + dk.to(r_keys.dtype), r_keys)
            values = torch.where(keep, r_values + dv.to(r_values.device, r_values.dtype), r_values)
            layers.append(LayerKV(keys, values, layer.positions))
        return with_layers(receiver, layers)


def _usable(x: torch.Tensor) -> torch.Tensor:
    """States made under `torch.inference_mode()` (every `Agent.prefill`) hold inference tensors, which
    autograd refuses to save: while training, work on a (bit-identical) normal copy."""
    return x.clone() if torch.is_grad_enabled() and x.is_inference() else x


def _flat(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """(H, T, D) -> (T, H D) in the parameters' dtype and device."""
    return x.transpose(0, 1).reshape(x.shape[1], -1).to(dtype=like.dtype, device=like.device)

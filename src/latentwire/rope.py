"""RoPE per layer type, and exact re-rotation of cached keys.

A cached key at position p is `k_p = s * R(p θ) k` where `R` rotates each channel pair by its angle
and `s` is the model's `attention_scaling` (folded into cos/sin by transformers). Rotations compose,
`R(Δθ) R(pθ) = R((p+Δ)θ)`, so moving a key to `p+Δ` is a *pure* rotation by `Δθ` with no scaling:
multiplying by `s` again is the "double attention_scaling" bug.

Only RoPE types whose frequencies are a fixed function of the config can be composed this way.
`dynamic` (frequencies depend on the current sequence length) and `longrope` (switches factor sets
with length) are refused with `UnsupportedRopeError` rather than approximated.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import UnsupportedRopeError

# Frequencies fixed at init: rotation by a delta is exact.
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@dataclass(frozen=True)
class RopeSpec:
    """The rotation one layer type applies: `inv_freq` exactly as the model holds it (float32 values)."""

    rope_type: str
    inv_freq: tuple[float, ...]  # (R/2,)  R = rotary dim (≤ head_dim; partial rotary keeps the rest)
    attention_scaling: float = 1.0  # already inside cached keys; recorded, never re-applied

    def __post_init__(self):
        if self.rope_type not in STATIC_ROPE_TYPES:
            raise UnsupportedRopeError(
                f"rope_type {self.rope_type!r} cannot be re-rotated exactly "
                f"(supported: {', '.join(STATIC_ROPE_TYPES)})"
            )
        if not self.inv_freq:
            raise UnsupportedRopeError("empty inv_freq")

    @property
    def rotary_dim(self) -> int:
        return 2 * len(self.inv_freq)

    def to_json(self) -> dict:
        return {"rope_type": self.rope_type, "inv_freq": list(self.inv_freq),
                "attention_scaling": self.attention_scaling}

    @classmethod
    def from_json(cls, d: dict) -> "RopeSpec":
        return cls(str(d["rope_type"]), tuple(float(x) for x in d["inv_freq"]), float(d["attention_scaling"]))


def decoder_of(model):
    """The text decoder stack (embeddings, layers, rotary module, final norm) of a causal LM: `model.model` for
    a *ForCausalLM, the language model of a multimodal *ForConditionalGeneration (Gemma3 4B and up)."""
    get = getattr(model, "get_decoder", None)
    decoder = get() if callable(get) else None
    return decoder if decoder is not None else getattr(model, "model", model)


def rope_specs_from_model(model) -> dict[str, RopeSpec]:
    """RoPE per HF layer type ("full_attention", "sliding_attention"), read from the model's rotary module.

    Reading the buffers the model itself uses (rather than recomputing from the config) guarantees
    the rotation we undo/redo is the one the model applied.
    """
    rotary = getattr(decoder_of(model), "rotary_emb", None)
    if rotary is None:
        raise UnsupportedRopeError(f"{type(model).__name__} has no rotary_emb module: not a RoPE model")
    config = model.config.get_text_config(decoder=True)
    layer_types = sorted(set(getattr(config, "layer_types", None) or ["full_attention"]))
    specs = {}
    rope_types = rotary.rope_type if isinstance(rotary.rope_type, dict) else None
    for lt in layer_types:
        if rope_types is not None:  # per-layer-type rotary (Gemma3): buffers named by layer type
            rope_type = rope_types[lt]
            inv_freq = getattr(rotary, f"{lt}_inv_freq")
            scaling = getattr(rotary, f"{lt}_attention_scaling")
        else:
            rope_type, inv_freq, scaling = rotary.rope_type, rotary.inv_freq, rotary.attention_scaling
        specs[lt] = RopeSpec(rope_type, tuple(float(x) for x in inv_freq.float().tolist()), float(scaling))
    return specs


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotate_keys(keys: torch.Tensor, delta: torch.Tensor, spec: RopeSpec) -> torch.Tensor:
    """Rotate cached keys by per-row position deltas, exactly (angles and products in float64).

    keys: (H, T, D) with RoPE applied at their old positions; delta: (T,) integer position shifts.
    Returns keys as if computed at `old + delta`, same dtype. Channels past the rotary dim pass through.
    """
    if keys.shape[-2] != delta.shape[0]:
        raise ValueError(f"{delta.shape[0]} deltas for {keys.shape[-2]} rows")
    rd = spec.rotary_dim
    if rd > keys.shape[-1]:
        raise UnsupportedRopeError(f"rotary dim {rd} exceeds head dim {keys.shape[-1]}")
    if not torch.any(delta != 0):
        return keys.clone()
    inv_freq = torch.tensor(spec.inv_freq, dtype=torch.float64, device=keys.device)  # (R/2,)
    angles = delta.to(keys.device, torch.float64)[:, None] * inv_freq[None, :]  # (T, R/2)
    angles = torch.cat((angles, angles), dim=-1)  # (T, R)
    cos, sin = angles.cos(), angles.sin()  # pure rotation: no attention_scaling here
    rot, rest = keys[..., :rd].to(torch.float64), keys[..., rd:]
    rotated = rot * cos + _rotate_half(rot) * sin  # (H, T, R)
    return torch.cat((rotated.to(keys.dtype), rest), dim=-1)

"""RoPE per layer type, and exact re-rotation of cached keys.

A cached key at position p is `k_p = s * R(p θ) k` where `R` rotates each channel pair by its angle
and `s` is the model's `attention_scaling` (folded into cos/sin by transformers). Rotations compose,
`R(Δθ) R(pθ) = R((p+Δ)θ)`, so moving a key to `p+Δ` is a *pure* rotation by `Δθ` with no scaling:
multiplying by `s` again is the "double attention_scaling" bug.

Only RoPE types whose frequencies are a fixed function of the config can be composed this way.
`dynamic` (frequencies depend on the current sequence length) and `longrope` (switches factor sets
with length) are refused with `UnsupportedRopeError` rather than approximated, and so is any model whose
own rotation `rotate_keys` does not reproduce on probe keys (`check_rotation`), in either pair layout:
(i, i + R/2) as in Llama, or interleaved (2i, 2i+1) as in Cohere and GLM (`RopeSpec.interleaved`).
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass, replace

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
    interleaved: bool = False  # pairs (2i, 2i+1) rotate together (Cohere, GLM); else (i, i + R/2)

    def __post_init__(self):
        if self.rope_type not in STATIC_ROPE_TYPES:
            raise UnsupportedRopeError(
                f"rope_type {self.rope_type!r} cannot be re-rotated exactly "
                f"(supported: {', '.join(STATIC_ROPE_TYPES)})"
            )
        if not self.inv_freq:
            raise UnsupportedRopeError("empty inv_freq")
        if not all(math.isfinite(f) for f in self.inv_freq):
            raise UnsupportedRopeError("inv_freq must hold finite numbers (a NaN or infinite frequency rotates nothing "
                                       "reproducibly)")
        if not (math.isfinite(self.attention_scaling) and self.attention_scaling > 0):
            raise UnsupportedRopeError(f"attention_scaling must be finite and > 0, got {self.attention_scaling!r}")

    @property
    def rotary_dim(self) -> int:
        return 2 * len(self.inv_freq)

    def to_json(self) -> dict:
        out = {"rope_type": self.rope_type, "inv_freq": list(self.inv_freq), "attention_scaling": self.attention_scaling}
        return out | {"interleaved": True} if self.interleaved else out  # absent when False: older bytes unchanged

    @classmethod
    def from_json(cls, d: dict) -> "RopeSpec":
        interleaved = d.get("interleaved", False)
        if type(interleaved) is not bool:
            raise TypeError(f"rope interleaved: want true or false, got {interleaved!r}")
        return cls(str(d["rope_type"]), tuple(float(x) for x in d["inv_freq"]), float(d["attention_scaling"]),
                   interleaved)


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
    return check_rotation(model, rotary, specs, per_type=rope_types is not None)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def half_split(x: torch.Tensor, rd: int) -> torch.Tensor:
    """Interleaved rotary channels (pairs 2i, 2i+1) reordered so pair i sits at (i, i + R/2), the layout
    `rotate_keys` rotates; channels past the rotary dim `rd` stay where they are."""
    return torch.cat((x[..., 0:rd:2], x[..., 1:rd:2], x[..., rd:]), dim=-1)


def interleave(x: torch.Tensor, rd: int) -> torch.Tensor:
    """The inverse of `half_split`."""
    half = rd // 2
    return torch.cat((torch.stack((x[..., :half], x[..., half:rd]), dim=-1).flatten(-2), x[..., rd:]), dim=-1)


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
    if spec.interleaved:  # the same rotation in the half-split layout, and back
        return interleave(rotate_keys(half_split(keys, rd), delta, replace(spec, interleaved=False)), rd)
    inv_freq = torch.tensor(spec.inv_freq, dtype=torch.float64, device=keys.device)  # (R/2,)
    angles = delta.to(keys.device, torch.float64)[:, None] * inv_freq[None, :]  # (T, R/2)
    angles = torch.cat((angles, angles), dim=-1)  # (T, R)
    cos, sin = angles.cos(), angles.sin()  # pure rotation: no attention_scaling here
    rot, rest = keys[..., :rd].to(torch.float64), keys[..., rd:]
    rotated = rot * cos + _rotate_half(rot) * sin  # (H, T, R)
    return torch.cat((rotated.to(keys.dtype), rest), dim=-1)


PROBE_POSITIONS = (3, 17, 250, 1000)


def nope_layers(model) -> list[int]:
    """Layers that apply no RoPE to their keys (SmolLM3's and Llama 4's `use_rope = 0` layers; the global
    layers of EXAONE-4 with a sliding window, of AfMoE and of Cohere2). Their keys do not depend on position,
    which this library's geometry cannot express, so such models are refused. The list is of switches known
    in transformers' modeling files; `latentwire check` measures the law on any model."""
    out = []
    for i, layer in enumerate(getattr(decoder_of(model), "layers", None) or ()):
        attn = getattr(layer, "self_attn", None)
        if attn is None:
            continue
        if not getattr(attn, "use_rope", True):
            out.append(i)
        elif getattr(attn, "is_sliding", None) is False and getattr(attn, "sliding_window", None):
            out.append(i)  # EXAONE-4: with a sliding window, only its sliding layers rotate
        elif getattr(attn, "is_local_attention", None) is False:
            out.append(i)  # AfMoE: only its local layers rotate
        elif type(attn).__name__ == "Cohere2Attention" and getattr(attn, "sliding_window", None) is None:
            out.append(i)  # Cohere2 (Command R7B, Command A): its global layers do not rotate
    return out


@torch.no_grad()
def check_rotation(model, rotary, specs: dict[str, RopeSpec], per_type: bool = False) -> dict[str, RopeSpec]:
    """`specs` as `rotate_keys` reproduces the model's own RoPE, else UnsupportedRopeError: probe keys rotated
    by the model (its rotary module and its modeling file's `apply_rotary_pos_emb`) at position 0, then moved
    by `rotate_keys`, must equal the model's keys at positions p, in the half-split pair layout (i, i + R/2)
    or, failing that, the interleaved one (2i, 2i+1: Cohere, GLM), which is then recorded in the spec. A
    rotation neither reproduces is refused instead of giving silently wrong caches, and so are models with
    layers that apply no RoPE (`nope_layers`). Only the rotated channels are probed (partial rotary: the rest passes
    through); the angles are taken at full float32 precision (no TF32)."""
    name = type(model).__name__
    nope = nope_layers(model)
    if nope:
        raise UnsupportedRopeError(f"{name}: layers {nope} apply no RoPE to their keys (NoPE layers); latentwire's "
                                   "geometry assumes every layer rotates its keys")
    layers = getattr(decoder_of(model), "layers", None)
    attn = getattr(layers[0], "self_attn", None) if layers is not None and len(layers) else None
    if attn is None:
        raise UnsupportedRopeError(f"{name}: no decoder layers with a `self_attn` module, so the rotation it "
                                   "applies to keys cannot be checked")
    apply = getattr(sys.modules.get(type(attn).__module__), "apply_rotary_pos_emb", None)
    if apply is None:
        raise UnsupportedRopeError(f"{name}: its modeling file has no apply_rotary_pos_emb, so the rotation it "
                                   "applies to keys cannot be checked")
    device = model.get_input_embeddings().weight.device
    n = len(PROBE_POSITIONS)
    at = torch.tensor([PROBE_POSITIONS], device=device)  # (1, n)
    out = {}
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")  # HF computes the angles with a float32 matmul
    try:
        for layer_type, spec in specs.items():
            rd = spec.rotary_dim  # probe keys: a fixed, non-degenerate pattern over the rotated channels
            x = torch.arange(n * rd, dtype=torch.float32, device=device).mul(0.37).sin().view(1, 1, n, rd)
            kw = {"layer_type": layer_type} if per_type else {}
            try:
                cos0, sin0 = (t.to(device) for t in rotary(x, torch.zeros_like(at), **kw))
                cosp, sinp = (t.to(device) for t in rotary(x, at, **kw))
                at0 = apply(x, x, cos0, sin0)[1][0]  # (1, n, R): every probe at position 0
                want = apply(x, x, cosp, sinp)[1][0]
            except (RuntimeError, TypeError, ValueError) as e:
                raise UnsupportedRopeError(f"{name} ({layer_type}): its RoPE could not be applied to probe keys "
                                           f"({type(e).__name__}: {str(e)[:120]})") from None
            errors = {}
            for candidate in (spec, replace(spec, interleaved=True)):
                got = rotate_keys(at0, at[0], candidate)
                errors[candidate.interleaved] = err = (float((got - want).abs().max()) if got.shape == want.shape
                                                       else float("inf"))
                if err <= 1e-4 * max(1.0, float(want.abs().max())):
                    out[layer_type] = candidate
                    break
            else:
                raise UnsupportedRopeError(
                    f"{name} ({layer_type}): moving a key by a position delta does not reproduce the model's own "
                    f"rotation, with channel pairs (i, i + R/2) nor (2i, 2i+1) (max errors {errors[False]:.3g}, "
                    f"{errors[True]:.3g}); latentwire cannot re-rotate its keys")
    finally:
        torch.set_float32_matmul_precision(precision)
    return out

"""Does latentwire work on this model? The laws the library relies on, measured on the model itself.

    latentwire check --model Qwen/Qwen3-0.6B [--device cuda --dtype float32]

Reading the geometry already refuses what cannot work (RoPE that depends on the sequence length, NoPE
layers, a rotation `rotate_keys` does not reproduce). Then, on a short prompt:

    rerotation   prefilled at 0 and moved to p == prefilled at p, every layer (relative key error)
    attention    the query attention CacheBack scores with == the model's eager attention weights
    logits       Agent.logits on the final hidden states == the model's own logits (relative)
    wire         a state after latent steps, moved, survives the wire bit for bit (digest)

Errors are relative (‖got − want‖ / ‖want‖) and reported as measured. The check loads the model in float32
unless told otherwise: the laws are exact there. In bf16/fp16 the bounds are loose, since a forward at
another position rounds differently in every layer and eager attention itself rounds its logits (a layer
without RoPE, or a wrong rotation, is off by order 1).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..agent import Agent
from ..state import KVState
from ..attention import attend
from ..models.compat import cache_arg

PROMPT = "Ada Lovelace wrote the first program for the Analytical Engine in 1843, in Marylebone, London."
QUERY = "Who wrote the first program?"
OFFSET = 300  # large enough that most channel pairs turn by a radian or more: a wrong rotation shows
BOUNDS = {torch.float32: 1e-3, torch.bfloat16: 0.2, torch.float16: 0.05}  # relative error per check


@dataclass(frozen=True)
class Check:
    name: str
    error: float
    bound: float
    detail: str

    @property
    def ok(self) -> bool:
        return self.error <= self.bound


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


@torch.inference_mode()
def _state_at(agent: Agent, ids: torch.Tensor, start: int) -> KVState:
    cache = agent.new_cache()
    agent._forward(cache, start, ids=ids)
    return KVState.from_cache(cache, agent.geometry, ids, start=start)


@torch.inference_mode()
def check_model(agent: Agent) -> list[Check]:
    """The four checks on `agent` (geometry already read and accepted)."""
    from ..wire import decode, encode

    bound = BOUNDS.get(agent.dtype, 0.1)
    ids = agent.ids(agent.tokenizer(PROMPT, add_special_tokens=False)["input_ids"])
    at0, atp = _state_at(agent, ids, 0), _state_at(agent, ids, OFFSET)
    moved = at0.shift(OFFSET)
    errors = [_rel(a.keys, b.keys) for a, b in zip(moved.layers, atp.layers)]
    worst = max(range(len(errors)), key=errors.__getitem__)
    out = [Check("rerotation", errors[worst], bound, f"worst layer {worst} of {len(errors)}, offset {OFFSET}")]

    state = agent.prefill(PROMPT)
    got = attend(agent, state, QUERY)  # (L_g, H_q, m, T)
    q = agent.ids(agent.tokenizer(QUERY, add_special_tokens=False)["input_ids"])
    before = agent.model.config._attn_implementation
    agent.model.set_attn_implementation("eager")
    try:
        ref = agent.decoder(input_ids=q[None], **cache_arg(agent.decoder, state.compact().to_cache()), use_cache=True,
                            position_ids=torch.arange(len(state), len(state) + len(q), device=agent.device)[None],
                            output_attentions=True).attentions
    finally:
        agent.model.set_attn_implementation(before)
    layers = [i for i, t in enumerate(state.geometry.layer_types) if t == "global"] or list(range(len(ref)))
    want = torch.stack([ref[i][0, :, :, :len(state)] for i in layers]).float()
    out.append(Check("attention", _rel(got, want), bound,
                     f"{len(layers)} scored layers, {len(state)} rows, {len(q)} query tokens"))

    hidden = agent.decoder(input_ids=ids[None]).last_hidden_state[0]
    out.append(Check("logits", _rel(agent.logits(hidden), agent.model(input_ids=ids[None]).logits[0]), bound,
                     f"{len(ids)} positions"))

    thought = agent.think(state, steps=2).shift(OFFSET)
    data = encode(thought, protocol="check")
    back = decode(data, expect=agent.geometry).body
    out.append(Check("wire", 0.0 if back.digest() == thought.digest() else 1.0, 0.0,
                     f"{len(thought)} rows after 2 latent steps, {len(data):,} bytes"))
    return out


def describe(agent: Agent) -> list[str]:
    """The geometry lines: layers, heads, RoPE per layer type."""
    g = agent.geometry
    kinds = {k: g.layer_types.count(k) for k in dict.fromkeys(g.layer_types)}
    lines = [f"model {g.model}: {g.num_layers} layers ({', '.join(f'{n} {k}' for k, n in kinds.items())}), "
             f"{g.num_kv_heads} KV heads × {g.head_dim}, hidden {g.hidden_size}, "
             f"sliding window {g.sliding_window}, {agent.dtype} on {agent.device}"]
    for kind, spec in g.rope:
        lines.append(f"  RoPE ({kind}): {spec.rope_type}, rotary dim {spec.rotary_dim} of {g.head_dim}, pairs "
                     f"{'(2i, 2i+1)' if spec.interleaved else '(i, i + R/2)'}, attention scaling "
                     f"{spec.attention_scaling:g}")
    return lines

"""The query's attention over a finished state, read from hooks under any attention implementation.

CacheBack reads a state through these (and `latentwire check` measures them). The state is not
re-run: the query's tokens go through the model with its own attention kernel (eager, sdpa, flash)
while hooks capture each global layer's query projection and RoPE cos/sin; the weights are rebuilt
in float32 as eager attention computes them. CacheBack scores with them (docs/methods.md,
"CacheBack scores").
"""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import torch

from .errors import StateFormatError
from .state import KVState
from .models.compat import cache_arg

if TYPE_CHECKING:
    from .agent import Agent


@torch.inference_mode()
def attend(agent: Agent, state: KVState, query: str) -> torch.Tensor:
    """Attention of the query's m tokens, appended after a finished state, over its T rows.

    Returns (L_g, H_q, m, T) float32: one slice per global-attention layer (sliding layers see only
    their window, so hybrid models are scored on global layers alone). See `query_attention`.
    """
    T = len(state)
    return torch.stack([w[:, :, :T] for _, w in query_attention(agent, state, query)])  # (L_g, H_q, m, T)


@torch.inference_mode()
def attend_grouped(agent: Agent, state: KVState, query: str, min_depth: float = 0.0,
                   max_depth: float = 1.0) -> torch.Tensor:
    """(S, m, T) float32: the query's attention averaged over global layers and over the query heads
    that share each KV head — what CacheBack scores — accumulated layer by layer, so the full
    (L_g, H_q, m, T) tensor is never held. `min_depth` / `max_depth`: only the scoring layers at relative depth
    in [min_depth, max_depth) (`scoring_layers`)."""
    total, n, S = None, 0, state.geometry.num_kv_heads
    for _, w in query_attention(agent, state, query, min_depth, max_depth):  # (H_q, m, T + m), contiguous
        g = w.view(S, -1, *w.shape[-2:]).mean(dim=1)  # (S, m, T + m)
        total, n = (g if total is None else total.add_(g)), n + 1
    return total[..., :len(state)] / n  # (S, m, T)


def scoring_layers(layer_types, min_depth: float = 0.0, max_depth: float = 1.0) -> list[int]:
    """The layers a query's attention is read on: every global layer (or, when every layer slides, every layer)
    whose relative depth i / L is in [min_depth, max_depth); when none is, the deepest of them below max_depth
    (the shallowest if none is)."""
    if not 0.0 <= min_depth < 1.0:
        raise ValueError(f"min_depth must be in [0, 1), got {min_depth!r}")
    if not min_depth < max_depth <= 1.0:
        raise ValueError(f"max_depth must be in (min_depth, 1] = ({min_depth!r}, 1], got {max_depth!r}")
    L = len(layer_types)
    layers = [i for i, t in enumerate(layer_types) if t == "global"] or list(range(L))
    if band := [i for i in layers if min_depth <= i / L < max_depth]:
        return band
    return [i for i in layers if i / L < max_depth][-1:] or layers[:1]


class _Stop(Exception):
    """Raised by a hook after the deepest scoring layer: the layers above it cannot change what was captured."""


def _stop(module, args, output):
    raise _Stop


@torch.inference_mode()
def query_attention(agent: Agent, state: KVState, query: str, min_depth: float = 0.0, max_depth: float = 1.0):
    """Yield (layer index, (H_q, m, T + m) float32 attention weights) for each global layer (those at relative
    depth in [`min_depth`, `max_depth`): `scoring_layers`): the columns are the state's T rows, then the query's
    own m tokens (causal). A model whose layers all slide is scored on every layer while its window holds all
    T + m rows; beyond that, StateFormatError. The query stops after the deepest scoring layer: with
    max_depth = 0.5 it costs about half a forward, and the weights are those of the whole forward (layer i reads
    nothing above it).

    The state is not re-run: the m query tokens go through the model with its own attention
    implementation (eager, sdpa, flash), while hooks capture each global layer's query projection
    and RoPE cos/sin; the weights are then softmax(q·Kᵀ·scaling) over the cached keys plus the
    query's own causal keys, as eager attention computes them (grouped-query aware, logit
    soft-capping applied), in float32.
    """
    agent.geometry.check_same(state.geometry)
    ids = agent.ids(agent.tokenizer(query, add_special_tokens=False)["input_ids"])
    agent.check_window(state=len(state), query=len(ids))
    T, m = len(state), len(ids)
    if "global" not in state.geometry.layer_types:  # every layer slides (Mistral 7B v0.1): exact while the window
        window = state.geometry.sliding_window      # holds the state and the query
        if T + m >= window:
            raise StateFormatError(f"every layer of {state.geometry.model} slides (window {window}): its attention "
                                   f"can score a state plus query of {window - 1} rows, not {T} rows plus a "
                                   f"{m}-token query")
    layers = scoring_layers(state.geometry.layer_types, min_depth, max_depth)
    captured: dict[int, list] = {i: [None, None] for i in layers}  # layer -> [q projection, (cos, sin)]
    cache = state.compact().to_cache()  # may refuse the state: before any hook is on the model
    hooks = []
    try:  # every hook comes off again, whatever fails (a hook left on would break the agent's next forward)
        for i in layers:
            attn = agent.decoder.layers[i].self_attn
            hooks.append(_query_hook(attn, lambda out, i=i: captured[i].__setitem__(0, out)))
            hooks.append(attn.register_forward_pre_hook(
                lambda mod, args, kwargs, i=i: captured[i].__setitem__(1, kwargs.get("position_embeddings")),
                with_kwargs=True))
        hooks.append(agent.decoder.layers[layers[-1]].register_forward_hook(_stop))
        agent.decoder(input_ids=ids[None], **cache_arg(agent.decoder, cache), use_cache=True,
                      position_ids=torch.arange(T, T + m, device=agent.device)[None])
    except _Stop:
        pass
    finally:
        for h in hooks:
            h.remove()
    causal = torch.ones(m, m, dtype=torch.bool, device=agent.device).tril()  # query i sees query j ≤ i
    for i in layers:
        attn = agent.decoder.layers[i].self_attn
        q_proj, cos_sin = captured.pop(i)
        if q_proj is None or cos_sin is None:
            raise StateFormatError(f"layer {i}: attention did not expose its query projection and RoPE "
                                   f"(unsupported attention module {type(attn).__name__})")
        q = _rotated_queries(attn, q_proj, cos_sin)[0].float()  # (H_q, m, D)
        keys = cache.layers[i].keys[0].float()  # (H_kv, T + m, D): the state's rows, then the query's own
        H_kv, H_q = keys.shape[0], q.shape[0]
        # Grouped-query attention without repeating K: the G query heads of a KV head share one matmul.
        logits = q.reshape(H_kv, -1, q.shape[-1]) @ keys.transpose(-1, -2)  # (H_kv, G·m, T + m)
        logits = logits.mul_(attn.scaling).view(H_q, m, T + m)
        cap = getattr(attn, "attn_logit_softcapping", None)
        if cap:
            logits = torch.tanh(logits / cap) * cap
        logits[..., T:].masked_fill_(~causal, float("-inf"))
        yield i, logits.softmax(dim=-1)  # (H_q, m, T + m)


def _query_hook(attn, store):
    """Hook that passes the layer's query projection output (1, m, H_q·D) to `store`: its `q_proj`, or the
    query slice of a fused `qkv_proj` (Phi-3: [Q; K; V] along the last dim, Q first)."""
    if hasattr(attn, "q_proj"):
        return attn.q_proj.register_forward_hook(lambda mod, inp, out: store(out))
    if hasattr(attn, "qkv_proj"):
        n = attn.config.num_attention_heads * attn.head_dim
        return attn.qkv_proj.register_forward_hook(lambda mod, inp, out: store(out[..., :n]))
    raise StateFormatError(f"{type(attn).__name__} has neither q_proj nor a fused qkv_proj: cannot score its "
                           "queries (unsupported attention module)")


def _rotated_queries(attn, q_proj: torch.Tensor, cos_sin) -> torch.Tensor:
    """The query states an attention module feeds its kernel, rebuilt from its q_proj output.

    q_proj: (1, m, H_q·D). A q_norm as wide as the projection (OLMo2) applies before the split into heads,
    a per-head one (Gemma3, Qwen3) after; RoPE uses the module's own cos/sin (attention_scaling included) and the rotation
    function of the model's own modeling file.
    """
    head_dim = attn.head_dim
    norm = getattr(attn, "q_norm", None)
    if norm is not None and getattr(norm, "weight", None) is not None and norm.weight.shape[-1] == q_proj.shape[-1]:
        q_proj, norm = norm(q_proj), None  # OLMo2: one norm over all heads, before the split
    q = q_proj.view(*q_proj.shape[:-1], -1, head_dim)  # (1, m, H_q, D)
    if norm is not None:
        q = norm(q)
    q = q.transpose(1, 2)  # (1, H_q, m, D)
    cos, sin = cos_sin
    apply = getattr(sys.modules[type(attn).__module__], "apply_rotary_pos_emb", None)
    if apply is None:
        raise StateFormatError(f"{type(attn).__module__} has no apply_rotary_pos_emb: cannot score its queries")
    rd = cos.shape[-1]  # partial rotary: some modeling files (Phi-2, StableLM) split before calling `apply`
    return torch.cat((apply(q[..., :rd], q[..., :rd], cos, sin)[0], q[..., rd:]), dim=-1)

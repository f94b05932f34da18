"""XKV's stacked forward (one tensor per layer group) against the per-layer forward it replaced.

`_reference_forward` is XKV.forward as it was before vectorisation (per-layer un-rotation, pooling,
rows, scaling and residual add), kept here only as the reference. Weights are perturbed away from
the zero-init head, so the comparison is not the trivial identity.

    .venv/bin/python tests/unit/test_xkv_stacked.py   # prints a micro-timing, old vs new forward
"""
from __future__ import annotations

import math

import pytest
import torch

from latentwire.rope import RopeSpec, rotate_keys
from latentwire.state import LayerKV
from latentwire.translate import build
from latentwire.translate.base import with_layers
from latentwire.translate.layers import _ROPE_TABLES, MAX_ROPE_TABLES, _rotate, rms, rope_table

# every arch as sharer and as receiver; gemma3 brings its sliding group (window 8) and two RoPE bases
PAIRS = [("gemma3", "llama"), ("llama", "gemma3"), ("qwen2", "gemma3"), ("llama", "qwen2"), ("gemma3", "qwen2"),
         ("gemma3", "gemma3"), ("cohere", "glm"), ("glm", "llama")]  # cohere, glm: interleaved RoPE pairs
SHARER_TEXT = "the sharer read this: Ned has 9 coins and gives 4 of them away."
RECEIVER_TEXT = "receiver: Ben has 5 fewer coins than Ned."


@pytest.fixture(scope="module")
def agent_of(models, tokenizer):
    """arch -> a fresh Agent: the session's tiny model, or (cohere, glm) one built once for this module."""
    from latentwire.agent import Agent
    from latentwire.models import tiny_model

    built = dict(models)

    def get(arch):
        if arch not in built:
            built[arch] = tiny_model(arch)
        return Agent(built[arch], tokenizer, model_name=arch)

    return get


def _reference_forward(t, sharer, receiver):
    """XKV.forward before vectorisation: Python loops over layers (the old SlotPool, unrotated, add_residuals)."""
    def unrotated(state):  # per layer (H, T_l, D) float32, keys without RoPE
        return [(rotate_keys(l.keys.float(), -l.positions, state.geometry.layer(i).rope), l.values.float())
                for i, l in enumerate(state.layers)]

    def pool(slot_pool, kv):  # (L, H k 2D)
        pooled = []
        for (keys, values), q in zip(kv, slot_pool.queries):
            k, v = rms(keys), rms(values)
            att = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(k.shape[-1]), dim=-1)  # (H, k, T)
            pooled.append(torch.cat([att @ k, att @ v], dim=-1).flatten())
        return rms(torch.stack(pooled))

    H, D = t.receiver.num_kv_heads, t.receiver.head_dim
    kv_r = unrotated(receiver)
    tokens = t.in_s(t.layer_map(pool(t.pool_s, unrotated(sharer)))) + t.in_r(pool(t.pool_r, kv_r)) + t.layer_emb
    memory = t.mixer(tokens[None])  # (1, L_R, d)
    rows = [rms(torch.cat([k, v], -1).transpose(0, 1).flatten(1)) for k, v in kv_r]  # (T_l, H 2D)
    sizes = [r.shape[0] for r in rows]
    counts = torch.tensor(sizes, dtype=torch.int64, device=t.layer_emb.device)
    layer_ids = torch.repeat_interleave(counts, output_size=sum(sizes))
    q = t.query(torch.cat(rows)) + t.layer_emb[layer_ids]  # (ΣT_l, d)
    h, _ = t.decoder(q[None], memory, memory, need_weights=False)
    h = t.norm(h[0] + q)
    out = t.head(h).view(-1, H, 2, D)
    gates = torch.sigmoid(t.gate(h)).view(-1, H, 2, 1)
    layers = []
    for i, (layer, (k, v), d) in enumerate(zip(receiver.layers, kv_r, (out * gates).split(sizes))):
        scale_k, scale_v = k.pow(2).mean().sqrt().detach(), v.pow(2).mean().sqrt().detach()
        d = d.permute(1, 2, 0, 3)  # (H, 2, T_l, D)
        dk = rotate_keys(d[:, 0] * scale_k, layer.positions.clone(), receiver.geometry.layer(i).rope)
        layers.append(LayerKV((layer.keys.float() + dk).to(layer.keys.dtype),
                              (layer.values.float() + d[:, 1] * scale_v).to(layer.values.dtype), layer.positions))
    return with_layers(receiver, layers)


def _perturbed(S, R, seed=0):
    """An XKV for S -> R with every parameter redrawn from a seeded normal (the head is no longer zero)."""
    t = build("xkv", S.geometry, R.geometry, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in t.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen, dtype=p.dtype, device="cpu").to(p.device))
    return t


def _variant(state, how):
    """Prefill rows as they come, a selection with gaps, or rows moved to negative positions."""
    if how == "gaps":
        return state.select([i for i in range(len(state)) if i % 3 != 1])
    if how == "negative":
        return state.shift(-5)
    return state


def _max_diff(a, b):
    return max(float((x - y).detach().abs().max()) for la, lb in zip(a.layers, b.layers, strict=True)
               for x, y in ((la.keys, lb.keys), (la.values, lb.values)))


@pytest.mark.parametrize("how", ["prefill", "gaps", "negative"])
@pytest.mark.parametrize("sharer,receiver", PAIRS)
def test_stacked_forward_matches_the_per_layer_reference(sharer, receiver, how, agent_of):
    S = _variant(agent_of(sharer).prefill(SHARER_TEXT), how)
    R = _variant(agent_of(receiver).prefill(RECEIVER_TEXT), how)
    t = _perturbed(S, R)
    ref, out = _reference_forward(t, S, R), t(S, R)
    assert _max_diff(ref, R) > 1e-2  # not vacuous: the residuals are real
    assert _max_diff(out, ref) < 1e-5
    for a, b in zip(out.layers, ref.layers):
        assert torch.equal(a.positions, b.positions) and a.keys.dtype == b.keys.dtype
    assert torch.equal(out.positions, R.positions) and torch.equal(out.token_ids, R.token_ids)
    # gradients through both paths agree too (what training sees)
    w = [torch.randn(l.keys.shape, generator=torch.Generator().manual_seed(i), dtype=torch.float32, device="cpu")
         for i, l in enumerate(R.layers)]
    grads = []
    for state in (ref, t(S, R)):
        t.zero_grad()
        sum((l.keys * wi).sum() + (l.values * wi).sum() for l, wi in zip(state.layers, w)).backward()
        grads.append({n: p.grad.clone() for n, p in t.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and "head.weight" in grads[0]
    for n in grads[0]:
        torch.testing.assert_close(grads[1][n], grads[0][n], rtol=1e-4, atol=1e-5, msg=n)


@pytest.mark.parametrize("sharer,receiver", PAIRS)
def test_zero_init_is_bit_identical_in_bf16_too(sharer, receiver, agent_of):
    S = agent_of(sharer).prefill(SHARER_TEXT).to(dtype=torch.bfloat16)
    R = agent_of(receiver).prefill(RECEIVER_TEXT).to(dtype=torch.bfloat16)
    out = build("xkv", S.geometry, R.geometry)(S, R)
    assert all(torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values) and a.keys.dtype == torch.bfloat16
               for a, b in zip(out.layers, R.layers, strict=True))
    type(R).from_bytes(out.to_bytes())  # per-layer views of a group tensor still serialise


def test_rope_table_is_cached_grown_and_bounded(agent_for):
    spec = agent_for("llama").geometry.layer(0).rope
    cos, sin = rope_table(spec, 10, torch.float32, torch.device("cpu"))
    assert rope_table(spec, 10, torch.float32, torch.device("cpu"))[0] is cos  # reused across calls
    assert rope_table(spec, cos.shape[0], torch.float32, torch.device("cpu"))[0] is cos
    big, _ = rope_table(spec, cos.shape[0] + 1, torch.float32, torch.device("cpu"))  # grown, same key
    assert big.shape[0] > cos.shape[0] and torch.equal(big[:cos.shape[0]], cos)
    angles = torch.arange(big.shape[0], dtype=torch.float64)[:, None] * torch.tensor(spec.inv_freq, dtype=torch.float64)
    torch.testing.assert_close(big[:, :len(spec.inv_freq)], angles.cos().float(), rtol=0, atol=0)
    for dtype in (torch.float64, torch.float16, torch.bfloat16, torch.float32) * 3:
        rope_table(spec, 7, dtype, torch.device("cpu"))
    assert len(_ROPE_TABLES) <= MAX_ROPE_TABLES


def test_table_rotation_matches_rotate_keys_with_partial_rotary():
    spec = RopeSpec("default", tuple(1e4 ** (-i / 4) for i in range(4)))  # rotary dim 8 of head dim 16
    keys = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(0), dtype=torch.float32, device="cpu")
    pos = torch.tensor([0, 3, 7, 100, 901], dtype=torch.int64, device="cpu")  # (T,)
    cos, sin = rope_table(spec, 902, torch.float32, torch.device("cpu"))
    rotated = _rotate(keys, cos[pos], sin[pos])
    torch.testing.assert_close(rotated, rotate_keys(keys, pos, spec), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(_rotate(rotated, cos[pos], -sin[pos]), keys, rtol=1e-5, atol=1e-5)
    assert torch.equal(rotated[..., 8:], keys[..., 8:])  # channels past the rotary dim pass through


def _timing(calls: int = 20) -> None:
    """Old (per-layer) vs new (stacked) forward on the tiny models, one thread, no grad; then 24-layer ones."""
    import time

    from latentwire.agent import Agent
    from latentwire.models import tiny_model, tiny_tokenizer

    torch.set_num_threads(1)
    tok = tiny_tokenizer()
    agents = {a: Agent(tiny_model(a), tok, model_name=a) for a in ("llama", "qwen2", "gemma3")}
    agents |= {f"{a}-24": Agent(tiny_model(a, num_hidden_layers=24), tok, model_name=f"{a}-24")
               for a in ("llama", "gemma3")}
    for sharer, receiver in PAIRS + [("gemma3-24", "llama-24"), ("llama-24", "gemma3-24")]:
        S, R = agents[sharer].prefill(SHARER_TEXT * 4), agents[receiver].prefill(RECEIVER_TEXT * 4)
        t = _perturbed(S, R).eval()
        best = {}
        with torch.no_grad():
            for name, fn in (("old", lambda: _reference_forward(t, S, R)), ("new", lambda: t(S, R))) * 2:
                fn()
                start = time.perf_counter()
                for _ in range(calls):
                    fn()
                best[name] = min(best.get(name, math.inf), (time.perf_counter() - start) / calls * 1e3)
        print(f"{sharer:>9} -> {receiver:<9} T_S={len(S):3d} T_R={len(R):3d} L_S={S.geometry.num_layers:2d} "
              f"L_R={R.geometry.num_layers:2d}: old {best['old']:6.2f} ms, new {best['new']:6.2f} ms, "
              f"x{best['old'] / best['new']:.2f}")


if __name__ == "__main__":
    _timing()

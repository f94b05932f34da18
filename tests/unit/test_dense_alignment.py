"""Dense latent alignment (docs/methods.md#dense-alignment): sharer rows -> compact receiver-geometry K/V,
on the tiny models."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from latentwire.errors import LatentWireError, GeometryMismatchError, StateFormatError
from latentwire.rope import rotate_keys
from latentwire.state import KVState
from latentwire.translate.base import build, cast, load
from latentwire.translate.dense_alignment import DenseAlignment, DenseAlignmentConfig

PAIRS = [("gemma3", "llama"), ("llama", "gemma3"), ("qwen2", "gemma3"), ("llama", "llama")]


@pytest.fixture
def dense(geometry_for):
    return lambda s, r, seed=0, **kw: build("dense", geometry_for(s), geometry_for(r), seed=seed, **kw)


@pytest.mark.parametrize("sharer,receiver", PAIRS)
def test_output_is_a_receiver_state_the_receiver_answers_over(sharer, receiver, dense, prefill_state, random_ids,
                                                              geometry_for, agent_for):
    tr = dense(sharer, receiver)
    T = 12  # > gemma3's window - 1: its sliding layers hold 7 rows
    with torch.no_grad():
        out = tr(prefill_state(sharer, random_ids(T)))
    g = geometry_for(receiver)
    assert isinstance(out, KVState) and out.geometry == g and len(out) == T
    assert torch.equal(out.positions, torch.arange(T)) and bool(out.is_latent.all())
    for i, layer in enumerate(out.layers):
        rows = T if g.layer_types[i] == "global" else min(T, g.sliding_window - 1)
        assert layer.keys.shape == (g.num_kv_heads, rows, g.head_dim) and layer.keys.dtype == torch.float32
        assert torch.equal(layer.positions, torch.arange(T - rows, T))
        assert torch.isfinite(layer.keys).all() and torch.isfinite(layer.values).all()
    agent = agent_for(receiver)
    reply = agent.answer("question?", message=out, max_new_tokens=3)
    assert reply.message_rows == T and reply.context > T
    own = agent.prefill("hello")
    joined = KVState.concat([out, own])  # translated rows, then the receiver's own prompt
    assert len(joined) == T + len(own)


def test_an_empty_sharer_state_gives_an_empty_receiver_state(dense, prefill_state, random_ids, geometry_for):
    with torch.no_grad():
        out = dense("gemma3", "llama")(prefill_state("gemma3", random_ids(4)).select([]))
    assert len(out) == 0 and out.geometry == geometry_for("llama")
    assert all(l.keys.shape == (2, 0, 16) for l in out.layers)


def test_bf16_states_are_accepted_and_come_back_in_bf16(dense, prefill_state, random_ids, kv_diff):
    tr = dense("qwen2", "gemma3")
    state = prefill_state("qwen2", random_ids(6))
    with torch.no_grad():
        full, half = tr(state), tr(cast(state, torch.bfloat16))
    assert half.dtype == torch.bfloat16
    assert kv_diff(cast(half, torch.float32), full) < 0.1 * max(l.keys.abs().max() for l in full.layers)


@pytest.mark.parametrize("sharer,receiver", [("gemma3", "llama"), ("llama", "gemma3"), ("qwen2", "llama")])
def test_translation_does_not_depend_on_the_sharer_positions(sharer, receiver, dense, prefill_state, random_ids,
                                                             kv_diff):
    tr = dense(sharer, receiver)
    state = prefill_state(sharer, random_ids(10))
    with torch.no_grad():
        a, b = tr(state), tr(state.shift(7))
        c = tr(prefill_state(sharer, random_ids(10), start=7))  # the model's own cache at 7..16
    scale = max(float(l.keys.abs().max()) for l in a.layers)
    assert kv_diff(a, b) < 1e-4 * scale and kv_diff(a, b, "values") < 1e-5
    assert kv_diff(a, c) < 1e-3 * scale  # RoPE is exactly relative: same content at any start
    # and the check has teeth: skipping the un-rotation would change the keys with the shift
    k0, k7 = state.layers[tr.sources[-1]].keys, state.shift(7).layers[tr.sources[-1]].keys
    assert (k0 - k7).abs().max() > 0.1 * k0.abs().max()


def _reference_layer(tr: DenseAlignment, sharer: KVState, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Receiver layer i computed by hand, step by step as docs/methods.md#dense-alignment says (keys at
    positions 0..T-1)."""
    gs, gr = sharer.geometry, tr.receiver
    T, H, D, G = len(sharer), gr.num_kv_heads, gr.head_dim, tr.groups
    mix_k = mix_v = 0
    for w, j in zip(torch.softmax(tr.map_logits[i], -1), tr.sources):
        layer = sharer.layers[j]
        k = rotate_keys(layer.keys, -layer.positions, gs.layer(j).rope).permute(1, 0, 2).reshape(T, -1)
        v = layer.values.permute(1, 0, 2).reshape(T, -1)
        mix_k = mix_k + w * k / k.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
        mix_v = mix_v + w * v / v.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
    outs = []
    for kv, x in enumerate((mix_k, mix_v)):
        heads = []
        for g in range(G):
            y = torch.sigmoid(tr.gate[kv, i, g]) * tr.scale[kv, i, g] * (x @ tr.w[kv, g].T) + tr.bias[kv, i, g]
            heads += list(y.reshape(T, H // G, D).transpose(0, 1))  # this group's heads, in order
        outs.append(torch.stack(heads))  # (H, T, D)
    keys = rotate_keys(outs[0], torch.arange(T), gr.layer(i).rope)  # the receiver's own RoPE of layer i
    return keys, outs[1]


@pytest.mark.parametrize("sharer,receiver,groups", [("llama", "gemma3", 0), ("gemma3", "qwen2", 1),
                                                    ("qwen2", "llama", 2)])
def test_pipeline_matches_a_hand_computed_reference(sharer, receiver, groups, dense, prefill_state, random_ids):
    tr = dense(sharer, receiver, groups=groups)
    with torch.no_grad():  # make every parameter matter: non-trivial map, gates, scales, biases
        for p in (tr.map_logits, tr.gate, tr.scale, tr.bias):
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    T = 7
    state = prefill_state(sharer, random_ids(T, seed=3), start=5)
    with torch.no_grad():
        out = tr(state)
        for i in range(tr.receiver.num_layers):
            keys, values = _reference_layer(tr, state, i)
            n = out.layers[i].keys.shape[1]
            torch.testing.assert_close(out.layers[i].keys, keys[:, T - n:], rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(out.layers[i].values, values[:, T - n:], rtol=1e-4, atol=1e-4)


def test_output_keys_carry_each_receiver_layers_own_rope(dense, prefill_state, random_ids):
    """gemma3 has two RoPE bases (sliding 1e4, global 1e6): un-rotating each output layer with its own
    spec gives back the position-free content; the other layer type's spec, or none, does not."""
    tr = dense("llama", "gemma3")
    T = 6  # all gemma3 layers hold every row
    with torch.no_grad():
        state = prefill_state("llama", random_ids(T))
        out, (content, _) = tr(state), tr.content(state)
    g = tr.receiver
    specs = {t: s for t, s in g.rope}
    assert specs["global"] != specs["sliding"]
    for i, layer in enumerate(out.layers):
        own = rotate_keys(layer.keys, -layer.positions, g.layer(i).rope)
        other = rotate_keys(layer.keys, -layer.positions, specs["sliding" if g.layer_types[i] == "global" else "global"])
        torch.testing.assert_close(own, content[i], rtol=1e-5, atol=1e-5)
        scale = float(content[i].abs().max())
        assert (other - content[i]).abs().max() > 1e-2 * scale
        assert (layer.keys - content[i]).abs().max() > 1e-2 * scale  # rotation was not skipped


@pytest.mark.parametrize("sharer,receiver,expect", [
    ("llama", "gemma3", [0, 0, 1, 1, 2, 2]),  # round(i * 2 / 5)
    ("qwen2", "llama", [0, 1, 2]),
    ("gemma3", "llama", [5, 5, 5]),  # gemma3's one global layer is its only source
])
def test_layer_map_starts_depth_proportional(sharer, receiver, expect, dense):
    tr = dense(sharer, receiver, map_init=0.8)
    A = tr.layer_map()
    assert A.shape == (tr.receiver.num_layers, len(tr.sources))
    torch.testing.assert_close(A.sum(-1), torch.ones(A.shape[0]))
    assert [tr.sources[j] for j in A.argmax(-1).tolist()] == expect
    if len(tr.sources) > 1:
        torch.testing.assert_close(A.max(-1).values, torch.full((A.shape[0],), 0.8))
    assert tr.sources == ((5,) if sharer == "gemma3" else (0, 1, 2))


def test_a_sharer_without_global_layers_reads_all_layers_while_they_hold_every_row(prefill_state, random_ids,
                                                                                  geometry_for):
    g = dataclasses.replace(geometry_for("gemma3"), layer_types=("sliding",) * 6)  # window 8 on every layer
    tr = build("dense", g, geometry_for("llama"))
    assert tr.sources == tuple(range(6))
    as_sliding = lambda st: dataclasses.replace(st, geometry=g)  # noqa: E731
    with torch.no_grad():
        assert len(tr(as_sliding(prefill_state("gemma3", random_ids(7))))) == 7
        with pytest.raises(StateFormatError, match="no global layer and its sliding layer 0 holds 7 of 12 rows"):
            tr(as_sliding(prefill_state("gemma3", random_ids(12))))


def test_reconstruction_loss_trains_without_token_alignment(dense, prefill_state, random_ids):
    tr = dense("qwen2", "llama", seed=0)
    ids = random_ids(16, seed=5)
    sharer, target = prefill_state("qwen2", ids), prefill_state("llama", ids[:, :11])  # T_s = 16, T_r = 11
    with torch.no_grad():  # a translator that outputs zeros scores exactly 1
        zero = dense("qwen2", "llama")
        zero.scale.zero_()
        assert float(zero.reconstruction_loss(sharer, target)) == pytest.approx(1.0, abs=1e-6)
    loss0 = tr.reconstruction_loss(sharer, target, probes=8)
    assert torch.isfinite(loss0) and loss0.requires_grad
    loss0.backward()
    for name, p in tr.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    opt = torch.optim.Adam(tr.parameters(), lr=1e-2)
    for _ in range(40):
        opt.zero_grad()
        loss = tr.reconstruction_loss(sharer, target, probes=8)
        loss.backward()
        opt.step()
    final = float(tr.reconstruction_loss(sharer, target, probes=8).detach())
    assert final < 0.7 * float(loss0.detach()) and final < 0.5, (float(loss0.detach()), final)  # beats zeros too


def test_reconstruction_loss_skips_windowed_receiver_layers(dense, prefill_state, random_ids):
    tr = dense("llama", "gemma3")
    sharer = prefill_state("llama", random_ids(9))
    long_, short = prefill_state("gemma3", random_ids(12)), prefill_state("gemma3", random_ids(12)[:, :6])
    # long target: only gemma3's global layer 5 counts, so gemma3's sliding layers get no gradient from it
    tr.reconstruction_loss(sharer, long_).backward()
    assert tr.scale.grad[:, :5].abs().sum() == 0 and tr.scale.grad[:, 5].abs().sum() > 0
    tr.zero_grad()
    tr.reconstruction_loss(sharer, short).backward()  # short target: every layer holds every row
    assert (tr.scale.grad.abs().sum(dim=(0, 2, 3)) > 0).all()


def test_checks_the_pair_and_names_both_models(dense, prefill_state, random_ids):
    tr = dense("llama", "gemma3")
    with pytest.raises(GeometryMismatchError, match=r"sharer llama -> receiver gemma3.*got sharer qwen2"):
        tr(prefill_state("qwen2", random_ids(5)))
    with pytest.raises(GeometryMismatchError, match="llama.*gemma3"):
        tr.reconstruction_loss(prefill_state("llama", random_ids(5)), prefill_state("qwen2", random_ids(5)))


def test_groups_and_config_validation(dense, geometry_for):
    with pytest.raises(LatentWireError, match="groups=3 does not divide the 2 KV heads of receiver llama"):
        dense("gemma3", "llama", groups=3)
    with pytest.raises(LatentWireError, match="groups=2 does not divide the 1 KV heads of receiver gemma3"):
        dense("llama", "gemma3", groups=2)
    for bad in (dict(groups=-1), dict(groups=1.5), dict(init_gate=0.0), dict(init_gate=1.0), dict(map_init=1.5)):
        with pytest.raises(LatentWireError, match="dense: "):
            DenseAlignmentConfig(**bad)
    # parameter count: L_R L_src + 2 (H_S D_S)(H_R D_R) + 2 L_R (2 H_R D_R + G)
    for groups, G in ((0, 2), (1, 1), (2, 2)):
        tr = dense("gemma3", "llama", groups=groups)
        assert tr.groups == G
        assert tr.num_parameters == 3 * 1 + 2 * (1 * 32) * (2 * 16) + 2 * 3 * (2 * 2 * 16 + G)


def test_gates_start_at_init_gate_and_closed_gates_leave_the_prior(dense, prefill_state, random_ids):
    tr = dense("qwen2", "llama", init_gate=0.2)
    torch.testing.assert_close(torch.sigmoid(tr.gate), torch.full_like(tr.gate, 0.2))
    with torch.no_grad():
        tr.gate.fill_(-math.inf)
        tr.bias.normal_()
        keys, values = tr.content(prefill_state("qwen2", random_ids(5)))
    for i, (k, v) in enumerate(zip(keys, values)):  # every row is the layer's learned prior b[l]
        torch.testing.assert_close(k, tr.bias[0, i].reshape(2, 1, 16).expand(2, 5, 16))
        torch.testing.assert_close(v, tr.bias[1, i].reshape(2, 1, 16).expand(2, 5, 16))


def test_checkpoint_round_trip(dense, prefill_state, random_ids, tmp_path, kv_diff):
    tr = dense("gemma3", "qwen2", groups=1, init_gate=0.3)
    with torch.no_grad():
        tr.bias.normal_()
    state = prefill_state("gemma3", random_ids(5))
    back = load(tr.save(tmp_path / "dense"))
    assert isinstance(back, DenseAlignment) and back.config == tr.config
    with torch.no_grad():
        assert kv_diff(tr(state), back(state)) == 0 and kv_diff(tr(state), back(state), "values") == 0

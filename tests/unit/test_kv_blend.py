"""CacheBack encoding="kv_blend": the read's K/V attached in the receiver's message slot, where the receiver recomputes
the share of rows its own context changes most (blend.py; "kv_reencoded" takes the same `recompute`). Laws on tiny
Llama / Qwen2 / Gemma3 (window 8): recomputing every row is the re-prefill; recomputing rows that are already exact
changes nothing; the rows whose K/V were corrupted are the ones picked, and recomputing them restores the re-prefill.
Over both transports: test_kv_reencoded.py."""
from __future__ import annotations

import threading
from dataclasses import replace

import pytest
import torch

from latentwire.agent import MESSAGE_PROMPT, Agent
from latentwire.bench.runner import parse_protocols
from latentwire.blend import blend_mask, deviation, layer_kv, recompute_count
from latentwire.errors import ConfigError, StateFormatError
from latentwire.models.tiny import tiny_model
from latentwire.protocols import get_protocol
from latentwire.protocols.cacheback import RECOMPUTE, CacheBack
from latentwire.state import KVState, LayerKV
from test_kv_reencoded import ARCHS, DOC, OTHER, Q, selected  # the same documents, question and hand selection


def close(seen, a: int, b: int) -> bool:
    """Two recorded decodes start at the same position from the same hidden state and the same cache (on sliding
    layers, the rows both caches hold: a blended cache keeps every row there, a plain one its last window)."""
    (sa, ha, ka), (sb, hb, kb) = seen[a], seen[b]
    n = [min(x.shape[1], y.shape[1]) for x, y in zip(ka, kb)]
    return sa == sb and len(ka) == len(kb) and torch.allclose(ha, hb, atol=1e-5) and all(
        torch.allclose(x[:, -m:], y[:, -m:], atol=1e-5) for x, y, m in zip(ka, kb, n))


@pytest.mark.parametrize("arch", ARCHS)
def test_recomputing_every_row_is_the_re_prefill_of_several_senders(agent_for, arch, spy_decode):
    agent = agent_for(arch)
    seen = spy_decode(agent)
    kw = dict(ratio=2, latent_steps=2, max_new_tokens=3)
    rows = CacheBack(**kw).run([agent, agent], [DOC, OTHER], agent, Q)
    blend = CacheBack(encoding="kv_blend", recompute=1.0, **kw).run([agent, agent], [DOC, OTHER], agent, Q)
    CacheBack(encoding="kv_blend", recompute=0.0, **kw).run([agent, agent], [DOC, OTHER], agent, Q)  # seen[2]
    apart = CacheBack(encoding="kv_reencoded", recompute=1.0, **kw).run([agent, agent], [DOC, OTHER], agent, Q)
    assert close(seen, 0, 1) and blend.answer == rows.answer and blend.kept_spans == rows.kept_spans
    assert close(seen, 0, 3) and apart.answer == rows.answer  # senders' rows encoded apart, then all recomputed
    assert not torch.allclose(seen[0][1], seen[2][1], atol=1e-3)  # the read's K/V as they are: another input
    if arch == "gemma3":  # longer than the window: the recompute's sliding mask was exercised
        assert blend.details["message_rows"] > agent.geometry.sliding_window


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("share", [0.2, 0.6])
def test_recomputing_rows_that_are_already_exact_changes_nothing(agent_for, arch, share, spy_decode):
    """One sender's rows re-encoded in the slot are what the receiver's re-prefill computes: any share recomputed
    (through the partial mask and the reassembly) leaves the answer's input as it was."""
    agent = agent_for(arch)
    exact = agent.encode_rows(agent.rows(selected(CacheBack(ratio=2, latent_steps=2), agent, DOC)))
    seen, picked, real = spy_decode(agent), [], agent._forward
    agent._forward = lambda *a, **k: (picked.append(k["positions"]) if "positions" in k else None, real(*a, **k))[1]
    agent.answer_attached(Q, exact, max_new_tokens=2)
    agent.answer_attached(Q, exact, max_new_tokens=2, recompute=share)
    assert close(seen, 0, 1)
    assert len(picked) == 1 and len(picked[0]) == recompute_count(share, len(exact)) > 0  # the recompute ran


@pytest.mark.parametrize("arch", ARCHS)
def test_the_rows_with_corrupted_k_v_are_the_ones_recomputed(agent_for, arch, spy_decode):
    agent = agent_for(arch)
    exact = agent.encode_rows(agent.rows(selected(CacheBack(ratio=2, latent_steps=1), agent, DOC)))
    bad = torch.tensor([1, 4, len(exact) - 3, len(exact) - 1], device=exact.device)  # late rows: Gemma's sliding
    noise = torch.randn(exact.layers[1].keys[:, bad].shape, generator=torch.Generator().manual_seed(0)).to(exact.device)
    layers = list(exact.layers)
    layers[1] = LayerKV(layers[1].keys.index_add(1, bad, noise), layers[1].values, layers[1].positions)
    hurt = KVState(exact.geometry, tuple(layers), exact.positions, exact.token_ids, exact.latents)
    picked = []
    real = agent._forward
    agent._forward = lambda *a, **k: (picked.append(k["positions"]) if "positions" in k else None, real(*a, **k))[1]
    seen = spy_decode(agent)
    agent.answer_attached(Q, exact, max_new_tokens=2)
    agent.answer_attached(Q, hurt, max_new_tokens=2)
    agent.answer_attached(Q, hurt, max_new_tokens=2, recompute=len(bad) / len(exact))
    head = len(agent.slot_ids(agent.chat_text(MESSAGE_PROMPT.format(question=Q)))[0])  # the rows before the slot
    assert torch.equal(picked[0], bad + head)
    assert close(seen, 0, 2) and not close(seen, 0, 1)


def test_a_model_whose_layers_all_slide_takes_the_one_mask(tokenizer, spy_decode):
    """Mistral-like models (every layer sliding; window 128 here: shorter than the message, long enough that the
    answer still sees it) take one mask, not a dict: recomputing every row is still the re-prefill, recomputing
    none is not."""
    agent = Agent(tiny_model("mistral", sliding_window=128), tokenizer, "mistral-sliding")
    assert set(agent.geometry.layer_types) == {"sliding"}
    seen = spy_decode(agent)
    # BM25 picks the rows: attention scores would need the window to hold the whole document
    kw = dict(ratio=2, latent_steps=1, max_new_tokens=3, selector="bm25")
    rows = CacheBack(**kw).run([agent, agent], [DOC, OTHER], agent, Q)
    CacheBack(encoding="kv_blend", recompute=1.0, **kw).run([agent, agent], [DOC, OTHER], agent, Q)
    CacheBack(encoding="kv_blend", recompute=0.0, **kw).run([agent, agent], [DOC, OTHER], agent, Q)
    assert rows.details["message_rows"] > agent.geometry.sliding_window
    assert close(seen, 0, 1) and not close(seen, 0, 2)


def test_the_stop_hook_leaves_another_threads_forward_alone(agent_for):
    """`layer_kv` stops its own forward after the layer it needs; a whole forward of the same model that another
    thread runs meanwhile (a transport's other agent) must finish."""
    agent = agent_for("llama")
    out, real = {}, agent._forward

    def forward(*a, **k):  # while the stop hook is registered, another thread runs the whole model
        t = threading.Thread(target=lambda: out.update(h=real(agent.new_cache(), 0, ids=torch.tensor([5, 6, 7]))))
        t.start(), t.join()
        return real(*a, **k)
    agent._forward = forward
    keys, values = layer_kv(agent, agent.new_cache(), 0, agent.embed([5, 6, 7, 8]), 1)
    assert out["h"].shape[0] == 3 and keys.shape[1] == values.shape[1] == 4


def test_deviation_weighs_keys_and_values_alike_and_ranks_the_moved_row_first():
    g = torch.Generator().manual_seed(1)
    keys, values = torch.randn(2, 5, 4, generator=g) * 10, torch.randn(2, 5, 4, generator=g)
    moved_v = values.clone()
    moved_v[:, 3] += 1.0
    d = deviation((keys, moved_v), (keys, values))
    assert d.shape == (5,) and int(d.argmax()) == 3 and float(d[[0, 1, 2, 4]].abs().max()) == 0
    d10 = deviation((keys * 10, moved_v * 10), (keys * 10, values * 10))  # scale-free
    assert torch.allclose(d, d10)


def test_blend_mask_hides_stale_copies_and_respects_the_window(agent_for):
    geometry = agent_for("gemma3").geometry  # sliding window 8
    pick = torch.tensor([3, 12])
    masks = blend_mask(pick, 14, geometry, torch.float32)
    full, near = (masks[k][0, 0] == 0 for k in ("full_attention", "sliding_attention"))  # (2, 16) allowed
    assert full.shape == (2, 16)
    assert full[0].tolist() == [True] * 3 + [False] * 11 + [True, False]  # rows 0..2, then its own fresh copy
    assert full[1, 3].item() is False and full[1, 12].item() is False and full[1, 13].item() is False
    assert full[1, :12].sum() == 11 and full[1, 14:].tolist() == [True, True]
    assert near[1].nonzero().flatten().tolist() == [5, 6, 7, 8, 9, 10, 11, 15]  # 12 − 7 .. 12 (fresh 3: too far)
    every = blend_mask(pick, 14, replace(geometry, layer_types=("sliding",) * geometry.num_layers), torch.float32)
    assert torch.equal(every, masks["sliding_attention"])  # one mask: Mistral-like models take no dict
    llama = blend_mask(pick, 14, agent_for("llama").geometry, torch.bfloat16)
    assert isinstance(llama, torch.Tensor) and llama.dtype == torch.bfloat16 and llama.shape == (1, 1, 2, 16)


def test_recompute_is_validated_named_and_only_where_it_applies():
    assert recompute_count(0.15, 100) == 15 and recompute_count(0.01, 5) == 1 and recompute_count(0.0, 5) == 0
    assert recompute_count(0.07, 100) == 7  # not the float product's ceiling, 8
    with pytest.raises(ConfigError, match="recompute"):
        recompute_count(1.5, 5)
    with pytest.raises(ConfigError, match="recompute"):
        CacheBack(encoding="kv_blend", recompute=-0.1)
    with pytest.raises(ConfigError, match="kv_blend"):
        CacheBack(encoding="kv", recompute=0.5)
    assert CacheBack(encoding="kv_blend").recompute_share == RECOMPUTE and CacheBack().recompute_share == 0.0
    assert CacheBack(encoding="kv_reencoded").recompute_share == 0.0
    assert CacheBack(encoding="kv_reencoded", recompute=0.2).recompute_share == 0.2
    (name, params), = parse_protocols("cacheback(ratio=4, encoding='kv_blend', mass=0.5, recompute=0.3)").values()
    named = get_protocol(name, **params)
    assert (named.encoding.name, named.flat["mass"], named.recompute_share) == ("kv_blend", 0.5, 0.3)
    with pytest.raises(ConfigError):
        get_protocol("cacheback_chain", encoding="kv_blend")


def test_a_bad_share_is_refused_before_any_compute(agent_for, monkeypatch):
    agent = agent_for("llama")
    part = selected(CacheBack(ratio=2, latent_steps=1, encoding="kv"), agent, DOC).compact()
    monkeypatch.setattr(agent, "_forward", lambda *a, **k: pytest.fail("a forward ran before the check"))
    with pytest.raises(ConfigError):
        agent.answer_attached(Q, part, recompute=2.0)
    gemma = agent_for("gemma3")
    windowed = gemma.prefill(DOC)  # sliding layers hold only the last window: nothing to recompute the rest from
    monkeypatch.setattr(gemma, "_forward", lambda *a, **k: pytest.fail("a forward ran before the check"))
    with pytest.raises(StateFormatError, match="sliding"):
        gemma.answer_attached(Q, windowed, recompute=0.5)
    flash = agent_for("llama")
    monkeypatch.setattr(flash.model.config, "_attn_implementation", "flash_attention_2")
    monkeypatch.setattr(flash, "_forward", lambda *a, **k: pytest.fail("a sender read before the check"))
    with pytest.raises(ConfigError, match="sdpa"):
        CacheBack(ratio=2, latent_steps=1, encoding="kv_blend").run([agent], [DOC], flash, Q)

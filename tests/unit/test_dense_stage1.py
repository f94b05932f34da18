"""Dense alignment stage I (row-wise K/V cache reconstruction), per-layer adapters and the context mode,
on the tiny models.

Tokenizers: the shared byte-level tiny tokenizer, and `merged`: the same byte vocabulary plus three BPE
merges (" t", "he", " the"; ids < TINY_VOCAB, so a tiny model can prefill it) under another chat
template, for a receiver that tokenizes the same text differently.
"""
from __future__ import annotations

import json

import pytest
import torch

from latentwire.agent import Agent
from latentwire.bench.tasks.pairs import pairs
from latentwire.errors import LatentWireError, ConfigError
from latentwire.models import tiny_merged_tokenizer
from latentwire.protocols.pair import get_pair_protocol, own_prompt
from latentwire.rope import rotate_keys
from latentwire.translate import build, load
from latentwire.translate.compose import PairStates, compose
from latentwire.translate.dense_alignment import ContextModeError, DenseAlignment, DenseAlignmentConfig
from latentwire.translate.token_alignment import align
from latentwire.training import trainer
from latentwire.training.states import StateCache, pair_states
from latentwire.training.trainer import TrainConfig, train

TEXT = "The theory of the heat engine: then the end of the line, and the other theme."
TEMPLATE = ("<s>[system] Be brief.</s>\n"
            "{% for m in messages %}<s>[{{ m['role'] }}] {{ m['content'] | trim }}</s>\n{% endfor %}"
            "{% if add_generation_prompt %}<s>[assistant] {% endif %}")


@pytest.fixture(scope="module")
def merged():
    return tiny_merged_tokenizer(TEMPLATE)


@pytest.fixture
def hetero(models, merged, agent_for):
    """(qwen2 sharer with the tiny tokenizer, llama receiver with `merged`): one text, two segmentations."""
    return agent_for("qwen2"), Agent(models["llama"], merged, "llama-merged")


def _content_of(state) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """A state's position-free keys and values per layer, each (H, T, D) float32."""
    keys = [rotate_keys(l.keys.float(), -l.positions, state.geometry.layer(i).rope) for i, l in enumerate(state.layers)]
    return keys, [l.values.float() for l in state.layers]


def _relative(pred: torch.Tensor, target: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(pred - target) / torch.linalg.vector_norm(target))


# -- stage I: row-wise reconstruction -----------------------------------------------------------------
def test_loss_is_exactly_zero_when_the_translated_cache_is_the_target(prefill_state, random_ids, geometry_for):
    ids = random_ids(14, seed=2)
    sharer, target = prefill_state("qwen2", ids), prefill_state("llama", ids[:, :10])  # same tokenizer, T_s > T_r
    tr = build("dense", geometry_for("qwen2"), geometry_for("llama"))
    keys, values = _content_of(target)  # (H_R, 10, D_R) per layer: the target's rows 0..9
    pad = lambda x: torch.cat([x, torch.randn(x.shape[0], 4, x.shape[2])], dim=1)  # noqa: E731  (rows 10..13)
    tr.content = lambda s: ([pad(k) for k in keys], [pad(v) for v in values])  # the translation is the target
    assert float(tr.reconstruction_loss(sharer, target)) == 0.0
    assert float(tr.reconstruction_loss(sharer, target, probes=3)) == 0.0


def test_loss_is_positive_otherwise_and_computed_row_by_row(prefill_state, random_ids, geometry_for):
    ids = random_ids(9, seed=4)
    sharer, target = prefill_state("qwen2", ids), prefill_state("llama", ids)
    tr = build("dense", geometry_for("qwen2"), geometry_for("llama"))
    with torch.no_grad():
        loss = float(tr.reconstruction_loss(sharer, target))
        keys, values = tr.content(sharer)
    want_k, want_v = _content_of(target)
    L = len(target.layers)
    hand = sum(_relative(keys[i], want_k[i]) + _relative(values[i], want_v[i]) for i in range(L)) / (2 * L)
    assert loss > 0.1 and loss == pytest.approx(hand, rel=1e-5)
    # one layer's values 10% off: loss (0 + 0.1) / 2 / L exactly as defined
    off = [v.clone() for v in want_v]
    off[1] = off[1] * 1.1
    tr.content = lambda s: (want_k, off)
    assert float(tr.reconstruction_loss(sharer, target)) == pytest.approx(0.1 / 2 / L, rel=1e-5)


def test_same_tokenizer_rows_must_hold_the_same_tokens(prefill_state, random_ids, geometry_for):
    tr = build("dense", geometry_for("qwen2"), geometry_for("llama"))
    a, b = random_ids(8, seed=1), random_ids(8, seed=2)
    with pytest.raises(LatentWireError, match="first 8 tokens differ"):
        tr.reconstruction_loss(prefill_state("qwen2", a), prefill_state("llama", b))
    rows, src = tr.row_pairs(prefill_state("qwen2", a), prefill_state("llama", a[:, :5]))
    assert rows.tolist() == src.tolist() == list(range(5))


def test_token_aligned_rows_across_tokenizers(hetero):
    sharer, receiver = hetero
    S, target = sharer.prefill(TEXT), receiver.prefill(TEXT)
    al = align(receiver, sharer, TEXT)
    assert len(S) != len(target) and 0 < al.num_exact < al.num_aligned  # merges + template: a real alignment
    tr = build("dense", sharer.geometry, receiver.geometry)
    with pytest.raises(LatentWireError, match="tokenize differently: pass align="):
        tr.reconstruction_loss(S, target)
    rows, src = tr.row_pairs(S, target, al)
    assert torch.equal(rows, torch.nonzero(al.mask).flatten()) and torch.equal(src, al.index[al.mask])
    assert len(set(src.tolist())) == len(src)  # distinct sharer rows: the target can be placed exactly
    # zero exactly when every aligned sharer row translates into its target row
    keys, values = _content_of(target)
    place = lambda x: torch.zeros(x.shape[0], len(S), x.shape[2]).index_copy(1, src, x[:, rows])  # noqa: E731
    exact = build("dense", sharer.geometry, receiver.geometry)
    exact.content = lambda s: ([place(k) for k in keys], [place(v) for v in values])
    assert float(exact.reconstruction_loss(S, target, al)) == 0.0
    assert float(exact.reconstruction_loss(S, target, al.index, al.mask)) == 0.0
    # the real translator: positive, differentiable, and it learns the aligned rows
    loss0 = float(tr.reconstruction_loss(S, target, al).detach())
    assert loss0 > 0.1
    opt = torch.optim.Adam(tr.parameters(), lr=1e-2)
    for _ in range(30):
        opt.zero_grad()
        loss = tr.reconstruction_loss(S, target, al)
        loss.backward()
        opt.step()
    assert float(tr.reconstruction_loss(S, target, al).detach()) < 0.8 * loss0
    with pytest.raises(LatentWireError, match="one entry per target row"):
        tr.reconstruction_loss(S, target, al.index[:-1])
    with pytest.raises(LatentWireError, match="outside the sharer's"):
        tr.reconstruction_loss(S, target, torch.where(al.mask, al.index + len(S), al.index), al.mask)


def test_stage1_pair_states_align_only_when_the_tokens_differ(hetero, agent_for):
    pair = pairs("reasoning", "train", 1)[0]
    same = pair_states(pair, agent_for("gemma3"), agent_for("llama"), "dense", stage1=True)
    assert same.align is None and same.receiver is None and same.receiver_both is None  # stage I reads only these
    assert torch.equal(same.sharer.token_ids, same.receiver_on_sharer.token_ids)
    sharer, receiver = hetero
    st = pair_states(pair, sharer, receiver, "dense", stage1=True)
    want = align(receiver, sharer, own_prompt(pair.sharer_doc, pair.question))
    assert torch.equal(st.align, want.index) and torch.equal(st.mask, want.mask)
    assert len(st.align) == len(st.receiver_on_sharer) != len(st.sharer)
    assert trainer.step_loss(build("dense", sharer.geometry, receiver.geometry), st, pair, receiver, 1) > 0


# -- per-layer adapters -------------------------------------------------------------------------------
def test_per_layer_adapters_start_as_the_shared_map(prefill_state, random_ids, geometry_for):
    gs, gr = geometry_for("llama"), geometry_for("qwen2")
    shared, adapted = build("dense", gs, gr, seed=3), build("dense", gs, gr, seed=3, rank=2)
    assert torch.equal(shared.w, adapted.w) and not adapted.adapter_a.any() and adapted.adapter_b.abs().sum() > 0
    assert not hasattr(shared, "adapter_a")  # rank 0: the same parameters (and checkpoints) as before
    state = prefill_state("llama", random_ids(7, seed=6))
    with torch.no_grad():
        a, b = shared.content(state), adapted.content(state)
        out_a, out_b = shared(state), adapted(state)
    assert all(torch.equal(x, y) for x, y in zip(a[0] + a[1], b[0] + b[1]))  # bit for bit
    assert all(torch.equal(x.keys, y.keys) and torch.equal(x.values, y.values)
               for x, y in zip(out_a.layers, out_b.layers))
    # parameters: + 2 L_R G r (H_S D_S + H_R/G D_R)
    L, G = gr.num_layers, adapted.groups
    d_in, d_out = gs.num_kv_heads * gs.head_dim, gr.head_dim * gr.num_kv_heads // G
    assert adapted.num_parameters - shared.num_parameters == 2 * L * G * 2 * (d_in + d_out)


def test_each_layer_gets_its_own_map(prefill_state, random_ids, geometry_for, tmp_path):
    tr = build("dense", geometry_for("llama"), geometry_for("qwen2"), rank=2, groups=1)
    state = prefill_state("llama", random_ids(6, seed=8))
    before = [k.detach() for k in tr.content(state)[0]]
    tr.reconstruction_loss(state, prefill_state("qwen2", random_ids(6, seed=8))).backward()
    assert tr.adapter_a.grad.abs().sum() > 0  # A learns from the start (B's gradient is 0 while A is 0)
    with torch.no_grad():
        tr.adapter_a[0, 1].normal_()  # keys of receiver layer 1 only
        keys = [k.detach() for k in tr.content(state)[0]]
        assert torch.equal(keys[0], before[0]) and torch.equal(keys[2], before[2])
        assert not torch.equal(keys[1], before[1])
        # by hand: layer 1's keys through W + A_1 B_1
        x = torch.einsum("n,ntd->td", tr.layer_map()[1], _sources(tr, state))  # (T, H_S D_S)
        w = tr.w[0, 0] + tr.adapter_a[0, 1, 0] @ tr.adapter_b[0, 1, 0]  # (H_R D_R, H_S D_S)
        y = torch.sigmoid(tr.gate[0, 1, 0]) * tr.scale[0, 1, 0] * (x @ w.T) + tr.bias[0, 1, 0]  # (T, H_R D_R)
        want = y.reshape(len(state), tr.receiver.num_kv_heads, -1).transpose(0, 1)
        torch.testing.assert_close(keys[1], want, rtol=1e-5, atol=1e-5)
    back = load(tr.save(tmp_path / "dense"))
    assert back.config.rank == 2 and torch.equal(back.adapter_a, tr.adapter_a)


def _sources(tr: DenseAlignment, state) -> torch.Tensor:
    """(L_src, T, H_S D_S): the sharer's RMS-normalised position-free keys of each source layer."""
    keys, _ = _content_of(state)
    k = torch.stack([keys[j].transpose(0, 1).flatten(1) for j in tr.sources])
    return k * torch.rsqrt(k.pow(2).mean(-1, keepdim=True) + 1e-6)


def test_config_validation():
    for bad in (dict(rank=-1), dict(rank=1.5), dict(rank=True), dict(context_aware="yes"), dict(context_aware=1)):
        with pytest.raises(LatentWireError, match="dense: "):
            DenseAlignmentConfig(**bad)
    with pytest.raises(ConfigError, match="dense method only"):
        TrainConfig("xkv", "a", "b", context_aware=True)
    with pytest.raises(ConfigError, match="dense method only"):
        TrainConfig("dense", "a", "b", context_aware=1)
    with pytest.raises(ConfigError, match="not in params"):
        TrainConfig("dense", "a", "b", params={"context_aware": True})


# -- the context mode ---------------------------------------------------------------------------------
def test_a_translator_refuses_the_other_mode(agent_for):
    s, r = agent_for("gemma3"), agent_for("llama")
    states = PairStates(sharer=s.prefill("the sharer's text"), receiver=r.prefill("mine"),
                        receiver_both=r.prefill("both texts"))
    for trained in (None, True, False):
        tr = build("dense", s.geometry, r.geometry, context_aware=trained)
        for use in (True, False):
            if trained is None or trained == use:
                assert len(compose(tr, states, use)) > 0
            else:
                with pytest.raises(ContextModeError, match=f"was trained context-{'aware' if trained else 'unaware'}"):
                    compose(tr, states, use)
    assert issubclass(ContextModeError, ConfigError)


def test_context_aware_training_round_trip(tmp_path, agent_for, monkeypatch):
    seen = {"pair_states": set(), "compose": set()}
    real_states, real_compose = trainer.pair_states, trainer.compose

    def spy_states(*a, **kw):
        seen["pair_states"].add((a[5] if len(a) > 5 else kw.get("context_aware"), kw.get("stage1")))
        return real_states(*a, **kw)

    def spy_compose(tr, states, context_aware=False):
        seen["compose"].add(context_aware)
        assert states.receiver_both is not None or not context_aware
        return real_compose(tr, states, context_aware)

    monkeypatch.setattr(trainer, "pair_states", spy_states)
    monkeypatch.setattr(trainer, "compose", spy_compose)
    s, r = agent_for("gemma3"), agent_for("llama")
    cfg = TrainConfig("dense", "gemma3", "llama", tasks=("reasoning",), train_n=2, val_n=1, steps=3, batch=1,
                      stage1_steps=1, eval_every=3, context_aware=True, params={"rank": 1})
    out = train(cfg, tmp_path / "aware", s, r, StateCache(tmp_path / "cache"), progress=False)
    assert seen == {"pair_states": {(True, True), (True, False)}, "compose": {True}}  # training and validation
    header = json.loads((out / "config.json").read_text())
    assert header["config"]["context_aware"] is True and header["training"]["config"]["context_aware"] is True
    tr = load(out)
    assert tr.config.context_aware is True and tr.config.rank == 1
    pair = pairs("reasoning", "test", 1)[0]
    args = (s, r, pair.sharer_doc, pair.receiver_doc, pair.question)
    with pytest.raises(ContextModeError, match="trained context-aware; use it with context_aware=True"):
        get_pair_protocol("translated", checkpoint=str(out), context_aware=False, max_new_tokens=2).run(*args)
    ok = get_pair_protocol("translated", checkpoint=str(out), context_aware=True, max_new_tokens=2).run(*args)
    assert ok.details["context_aware"] is True
    # a run saved before the field existed (no "context_aware" in trainer.json) still resumes as unaware
    unaware = TrainConfig("dense", "gemma3", "llama", tasks=("reasoning",), train_n=2, val_n=1, steps=2, batch=1,
                          eval_every=2)
    out2 = train(unaware, tmp_path / "unaware", s, r, StateCache(tmp_path / "cache"), progress=False)
    assert load(out2).config.context_aware is False
    log = json.loads((out2 / "trainer.json").read_text())
    del log["config"]["context_aware"]
    (out2 / "trainer.json").write_text(json.dumps(log))
    assert train(unaware, out2, s, r, StateCache(tmp_path / "cache"), progress=False) == out2

"""C2C (docs/methods.md#c2c) and the token alignment it needs, on the tiny models.

Tokenizers: the shared byte-level tiny tokenizer; `merged` = the same vocabulary plus 3 BPE merges
(" t", "he", " the": ids < TINY_VOCAB, so tiny models can prefill it) under a different template that
trims contents and adds a system prompt; `trained` = a 400-token BPE trained on a few sentences
(alignment only: its ids do not fit the tiny models).
"""
from __future__ import annotations

import dataclasses

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from latentwire.agent import Agent
from latentwire.errors import LatentWireError, ConfigError, GeometryMismatchError
from latentwire.models.tiny import _SPECIALS
from latentwire.translate.base import build, load
from latentwire.translate.c2c import C2C, C2CConfig, layer_map
from latentwire.translate.token_alignment import align, decoded_spans, token_spans

CONTENT = "The theory of the  heat engine: naïve café, 日本 — then the end.\nA second line."
OTHER_TEMPLATE = (
    "<s>[system] Answer the question.</s>\n"
    "{% for m in messages %}<s>[{{ m['role'] }}] {{ m['content'] | trim }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>[assistant] {% endif %}"
)


def _fast(tok: Tokenizer, template: str) -> PreTrainedTokenizerFast:
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>",
                                   eos_token="<|im_end|>", additional_special_tokens=["<|im_start|>", "</s>"])
    fast.chat_template = template
    return fast


@pytest.fixture(scope="module")
def merged():
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {t: i for i, t in enumerate(_SPECIALS + alphabet + ["Ġt", "he", "Ġthe"])}
    assert len(vocab) <= 264  # fits the tiny models' embedding
    return _fast(Tokenizer(models.BPE(vocab=vocab, merges=[("Ġ", "t"), ("h", "e"), ("Ġt", "he")])), OTHER_TEMPLATE)


@pytest.fixture(scope="module")
def trained():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    corpus = ["The theory of heat engines and the end of the line.", "naïve café au lait, 日本語 text",
              "Answer the question with a second line of the theory."] * 20
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=_SPECIALS,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return _fast(tok, OTHER_TEMPLATE)


def _span_of(agent, text_chat) -> tuple[str, int]:
    text = agent.chat_text(text_chat)
    return text, text.index(CONTENT.strip())


# -- token alignment ------------------------------------------------------------------------------
@pytest.mark.parametrize("chat", [CONTENT, [{"role": "system", "content": "Be terse."},
                                            {"role": "user", "content": CONTENT}]], ids=["str", "messages"])
def test_alignment_is_identity_on_identical_tokenizers(agent_for, chat):
    receiver, sharer = agent_for("llama"), agent_for("gemma3")
    a = align(receiver, sharer, chat)
    ids = receiver.chat_ids(chat)
    assert a.receiver_ids.tolist() == ids == a.sharer_ids.tolist() == sharer.chat_ids(chat)
    # Expected mask from first principles: tokens whose characters lie in a message content.
    text = receiver.chat_text(chat)
    contents = [CONTENT] if isinstance(chat, str) else [m["content"] for m in chat]
    inside = torch.zeros(len(text), dtype=torch.bool)
    for c in contents:
        k = text.index(c)
        inside[k:k + len(c)] = True
    spans = token_spans(receiver.tokenizer, text, ids)
    want = torch.tensor([bool(inside[a_:b_].any()) for a_, b_ in spans])
    assert torch.equal(a.mask, want)
    assert a.num_aligned > len(CONTENT.encode()) * 0.9  # byte-level: ~one token per byte of content
    assert not a.mask[:3].any() and not a.mask[-3:].any()  # "<|im_start|>user\n" ... "assistant\n"
    assert torch.equal(a.index[a.mask], torch.nonzero(a.mask).flatten())  # the identity, byte pieces included
    assert torch.all(a.index[~a.mask] == -1)
    assert a.num_exact == a.num_aligned


@pytest.mark.parametrize("which", ["merged", "trained"])
def test_alignment_across_segmentations_overlaps_in_characters(agent_for, models, tokenizer, merged, trained, which):
    other = {"merged": merged, "trained": trained}[which]
    receiver = Agent(models["llama"], other, "llama-other")
    sharer = agent_for("qwen2")  # tiny byte-level tokenizer, ChatML template
    chat = "  " + CONTENT + " \n"  # the receiver's template trims it, the sharer's does not
    a = align(receiver, sharer, chat)
    r_text, r0 = _span_of(receiver, chat)
    s_text, s0 = _span_of(sharer, chat)
    r_spans = token_spans(other, r_text, receiver.chat_ids(chat))
    s_spans = token_spans(tokenizer, s_text, sharer.chat_ids(chat))
    n = len(CONTENT.strip())
    assert len(a) == len(r_spans) and len(a.sharer_ids) == len(s_spans)
    in_content = [max(a_ - r0, 0) < min(b_ - r0, n) for a_, b_ in r_spans]
    assert sum(in_content) < sum(max(a_ - s0, 0) < min(b_ - s0, n) for a_, b_ in s_spans)  # merges: fewer tokens
    prev = -1
    for t, ((a_, b_), m) in enumerate(zip(r_spans, a.mask.tolist())):
        lo, hi = max(a_ - r0, 0), min(b_ - r0, n)  # receiver token in content coordinates
        if not m:
            assert lo >= hi, f"content token {t} {r_text[a_:b_]!r} left unaligned"
            continue
        sa, sb = s_spans[int(a.index[t])]
        slo, shi = sa - s0, sb - s0
        assert max(lo, slo) < min(hi, shi), f"token {t} {r_text[a_:b_]!r} vs {s_text[sa:sb]!r}: no common character"
        assert slo < hi <= shi, "the sharer token must cover the receiver token's last content character"
        assert int(a.index[t]) >= prev  # alignment is monotone
        prev = int(a.index[t])
    # template tokens: "<s>[system] Answer the question.</s>" etc. are never aligned, content tokens always
    assert not a.mask[: len(receiver.tokenizer("<s>[system] Answer", add_special_tokens=False)["input_ids"])].any()
    assert a.mask.tolist() == in_content
    assert 0 < a.num_exact < a.num_aligned


def test_decoded_spans_agree_with_offsets(tokenizer, merged, trained):
    for tok in (tokenizer, merged, trained):
        text = tok.apply_chat_template([{"role": "user", "content": "the heat of the end, twice  over"}],
                                       tokenize=False, add_generation_prompt=True)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert decoded_spans(tok, text, ids) == token_spans(tok, text, ids)
    with pytest.raises(LatentWireError, match="does not reproduce"):
        decoded_spans(tokenizer, "other text", tokenizer("some text", add_special_tokens=False)["input_ids"])


# -- C2C ---------------------------------------------------------------------------------------------
PAIRS = [("gemma3", "llama"), ("llama", "gemma3"), ("qwen2", "llama"), ("llama", "qwen2")]


@pytest.fixture(scope="module")
def pair_states(models, merged):
    """(sharer arch, receiver arch) -> (sharer agent, receiver agent, sharer state, receiver state, alignment).

    The llama receiver of the qwen2 pair uses the merged tokenizer and template (a real, non-identity alignment)."""
    from latentwire.models import tiny_tokenizer

    cache = {}

    def get(s_arch, r_arch):
        if (s_arch, r_arch) not in cache:
            tok = tiny_tokenizer()
            sharer = Agent(models[s_arch], tok, s_arch)
            receiver = Agent(models[r_arch], merged if (s_arch, r_arch) == ("qwen2", "llama") else tok, r_arch)
            cache[s_arch, r_arch] = (sharer, receiver, sharer.prefill(CONTENT), receiver.prefill(CONTENT),
                                     align(receiver, sharer, CONTENT))
        return cache[s_arch, r_arch]

    return get


def _perturb(c2c: C2C, seed: int = 0, scale: float = 0.5) -> C2C:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in c2c.projectors:
            for head in (p.out_k, p.out_v):
                head.weight.copy_(torch.randn(head.weight.shape, generator=g) * scale)
                head.bias.copy_(torch.randn(head.bias.shape, generator=g) * scale)
    return c2c


@pytest.mark.parametrize("gate", ["static", "input"])
@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p[0]}->{p[1]}")
def test_untrained_c2c_leaves_the_receiver_bit_identical(pair_states, pair, gate):
    sharer_agent, receiver_agent, s, r, a = pair_states(*pair)
    c2c = build("c2c", sharer_agent.geometry, receiver_agent.geometry, hidden=32, gate=gate)
    assert (c2c.projectors[0].gate_in is not None) == (gate == "input")
    assert isinstance(c2c, C2C) and 0 < a.num_aligned < len(r)
    out = c2c(s, r, align=a.index, mask=a.mask)
    assert out.geometry == r.geometry and torch.equal(out.positions, r.positions)
    assert torch.equal(out.token_ids, r.token_ids)
    for lo, lr in zip(out.layers, r.layers, strict=True):
        assert torch.equal(lo.keys, lr.keys) and torch.equal(lo.values, lr.values)
        assert torch.equal(lo.positions, lr.positions)


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p[0]}->{p[1]}")
def test_trained_c2c_changes_aligned_rows_only(pair_states, pair):
    sharer_agent, receiver_agent, s, r, a = pair_states(*pair)
    c2c = _perturb(build("c2c", sharer_agent.geometry, receiver_agent.geometry, hidden=32))
    out = c2c(s, r, align=a)  # a TokenAlignment works too
    changed_somewhere = False
    for i, (lo, lr) in enumerate(zip(out.layers, r.layers, strict=True)):
        rows = torch.searchsorted(r.positions, lr.positions)
        m = a.mask[rows]
        assert torch.equal(lo.keys[:, ~m], lr.keys[:, ~m]) and torch.equal(lo.values[:, ~m], lr.values[:, ~m])
        dk = (lo.keys[:, m] - lr.keys[:, m]).abs().amax(dim=(0, 2))
        dv = (lo.values[:, m] - lr.values[:, m]).abs().amax(dim=(0, 2))
        assert bool((dk > 1e-3).all()) and bool((dv > 1e-3).all()), f"layer {i}: an aligned row is unchanged"
        changed_somewhere |= bool(m.any())
    assert changed_somewhere


def test_sliding_receiver_layers_fuse_the_rows_they_hold(pair_states):
    """One masked-in row (the last one, held by every layer): it alone changes, in every layer, at its position."""
    sharer_agent, receiver_agent, s, r, a = pair_states("llama", "gemma3")
    assert any(len(l.positions) < len(r) for l in r.layers)  # the receiver's sliding layers hold fewer rows
    c2c = _perturb(build("c2c", sharer_agent.geometry, receiver_agent.geometry, hidden=32))
    T = len(r)
    mask = torch.zeros(T, dtype=torch.bool)
    mask[-1] = True
    index = torch.arange(T).clamp_max(len(s) - 1)
    out = c2c(s, r, align=index, mask=mask)
    for lo, lr in zip(out.layers, r.layers, strict=True):
        diff = (lo.keys - lr.keys).abs().amax(dim=(0, 2)) + (lo.values - lr.values).abs().amax(dim=(0, 2))
        assert torch.nonzero(diff).flatten().tolist() == [len(lr.positions) - 1]


def test_keys_are_fused_without_position(pair_states):
    """Projector inputs are un-rotated keys and the key residual is rotated to the receiver row's position:
    moving the receiver moves the output exactly as re-rotation does; moving the sharer changes nothing."""
    sharer_agent, receiver_agent, s, r, a = pair_states("gemma3", "llama")
    c2c = _perturb(build("c2c", sharer_agent.geometry, receiver_agent.geometry, hidden=32))
    with torch.no_grad():
        base = c2c(s, r, align=a)
        moved = c2c(s, r.shift(37), align=a)
        sharer_moved = c2c(s.shift(11), r, align=a)
    want = base.shift(37)
    for lm, lw, lb, ls in zip(moved.layers, want.layers, base.layers, sharer_moved.layers, strict=True):
        assert torch.equal(lm.positions, lw.positions)
        torch.testing.assert_close(lm.keys, lw.keys, atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(lm.values, lw.values, atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(ls.keys, lb.keys, atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(ls.values, lb.values, atol=2e-5, rtol=1e-5)


def test_layer_map(geometry_for):
    llama, gemma = geometry_for("llama"), geometry_for("gemma3")
    assert gemma.layer_types == ("sliding",) * 5 + ("global",)
    assert layer_map(gemma, llama) == [5, 5, 5]  # mapped layers 0, 3 slide: the only global layer instead
    assert layer_map(llama, gemma) == [0, 0, 1, 1, 2, 2]  # depth-proportional, half up
    assert layer_map(llama, llama) == [0, 1, 2]
    hybrid = dataclasses.replace(gemma, layer_types=("global", "sliding", "sliding", "global", "sliding", "sliding"))
    assert layer_map(hybrid, gemma) == [0, 0, 3, 3, 3, 3]  # nearest global; 1 is nearer 0 than 3
    one = dataclasses.replace(llama, layer_types=("global",))
    assert layer_map(gemma, one) == [5] and layer_map(one, gemma) == [0] * 6


def test_adam_steps_lower_a_fusion_loss(pair_states):
    sharer_agent, receiver_agent, s, r, a = pair_states("qwen2", "llama")
    torch.manual_seed(0)
    c2c = build("c2c", sharer_agent.geometry, receiver_agent.geometry, hidden=32)
    init = {k: v.clone() for k, v in c2c.state_dict().items()}
    m = a.mask
    # Targets: receiver keys scaled by 1.5 (rotation is linear: a scale is learnable un-rotated), values by 0.5.
    targets = [(1.5 * l.keys[:, m], 0.5 * l.values[:, m]) for l in r.layers]

    def loss_fn():
        out = c2c(s, r, align=a)
        mse = torch.nn.functional.mse_loss
        return sum(mse(l.keys[:, m], tk) + mse(l.values[:, m], tv) for l, (tk, tv) in zip(out.layers, targets))

    opt = torch.optim.Adam(c2c.parameters(), lr=3e-3)
    with torch.no_grad():
        first = float(loss_fn())
    for _ in range(40):
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        opt.step()
    with torch.no_grad():
        last = float(loss_fn())
    assert last < 0.3 * first, (first, last)
    for k, v in c2c.state_dict().items():  # gradients reached every parameter (gates and hidden layers too)
        assert not torch.equal(v, init[k]), f"{k} never moved"


def test_wrong_pair_names_both_models(pair_states):
    sharer_agent, receiver_agent, s, r, a = pair_states("gemma3", "llama")
    c2c = build("c2c", sharer_agent.geometry, receiver_agent.geometry, hidden=8)
    q_agent, _, q_state, _, _ = pair_states("qwen2", "llama")
    with pytest.raises(GeometryMismatchError, match=r"sharer gemma3 -> receiver llama.*got sharer qwen2"):
        c2c(q_state, r, align=a)
    with pytest.raises(GeometryMismatchError, match="receiver llama.*receiver gemma3"):
        c2c(s, s, align=a)
    with pytest.raises(LatentWireError, match="receiver"):
        c2c(s)


def test_bad_alignment_is_refused(pair_states):
    sharer_agent, receiver_agent, s, r, a = pair_states("gemma3", "llama")
    c2c = build("c2c", sharer_agent.geometry, receiver_agent.geometry, hidden=8)
    with pytest.raises(LatentWireError, match="one entry per receiver row"):
        c2c(s, r, align=a.index[:-1], mask=a.mask[:-1])
    bad = a.index.clone()
    bad[a.mask.nonzero()[0]] = len(s)
    with pytest.raises(LatentWireError, match="outside the sharer"):
        c2c(s, r, align=bad, mask=a.mask)


def test_config_parameter_count_and_checkpoint(pair_states, tmp_path):
    with pytest.raises(ConfigError):
        C2CConfig(hidden=0)
    with pytest.raises(ConfigError):
        C2CConfig(hidden=2.5)
    sharer_agent, receiver_agent, s, r, a = pair_states("llama", "gemma3")
    sg, rg = sharer_agent.geometry, receiver_agent.geometry
    c2c = build("c2c", sg, rg, seed=3, hidden=16)
    # I = 2 (2*16 + 1*32) = 128, O = 32, h = 16, L_R = 6, H_R = 1
    assert c2c.num_parameters == C2C.parameter_count(sg, rg, 16) == \
        6 * (2 * 128 + 129 * 16 + 17 * 16 + 2 * 17 * 32 + 2)
    _perturb(c2c, seed=1)
    back = load(c2c.save(tmp_path / "c2c"))
    assert isinstance(back, C2C) and back.config == C2CConfig(hidden=16)
    with torch.no_grad():
        x, y = c2c(s, r, align=a), back(s, r, align=a)
    for lx, ly in zip(x.layers, y.layers):
        assert torch.equal(lx.keys, ly.keys) and torch.equal(lx.values, ly.values)


def test_input_conditioned_gate(pair_states, tmp_path):
    """gate="input": at init the gates equal the static ones (the same residuals as a static C2C with the same
    weights); once its map is trained, the gate depends on the sharer's rows; parameters and checkpoints."""
    sharer_agent, receiver_agent, s, r, a = pair_states("qwen2", "llama")
    sg, rg = sharer_agent.geometry, receiver_agent.geometry
    with pytest.raises(ConfigError, match="gate"):
        C2CConfig(gate="dynamic")
    static = _perturb(build("c2c", sg, rg, hidden=16))
    dynamic = build("c2c", sg, rg, hidden=16, gate="input")
    missing, unexpected = dynamic.load_state_dict(static.state_dict(), strict=False)
    assert not unexpected and missing and all(k.endswith("gate_in.weight") for k in missing)
    with torch.no_grad():
        x, y = static(s, r, align=a), dynamic(s, r, align=a)
    for lx, ly in zip(x.layers, y.layers):
        assert torch.equal(lx.keys, ly.keys) and torch.equal(lx.values, ly.values)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in dynamic.projectors:
            p.gate_in.weight.copy_(torch.randn(p.gate_in.weight.shape, generator=g))
        y = dynamic(s, r, align=a)
    assert any(not torch.equal(lx.keys, ly.keys) for lx, ly in zip(x.layers, y.layers))
    # the gate is a function of the input: the same rows, pooled over fewer of them, give another gate
    p0, q0 = dynamic.projectors[0], static.projectors[0]
    g = torch.Generator().manual_seed(3)
    ks, vs, kr, vr = (torch.randn(5, n.normalized_shape[0], generator=g) for n in p0.norms)
    first_two = torch.tensor([True, True, False, False, False])
    with torch.no_grad():
        assert not torch.allclose(p0(ks, vs, kr, vr)[0], p0(ks, vs, kr, vr, rows=first_two)[0])
        assert torch.equal(q0(ks, vs, kr, vr)[0], q0(ks, vs, kr, vr, rows=first_two)[0])  # static: no input
    assert dynamic.num_parameters == C2C.parameter_count(sg, rg, 16, gate="input") == \
        static.num_parameters + rg.num_layers * 4 * rg.num_kv_heads * sg.num_kv_heads * sg.head_dim
    back = load(dynamic.save(tmp_path / "c2c"))
    assert back.config == C2CConfig(hidden=16, gate="input")
    with torch.no_grad():
        z = back(s, r, align=a)
    for ly, lz in zip(y.layers, z.layers):
        assert torch.equal(ly.keys, lz.keys) and torch.equal(ly.values, lz.values)

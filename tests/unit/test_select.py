"""Selectors: formulas on hand-made attention, exact budgets, determinism, shapes on all three families.

Sentence-unit selection (groups, the unit floor, mass budgets, context rows) is in test_select_sentences.py.
"""
import math
import sys

import pytest
import torch

from latentwire.agent import Agent
from latentwire.errors import MissingExtraError, PressUnsupportedError, UnknownNameError
from latentwire.select.presses import kvpress_installed
from latentwire.models import tiny_model, tiny_tokenizer
from latentwire.protocols import get_protocol
from latentwire.select import SELECTORS, TextSelector, always_kept, fanin_budget, fixed_chain_budget, get_selector, \
    relative_chain_budget, select_rows
from latentwire.select.cacheback import cacheback_scores, grouped_attention, pool
from latentwire.attention import attend


def _b():
    # 1 KV group, m = 4 query tokens, T = 3 rows. Row 0: one token attends strongly (0.8), the others not
    # at all; row 1: every token attends weakly (0.3); row 2 absorbs the rest.
    return torch.tensor([[[0.8, 0.1, 0.1], [0.0, 0.3, 0.7], [0.0, 0.3, 0.7], [0.0, 0.3, 0.7]]], dtype=torch.float64)


def test_concentrated_row_beats_diffuse_row():
    b = _b()
    mean_q = cacheback_scores(b, 0, "none", 7)
    cb = cacheback_scores(b, 2, "none", 7)
    assert mean_q[1] > mean_q[0]  # averaging dilutes the concentrated signal...
    assert cb[0] > cb[1]  # ...the correction restores it


def test_correction_matches_closed_form_without_pooling():
    torch.manual_seed(0)
    b = torch.rand(3, 5, 11, dtype=torch.float64)  # (S, m, T)
    mean_r = b.mean(1)
    c = 1 + b.var(dim=1, unbiased=False).sum(0) / mean_r.pow(2).sum(0)
    q = mean_r.mean(0)
    assert torch.allclose(cacheback_scores(b, 2, "none", 7), q * c.pow(2))
    assert torch.allclose(cacheback_scores(b, 0, "avg", 7), pool(q, "avg", 7))  # p = 0: mean query attention


def test_grouped_attention_averages_heads_sharing_a_kv_head():
    attn = torch.zeros(2, 4, 1, 3)  # (L, H_q, m, T), 2 KV heads -> query heads (0,1) and (2,3)
    attn[:, 0, 0, 0] = 1.0
    attn[:, 3, 0, 2] = 1.0
    g = grouped_attention(attn, 2)
    assert g.shape == (2, 1, 3) and g[0, 0, 0] == 0.5 and g[1, 0, 2] == 0.5 and g[0, 0, 2] == 0


def test_pool_keeps_length_and_is_centred():
    x = torch.zeros(1, 9, dtype=torch.float64)
    x[0, 4] = 7.0
    assert torch.equal(pool(x, "max", 7)[0], torch.tensor([0, 1, 1, 1, 1, 1, 1, 1, 0.0], dtype=torch.float64) * 7)
    assert pool(x, "avg", 7)[0, 4] == pytest.approx(1.0)


def test_budget_ceiling_is_exact_for_decimal_ratios():
    """21 / 1.4 and 42 / 2.8 are 15 exactly; float division makes them 15.000000000000002 (a ceiling of 16)."""
    assert (fanin_budget(21, 1.4), fanin_budget(42, 2.8), fanin_budget(22, 1.4), fanin_budget(100, 8)) == (15, 15, 16, 13)


@pytest.mark.parametrize("T,ratio", [(100, 2), (100, 8), (37, 4), (500, 128), (16, 1)])
def test_budget_is_exact(T, ratio):
    keep = torch.zeros(T, dtype=torch.bool)
    keep[0] = True
    keep[-5:] = True  # latent rows
    scores = torch.rand(T, generator=torch.Generator().manual_seed(T))
    B = fanin_budget(T, ratio)
    rows = select_rows(scores, B, keep)
    assert B == -(-T // ratio)  # ceil for the integer ratios here
    assert len(rows) == min(B, T - int(keep.sum())) + int(keep.sum())  # exactly B beyond the always-kept rows
    assert set(torch.nonzero(keep).flatten().tolist()) <= set(rows.tolist())
    assert torch.equal(rows, torch.sort(torch.unique(rows)).values)
    assert torch.equal(rows, select_rows(scores.clone(), B, keep.clone()))  # deterministic


def test_spans_are_ranked_by_mean_and_added_whole():
    scores = torch.zeros(49)
    scores[17:33] = 1.0  # the second span of 16 free rows (rows 1..48 are free; row 0 is kept)
    keep = torch.zeros(49, dtype=torch.bool)
    keep[0] = True
    assert select_rows(scores, 16, keep).tolist() == [0] + list(range(17, 33))
    # 20 rows: the best span whole, then the leftover 4 from the next-best span (rows 1..16, all 0: earliest)
    assert select_rows(scores, 20, keep).tolist() == [0, 1, 2, 3, 4] + list(range(17, 33))


def test_leftover_budget_takes_the_best_window_of_the_next_span():
    scores = torch.zeros(49)
    scores[17:33] = 1.0  # span 2 (rows 17..32): mean 1
    scores[40:43] = 10.0  # inside span 3 (rows 33..48): mean 30/16, the best span
    keep = torch.zeros(49, dtype=torch.bool)
    keep[0] = True
    # a budget below one span still sends the best window of the best span
    assert select_rows(scores, 3, keep).tolist() == [0, 40, 41, 42]
    assert select_rows(scores, 15, keep).tolist() == [0] + list(range(33, 48))  # ties: the earliest window
    # span 3 whole, then 4 rows of span 2 (all equal: its earliest window)
    assert select_rows(scores, 20, keep).tolist() == [0, 17, 18, 19, 20] + list(range(33, 49))


def test_chain_budgets():
    assert relative_chain_budget(40, 100, 8) == 40 + 13
    assert fixed_chain_budget(40, 100, 64) == 64 and fixed_chain_budget(10, 20, 64) == 30


def test_unknown_selector_lists_names():
    with pytest.raises(UnknownNameError) as e:
        get_selector("h3o")
    assert all(n in str(e.value) for n in SELECTORS)


@pytest.fixture(scope="module", params=["llama", "gemma3", "qwen2"])
def finished(request):
    torch.set_num_threads(1)
    agent = Agent(tiny_model(request.param), tiny_tokenizer(), request.param)
    state = agent.think(agent.prefill("The blue crate holds 58 bolts. " * 3), 2)
    return agent, state


@pytest.mark.parametrize("name", sorted(SELECTORS))
def test_every_selector_scores_every_row_deterministically(finished, name):
    agent, state = finished
    sel = get_selector(name)
    if sel.extra == "kvpress" and not kvpress_installed():  # the core install: the typed error names the extra
        with pytest.raises(MissingExtraError, match=r"latentwire\[kvpress\]"):
            sel.score(agent, state, "How many bolts?")
        return
    if name == "kvzip" and "sliding" in state.geometry.layer_types:  # kvpress refuses Gemma3: a typed error
        with pytest.raises(PressUnsupportedError, match="Gemma3"):
            sel.score(agent, state, "How many bolts?")
        return
    if isinstance(sel, TextSelector):  # reads the document, not the state: scored per unit (test_retrieval.py)
        with pytest.raises(TypeError, match="scores text"):
            sel.score(agent, state, "How many bolts?")
        units = ["The blue crate holds 58 bolts.", "The red crate is empty.", ""]
        u = sel.score_units(units, "How many bolts?")
        assert u.shape == (3,) and torch.isfinite(u).all()
        assert torch.equal(u, sel.score_units(units, "How many bolts?"))
        return
    s = sel.score(agent, state, "How many bolts?")
    assert s.shape == (len(state),) and torch.isfinite(s).all()
    assert torch.equal(s, sel.score(agent, state, "How many bolts?"))


def test_attend_uses_global_layers_only_on_hybrid(finished):
    agent, state = finished
    attn = attend(agent, state, "How many?")
    n_global = state.geometry.layer_types.count("global")
    assert attn.shape[0] == n_global and attn.shape[-1] == len(state)
    assert torch.all(attn.sum(-1) <= 1 + 1e-5)  # the query's own tokens take the rest
    assert torch.all(attn.sum(-1) > 0.01)  # and the state's rows are read, not left at zero


def test_cacheback_protocol_sends_its_budget(finished, spy_decode):
    agent, _ = finished
    docs = ["The blue crate holds 58 bolts. " * 4, "Nothing to see here. " * 5]
    seen = spy_decode(agent)
    out = get_protocol("cacheback", ratio=4, latent_steps=2, max_new_tokens=2).run([agent] * 2, docs, agent, "Bolts?")
    for sender in out.details["senders"]:  # B document rows exactly (the documents hold more), first row, latent rows
        assert sender["sent"] == math.ceil(sender["rows"] / 4) + 1 + 2
        assert sender["sent_document_rows"] == math.ceil(sender["rows"] / 4)
    assert out.message_bytes == out.details["message_rows"] * agent.geometry.hidden_size * 4
    assert all(0 <= a < b <= len(d) for spans, d in zip(out.kept_spans, docs) for a, b in spans)
    ids = get_protocol("cacheback", ratio=4, latent_steps=2, max_new_tokens=2, encoding="token_ids").run(
        [agent] * 2, docs, agent, "Bolts?")
    assert ids.answer == out.answer and ids.message_bytes < out.message_bytes
    (s0, h0, k0), (s1, h1, k1) = seen  # token ids rebuilt by the receiver: the very rows, the same decode input
    assert s0 == s1 and torch.equal(h0, h1) and all(torch.equal(x, y) for x, y in zip(k0, k1, strict=True))


def test_follow_up_query_rescores_the_stored_state_without_rerunning_the_sender(finished):
    agent, _ = finished
    proto = get_protocol("cacheback", ratio=4, latent_steps=2)
    state = proto.read(agent, "The blue crate holds 58 bolts. The red crate holds 12 nails. " * 3)
    digest, ops = state.digest(), [c.op for c in agent.calls]
    first = proto.choose(agent, state, "How many bolts?")
    second = proto.choose(agent, state, "How many nails?")
    assert [c.op for c in agent.calls] == ops  # no prefill, no latent step, no answer: only q was run
    assert state.digest() == digest  # the stored state is untouched and can serve further queries
    assert torch.equal(first, proto.choose(agent, state, "How many bolts?"))
    assert len(first) == len(second)  # same budget; the rows may differ with the query
    # each question is scored afresh on the stored state: the selection is the one its own scores give
    for q, rows in (("How many bolts?", first), ("How many nails?", second)):
        want = select_rows(proto.scores(agent, state, q), fanin_budget(len(state), proto.ratio), always_kept(state),
                           proto.span)
        assert torch.equal(rows, want), q
    assert not torch.equal(proto.scores(agent, state, "How many bolts?"), proto.scores(agent, state, "How many nails?"))


@pytest.mark.parametrize("budget", ["relative", "fixed"])
def test_chain_hops_respect_their_budgets_and_track_origins(finished, budget):
    agent, _ = finished
    docs = ["The blue crate holds 58 bolts. " * 3, "The red crate holds 12 nails. " * 3, "Doors lock at six. " * 3]
    proto = get_protocol("cacheback_chain", ratio=4, latent_steps=1, max_new_tokens=2, budget=budget, max_rows=40)
    out = proto.run([agent] * 3, docs, agent, "How many bolts?")
    hops = out.details["hops"]
    assert len(hops) == 3 and hops[0]["budget"] == math.ceil(hops[0]["rows"] / 4)
    for i, h in enumerate(hops):
        latent_inherited = i  # one latent row per earlier hop travels on (always kept)
        assert h["sent"] <= h["budget"] + 1 + 1 + latent_inherited  # B + first row + own latent + inherited latents
        if budget == "fixed" and i:
            assert h["budget"] <= 40
    assert out.details["message_rows"] == hops[-1]["sent"]
    for spans, doc in zip(out.kept_spans, docs):
        assert all(0 <= a < b <= len(doc) for a, b in spans)


def test_prefill_with_rows_places_the_message_in_the_slot(finished):
    from latentwire.agent import SLOT

    agent, state = finished
    rows = agent.rows(state)
    hop = agent.prefill("Notes:\n" + SLOT + "\nThen more.", rows=rows)
    pre, post = agent.slot_ids(agent.chat_text("Notes:\n" + SLOT + "\nThen more."))
    assert len(hop) == len(pre) + len(rows) + len(post)
    assert torch.equal(hop.token_ids[len(pre):len(pre) + len(rows)], rows.token_ids)
    assert torch.allclose(hop.latents, rows.embeds[rows.token_ids == -1])


def test_a_kvpress_selector_on_the_core_install_names_the_extra(finished, monkeypatch):
    """kvpress is the optional extra `kvpress`: without it (blocked here as on a core install) every kvpress selector
    raises MissingExtraError with the pip line, and a protocol built on one is refused before any compute."""
    agent, state = finished
    monkeypatch.setitem(sys.modules, "kvpress", None)
    assert not kvpress_installed()
    kvpress_names = [n for n in SELECTORS if SELECTORS[n].extra == "kvpress"]
    assert set(kvpress_names) == {"snapkv", "h2o", "tova", "knorm", "chunkkv", "kvzip"}
    for name in kvpress_names:
        with pytest.raises(MissingExtraError, match=r"pip install 'latentwire\[kvpress\]'") as e:
            get_selector(name).score(agent, state, "How many bolts?")
        assert isinstance(e.value, ImportError) and e.value.extra == "kvpress"
    with pytest.raises(MissingExtraError, match="kvpress"):
        get_protocol("cacheback", selector="snapkv")
    assert get_protocol("cacheback", selector="cacheback").selector == "cacheback"  # the core selectors still run


def test_a_dense_encoder_path_that_holds_no_model_is_refused_when_built(tmp_path):
    from latentwire.errors import ModelNotFoundError
    from latentwire.protocols import get_protocol

    for path in (tmp_path / "nothing", tmp_path):  # missing, and a folder without config.json
        with pytest.raises(ModelNotFoundError, match="not a model folder"):
            get_selector("dense", model=str(path))
    with pytest.raises(ModelNotFoundError):  # through a protocol's selector_params too, before any run
        get_protocol("cacheback", selector="dense", selector_params={"model": str(tmp_path / "nothing")})

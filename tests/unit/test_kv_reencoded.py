"""CacheBack encoding="kv_reencoded": the sender re-reads its selected rows alone in the receiver's message slot
(`Agent.encode_rows`) and ships their K/V; the receiver attaches them there (`Agent.answer_attached`). For one sender
this is exactly the "rows" encoding with the re-prefill moved to the sender; tiny Llama / Qwen2 / Gemma3 (window 8)."""
from __future__ import annotations

import pytest
import torch

from latentwire.agent import MESSAGE_PROMPT
from latentwire.errors import ConfigError, ContextOverflowError, UnknownNameError
from latentwire.protocols import get_protocol
from latentwire.protocols.cacheback import CacheBack, document_rows
from latentwire.state import KVState

DOC = ("The printer on the third floor jammed twice. Mira Novak was born in Tartu and moved away at nineteen. "
       "Mira Novak plays the cello every evening. Lunch is served at noon in the canteen.")
OTHER = "The red crate holds 12 nails. The lift broke on Monday."
Q = "Which instrument does Mira Novak play?"
ARCHS = ["llama", "qwen2", "gemma3"]


def selected(cb: CacheBack, agent, doc: str) -> KVState:
    """The sender's selected rows, chosen by hand as `send_one` chooses them."""
    state = cb.read(agent, doc)
    per_row, eligible = document_rows(agent, doc, len(state))
    return state.select(cb.choose(agent, state, Q, eligible, cb.span_groups(per_row, doc), per_row, doc))


@pytest.mark.parametrize("arch", ARCHS)
def test_encoded_rows_are_the_rows_a_receiver_prefill_computes_in_its_slot(agent_for, arch, kv_diff):
    agent = agent_for(arch)
    rows = agent.rows(selected(CacheBack(ratio=2, latent_steps=2), agent, DOC))
    got = agent.encode_rows(rows)
    # by hand: the receiver's own prefill of its message prompt, rows in the slot, every row kept on sliding layers
    whole = agent.prefill(MESSAGE_PROMPT.format(question=Q), rows=rows, full_history=True)
    start = len(agent.slot_ids(agent.chat_text(MESSAGE_PROMPT.format(question=Q)))[0])
    want = whole.select(torch.arange(start, start + len(rows))).compact()
    assert torch.equal(got.positions, torch.arange(len(rows))) and torch.equal(got.token_ids, rows.token_ids)
    assert int((got.token_ids == -1).sum()) == 2 and torch.allclose(got.latents, want.latents)
    assert kv_diff(got, want) < 1e-5 and kv_diff(got, want, "values") < 1e-5
    if arch == "gemma3":  # longer than the window: the sliding layers' rows were all kept, not just the last 7
        assert len(got) > agent.geometry.sliding_window
        assert all(len(layer.positions) == len(got) for layer in got.layers)


@pytest.mark.parametrize("arch", ARCHS)
def test_one_sender_answers_exactly_as_with_re_prefilled_rows(agent_for, arch, spy_decode):
    """Same selection, same receiver input: the last hidden state that starts decoding agrees to float error."""
    agent = agent_for(arch)
    seen = spy_decode(agent)
    kw = dict(ratio=2, latent_steps=2, max_new_tokens=4)
    by_rows = CacheBack(**kw).run([agent], [DOC], agent, Q)
    attached = CacheBack(encoding="kv_reencoded", **kw).run([agent], [DOC], agent, Q)
    (start_r, hidden_r, _), (start_a, hidden_a, _) = seen
    assert start_r == start_a and torch.allclose(hidden_r, hidden_a, atol=1e-5)
    assert attached.answer == by_rows.answer and attached.kept_spans == by_rows.kept_spans
    assert attached.details["message_rows"] == by_rows.details["message_rows"]
    assert attached.message_bytes == attached.details["kv_bytes"] > by_rows.message_bytes  # K/V outweigh rows


@pytest.mark.parametrize("arch", ARCHS)
def test_several_senders_are_encoded_apart_and_attached_one_after_another(agent_for, arch, spy_decode):
    agent = agent_for(arch)
    cb = CacheBack(ratio=2, latent_steps=1, encoding="kv_reencoded", max_new_tokens=3)
    parts, _, _, _ = cb.send([agent, agent], [DOC, OTHER], Q)
    by_hand = [agent.encode_rows(agent.rows(selected(cb, agent, d))) for d in (DOC, OTHER)]
    for a, b in zip(parts, by_hand):
        assert torch.equal(a.token_ids, b.token_ids)
        assert max(float((x.keys - y.keys).abs().max()) for x, y in zip(a.layers, b.layers)) < 1e-5
    seen = spy_decode(agent)
    out = cb.run([agent, agent], [DOC, OTHER], agent, Q)
    reply = agent.answer_attached(Q, KVState.concat(by_hand), max_new_tokens=3)
    assert out.answer == reply.text and torch.allclose(seen[0][1], seen[1][1], atol=1e-5)
    assert out.message_bytes == sum(len(p.to_bytes()) for p in by_hand)
    # encoded apart: the second sender's rows never saw the first's, so this is not one re-prefill of both
    rows = CacheBack(ratio=2, latent_steps=1, max_new_tokens=3).run([agent, agent], [DOC, OTHER], agent, Q)
    assert not torch.allclose(seen[1][1], seen[2][1], atol=1e-3) and rows.kept_spans == out.kept_spans


def _no_compute(monkeypatch, agent):
    monkeypatch.setattr(agent, "_forward", lambda *a, **k: pytest.fail("a forward ran before the window check"))


def test_a_message_too_long_for_the_receiver_is_refused_before_any_compute(agent_for, monkeypatch):
    agent = agent_for("llama")
    part = agent.encode_rows(agent.rows(selected(CacheBack(ratio=2, latent_steps=1), agent, DOC)))
    small = agent_for("llama", context_window=len(part) + 4)
    _no_compute(monkeypatch, small)  # not even the receiver's own template text is prefilled
    with pytest.raises(ContextOverflowError):
        small.answer_attached(Q, part)
    with pytest.raises(ContextOverflowError):
        small.encode_rows(agent.rows(KVState.concat([part, part])))


def test_a_sender_whose_re_read_overflows_is_refused_before_it_reads(agent_for, monkeypatch):
    """ratio=1 sends every row: the read fits the sender's window, its re-read after the slot's text does not."""
    cb = CacheBack(ratio=1, latent_steps=1, encoding="kv_reencoded", max_new_tokens=2)
    probe = agent_for("llama")
    T = len(probe.chat_ids(cb.sender_prompt(DOC))) + 1
    sender, receiver = agent_for("llama", context_window=T), agent_for("llama")
    _no_compute(monkeypatch, sender)
    with pytest.raises(ContextOverflowError, match="slot prompt"):
        cb.run([sender], [DOC], receiver, Q)
    CacheBack(ratio=1, latent_steps=1, max_new_tokens=2).check_window([sender], [DOC], receiver, Q)  # rows: fits


@pytest.mark.parametrize("extra", [{"encoding": "kv_reencoded"}, {"encoding": "kv_blend", "recompute": 0.5}])
def test_a_transport_runs_it_as_the_protocol_does(agent_for, extra, monkeypatch):
    """run_protocol (zero-copy and over the wire): the same answer, bytes and rows as `CacheBack.run`; also for the
    read's K/V partly recomputed by the receiver (test_kv_blend.py), whose share reaches the receiver every time."""
    import latentwire.agent
    from latentwire.transport import AgentSpec, InProcessTransport, run_protocol

    shares, real = [], latentwire.agent.blended_cache
    monkeypatch.setattr(latentwire.agent, "blended_cache", lambda a, p, f, r: (shares.append(r), real(a, p, f, r))[1])
    cb = CacheBack(ratio=2, latent_steps=1, max_new_tokens=3, **extra)
    agent = agent_for("gemma3")
    ref = cb.run([agent, agent], [DOC, OTHER], agent, Q)
    for wire in (False, True):
        with InProcessTransport(wire=wire) as t:
            for name in ("s0", "s1", "r"):
                t.add(name, AgentSpec.tiny("gemma3"))
            out = run_protocol(t, cb, ["s0", "s1"], [DOC, OTHER], "r", Q)
        assert (out.answer, out.message_bytes, out.receiver_context, out.kept_spans) == \
            (ref.answer, ref.message_bytes, ref.receiver_context, ref.kept_spans)
        assert out.details["kv_bytes"] == ref.details["kv_bytes"] and "delivery" not in out.details
        assert out.details["message_rows"] == ref.details["message_rows"]
    assert shares == [extra.get("recompute", 0.0)] * 3 if "recompute" in extra else shares == []


def test_kv_encodings_are_named_and_refused_where_rows_are_re_prefilled():
    with pytest.raises(ConfigError, match="kv_reencoded"):
        get_protocol("cacheback_chain", encoding="kv_reencoded")
    with pytest.raises(UnknownNameError, match="kv_reencoded"):
        get_protocol("cacheback", encoding="kv_local")
    with pytest.raises(ConfigError):
        get_protocol("cacheback_x", encoding="kv_reencoded")


def test_the_delivery_benchmark_gives_each_variant_the_same_selection(agent_for, monkeypatch, spy_decode):
    """benchmarks/kv_delivery.py: its rows, kv, kv_reencoded and kv_blend variants hand decoding exactly what the
    protocols do (the same start, last hidden state and cache; answers of tiny models alone would prove little)."""
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import kv_delivery as kd

    agent = agent_for("qwen2")
    kw = dict(ratio=2, latent_steps=2, max_new_tokens=3)
    cb = CacheBack(encoding="kv", **kw)
    sent = [cb.send_one(agent, doc, Q, i) for i, doc in enumerate([DOC, OTHER])]
    parts = [x.part for x in sent]
    units = [cb.span_groups(kd.token_document_spans(agent, agent.chat_text(cb.sender_prompt(d)), d), d)
             for d in (DOC, OTHER)]
    got = kd.answers(agent, Q, parts, 3, [x.positions for x in sent], units)
    assert tuple(got) == kd.VARIANTS
    seen = spy_decode(agent)
    for variant in ("rows", "kv", "kv_reencoded", "kv_blend"):
        kd.answers(agent, Q, parts, 3, [x.positions for x in sent], units, only=(variant,))
        out = CacheBack(encoding=variant, **kw).run([agent, agent], [DOC, OTHER], agent, Q)
        (sa, ha, ka), (sb, hb, kb) = seen[-2], seen[-1]
        assert got[variant] == out.answer and sa == sb and torch.allclose(ha, hb, atol=1e-5), variant
        assert len(ka) == len(kb) and all(torch.allclose(x, y, atol=1e-5) for x, y in zip(ka, kb)), variant
    assert not torch.allclose(seen[0][1], seen[2][1], atol=1e-3)  # rows and the read's K/V: different inputs
    # touching sentences stay apart; rows outside every unit (first, latent) group by run
    assert kd.blocks([0, 5, 6, 7, 12, 40, 41], [[5, 6], [7, 8], [12]]) == [[0], [1, 2], [3], [4], [5, 6]]
    blocks = kd.blocks(sent[0].positions, units[0])
    assert sorted(i for b in blocks for i in b) == list(range(len(parts[0]))) and len(blocks) > 2
    pos = [sent[0].positions[i] for i in blocks[1]]
    one = kd.sentences(agent, parts[0].select(blocks[1]).compact(), pos, units[0])
    assert torch.allclose(one.layers[0].keys, agent.encode_rows(agent.rows(parts[0].select(blocks[1]))).layers[0].keys)
    bare = kd.without(parts[0], first=True, latent=True)
    assert len(bare) == len(parts[0]) - 3 and bool((bare.token_ids >= 0).all()) and bare.is_compact


def test_a_message_with_gaps_is_attached_closed_up(agent_for, spy_decode):
    """A state whose positions have gaps (e.g. selected, not compacted) is placed compacted, as `answer` places K/V."""
    agent = agent_for("qwen2")
    part = agent.encode_rows(agent.rows(selected(CacheBack(ratio=2, latent_steps=1), agent, DOC)))
    seen = spy_decode(agent)
    a = agent.answer_attached(Q, part, max_new_tokens=2)
    b = agent.answer_attached(Q, part.rerotate(2 * part.positions + 3), max_new_tokens=2)
    assert a.text == b.text and seen[0][0] == seen[1][0] and torch.allclose(seen[0][1], seen[1][1], atol=1e-5)

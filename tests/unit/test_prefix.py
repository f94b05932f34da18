"""Shared-prefix reads: the text before the documents read once and attached once; the law is that one sender's
prefix and rows attached are the state of reading [prefix][document] in one prefill."""
from __future__ import annotations

import pytest
import torch

from latentwire.agent import Agent
from latentwire.errors import ContextOverflowError
from latentwire.protocols import get_protocol
from latentwire.protocols.base import SENDER_PROMPT
from latentwire.protocols.prefix import PrefixMismatchError, attach, common_prefix, prefix_state, read_after, split
from latentwire.protocols.reads import HeldReads, shared_reads

DOCS = ["Ada led Orion in Lisbon. She drinks tea. The lobby lights were replaced on Monday.",
        "The blue crate holds 58 bolts. The red crate holds 12 nails. Lunch moved to Friday."]
QUESTION = "Where did Ada lead Orion?"


def _caches_close(a, b, atol=1e-5):
    """Layer by layer, the K/V a model continues from (sliding layers: their last window), within `atol`."""
    ca, cb = a.compact().to_cache(), b.compact().to_cache()
    for i, (x, y) in enumerate(zip(ca.layers, cb.layers)):
        assert x.keys.shape == y.keys.shape, f"layer {i}: {tuple(x.keys.shape)} vs {tuple(y.keys.shape)}"
        assert torch.allclose(x.keys, y.keys, atol=atol, rtol=0), f"layer {i} keys"
        assert torch.allclose(x.values, y.values, atol=atol, rtol=0), f"layer {i} values"


@pytest.mark.parametrize("steps", [0, 2])
def test_one_senders_prefix_and_rows_are_its_read_in_one_prefill(agent_for, arch, steps):
    agent = agent_for(arch)
    doc = DOCS[0] * (3 if arch == "gemma3" else 1)  # longer than gemma3's sliding window (8): its layers roll
    prompt = SENDER_PROMPT.format(document=doc)
    s = split(agent, prompt, doc)
    ids = common_prefix([agent], [s])
    prefix, _, _ = prefix_state(agent, ids)
    rows, _ = read_after(agent, prefix, s, steps, "rescale")
    whole = agent.think(agent.prefill(prompt), steps)
    placed = attach(prefix, [rows])
    assert len(placed) == len(whole) and torch.equal(placed.token_ids, whole.token_ids)
    assert torch.equal(placed.positions, whole.positions) and len(prefix) == s.cut > 0
    _caches_close(placed, whole)
    assert torch.allclose(placed.latents, whole.latents, atol=1e-5, rtol=0)


def test_shared_prefix_fullkv_answers_one_sender_as_its_whole_read(agent_for):
    agent = agent_for("qwen2")
    own = get_protocol("fullkv", latent_steps=1, max_new_tokens=4).run([agent], DOCS[:1], agent, QUESTION)
    shared = get_protocol("fullkv", latent_steps=1, max_new_tokens=4, prefix="shared").run([agent], DOCS[:1], agent,
                                                                                         QUESTION)
    assert shared.answer == own.answer and shared.receiver_context == own.receiver_context
    assert shared.message_bytes < own.message_bytes  # the prefix is held, not sent


def test_several_senders_attach_one_prefix(agent_for):
    agent = agent_for("llama")
    p = get_protocol("fullkv", latent_steps=2, max_new_tokens=2, prefix="shared")
    own = get_protocol("fullkv", latent_steps=2, max_new_tokens=2).run([agent] * 2, DOCS, agent, QUESTION)
    out = p.run([agent] * 2, DOCS, agent, QUESTION)
    P = out.details["prefix_rows"]
    assert P > 0 and out.details["message_rows"] == own.details["message_rows"] - P  # the prefix once, not twice
    assert len(out.sender_seconds) == 2 and out.read_seconds == out.sender_seconds
    with shared_reads(HeldReads()) as memo:  # held: the prefix is read once for every sender and question
        p.run([agent] * 2, DOCS, agent, QUESTION)
        p.run([agent] * 2, DOCS, agent, "How many bolts?")
        assert sum(1 for k in memo if k[:2] == ("index", "prefix")) == 1


def test_senders_whose_prefixes_differ_are_refused_before_any_compute(agent_for, models, tokenizer):
    a, b = agent_for("llama"), agent_for("qwen2")
    p = get_protocol("fullkv", latent_steps=1, prefix="shared")
    with pytest.raises(PrefixMismatchError, match="sender 1 runs"):
        p.run([a, b], DOCS, a, QUESTION)
    with pytest.raises(PrefixMismatchError, match="receiver runs"):
        p.run([a, a], DOCS, b, QUESTION)
    aware = get_protocol("fullkv", latent_steps=1, prefix="shared", query_aware=True)
    other = Agent(models["llama"], tokenizer, "llama")
    s0 = split(a, SENDER_PROMPT.format(document=DOCS[0]), DOCS[0])
    s1 = split(other, "Skim this.\n\n" + DOCS[1], DOCS[1])  # another instruction before the document
    with pytest.raises(PrefixMismatchError, match="sender 1's text before its document"):
        common_prefix([a, other], [s0, s1])
    assert a.calls == [] and b.calls == [] and aware.prefix == "shared"


def test_a_message_past_the_receivers_window_is_refused_before_any_read(agent_for):
    sender, receiver = agent_for("llama"), agent_for("llama", context_window=40)
    with pytest.raises(ContextOverflowError, match="prefix_rows"):
        get_protocol("fullkv", latent_steps=1, prefix="shared").run([sender] * 2, DOCS, receiver, QUESTION)
    assert sender.calls == []


def test_an_unknown_prefix_lists_the_valid_ones():
    from latentwire.errors import UnknownNameError

    with pytest.raises(UnknownNameError, match="own, shared"):
        get_protocol("fullkv", prefix="common")


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_recomputing_every_attached_row_is_the_re_prefill_of_all_documents_after_the_prefix(agent_for, arch):
    from latentwire.blend import blended_cache
    from latentwire.protocols.prefix import first_rows

    agent = agent_for(arch)
    splits = [split(agent, SENDER_PROMPT.format(document=d), d) for d in DOCS]
    ids = common_prefix([agent, agent], splits)
    prefix, _, _ = prefix_state(agent, ids, full_history=True)
    rows = [read_after(agent, prefix, s, 0, "rescale", full_history=True)[0] for s in splits]
    placed = attach(prefix, rows)
    pick = first_rows(rows, 10 ** 6)  # every row: k past every document's length
    assert pick == list(range(len(placed) - len(prefix)))
    got = blended_cache(agent, placed, len(prefix), 0.0, pick)
    want = agent.read_on(prefix, [t for s in splits for t in s.ids[s.cut:]], full_history=True).to_cache(True)
    for i, (x, y) in enumerate(zip(got.layers, want.layers)):
        assert torch.allclose(x.keys, y.keys, atol=1e-5, rtol=0) and torch.allclose(x.values, y.values, atol=1e-5,
                                                                                     rtol=0), f"layer {i}"
    assert first_rows(rows, 2) == [0, 1, len(rows[0]), len(rows[0]) + 1]  # EPIC: each document's first rows


def test_recompute_first_runs_and_needs_a_shared_prefix(agent_for):
    from latentwire.errors import ConfigError

    agent = agent_for("gemma3")  # sliding layers: the reads keep every row for the recompute
    plain = get_protocol("fullkv", latent_steps=1, max_new_tokens=2, prefix="shared")
    epic = get_protocol("fullkv", latent_steps=1, max_new_tokens=2, prefix="shared", recompute_first=4)
    a, b = plain.run([agent] * 2, DOCS, agent, QUESTION), epic.run([agent] * 2, DOCS, agent, QUESTION)
    assert (a.message_bytes, a.receiver_context) != (0, 0) and b.receiver_context == a.receiver_context
    for bad in ({"recompute_first": 2}, {"recompute_first": -1, "prefix": "shared"}):
        with pytest.raises(ConfigError, match="recompute_first"):
            get_protocol("fullkv", **bad)


def test_moved_tteoa_adds_the_transfer_at_the_declared_link():
    from latentwire.errors import ConfigError
    from latentwire.protocols.base import Outcome, transfer_seconds

    out = Outcome("x", "a", 125_000_000, 10, (3.0, 2.0), 1.0, read_seconds=(2.5, 1.0))  # 1 Gbit of message
    assert out.question_tteoa == 2.0 and out.moved_tteoa() == pytest.approx(3.0)  # + 1 s at 1 Gbit/s
    assert out.moved_tteoa(None) == 2.0 and out.moved_tteoa(10.0) == pytest.approx(2.1)
    assert transfer_seconds(125_000_000, 0.1) == pytest.approx(10.0)
    assert Outcome("x", "a", 10, 1, (1.0,), 1.0).moved_tteoa() is None  # reads not separable: no question time
    with pytest.raises(ConfigError, match="link speed"):
        transfer_seconds(1, 0)

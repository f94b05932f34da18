"""cacheback_x's "translated" delivery on the tiny models: a qwen2 reader selects as CacheBack does, a dense
translator turns the selected rows' K/V into the gemma3 receiver's geometry, the receiver attends to them."""
from __future__ import annotations

import pytest
import torch

from latentwire.errors import ConfigError, GeometryMismatchError
from latentwire.protocols.cacheback import CacheBack
from latentwire.protocols.cacheback_x import CacheBackX, MessageOverflowError, receiver_state
from latentwire.state import KVState
from latentwire.translate import build
from latentwire.translate.dense_alignment import ContextModeError

DOCS = ("Ana Silva leads the Heron project. The weather was mild on Monday.\n"
        "The Heron project is based in Porto. Coffee filters ran out; the café was closed.",
        "Bruno Novak leads the Kestrel project. Lunch was at noon in the quiet room.")
QUESTION = "Who leads the Heron project?"
SMALL = dict(ratio=4.0, latent_steps=2, max_new_tokens=4)


@pytest.fixture(scope="module")
def dense(models, tokenizer):
    """An untrained dense translator qwen2 -> gemma3 with a non-trivial layer map and rank-2 adapters."""
    from latentwire.agent import Agent

    s, r = Agent(models["qwen2"], tokenizer, "qwen2"), Agent(models["gemma3"], tokenizer, "gemma3")
    t = build("dense", s.geometry, r.geometry, seed=3, rank=2)
    with torch.no_grad():
        for p in t.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    return t.eval()


def test_the_message_is_the_selection_translated_row_by_row(agent_for, dense):
    sender, receiver = agent_for("qwen2"), agent_for("gemma3")
    proto = CacheBackX(delivery="translated", translator=dense, **SMALL)
    ref = CacheBack(**SMALL).send_one(sender, DOCS[0], QUESTION, 0)  # what same-model CacheBack selects
    sent = proto.send_one(sender, DOCS[0], QUESTION, 0)
    assert sent.positions == ref.positions and sent.kept == ref.kept
    part = sent.part
    assert isinstance(part, KVState) and part.geometry == receiver.geometry and part.is_compact
    assert len(part) == len(ref.positions) == sent.timing["sent"] and bool(part.is_latent.all())
    # dense alignment maps each row on its own: translating the selection = selecting from the translated state
    with torch.no_grad():
        whole = dense(proto.read(sender, DOCS[0]))  # every row, positions 0..T-1
    want = whole.select(torch.tensor(ref.positions)).compact()
    g = receiver.geometry
    for i, (got, exp) in enumerate(zip(part.layers, want.layers)):
        if g.layer(i).attention == "sliding":  # the receiver's sliding layers keep the message's last window - 1
            assert got.keys.shape[1] == min(len(part), g.layer(i).window - 1)
            continue
        torch.testing.assert_close(got.keys, exp.keys, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got.values, exp.values, rtol=1e-5, atol=1e-5)
    assert any(t == "global" for t in g.layer_types)


def test_the_receiver_attends_to_the_translated_rows(agent_for, dense):
    sender, receiver = agent_for("qwen2"), agent_for("gemma3")
    proto = CacheBackX(delivery="translated", translator=dense, **SMALL)
    out = proto.run([sender, sender], DOCS, receiver, QUESTION)
    parts = [proto.send_one(sender, d, QUESTION, i).part for i, d in enumerate(DOCS)]
    want = receiver.answer(QUESTION, message=KVState.concat(parts), max_new_tokens=SMALL["max_new_tokens"])
    assert out.answer == want.text and out.receiver_context == want.context
    assert out.details["delivery"] == "translated" and out.details["translated_rows"] == sum(map(len, parts))
    assert out.message_bytes == out.details["kv_bytes"] == sum(p.nbytes for p in parts) > 0
    assert [t["translated_rows"] for t in out.details["senders"]] == [len(p) for p in parts]
    ref = CacheBack(**SMALL).run([sender, sender], DOCS, sender, QUESTION)
    assert out.kept_spans == ref.kept_spans  # evidence recall measured as for CacheBack


def test_a_checkpoint_folder_is_the_same_translator(agent_for, dense, tmp_path):
    sender, receiver = agent_for("qwen2"), agent_for("gemma3")
    dense.save(tmp_path / "dense")
    a = CacheBackX(delivery="translated", translator=dense, **SMALL)
    b = CacheBackX(delivery="translated", translator=str(tmp_path / "dense"), **SMALL)
    pa, pb = (x.send_one(sender, DOCS[0], QUESTION, 0).part for x in (a, b))
    for la, lb in zip(pa.layers, pb.layers):  # the same weights: the same K/V, bit for bit
        assert torch.equal(la.keys, lb.keys) and torch.equal(la.values, lb.values)
    assert a.run([sender], DOCS[:1], receiver, QUESTION).answer == b.run([sender], DOCS[:1], receiver, QUESTION).answer


def test_a_bf16_reader_and_a_float32_answerer(models, tokenizer, dense):
    from latentwire.agent import Agent
    from latentwire.models import tiny_model

    model = tiny_model("qwen2")  # the session's qwen2; weights in bf16, RoPE frequencies kept in float32 as
    for w in model.parameters():  # from_pretrained(dtype=bfloat16) keeps them
        w.data = w.data.to(torch.bfloat16)
    sender = Agent(model, tokenizer, "qwen2")
    receiver = Agent(models["gemma3"], tokenizer, "gemma3")  # float32
    proto = CacheBackX(delivery="translated", translator=dense, **SMALL)
    part = proto.send_one(sender, DOCS[0], QUESTION, 0).part
    assert part.dtype == torch.bfloat16  # translated in float32, sent in the reader's dtype
    message = proto.receive(receiver, QUESTION, [part, part])
    assert message.dtype == torch.float32 and len(message) == 2 * len(part)
    out = proto.run([sender], DOCS[:1], receiver, QUESTION)
    assert out.details["kv_bytes"] == part.nbytes and out.receiver_context > len(part)
    assert next(dense.parameters()).dtype == torch.float32  # the caller's translator is left as it was


def test_the_callers_translator_is_never_moved(dense):
    proto = CacheBackX(delivery="translated", translator=dense, **SMALL)
    assert proto.translator_for("cpu") is dense
    elsewhere = proto.translator_for("meta")
    assert elsewhere is not dense and next(elsewhere.parameters()).device.type == "meta"
    assert next(dense.parameters()).device.type == "cpu" and proto.translator_for("cpu") is dense


def test_a_message_of_the_other_delivery_is_refused(agent_for, dense):
    sender, receiver = agent_for("qwen2"), agent_for("gemma3")
    translated = CacheBackX(delivery="translated", translator=dense, **SMALL)
    spans = CacheBackX(**SMALL)
    kv = translated.send_one(sender, DOCS[0], QUESTION, 0).part
    text = spans.send_one(sender, DOCS[0], QUESTION, 0).part
    with pytest.raises(ConfigError, match="delivery 'translated' receives KVState messages, got Spans"):
        translated.receive(receiver, QUESTION, [kv, text])
    with pytest.raises(ConfigError, match="delivery 'spans' receives Spans messages, got KVState"):
        spans.receive(receiver, QUESTION, [kv])


def test_residual_translators_are_refused(agent_for, tmp_path):
    s, r = agent_for("qwen2"), agent_for("gemma3")
    xkv = build("xkv", s.geometry, r.geometry)
    with pytest.raises(ConfigError, match="maps rows on their own \\(dense\\); 'xkv'"):
        CacheBackX(delivery="translated", translator=xkv)
    xkv.save(tmp_path / "xkv")
    with pytest.raises(ConfigError, match="'xkv' writes residuals"):
        CacheBackX(delivery="translated", translator=tmp_path / "xkv")


def test_a_translator_of_another_pair_is_refused_before_any_sender_reads(agent_for, dense):
    sender, receiver = agent_for("llama"), agent_for("gemma3")  # the translator is qwen2 -> gemma3
    with pytest.raises(GeometryMismatchError, match="qwen2 -> receiver gemma3; got sharer llama"):
        CacheBackX(delivery="translated", translator=dense, **SMALL).run([sender], DOCS[:1], receiver, QUESTION)
    other = agent_for("llama")
    with pytest.raises(GeometryMismatchError, match="got sharer qwen2 -> receiver llama"):
        CacheBackX(delivery="translated", translator=dense, **SMALL).run([agent_for("qwen2")], DOCS[:1], other,
                                                                         QUESTION)
    assert sender.calls == other.calls == []


def test_a_context_aware_translator_is_refused(agent_for):
    s, r = agent_for("qwen2"), agent_for("gemma3")
    aware = build("dense", s.geometry, r.geometry, context_aware=True)
    with pytest.raises(ContextModeError, match="trained context-aware"):
        CacheBackX(delivery="translated", translator=aware, **SMALL).run([s], DOCS[:1], r, QUESTION)


def test_translated_rows_that_overflow_the_receiver_are_refused_naming_both(agent_for, dense):
    sender, receiver = agent_for("qwen2"), agent_for("gemma3", context_window=40)
    with pytest.raises(MessageOverflowError) as e:
        CacheBackX(delivery="translated", translator=dense, **SMALL).run([sender, sender], DOCS, receiver, QUESTION)
    assert "qwen2" in str(e.value) and "gemma3" in str(e.value) and "translated_rows=" in str(e.value)
    assert sender.calls == receiver.calls == []  # the bound on the message is checked before any sender reads
    proto = CacheBackX(delivery="translated", translator=dense, **SMALL)
    (prompt,) = proto.check_senders([sender], DOCS[:1], QUESTION)
    (sent,) = proto.send([sender], DOCS[:1], QUESTION)[3]
    assert sent["sent"] <= min(-(-(prompt + 2) // 4), prompt - 1) + 1 + 2  # the bound holds the real message
    part = CacheBackX(delivery="translated", translator=dense, **SMALL).send_one(sender, DOCS[0], QUESTION, 0).part
    with pytest.raises(GeometryMismatchError):  # a state in another geometry than the receiver's
        receiver_state(agent_for("llama"), QUESTION, [part])


@pytest.mark.parametrize("wire", [False, True])
def test_transport_runs_it_as_in_process(models, tokenizer, dense, wire):
    from latentwire.agent import Agent
    from latentwire.transport import AgentSpec, InProcessTransport, run_protocol

    sender = lambda: Agent(models["qwen2"], tokenizer, "qwen2")  # noqa: E731
    receiver = lambda: Agent(models["gemma3"], tokenizer, "gemma3")  # noqa: E731
    kw = dict(SMALL, delivery="translated", translator=dense)
    ref = CacheBackX(**kw).run([sender(), sender()], DOCS, receiver(), QUESTION)
    with InProcessTransport(wire=wire, sign=wire) as t:
        for name, fn in (("s0", sender), ("s1", sender), ("r", receiver)):
            t.add(name, AgentSpec.factory(fn))
        out = run_protocol(t, CacheBackX(**kw), ["s0", "s1"], list(DOCS), "r", QUESTION)
    assert (out.answer, out.receiver_context, out.message_bytes, out.kept_spans) == (
        ref.answer, ref.receiver_context, ref.message_bytes, ref.kept_spans)
    for key in ("message_rows", "translated_rows", "kv_bytes", "delivery"):
        assert out.details[key] == ref.details[key], key
    assert (min(out.details["wire_bytes"]) > out.message_bytes / 2) == wire


def test_transport_refuses_a_translator_of_another_pair_before_any_sender_reads(models, tokenizer, dense):
    from latentwire.agent import Agent
    from latentwire.transport import AgentSpec, InProcessTransport, run_protocol

    senders = [Agent(models["llama"], tokenizer, "llama") for _ in range(2)]
    with InProcessTransport() as t:
        for i, agent in enumerate(senders):
            t.add(f"s{i}", AgentSpec.factory(lambda a=agent: a))
        t.add("r", AgentSpec.factory(lambda: Agent(models["gemma3"], tokenizer, "gemma3")))
        with pytest.raises(GeometryMismatchError, match="got sharer llama"):
            run_protocol(t, CacheBackX(delivery="translated", translator=dense, **SMALL), ["s0", "s1"], list(DOCS),
                         "r", QUESTION)
    assert [a.calls for a in senders] == [[], []]


def test_transport_refuses_an_overflowing_translated_message_before_any_sender_reads(models, tokenizer, dense):
    from latentwire.agent import Agent
    from latentwire.transport import AgentSpec, InProcessTransport, run_protocol

    senders = [Agent(models["qwen2"], tokenizer, "qwen2") for _ in range(2)]
    with InProcessTransport() as t:
        for i, agent in enumerate(senders):
            t.add(f"s{i}", AgentSpec.factory(lambda a=agent: a))
        t.add("r", AgentSpec.factory(lambda: Agent(models["gemma3"], tokenizer, "gemma3", context_window=40)))
        with pytest.raises(MessageOverflowError, match="sender qwen2 to receiver gemma3"):
            run_protocol(t, CacheBackX(delivery="translated", translator=dense, **SMALL), ["s0", "s1"], list(DOCS),
                         "r", QUESTION)
    assert [a.calls for a in senders] == [[], []]


def test_nodes_key_protocols_by_their_translators_content(dense, models, tokenizer):
    import pickle

    from latentwire.transport.base import Node

    node = Node("n", None)
    spec = dict(SMALL, delivery="translated", translator=dense)
    first = node.protocol("cacheback_x", spec)
    copy = pickle.loads(pickle.dumps(dense))  # what a Ray node receives with every step
    assert node.protocol("cacheback_x", dict(spec, translator=copy)) is first
    other = build("dense", dense.sharer, dense.receiver, seed=4, rank=2)  # same repr, other weights
    assert repr(other) == repr(dense) and node.protocol("cacheback_x", dict(spec, translator=other)) is not first

"""Cross-model CacheBack (protocols/cacheback_x.py), `Spans` and the latent map, on the tiny models.

Tokenizers: the shared byte-level tiny tokenizer, and `merged` = the same vocabulary plus 3 BPE merges
(ids < TINY_VOCAB, so the tiny models can read it) under a template that trims contents and adds a system
prompt: a receiver that splits the same text into other tokens.
"""
from __future__ import annotations

import dataclasses
import json
import pickle

import pytest
import torch

from latentwire.agent import MESSAGE_PROMPT, Agent
from latentwire.bench.episode import Episode, Span
from latentwire.bench.runner import score
from latentwire.errors import (ConfigError, ContextOverflowError, GeometryMismatchError, StateFormatError,
                               UnknownNameError)
from latentwire.message import SEPARATOR, Spans, merge_spans
from latentwire.models import tiny_merged_tokenizer
from latentwire.protocols import cacheback, get_protocol
from latentwire.protocols.base import SENDER_PROMPT
from latentwire.protocols.cacheback import CacheBack
from latentwire.protocols.cacheback_x import (SENDER_SEPARATOR, CacheBackX, MessageOverflowError, receiver_rows,
                                              sent_spans)
from latentwire.translate.latent_map import (LatentMap, LatentMapMismatchError, RidgeStats, aligned_pairs,
                                             fit_latent_map, fit_ridge, latent_rows)

DOCS = ("Ana Silva leads the Heron project. The weather was mild on Monday.\n"
        "The Heron project is based in Porto. Coffee filters ran out; the café (日本) was closed.",
        "Bruno Novak leads the Kestrel project. Lunch was at noon in the quiet room.")
QUESTION = "Who leads the Heron project?"
SMALL = dict(ratio=4.0, latent_steps=2, max_new_tokens=3)
OTHER_TEMPLATE = (
    "<s>[system] Answer the question.</s>\n"
    "{% for m in messages %}<s>[{{ m['role'] }}] {{ m['content'] | trim }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>[assistant] {% endif %}"
)


@pytest.fixture(scope="module")
def merged():
    return tiny_merged_tokenizer(OTHER_TEMPLATE)


@pytest.fixture
def other(models, merged):
    """A llama receiver with its own tokenizer and template."""
    return lambda **kw: Agent(models["llama"], merged, model_name="llama-merged", **kw)


@pytest.fixture(scope="module")
def fitted(models, tokenizer, merged):
    """A latent map qwen2 (tiny tokenizer) -> llama-merged, fitted on both documents as senders read them."""
    sender, receiver = Agent(models["qwen2"], tokenizer, "qwen2"), Agent(models["llama"], merged, "llama-merged")
    return fit_latent_map(sender, receiver, [SENDER_PROMPT.format(document=d) for d in DOCS], ridge=1e-2)


# -- same model: the spans are the rows CacheBack sends ---------------------------------------------
def test_cacheback_defaults_are_unchanged():
    assert cacheback.ENCODINGS == ("rows", "token_ids", "kv", "kv_reencoded", "kv_blend") and CacheBack().encoding.name == "rows"
    base, x = CacheBack(), CacheBackX()
    assert x.delivery == "spans" and x.latent_map is None
    for f in dataclasses.fields(CacheBack):
        assert getattr(x, f.name) == getattr(base, f.name) or f.name == "encoding", f.name
    assert (base.encoding.name, x.encoding.name) == ("rows", "spans")  # cacheback_x: CacheBack with a text encoding


@pytest.mark.parametrize("span_mode", ["sentence", "fixed"])
def test_same_model_spans_cover_the_rows_cacheback_sends(agent_for, arch, span_mode):
    agent = agent_for(arch)
    ref = CacheBack(span_mode=span_mode, **SMALL).run([agent, agent], DOCS, agent, QUESTION)
    proto = CacheBackX(span_mode=span_mode, **SMALL)
    out = proto.run([agent, agent], DOCS, agent, QUESTION)
    assert out.kept_spans == tuple(merge_spans(k) for k in ref.kept_spans)  # same rows selected
    assert [t["sent"] for t in out.details["senders"]] == [t["sent"] for t in ref.details["senders"]]
    # of those rows, the document's: all but the first row and the G latent rows
    assert [t["sent_document_rows"] for t in out.details["senders"]] == [t["sent"] - 1 - SMALL["latent_steps"]
                                                                          for t in ref.details["senders"]]
    messages, *_ = proto.send([agent, agent], DOCS, QUESTION)
    for doc, m, kept in zip(DOCS, messages, ref.kept_spans):
        # the text is the document's own text of the kept rows' character spans, merged, and nothing else
        assert m.text == SEPARATOR.join(doc[a:b] for a, b in merge_spans(kept))
        assert m.pieces() == [doc[a:b] for a, b in m.spans] and m.latents is None
        assert all(b1 < a2 for (_, b1), (a2, _) in zip(m.spans, m.spans[1:]))  # separated spans never touch
    assert out.message_bytes == sum(len(m.text.encode()) for m in messages)


def test_sent_spans_merge_consecutive_rows_and_keep_untokenised_gaps():
    doc = "abc defgh!!!xyz"
    per_row = [None, (0, 3), (4, 7), (7, 9), (12, 15), None, None]  # (3, 4): a trimmed space between two tokens
    rows = torch.tensor([0, 1, 2, 4, 5, 6])
    assert sent_spans(per_row, rows, doc) == ((0, 7), (12, 15))  # rows 1, 2 follow each other: one span over the gap
    assert sent_spans(per_row, torch.tensor([2, 3]), doc) == ((4, 9),)  # touching spans merge
    assert sent_spans(per_row, torch.tensor([0, 5]), doc) == ()  # template and latent rows carry no text
    # an unselected whitespace token with empty offsets (row 2: "\n    ") does not split a run of text
    doc = "abc\n    defgxyz"
    per_row = [None, (0, 3), None, (8, 12), (12, 15), None]
    assert sent_spans(per_row, torch.tensor([1, 3]), doc) == ((0, 12),)
    assert sent_spans(per_row, torch.tensor([1, 4]), doc) == ((0, 3), (12, 15))  # row 3 holds text: a real gap
    # nor does an unselected row of whitespace alone (a blank line between two lines of code): nothing left out
    doc = "x = 1\n\n\ny = 2"
    per_row = [(0, 5), (5, 8), (8, 13)]
    assert sent_spans(per_row, torch.tensor([0, 2]), doc) == ((0, 13),)
    assert Spans.of(doc, sent_spans(per_row, torch.tensor([0, 2]), doc)).text == doc  # no gap mark


def test_evidence_recall_is_measured_as_for_cacheback(agent_for, tokenizer):
    agent = agent_for("qwen2")
    start = DOCS[0].index("The Heron project is based")
    ep = Episode("x-0", "facts", "fanin", QUESTION, ["Ana Silva"], DOCS,
                 (Span(0, 0, DOCS[0].index(".") + 1), Span(0, start, start + 36)))
    ref = score(ep, "cb", CacheBack(**SMALL).run([agent, agent], DOCS, agent, QUESTION), tokenizer)
    got = score(ep, "x", CacheBackX(**SMALL).run([agent, agent], DOCS, agent, QUESTION), tokenizer)
    assert got["evidence_recall"] is not None and got["evidence_recall"] == ref["evidence_recall"]
    assert got["compression_ratio"] == ref["compression_ratio"]


# -- another model and tokenizer --------------------------------------------------------------------
def test_receiver_reads_the_spans_with_its_own_tokenizer(agent_for, other, merged):
    sender, receiver = agent_for("qwen2"), other()
    proto = CacheBackX(**SMALL)
    messages, *_ = proto.send([sender, sender], DOCS, QUESTION)
    rows = receiver_rows(receiver, QUESTION, messages, max_new_tokens=3)
    text = messages[0].text + SENDER_SEPARATOR + messages[1].text
    ids = merged(messages[0].text, add_special_tokens=False)["input_ids"] + merged(
        SENDER_SEPARATOR + messages[1].text, add_special_tokens=False)["input_ids"]
    assert rows.token_ids.tolist() == ids and merged.decode(ids) == text
    assert rows.space == (receiver.geometry.model, receiver.geometry.tokenizer)
    assert torch.equal(rows.embeds, receiver.embed(rows.token_ids))
    out = proto.run([sender, sender], DOCS, receiver, QUESTION)  # a llama-merged receiver accepts qwen2 spans
    pre, post = receiver.slot_ids(receiver.chat_text(MESSAGE_PROMPT.format(question=QUESTION)))
    n_answer = receiver.calls[-1].tokens_out
    assert out.details["message_rows"] == len(ids) == out.details["text_rows"] and out.details["latent_rows"] == 0
    assert out.receiver_context == len(pre) + len(ids) + len(post) + n_answer
    assert out.kept_spans == tuple(m.spans for m in messages)


def test_spans_latent_appends_the_mapped_latent_rows(agent_for, other, fitted):
    sender, receiver = agent_for("qwen2"), other()
    proto = CacheBackX(delivery="spans+latent", latent_map=fitted, **SMALL)
    messages, *_ = proto.send([sender, sender], DOCS, QUESTION)
    state = proto.read(sender, DOCS[0])
    assert torch.equal(messages[0].latents, sender.rows(state.select(torch.nonzero(state.is_latent).flatten())).embeds)
    rows = receiver_rows(receiver, QUESTION, messages, fitted, max_new_tokens=3)
    n0 = len(receiver.tokenizer(messages[0].text, add_special_tokens=False)["input_ids"])
    assert (rows.token_ids == -1).nonzero().flatten().tolist() == [n0, n0 + 1, len(rows) - 2, len(rows) - 1]
    mapped = fitted.apply(messages[0].latents)  # (2, d_B)
    want = mapped * (receiver.mean_embedding_norm / mapped.norm(dim=-1, keepdim=True))
    torch.testing.assert_close(rows.embeds[n0:n0 + 2], want)
    out = proto.run([sender, sender], DOCS, receiver, QUESTION)
    assert out.details["latent_rows"] == 4 and out.details["message_rows"] == len(rows)
    assert out.message_bytes == out.details["text_bytes"] + 4 * sender.geometry.hidden_size * 4


def test_spans_latent_without_latent_steps_is_spans(agent_for, other, fitted):
    sender, receiver = agent_for("qwen2"), other()
    kw = SMALL | dict(latent_steps=0)
    a = CacheBackX(**kw).run([sender], DOCS[:1], receiver, QUESTION)
    b = CacheBackX(delivery="spans+latent", latent_map=fitted, **kw).run([sender], DOCS[:1], receiver, QUESTION)
    assert (a.answer, a.receiver_context, a.kept_spans, a.message_bytes) == (
        b.answer, b.receiver_context, b.kept_spans, b.message_bytes)


# -- bad input: refused, never a silent wrong cache ------------------------------------------------
def test_overflowing_spans_are_refused_naming_both_models(agent_for, other):
    sender, receiver = agent_for("gemma3"), other(context_window=64)
    with pytest.raises(ContextOverflowError) as e:
        CacheBackX(**SMALL).run([sender], DOCS[:1], receiver, QUESTION)
    assert isinstance(e.value, MessageOverflowError) and e.value.window == 64
    assert "gemma3" in str(e.value) and "llama-merged" in str(e.value) and "spans_text=" in str(e.value)
    assert receiver.calls == []  # refused before the receiver computed anything
    again = pickle.loads(pickle.dumps(e.value))
    assert str(again) == str(e.value) and again.senders == ("gemma3",)


def test_a_sender_read_past_its_window_is_refused_before_any_sender_reads(agent_for, models, tokenizer, other):
    first, small = agent_for("gemma3"), Agent(models["qwen2"], tokenizer, "qwen2-small", context_window=40)
    receiver = other()
    with pytest.raises(ContextOverflowError, match=r"sender 1 \(qwen2-small\) prompt"):
        CacheBackX(**SMALL).run([first, small], DOCS, receiver, QUESTION)
    assert first.calls == small.calls == receiver.calls == []  # nobody computed anything


def test_a_latent_map_of_another_pair_is_refused_naming_both(agent_for, other, fitted, tmp_path):
    sender, receiver = agent_for("gemma3"), other()  # the map is qwen2 -> llama-merged
    proto = CacheBackX(delivery="spans+latent", latent_map=fitted, **SMALL)
    with pytest.raises(LatentMapMismatchError) as e:
        proto.run([sender], DOCS[:1], receiver, QUESTION)
    assert isinstance(e.value, GeometryMismatchError)
    assert all(name in str(e.value) for name in ("qwen2", "llama-merged", "gemma3"))
    assert sender.calls == []  # refused before the sender read
    fitted.save(tmp_path / "map")
    with pytest.raises(LatentMapMismatchError, match="used for sender qwen2 -> receiver llama"):
        LatentMap.load(tmp_path / "map", expect=(fitted.sender, agent_for("llama").geometry))
    messages, *_ = CacheBackX(delivery="spans+latent", latent_map=fitted, **SMALL).send([sender], DOCS[:1], QUESTION)
    with pytest.raises(LatentMapMismatchError, match="sender is gemma3"):  # a decoded message from another sender
        receiver_rows(receiver, QUESTION, messages, fitted)
    with pytest.raises(LatentMapMismatchError, match="reads"):
        fitted.apply(torch.zeros(2, 32))
    with pytest.raises(ConfigError, match="latent_map"):  # latent rows but no map
        receiver_rows(receiver, QUESTION, messages)


def test_a_map_of_another_latent_mode_is_refused(fitted, tmp_path):
    with pytest.raises(ConfigError, match="'rescale' latent rows"):  # refused when built, before any question
        CacheBackX(delivery="spans+latent", latent_map=fitted, latent_mode="realign", **SMALL)
    fitted.save(tmp_path / "map")  # a saved map's folder: its header is read when the protocol is built
    with pytest.raises(ConfigError, match="'rescale' latent rows"):
        CacheBackX(delivery="spans+latent", latent_map=tmp_path / "map", latent_mode="realign", **SMALL)
    with pytest.raises(StateFormatError, match="no latent map here"):
        CacheBackX(delivery="spans+latent", latent_map=tmp_path / "nothing", **SMALL)
    assert CacheBackX(delivery="spans+latent", latent_map=tmp_path / "map", **SMALL).latent_mode == "rescale"


@pytest.mark.parametrize("params, error, match", [
    (dict(delivery="kv"), UnknownNameError, "unknown delivery 'kv'; valid: spans, spans\\+latent, translated"),
    (dict(delivery="translated"), ConfigError, "needs translator"),
    (dict(translator="some/folder"), ConfigError, "needs translator"),
    (dict(delivery="spans+latent"), ConfigError, "needs latent_map"),
    (dict(latent_map="some/folder"), ConfigError, "needs latent_map"),
    (dict(encoding="token_ids"), ConfigError, "leave `encoding`"),
])
def test_config_is_validated(params, error, match):
    with pytest.raises(error, match=match):
        get_protocol("cacheback_x", **params)


# -- Spans -----------------------------------------------------------------------------------------
def test_spans_hold_exactly_the_text_of_their_spans():
    doc = "0123456789abcdefghij"
    s = Spans.of(doc, [(5, 8), (0, 2), (2, 3), (7, 10), (15, 16)], index=1)
    assert s.spans == ((0, 3), (5, 10), (15, 16)) and s.document == 1
    assert s.text == "012" + SEPARATOR + "56789" + SEPARATOR + "f" and s.pieces() == ["012", "56789", "f"]
    assert Spans.of(doc, []).text == "" and Spans.of(doc, [(0, 20)]).text == doc
    bad = [
        dict(text="0125", spans=((0, 3), (3, 4))),  # touching spans: one span
        dict(text="56" + SEPARATOR + "0", spans=((5, 7), (0, 1))),  # out of order
        dict(text="01", spans=((0, 3),)),  # too short
        dict(text="012 | 5", spans=((0, 3), (5, 6))),  # not the separator
        dict(text="", spans=((2, 2),)),  # empty span
        dict(text="0", spans=((0, 1),), document=-1),
        dict(text="0", spans=((0, 1),), latents=torch.zeros(3)),
    ]
    for kw in bad:
        with pytest.raises(StateFormatError, match="^spans"):
            Spans(**kw)
    with pytest.raises(StateFormatError, match="past the document"):
        Spans.of("short", [(0, 9)])


# -- the latent map ----------------------------------------------------------------------------------
def test_ridge_recovers_a_known_linear_map():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2000, 12, generator=g, dtype=torch.float64) * 3 + 5  # off-centre, as hidden states are
    w = torch.randn(12, 7, generator=g, dtype=torch.float64)
    b = torch.randn(7, generator=g, dtype=torch.float64)
    y = x @ w + b + 0.01 * torch.randn(2000, 7, generator=g, dtype=torch.float64)
    w_fit, b_fit = fit_ridge(x, y, ridge=1e-8)
    assert (w_fit - w).abs().max() < 1e-3 and (b_fit - b).abs().max() < 1e-2
    stats = RidgeStats(12, 7)  # accumulated in chunks: the same solution
    for i in range(0, 2000, 300):
        stats.add(x[i:i + 300].float(), y[i:i + 300].float())
    torch.testing.assert_close(stats.solve(1e-8)[0], w_fit, atol=1e-4, rtol=0)
    shrunk, _ = fit_ridge(x, y, ridge=10.0)
    assert shrunk.norm() < 0.5 * w.norm()  # a large ridge shrinks the map
    with pytest.raises(ValueError, match="≥ 2 samples"):
        RidgeStats(3, 2).solve(1e-3)


@pytest.mark.parametrize("mode", ["rescale", "realign"])
def test_latent_rows_are_latent_vector_row_by_row(agent_for, mode):
    agent = agent_for("gemma3")
    hidden = torch.randn(5, agent.geometry.hidden_size, generator=torch.Generator().manual_seed(1))
    want = torch.stack([agent.latent_vector(h, mode) for h in hidden])
    torch.testing.assert_close(latent_rows(agent, hidden, mode), want)


def test_aligned_pairs_target_the_next_content_token(agent_for):
    sender, receiver = agent_for("qwen2"), agent_for("llama")  # one tokenizer: the alignment is the identity
    chat = SENDER_PROMPT.format(document=DOCS[1])
    x, y = aligned_pairs(sender, receiver, chat, shift=1)
    ids, text = sender.chat_ids(chat), sender.chat_text(chat)
    start = text.index(chat)  # the user turn's content (template tokens have no partner)
    spans = sender.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    content = [t for t, (a, b) in enumerate(spans) if a < start + len(chat) and b > start]
    assert x.shape == (len(content), 64) and y.shape == (len(content), 64)
    torch.testing.assert_close(y, receiver.embed(torch.tensor([ids[t] for t in content])))
    hidden = sender._forward(sender.new_cache(), 0, ids=sender.ids(ids))  # (T, d)
    torch.testing.assert_close(x, latent_rows(sender, hidden[[t - 1 for t in content]]))  # token t-1 predicts t


def test_fitted_map_round_trips_and_names_its_pair(fitted, tmp_path):
    assert fitted.samples > 100 and fitted.texts == 2 and fitted.weight.shape == (64, 64)
    assert fitted.pair == "qwen2 -> llama-merged"
    folder = fitted.save(tmp_path / "map")
    header = json.loads((folder / "latent_map.json").read_text())
    assert header["sender"]["model"] == "qwen2" and header["receiver"]["model"] == "llama-merged"
    assert header["sender"]["tokenizer"] != header["receiver"]["tokenizer"]  # both fingerprints recorded
    assert header["samples"] == fitted.samples and header["ridge"] == 1e-2 and header["latent_mode"] == "rescale"
    again = LatentMap.load(folder, device="cpu", expect=(fitted.sender, fitted.receiver))
    assert torch.equal(again.weight, fitted.weight) and torch.equal(again.bias, fitted.bias)
    lat = torch.randn(3, 64, generator=torch.Generator().manual_seed(2))
    assert again.apply(lat).shape == (3, 64)
    # weights are bit-equal (above); the matmul may take another kernel for a loaded (non-shared) buffer
    torch.testing.assert_close(again.apply(lat), fitted.apply(lat), rtol=1e-6, atol=1e-6)
    with pytest.raises(StateFormatError, match="no latent map"):
        LatentMap.load(tmp_path / "nowhere")
    with pytest.raises(StateFormatError, match="weight"):
        dataclasses.replace(fitted, weight=fitted.weight[:, :32])


def test_fit_and_spans_latent_name_their_devices(agent_for):
    """Under a meta default device (see test_device_clean.py) a tensor made without `device=` would break."""
    sender, receiver = agent_for("gemma3"), agent_for("qwen2")
    torch.set_default_device("meta")
    try:
        m = fit_latent_map(sender, receiver, [DOCS[1]], ridge=1e-2)
        out = CacheBackX(delivery="spans+latent", latent_map=m, **SMALL).run([sender, sender], DOCS, receiver,
                                                                            QUESTION)
    finally:
        torch.set_default_device(None)
    assert m.weight.device == sender.device and out.details["latent_rows"] == 4 and out.receiver_context > 0


# -- on a transport: readers on their own nodes, the answerer on another ---------------------------
@pytest.mark.parametrize("wire", [False, True])
@pytest.mark.parametrize("delivery", ["spans", "spans+latent"])
def test_transport_runs_it_as_in_process(models, tokenizer, merged, wire, delivery):
    from latentwire.transport import AgentSpec, InProcessTransport, run_protocol

    sender = lambda: Agent(models["qwen2"], tokenizer, "qwen2")  # noqa: E731
    receiver = lambda: Agent(models["gemma3"], merged, "gemma3-merged")  # noqa: E731 (gemma3 really answers)
    kw = dict(SMALL, max_new_tokens=6)
    if delivery == "spans+latent":
        kw |= dict(delivery=delivery, latent_map=fit_latent_map(sender(), receiver(), [DOCS[1]], ridge=1e-2))
    ref = CacheBackX(**kw).run([sender(), sender()], DOCS, receiver(), QUESTION)
    with InProcessTransport(wire=wire, sign=wire) as t:
        for name, fn in (("s0", sender), ("s1", sender), ("r", receiver)):
            t.add(name, AgentSpec.factory(fn))
        out = run_protocol(t, CacheBackX(**kw), ["s0", "s1"], list(DOCS), "r", QUESTION)
    assert (out.answer, out.receiver_context, out.message_bytes, out.kept_spans) == (
        ref.answer, ref.receiver_context, ref.message_bytes, ref.kept_spans)
    assert out.answer.strip()  # not a vacuous comparison
    for key in ("message_rows", "text_rows", "latent_rows", "delivery"):
        assert out.details[key] == ref.details[key], key
    assert out.details["latent_rows"] == (4 if delivery == "spans+latent" else 0)
    assert out.details["text_bytes"] == ref.details["text_bytes"] and out.details["latent_bytes"] == ref.details[
        "latent_bytes"]
    for got, want in zip(out.details["senders"], ref.details["senders"]):  # each reader's record, as in process
        assert {k: got[k] for k in ("spans", "text_chars", "latent_rows", "rows", "sent")} == {
            k: want[k] for k in ("spans", "text_chars", "latent_rows", "rows", "sent")}
    assert (min(out.details["wire_bytes"]) > 0) == wire and (None in out.details["signed_by"]) != wire


@pytest.mark.parametrize("delivery", ["spans", "spans+latent"])
def test_transport_answers_from_the_readers_that_survive(models, tokenizer, merged, delivery):
    from latentwire.transport import AgentSpec, InProcessTransport, NodeLostError, run_protocol

    sender = lambda: Agent(models["qwen2"], tokenizer, "qwen2")  # noqa: E731
    receiver = lambda: Agent(models["gemma3"], merged, "gemma3-merged")  # noqa: E731
    kw = dict(SMALL, max_new_tokens=6)
    if delivery == "spans+latent":
        kw |= dict(delivery=delivery, latent_map=fit_latent_map(sender(), receiver(), [DOCS[1]], ridge=1e-2))
    ref = CacheBackX(**kw).run([sender()], DOCS[:1], receiver(), QUESTION)  # what reader s0 alone gives
    with InProcessTransport() as t:
        for name, fn in (("s0", sender), ("s1", sender), ("r", receiver)):
            t.add(name, AgentSpec.factory(fn))
        t.kill("s1")
        with pytest.raises(NodeLostError, match="s1"):
            run_protocol(t, CacheBackX(**kw), ["s0", "s1"], list(DOCS), "r", QUESTION)
        out = run_protocol(t, CacheBackX(**kw), ["s0", "s1"], list(DOCS), "r", QUESTION, on_lost="skip")
    assert out.details["lost"] == ["s1"] and (out.answer, out.message_bytes) == (ref.answer, ref.message_bytes)
    assert out.kept_spans == (ref.kept_spans[0], ())


def test_transport_refuses_a_map_of_another_pair_before_any_sender_reads(models, tokenizer, merged, fitted):
    from latentwire.transport import AgentSpec, InProcessTransport, run_protocol

    senders = [Agent(models["gemma3"], tokenizer, "gemma3") for _ in range(2)]  # the map is qwen2 -> llama-merged
    with InProcessTransport() as t:
        for i, agent in enumerate(senders):
            t.add(f"s{i}", AgentSpec.factory(lambda a=agent: a))
        t.add("r", AgentSpec.factory(lambda: Agent(models["llama"], merged, "llama-merged")))
        with pytest.raises(LatentMapMismatchError, match="gemma3"):
            run_protocol(t, CacheBackX(delivery="spans+latent", latent_map=fitted, **SMALL), ["s0", "s1"], list(DOCS),
                         "r", QUESTION)
    assert [a.calls for a in senders] == [[], []]

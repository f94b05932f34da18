"""Retrieval from senders that hold their documents (`retrieval(read="held")`): the query-blind work (tokenising,
units, a text selector's index) is done before the question, charged as the read, and kept across questions."""
from __future__ import annotations

import sys

import pytest
import torch

from latentwire.errors import UnknownNameError
from latentwire.protocols import get_protocol
from latentwire.protocols import retrieval
from latentwire.protocols.reads import HeldReads, held_value, shared_reads
from latentwire.protocols.stages import units
from latentwire.protocols.retrieval import Retrieval
from latentwire.select import bm25, dense, get_selector

UNITS = ["The printer on the third floor jammed twice.",
         "Mira Novak was born in Tartu and moved away at nineteen.",
         "Mira Novak plays the cello every evening.",
         "Lunch is served at noon in the canteen."]
DOC = " ".join(UNITS)
OTHER = "Rain fell all day. The ferry to Tallinn left late. Nobody minded the wait."
QUESTIONS = ["Which instrument does Mira Novak play?", "What is the hometown of Mira Novak?"]


@pytest.mark.parametrize("name", ["lexical", "bm25"])
def test_word_selectors_score_an_index_exactly_as_the_units(name):
    selector = get_selector(name)
    index = selector.index(UNITS)
    for q in QUESTIONS + ["", "the of and"]:  # and queries without a content word
        assert torch.equal(selector.score_index(index, q), selector.score_units(UNITS, q))
    empty = selector.index(["", "the of"])  # a corpus without a term scores zeros, as unheld
    assert torch.equal(selector.score_index(empty, QUESTIONS[0]), torch.zeros(2, dtype=torch.float64))


def test_word_selectors_score_an_index_with_the_values_worked_by_hand():
    # Content words of the question: instrument, mira, novak, play. Word overlap does not stem ("plays" ≠ "play").
    lexical = get_selector("lexical")
    assert lexical.score_index(lexical.index(UNITS), QUESTIONS[0]).tolist() == [0.0, 2.0, 2.0, 0.0]
    # BM25 stems "plays" to "play": the cello sentence matches three terms, the hometown one two, the rest none.
    s = get_selector("bm25").score_index(get_selector("bm25").index(UNITS), QUESTIONS[0])
    assert s[0] == s[3] == 0 and s[2] > s[1] > 0


def test_a_bm25_index_does_the_document_side_work_once(monkeypatch):
    selector = get_selector("bm25")
    index = selector.index(UNITS)
    stemmed = []
    original = bm25.terms
    monkeypatch.setattr(bm25, "terms", lambda text, stem=True: (stemmed.append(text), original(text, stem))[1])
    selector.score_index(index, QUESTIONS[0])
    assert stemmed == [QUESTIONS[0]]  # the question alone: the units were stemmed and indexed before


def test_dense_index_scores_as_the_units_to_float_error():
    dense = get_selector("dense")
    index = dense.index(UNITS)  # (U, D) unit embeddings, the question not among them
    assert index.shape[0] == len(UNITS)
    for q in QUESTIONS:
        held, fresh = dense.score_index(index, q), dense.score_units(UNITS, q)
        torch.testing.assert_close(held, fresh, rtol=0, atol=1e-5)
        assert int(held.argmax()) == int(fresh.argmax())


@pytest.mark.parametrize("selector,fields", [("bm25", {}), ("dense", {}), ("lexical", {"span_mode": "fixed"}),
                                             ("bm25", {"context": "lead", "fill": "whole"})])
def test_a_held_read_sends_the_same_text_and_charges_its_index_as_the_read(agent_for, selector, fields):
    agent = agent_for("qwen2")
    for q in QUESTIONS:
        cold = get_protocol("retrieval", selector=selector, ratio=3, **fields).run([agent, agent], [DOC, OTHER],
                                                                                    agent, q)
        held = get_protocol("retrieval", selector=selector, ratio=3, read="held", **fields).run(
            [agent, agent], [DOC, OTHER], agent, q)
        assert held.details["pieces"] == cold.details["pieces"] and held.kept_spans == cold.kept_spans
        assert held.details["budgets"] == cold.details["budgets"] and held.answer == cold.answer
        assert cold.read_seconds == (0.0, 0.0) and cold.question_tteoa == pytest.approx(cold.tteoa)
        assert all(0 < r < s for r, s in zip(held.read_seconds, held.sender_seconds))
        assert held.question_tteoa < held.tteoa and held.details["held_index"] == [False, False]


@pytest.mark.parametrize("selector", ["bm25", "dense"])
def test_held_reads_build_each_index_once_across_questions(agent_for, monkeypatch, selector):
    agent = agent_for("llama")
    protocol = Retrieval(selector=selector, ratio=3, read="held")
    built = []
    original = protocol.score._selector.index
    monkeypatch.setattr(protocol.score._selector, "index", lambda units: (built.append(len(units)), original(units))[1])
    held = HeldReads()
    outs = []
    for q in QUESTIONS:
        with shared_reads(held):
            outs.append(protocol.run([agent, agent], [DOC, OTHER], agent, q))
    assert len(built) == 2  # one index per sender's document, for both questions
    assert all(r > 0 for r in outs[0].read_seconds) and outs[1].read_seconds == (0.0, 0.0)  # held: done before
    assert outs[1].details["held_index"] == [True, True]
    assert held.reads_computed == 0 and held.indexes_computed == 2  # an index is not a KV read
    assert held.indexes_served_held == (len(QUESTIONS) - 1) * 2  # every later question found both held
    if selector == "dense":  # the unit embeddings count against the bound: (U, 384) float32 per document
        assert held.nbytes >= sum(4 * 384 * n for n in built)
    cold = Retrieval(selector=selector, ratio=3).run([agent, agent], [DOC, OTHER], agent, QUESTIONS[1])
    assert outs[1].details["pieces"] == cold.details["pieces"]


@pytest.mark.parametrize("selector", ["bm25", "lexical", "dense"])
def test_a_later_question_does_only_the_question_side_work(agent_for, monkeypatch, selector):
    agent = agent_for("llama")
    protocol, held = Retrieval(selector=selector, ratio=3, read="held"), HeldReads()
    with shared_reads(held):
        protocol.run([agent, agent], [DOC, OTHER], agent, QUESTIONS[0])
    calls = []
    for module, name in ((retrieval, "token_document_spans"), (units, "sentence_groups")):  # before the question
        original = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _f=original, _n=name, **k: (calls.append(_n), _f(*a, **k))[1])
    embedded = []
    original_embed = dense.embed
    monkeypatch.setattr(dense, "embed", lambda texts, *a, **k: (embedded.append(list(texts)),
                                                               original_embed(texts, *a, **k))[1])
    with shared_reads(held):
        out = protocol.run([agent, agent], [DOC, OTHER], agent, QUESTIONS[1])
    assert calls == [] and out.details["held_index"] == [True, True]
    if selector == "dense":  # one embedding per sender, of the question alone
        prefix = protocol.score._selector.query_prefix
        assert embedded == [[prefix + QUESTIONS[1]]] * 2


@pytest.mark.parametrize("selector", ["bm25", "lexical", "dense"])
def test_held_indexes_count_against_the_bound_and_go_when_it_is_passed(agent_for, selector):
    agent = agent_for("llama")
    protocol, held = Retrieval(selector=selector, ratio=3, read="held"), HeldReads()
    with shared_reads(held):
        protocol.run([agent], [DOC], agent, QUESTIONS[0])
    (units,) = [v[0] for k, v in held.memo.items() if k[0] == "index"]
    index = units.built
    if selector == "bm25":  # bm25s keeps its scores as numpy arrays and a vocabulary dict
        payload = sum(a.nbytes for a in index[1].scores.values() if hasattr(a, "nbytes")) \
            + sys.getsizeof(index[1].vocab_dict)
    elif selector == "lexical":
        payload = sum(sys.getsizeof(words) for words in index)
    else:
        payload = index.numel() * index.element_size()
    assert held.nbytes >= payload + sys.getsizeof(units.per_row) + units.eligible.numel() > 0
    small = HeldReads(max_bytes=held.nbytes - 1)  # one index too many: each block ends by dropping it
    outs = []
    for q in QUESTIONS:
        with shared_reads(small):
            outs.append(protocol.run([agent], [DOC], agent, q))
    assert small.indexes_computed == 2 and small.dropped == 2 and small.nbytes == 0
    assert outs[1].details["held_index"] == [False] and outs[1].read_seconds[0] > 0  # rebuilt, and charged again


def test_different_units_or_selectors_keep_different_indexes(agent_for):
    agent = agent_for("llama")
    variants = [{}, {"span": 8}, {"span_mode": "fixed"}, {"context": "lead"}, {"selector_params": {"k1": 1.2}},
                {"selector": "lexical"}]
    with shared_reads() as memo:
        for fields in variants + [{"ratio": 2}, {"fill": "whole"}, {"unit_floor": False}]:  # the last three: shared
            Retrieval(**({"selector": "bm25", "ratio": 3, "read": "held"} | fields)).pick(agent, DOC, QUESTIONS[0])
        assert sum(1 for k in memo if k[0] == "index") == len(variants)
        Retrieval(selector="bm25", ratio=3, read="held").pick(agent_for("qwen2"), DOC, QUESTIONS[0])
        assert sum(1 for k in memo if k[0] == "index") == len(variants) + 1  # another tokenizer, its own rows


def test_held_value_keeps_nothing_outside_a_block_and_takes_only_index_keys():
    calls = []
    for _ in range(2):
        value, seconds, held = held_value(("index", "x"), lambda: calls.append(1) or 7)
        assert (value, held) == (7, False) and seconds >= 0
    assert len(calls) == 2
    with pytest.raises(ValueError, match="index"):
        held_value(("report", "x"), lambda: 7)


def test_one_block_shares_an_index_and_charges_it_to_every_protocol(agent_for):
    agent = agent_for("llama")
    a, b = (Retrieval(selector="bm25", ratio=r, read="held") for r in (2, 4))
    with shared_reads() as memo:
        first = a.run([agent], [DOC], agent, QUESTIONS[0])
        second = b.run([agent], [DOC], agent, QUESTIONS[0])
        assert sum(1 for k in memo if k[0] == "index") == 1
    assert first.read_seconds == second.read_seconds and first.read_seconds[0] > 0  # the measured build, both times


def test_an_unknown_read_lists_the_valid_ones():
    with pytest.raises(UnknownNameError, match="with_question.*held|held.*with_question"):
        Retrieval(read="cached")

"""Retrieval from senders that hold their documents (`retrieval(read="held")`): the query-blind work (tokenising,
units, a text selector's index) is done before the question, charged as the read, and kept across questions."""
from __future__ import annotations

import pytest
import torch

from latentwire.errors import UnknownNameError
from latentwire.protocols import get_protocol
from latentwire.protocols.reads import HeldReads, held_value, shared_reads
from latentwire.protocols.retrieval import Retrieval
from latentwire.select import bm25, get_selector

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
    original = protocol._selector.index
    monkeypatch.setattr(protocol._selector, "index", lambda units: (built.append(len(units)), original(units))[1])
    held = HeldReads()
    outs = []
    for q in QUESTIONS:
        with shared_reads(held):
            outs.append(protocol.run([agent, agent], [DOC, OTHER], agent, q))
    assert len(built) == 2  # one index per sender's document, for both questions
    assert all(r > 0 for r in outs[0].read_seconds) and outs[1].read_seconds == (0.0, 0.0)  # held: done before
    assert outs[1].details["held_index"] == [True, True]
    assert held.reads_computed == 0 and held.indexes_computed == 2  # an index is not a KV read
    if selector == "dense":  # the unit embeddings count against the bound: (U, 384) float32 per document
        assert held.nbytes >= sum(4 * 384 * n for n in built)
    cold = Retrieval(selector=selector, ratio=3).run([agent, agent], [DOC, OTHER], agent, QUESTIONS[1])
    assert outs[1].details["pieces"] == cold.details["pieces"]


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

"""Message stages: each validated on its own, composed by a protocol, refused by the stage that cannot serve, written
and read back as specs; a new stage plugs in without touching the others."""
from __future__ import annotations

import dataclasses
import pickle

import pytest

from latentwire.bench.runner import parse_protocols, protocol_parameters
from latentwire.errors import ConfigError, UnknownNameError, UnknownParameterError
from latentwire.protocols import get_protocol
from latentwire.protocols.stages import (STAGES, Attention, Budget, Calibrated, Chain, Fuse, KVBlend, Mass, Probe,
                                         Ratio, Sentences, FixedSpans, Text, contrastive, parse_stage, stage, to_flat)

DOCS = ["Ada led Orion in Lisbon. She drinks tea.\n\nBo led Vega in Oslo. He drinks coffee.",
        "The blue crate holds 58 bolts. The red crate holds 12 nails."]
QUESTION = "Where did Ada lead Orion?"


@pytest.mark.parametrize("spec", [
    "attention('cacheback')", "attention('snapkv', params={'window_size': 8})", "text('dense', draft=8)",
    "probe(16, mix='and')", "calibrated('masked', floor=0.1, of=probe(4))", "fuse(attention('cacheback'), text('bm25'), k=30.0)",
    "sentences(16, context='lead', fill='whole')", "fixed_spans(8)", "spans()", "ratio(4)", "mass(0.5, ratio=4, floor=32)",
    "chain('fixed', max_rows=64)", "rows()", "token_ids()", "kv()", "kv_reencoded(0.2)", "kv_blend(0.3)"])
def test_a_stage_reads_back_from_its_spec(spec):
    s = parse_stage(spec)
    assert parse_stage(repr(s)) == s and pickle.loads(pickle.dumps(s)) == s


def test_the_issues_example_is_the_flat_spec_it_replaces():
    (a, b) = parse_protocols("cacheback(ratio=8, score=probe(16), units=sentences(context='lead'), encoding='kv'),"
                             "cacheback(ratio=8, probe=16, context='lead', encoding='kv')").values()
    new, old = get_protocol(a[0], **a[1]), get_protocol(b[0], **b[1])
    assert new == old and new.score == Probe(16) and new.units == Sentences(context="lead")
    assert protocol_parameters(new) == protocol_parameters(old)  # config.json compares a resumed folder alike
    assert to_flat(new)["probe"] == 16 and to_flat(new)["encoding"] == "kv"


def test_contrastive_is_deep_generic_calibration():
    assert contrastive() == Calibrated("generic", of=Attention(params={"p": 0.0, "min_depth": 0.5}))
    assert get_protocol("cacheback", score=contrastive()) == \
        get_protocol("cacheback", calibration="generic", selector_params={"p": 0.0, "min_depth": 0.5})


@pytest.mark.parametrize("build, error, names", [
    (lambda: Attention("bm25"), ConfigError, "text('bm25')"),                     # a retriever is a text scorer
    (lambda: Text("snapkv"), UnknownNameError, "bm25, dense, lexical"),
    (lambda: Probe(4, of=Text("bm25")), ConfigError, "score stage probe"),        # no attention to pool
    (lambda: Probe(4, of=Attention(query="raw")), ConfigError, "query='turn'"),
    (lambda: Probe(4, mix="or"), UnknownNameError, "and, join"),
    (lambda: Calibrated("generic", of=Attention("streaming_llm")), ConfigError, "query-conditioned"),
    (lambda: Calibrated("ratio"), UnknownNameError, "generic, masked"),
    (lambda: Fuse(Attention(), Fuse()), ConfigError, "fuse"),
    (lambda: Sentences(context="paragraph"), UnknownNameError, "lead, none, previous"),
    (lambda: Mass(1.5), ConfigError, "budget stage mass"),
    (lambda: Mass(0.5, ratio=8, floor=4), ConfigError, "floor"),
    (lambda: KVBlend(1.5), ConfigError, "recompute"),
    (lambda: stage("units", "lines"), UnknownNameError, "fixed_spans, sentences"),
    (lambda: stage("score", Ratio()), ConfigError, "budget stage"),
])
def test_a_stage_refuses_what_it_cannot_be_and_names_the_valid_choices(build, error, names):
    with pytest.raises(error, match=names.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        build()


@pytest.mark.parametrize("spec, says", [
    ("cacheback(budget=mass(0.5), score=fuse(attention('cacheback'), text('dense')))", "budget stage mass"),
    ("cacheback(budget=mass(0.5), units=sentences(context='lead'))", "context rows"),
    ("retrieval(score=attention('cacheback'))", "score stage attention"),       # retrieval reads nothing
    ("retrieval(score=text('bm25', draft=8))", "score stage text"),             # no sender to draft with
    ("cacheback(budget=chain('fixed'))", "budget stage chain"),
    ("cacheback(score=probe(16), probe=8)", "score is given"),                   # a stage and its flat keywords
])
def test_a_composition_is_refused_by_the_stage_that_cannot_serve_it(spec, says):
    (name, params), = parse_protocols(spec).values()
    with pytest.raises(ConfigError, match=says.replace("(", r"\(")):
        get_protocol(name, **params)


def test_a_misspelt_stage_parameter_lists_the_stage_s_own():
    with pytest.raises(UnknownParameterError, match="stage probe has no parameter 'token'.*valid: tokens, mix, of"):
        parse_protocols("cacheback(score=probe(token=16))")
    with pytest.raises(UnknownNameError, match="unknown stage 'prob'"):
        parse_protocols("cacheback(score=prob(16))")


def test_retrieval_fuses_two_retrievers_with_no_new_code(agent_for):
    agent = agent_for("llama")
    fused = get_protocol("retrieval", score=Fuse(Text("bm25"), Text("lexical")), ratio=3, max_new_tokens=2)
    out = fused.run([agent, agent], DOCS, agent, QUESTION)
    assert all(out.details["pieces"]) and out.read_seconds == (0.0, 0.0)
    with pytest.raises(ConfigError, match="read 'held'"):  # a held index is one retriever's
        get_protocol("retrieval", score=Fuse(Text("bm25"), Text("lexical")), read="held")


@STAGES.register
@dataclasses.dataclass(repr=False)
class FirstRows(Budget):
    """A new budget, declared here only: the first ceil(T / ratio) rows' worth, whatever the scores."""
    name = "first_rows_test"
    ratio: float = 8.0


def test_a_new_stage_plugs_in_without_touching_the_others(agent_for):
    agent = agent_for("qwen2")
    (name, params), = parse_protocols("cacheback(budget=first_rows_test(4), latent_steps=1, max_new_tokens=2)").values()
    new = get_protocol(name, **params)
    base = get_protocol("cacheback", ratio=4, latent_steps=1, max_new_tokens=2)
    a, b = new.run([agent], DOCS[:1], agent, QUESTION), base.run([agent], DOCS[:1], agent, QUESTION)
    assert a.kept_spans == b.kept_spans and a.answer == b.answer  # the same budget, written as a new stage
    assert protocol_parameters(new)["budget"] == "first_rows_test(4)"  # no flat form: the config keeps its spec


def test_a_chain_keeps_its_flat_budget_and_max_rows():
    chain = get_protocol("cacheback_chain", budget="fixed", max_rows=256, ratio=8)
    assert chain.budget == Chain("fixed", ratio=8, max_rows=256) and chain.units == Sentences()
    assert to_flat(chain) | {"budget": "fixed"} == to_flat(chain) and to_flat(chain)["max_rows"] == 256


def test_held_state_memo_is_per_read_and_shared_by_the_probe_and_the_draft(agent_for):
    agent = agent_for("qwen2")
    cb = get_protocol("cacheback", latent_steps=0, probe=3, fuse="lexical", text_query="draft")
    state = cb.read(agent, DOCS[1])
    h = cb.held(agent, state)
    before = sum(c.op == "answer" for c in agent.calls)
    cb.said(agent, state, QUESTION), cb.score.first.scores(h, QUESTION)
    assert sum(c.op == "answer" for c in agent.calls) == before + 1 and cb.held(agent, state).memo is h.memo
    assert cb.score.second.query(h, QUESTION) == f"{QUESTION} {cb.said(agent, state, QUESTION)}"
    with pytest.raises(ValueError, match="per_row and document"):  # a fusion with text scores the document too
        cb.scores(agent, state, QUESTION)


def test_fixed_spans_are_the_flat_span_mode_fixed():
    assert get_protocol("cacheback", span_mode="fixed", span=8).units == FixedSpans(8)
    with pytest.raises(ConfigError, match="span_mode 'sentence'"):
        get_protocol("cacheback", span_mode="fixed", context="lead")

"""Answer-probe CacheBack: the sender's own first answer tokens join the question's attention; nothing else moves."""
import pickle

import pytest
import torch

from latentwire.agent import KV_PROMPT
from latentwire.errors import ConfigError, UnknownNameError
from latentwire.protocols import get_protocol
from latentwire.protocols.cacheback import CacheBack
from latentwire.protocols.calibration import GENERIC_QUESTION

DOC = "The blue crate holds 58 bolts. The red crate holds 12 nails. The green crate is empty."
QUESTION = "How many bolts are in the blue crate?"


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_probe_scores_the_question_turn_then_the_senders_own_greedy_answer(agent_for, arch):
    agent = agent_for(arch)
    cb = CacheBack(ratio=4, latent_steps=2, probe=5)
    state = cb.read(agent, DOC)
    keys = [layer.keys.clone() for layer in state.layers]
    answer = agent.answer_after(state, KV_PROMPT.format(question=QUESTION), max_new_tokens=5)
    probe = agent.tokenizer.decode(list(answer.token_ids), skip_special_tokens=True)
    query = cb.score.query_for(cb.held(agent, state), QUESTION)
    assert query == cb.attention.query_text(agent, QUESTION) + probe
    assert 0 < len(answer.token_ids) <= 5
    # the scores are the selector's on that text: no other change to CacheBack
    assert torch.equal(cb.scores(agent, state, QUESTION), cb.attention._selector.score(agent, state, query))
    # decoding the probe leaves the stored state as it was (follow-up questions score the same state)
    assert all(torch.equal(k, layer.keys) for k, layer in zip(keys, state.layers))
    assert torch.equal(cb.scores(agent, state, QUESTION), cb.scores(agent, state, QUESTION))  # deterministic
    before = sum(c.op == "answer" for c in agent.calls)
    assert cb.said(agent, state, QUESTION) == probe and sum(c.op == "answer" for c in agent.calls) == before  # once


def test_probe_zero_is_todays_cacheback(agent_for):
    agent = agent_for("llama")
    state = CacheBack(latent_steps=1).read(agent, DOC)
    plain, zero = CacheBack(latent_steps=1), CacheBack(latent_steps=1, probe=0)
    assert zero.score == plain.score and zero.said(agent, state, QUESTION) is None
    assert torch.equal(zero.scores(agent, state, QUESTION), plain.scores(agent, state, QUESTION))


def test_probe_with_generic_calibration_probes_the_background_once_per_state(agent_for):
    agent = agent_for("qwen2")
    cb = CacheBack(ratio=4, latent_steps=0, calibration="generic", probe=3)
    state = cb.read(agent, DOC)
    seen = []
    score = cb.attention._selector.score
    cb.attention._selector.score = lambda a, s, q: seen.append(q) or score(a, s, q)
    cb.scores(agent, state, QUESTION)
    cb.scores(agent, state, "How many nails?")
    background = cb.score.of.query_for(cb.held(agent, state), GENERIC_QUESTION)
    assert seen.count(background) == 1  # the background is probed too, and scored once for both questions
    assert background.startswith(cb.attention.query_text(agent, GENERIC_QUESTION))


def test_probe_runs_end_to_end_one_decode_per_sender(agent_for):
    agent = agent_for("llama")
    docs = [DOC, "Memo: the lobby lights were replaced on Monday."]
    base = get_protocol("cacheback", ratio=4, latent_steps=1).run([agent] * 2, docs, agent, QUESTION)
    before = sum(c.op == "answer" for c in agent.calls)
    probed = get_protocol("cacheback", ratio=4, latent_steps=1, probe=4).run([agent] * 2, docs, agent, QUESTION)
    assert sum(c.op == "answer" for c in agent.calls) - before == 2 + 1  # each sender's probe, then the receiver
    assert probed.details["message_rows"] == base.details["message_rows"]  # same budget, whatever it picks
    said = [s["probe"] for s in probed.details["senders"]]  # each record keeps what its sender began to answer
    assert all(isinstance(x, str) for x in said) and "probe" not in base.details["senders"][0]
    chain = get_protocol("cacheback_chain", ratio=4, latent_steps=1, probe=2)  # hop scores are probed as well
    assert chain.run([agent] * 2, docs, agent, QUESTION).answer is not None


def test_a_probed_protocol_pickles(agent_for):
    cb = CacheBack(probe=6, calibration="generic")
    assert pickle.loads(pickle.dumps(cb)).flat["probe"] == 6 and pickle.loads(pickle.dumps(cb)).score == cb.score


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_probe_mix_and_is_the_geometric_mean_of_the_turns_and_the_joined_querys_scores(agent_for, arch):
    agent = agent_for(arch)
    joined, both = CacheBack(ratio=4, latent_steps=1, probe=4), CacheBack(ratio=4, latent_steps=1, probe=4, probe_mix="and")
    state = joined.read(agent, DOC)
    turn = both.attention._selector.score(agent, state, both.attention.query_text(agent, QUESTION))
    want = (joined.scores(agent, state, QUESTION) * turn).sqrt()
    assert torch.allclose(both.scores(agent, state, QUESTION), want, rtol=0, atol=0)
    assert both.said(agent, state, QUESTION) == joined.said(agent, state, QUESTION)  # the same probe text
    assert not torch.equal(both.scores(agent, state, QUESTION), joined.scores(agent, state, QUESTION))


def test_probe_mix_and_mixes_the_generic_background_the_same_way(agent_for):
    agent = agent_for("qwen2")
    cb = CacheBack(ratio=4, latent_steps=0, calibration="generic", probe=3, probe_mix="and")
    state = cb.read(agent, DOC)
    probed = cb.score.of.query_for(cb.held(agent, state), GENERIC_QUESTION)
    selector, attention = cb.attention._selector, cb.attention
    want = (selector.score(agent, state, probed)
            * selector.score(agent, state, attention.query_text(agent, GENERIC_QUESTION))).sqrt()
    assert torch.equal(cb.score.generic(cb.held(agent, state)), want)


@pytest.mark.parametrize("fields", [{"probe": -1}, {"probe": 1.5}, {"probe": True},
                                    {"probe_mix": "and"},
                                    {"probe": 4, "query_format": "raw"},
                                    {"probe": 4, "selector": "bm25"}, {"probe": 4, "selector": "random"}])
def test_bad_probe_settings_are_typed_errors(fields):
    with pytest.raises(ConfigError):
        CacheBack(**fields)


def test_an_unknown_probe_mix_lists_the_valid_ones():
    with pytest.raises(UnknownNameError, match="join"):
        CacheBack(probe=4, probe_mix="or")


CRATES = ("Facilities log. The access code of the north door is 7341. Halifax is where Vera grew up. "
          "The lobby lights were replaced. Lunch moved to Friday.")


def _chosen_text(cb, agent, state, question):
    from latentwire.protocols.documents import document_rows

    per_row, eligible = document_rows(agent, CRATES, len(state))
    rows = cb.choose(agent, state, question, eligible, cb.span_groups(per_row, CRATES), per_row, CRATES)
    spans = [per_row[r] for r in rows.tolist() if r < len(per_row) and per_row[r] is not None]
    return "".join(CRATES[a:b] for a, b in spans)


@pytest.mark.parametrize("fuse", [None, "bm25"])
def test_draft_query_lets_word_overlap_find_what_the_sender_said(agent_for, fuse):
    """The question shares no word with its evidence; the sender's draft does ("Halifax"), so BM25 over
    question + draft picks that sentence, over the question alone it does not."""
    agent = agent_for("llama")
    fields = dict(ratio=6, latent_steps=0, span_mode="sentence", probe=4)
    fields.update(selector="bm25") if fuse is None else fields.update(fuse=fuse, fuse_k=0.5)
    question = "What is the hometown of the person?"
    draft = CacheBack(**fields, text_query="draft")
    plain = CacheBack(**{**fields, "probe": 4 if fuse else 0})
    state = draft.read(agent, CRATES)
    for cb in (plain, draft):  # a random-weight model's draft is noise: pin it to what a sender would say
        cb.held(agent, state).memo[("probe", agent.uid, question, 4)] = "Vera grew up in Halifax."
    assert "Halifax" in _chosen_text(draft, agent, state, question)
    assert "Halifax" not in _chosen_text(plain, agent, state, question)


def test_draft_is_decoded_once_and_shared_with_the_attention_probe(agent_for):
    agent = agent_for("qwen2")
    cb = CacheBack(ratio=4, latent_steps=0, span_mode="sentence", probe=3, fuse="lexical", text_query="draft")
    state = cb.read(agent, CRATES)
    before = sum(c.op == "answer" for c in agent.calls)
    _chosen_text(cb, agent, state, QUESTION)
    assert sum(c.op == "answer" for c in agent.calls) == before + 1  # one decode: the probe and the draft


@pytest.mark.parametrize("fields, error", [
    ({"text_query": "answer"}, UnknownNameError),
    ({"selector": "bm25", "text_query": "draft"}, ConfigError),               # no probe to draft with
    ({"probe": 4, "text_query": "draft"}, ConfigError),                       # no text selector reads it
    ({"selector": "bm25", "probe": 4}, ConfigError),                          # a probe with nothing to score
    ({"selector": "bm25", "probe": 4, "text_query": "draft", "probe_mix": "and"}, ConfigError),
])
def test_bad_draft_settings_are_typed_errors(fields, error):
    with pytest.raises(error):
        CacheBack(**fields)


def test_bm25_with_a_draft_is_allowed_and_pickles():
    cb = CacheBack(selector="bm25", probe=8, text_query="draft")
    assert pickle.loads(pickle.dumps(cb)).flat["text_query"] == "draft"
    assert get_protocol("cacheback", probe=16, fuse="bm25", text_query="draft").flat["text_query"] == "draft"

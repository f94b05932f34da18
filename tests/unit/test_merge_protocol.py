"""The merge protocol: thinkers' states as fragments, rendered by BagMerge or CanonicalMerge (tiny models)."""
import pytest

from latentwire.agent import Agent
from latentwire.errors import ConfigError, UnknownNameError
from latentwire.protocols import get_protocol

QUESTION = "What is the cat called?"
DOCS = ["The cat is called Tom.", "Tom lives in Paris, near the river.", "The river is wide."]


@pytest.fixture
def agents(models, tokenizer):
    return [Agent(models["gemma3"], tokenizer, model_name="gemma3") for _ in range(4)]


def test_validation():
    with pytest.raises(UnknownNameError, match="canonical"):
        get_protocol("merge", render="shuffle")
    with pytest.raises(ConfigError, match="bag"):
        get_protocol("merge", order=(1, 0))  # canonical chooses its own order
    with pytest.raises(ConfigError, match="permutation"):
        get_protocol("merge", render="bag", order=(0, 0))


def test_canonical_merge_answers_the_same_whatever_the_thinker_order(agents):
    *thinkers, judger = agents
    p = get_protocol("merge", latent_steps=1, max_new_tokens=3)
    a = p.run(thinkers, DOCS, judger, QUESTION)
    b = p.run(thinkers[::-1], DOCS[::-1], judger, QUESTION)
    assert a.details["digest"] == b.details["digest"] and a.answer == b.answer
    assert a.details["fragments"] == 3 and sorted(a.details["slots"]) == [0, 1, 2]
    assert [DOCS[i] for i in a.details["slots"]] == [DOCS[::-1][i] for i in b.details["slots"]]


def test_bag_merge_follows_the_given_order(agents):
    *thinkers, judger = agents
    outs = {o: get_protocol("merge", render="bag", order=o, latent_steps=1, max_new_tokens=2)
            .run(thinkers[:2], DOCS[:2], judger, QUESTION) for o in [(0, 1), (1, 0)]}
    assert outs[(0, 1)].details["slots"] == [0, 1] and outs[(1, 0)].details["slots"] == [1, 0]
    assert outs[(0, 1)].details["digest"] != outs[(1, 0)].details["digest"]
    assert outs[(0, 1)].details["message_rows"] == outs[(1, 0)].details["message_rows"]


def test_identical_thinker_states_are_absorbed(agents):
    *thinkers, judger = agents
    out = get_protocol("merge", latent_steps=0, max_new_tokens=1).run(thinkers[:2], DOCS[:1] * 2, judger, QUESTION)
    single = get_protocol("merge", latent_steps=0, max_new_tokens=1).run(thinkers[:1], DOCS[:1], judger, QUESTION)
    assert out.details["fragments"] == 1 and out.details["digest"] == single.details["digest"]
    assert out.message_bytes == single.message_bytes

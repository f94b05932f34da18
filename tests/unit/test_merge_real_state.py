"""Renders on real thinker states of the three tiny architectures (prefill + latent steps).

CanonicalMerge gives one digest under every input order, BagMerge one per order; a judger answers
over the render; Gemma3's sliding layers survive concatenation (validation, to_cache).
"""
import itertools
import math

import pytest
import torch

from latentwire.agent import Agent
from latentwire.merge import BagMerge, CanonicalMerge, Fragment, FragmentSet
from latentwire.state import KVState

TEXTS = ("The red key is in the blue box.", "Alice left at noon.", "Seven is prime.", "Rain fell on Tuesday.",
         "The ship sails north.")


@pytest.fixture(scope="module")
def thinkers(models, tokenizer):
    """arch -> (agent, 5 fragments): each a prefill of one text plus 2 latent steps."""
    out = {}
    for arch, model in models.items():
        agent = Agent(model, tokenizer, model_name=arch)
        out[arch] = agent, [Fragment.of(agent.think(agent.prefill(t), steps=2)) for t in TEXTS]
    return out


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_canonical_is_byte_identical_bag_is_not(thinkers, arch, n):
    frags = thinkers[arch][1][:n]
    canonical = {CanonicalMerge().render([frags[i] for i in p]).digest() for p in itertools.permutations(range(n))}
    bag = {BagMerge(order=p).render(frags).digest() for p in itertools.permutations(range(n))}
    assert len(canonical) == 1
    assert len(bag) == math.factorial(n)  # BagMerge: a different cache for every order


def test_render_blocks_are_exactly_rerotated(thinkers, arch):
    frags = thinkers[arch][1][:3]
    render = CanonicalMerge()
    state, offset = render.render(frags), 0
    assert state.is_compact and len(state) == sum(len(f) for f in frags)
    for f in render.order(frags):
        moved = f.state.shift(offset)
        for i, (layer, want) in enumerate(zip(state.layers, moved.layers)):
            rows = torch.isin(layer.positions, want.positions)
            assert torch.equal(layer.keys[:, rows], want.keys) and torch.equal(layer.values[:, rows], want.values), i
        offset += len(f)


def test_judger_answers_over_the_render(thinkers, arch):
    agent, frags = thinkers[arch]
    replicas = [FragmentSet(frags[:2]).add(frags[2]), FragmentSet([frags[2]]).merge(FragmentSet(frags[1::-1]))]
    assert replicas[0] == replicas[1]
    rendered = [CanonicalMerge().render(r) for r in replicas]
    assert rendered[0].digest() == rendered[1].digest()
    answers = [agent.answer("Where is the red key?", message=s, max_new_tokens=2) for s in rendered]
    assert answers[0].message_rows == len(rendered[0]) and answers[0].token_ids == answers[1].token_ids


def test_gemma3_sliding_layers_survive_concatenation(thinkers, prefill_state, random_ids):
    agent, frags = thinkers["gemma3"]
    window = agent.geometry.sliding_window
    short = [Fragment.of(prefill_state("gemma3", random_ids(3, seed=s))) for s in (1, 2)]  # shorter than the window
    assert "sliding" in agent.geometry.layer_types
    for order in itertools.permutations([frags[0], frags[1], *short]):
        state = BagMerge().render(list(order))
        back = KVState.from_bytes(state.to_bytes())  # re-validated from scratch
        assert back.digest() == state.digest()
        cache = state.to_cache()
        for i, kind in enumerate(state.geometry.layer_types):
            held = cache.layers[i].keys.shape[-2]
            assert held == (window - 1 if kind == "sliding" else len(state)), (i, kind)
    answer = agent.answer("What?", message=CanonicalMerge().render([frags[0], *short]), max_new_tokens=2)
    assert answer.message_rows == len(frags[0]) + 6

"""Repeated fragments: BagMerge concatenates what it is given, repeats included; a FragmentSet (and so
CanonicalMerge over it) absorbs a re-delivered fragment; the merge protocol's `dedupe` switch."""
import pytest
import torch

from latentwire.agent import Agent
from latentwire.errors import ConfigError
from latentwire.merge import BagMerge, CanonicalMerge, Fragment, FragmentSet
from latentwire.protocols import get_protocol
from latentwire.state import KVState, LayerKV

QUESTION = "What is the cat called?"
DOCS = ["The cat is called Tom.", "Tom lives in Paris, near the river."]


def synthetic(geometry, seed: int, rows: int) -> KVState:
    """A compact state of `rows` rows (the last one latent) with random keys/values on every layer."""
    g = torch.Generator().manual_seed(seed)
    H, D = geometry.num_kv_heads, geometry.head_dim
    pos = torch.arange(rows, device="cpu")
    layers = tuple(LayerKV(torch.randn(H, rows, D, generator=g, device="cpu"),
                           torch.randn(H, rows, D, generator=g, device="cpu"), pos)
                   for _ in range(geometry.num_layers))
    token_ids = torch.randint(5, 261, (rows,), generator=g, device="cpu")
    token_ids[-1] = -1
    return KVState(geometry, layers, pos, token_ids, torch.randn(1, geometry.hidden_size, generator=g, device="cpu"))


@pytest.fixture(scope="module")
def frags(geometry_for):
    geometry = geometry_for("llama")
    return [Fragment.of(synthetic(geometry, seed, rows)) for seed, rows in enumerate((2, 3, 4))]


def redelivered(f: Fragment) -> Fragment:
    """The same fragment decoded again from its bytes: equal digest, distinct object."""
    return Fragment.of(KVState.from_bytes(f.state.to_bytes()))


def test_bag_merge_renders_every_given_fragment_repeats_included(frags):
    a, b, _ = frags
    given = [a, b, redelivered(a)]
    state = BagMerge().render(given)
    assert len(state) == sum(len(f) for f in given) == 2 * len(a) + len(b)  # a longer cache, not absorbed
    assert torch.equal(state.token_ids, torch.cat([f.state.token_ids for f in given]))
    assert len(BagMerge().render([a, a])) == 2 * len(a)  # the same object twice, too
    permuted = BagMerge(order=(2, 0, 1)).render(given)  # order: a permutation of the slots, repeats included
    assert len(permuted) == len(state) and permuted.digest() != state.digest()


def test_a_set_absorbs_a_redelivered_fragment_for_canonical_merge(frags):
    a, b, c = frags
    with_repeat, without = FragmentSet([a, b, c, redelivered(b)]), FragmentSet([a, b, c])
    assert len(with_repeat) == 3
    assert CanonicalMerge().render(with_repeat).digest() == CanonicalMerge().render(without).digest()
    assert BagMerge().render(with_repeat).digest() == BagMerge().render(without).digest()  # the set, not a bag
    with pytest.raises(ConfigError, match="given twice"):  # a bare sequence with a repeat: put it in a set
        CanonicalMerge().render([a, b, redelivered(b)])


def test_dedupe_validation():
    with pytest.raises(ConfigError, match="bag"):
        get_protocol("merge", dedupe=False)  # CanonicalMerge renders the set: nothing to switch off
    with pytest.raises(ConfigError, match="dedupe must be bool"):
        get_protocol("merge", render="bag", dedupe=0)
    assert get_protocol("merge", render="bag", dedupe=False, order=(1, 0)).dedupe is False


@pytest.fixture
def agents(models, tokenizer):
    return [Agent(models["gemma3"], tokenizer, model_name="gemma3") for _ in range(3)]


def test_dedupe_false_renders_every_thinker_of_a_repeated_document(agents):
    *thinkers, judger = agents

    def run(**kw):
        p = get_protocol("merge", render="bag", latent_steps=0, max_new_tokens=1, **kw)
        return p.run(thinkers, DOCS[:1] * 2, judger, QUESTION)  # two thinkers given the same document

    once, twice = run(), run(dedupe=False)
    single = get_protocol("merge", render="bag", latent_steps=0, max_new_tokens=1).run(
        thinkers[:1], DOCS[:1], judger, QUESTION)
    assert once.details["fragments"] == twice.details["fragments"] == 1  # the same state either way
    assert once.details["message_rows"] == single.details["message_rows"]
    assert twice.details["message_rows"] == 2 * once.details["message_rows"]  # more rows without dedupe
    assert twice.details["slots"] == [0, 1] and once.details["slots"] == [0]
    assert twice.details["blocks"] == 2 and twice.message_bytes == 2 * once.message_bytes
    swapped = run(dedupe=False, order=(1, 0))  # order names every thinker, repeats included
    assert swapped.details["slots"] == [1, 0] and swapped.details["digest"] == twice.details["digest"]
    with pytest.raises(ValueError, match="dedupe=False"):
        run(order=(1, 0))  # with dedupe the two thinkers are one block: order cannot name both


def test_dedupe_false_without_repeats_changes_nothing(agents):
    *thinkers, judger = agents
    outs = [get_protocol("merge", render="bag", latent_steps=0, max_new_tokens=1, dedupe=d)
            .run(thinkers, DOCS, judger, QUESTION) for d in (True, False)]
    assert outs[0].details["digest"] == outs[1].details["digest"] and outs[0].details["slots"] == [0, 1]

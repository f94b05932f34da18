"""Real SmolLM2 thinkers: CanonicalMerge is one cache under every arrival order, BagMerge is not
(docs/methods.md#canonicalmerge).

N = 2 … 4 thinkers each read one short generated `facts` document (query-blind) and think 2 latent steps.
Over all N! input orders, CanonicalMerge renders byte-identical caches and the judger's answer over them
is the same tokens every time; BagMerge renders more than one distinct cache.
"""
import itertools
import math

import pytest

from latentwire.bench.tasks.facts import episodes
from latentwire.merge import BagMerge, CanonicalMerge, Fragment, FragmentSet
from latentwire.protocols.base import SENDER_PROMPT

pytestmark = pytest.mark.integration
MAX_N = 4


@pytest.fixture(scope="module")
def thinkers(smollm2):
    """(question, MAX_N fragments): each a query-blind prefill of one ~40-token document + 2 latent steps."""
    episode = episodes(seed=7, n=1, tokens=40, senders=MAX_N)[0]
    fragments = [Fragment.of(smollm2.think(smollm2.prefill(SENDER_PROMPT.format(document=doc)), steps=2))
                 for doc in episode.contexts]
    assert len(set(fragments)) == MAX_N  # distinct thinkers, distinct digests
    return episode.question, fragments


@pytest.mark.parametrize("n", range(2, MAX_N + 1))
def test_canonical_is_order_free_on_real_state_bag_is_not(smollm2, thinkers, n):
    question, fragments = thinkers
    perms = list(itertools.permutations(fragments[:n]))
    assert len(perms) == math.factorial(n)
    canonical = [CanonicalMerge().render(list(p)) for p in perms]
    digests = {s.digest() for s in canonical}
    assert len(digests) == 1
    assert digests == {CanonicalMerge().render(FragmentSet(fragments[:n])).digest()}  # the CvRDT's render too
    bag = {BagMerge().render(list(p)).digest() for p in perms}
    assert len(bag) > 1, "BagMerge gave one cache for every order"
    assert digests <= bag  # CanonicalMerge is BagMerge in one content-chosen order

    # byte-identical caches give one answer: the first and the last arrival order (one render each suffices;
    # answering all n! identical renders would only re-test determinism at n! times the cost)
    answers = {smollm2.answer(question, message=s, max_new_tokens=4).token_ids for s in (canonical[0], canonical[-1])}
    assert len(answers) == 1, "the judger answered two ways over byte-identical caches"

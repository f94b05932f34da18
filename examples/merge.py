"""Merge: thinkers' caches are fragments of a FragmentSet (a CvRDT); CanonicalMerge renders it order-free."""
import os

from latentwire.agent import Agent
from latentwire.merge import CanonicalMerge, FragmentSet

MODEL = os.environ.get("LATENTWIRE_EXAMPLE_MODEL", "qwen2.5-coder-0.5b")
premises = ["Ada is older than Ben.", "Ben is older than Cy."]  # each thinker holds one
question = "Who is the oldest of Ada, Ben and Cy?"

agent = Agent.from_pretrained(MODEL)
states = [agent.think(agent.prefill("Read this document.\n\n" + p), steps=8) for p in premises]
a, b = FragmentSet.of(states[0]), FragmentSet.of(states[1])  # two replicas, one fragment each
assert a.merge(b) == b.merge(a) == a.merge(b).merge(a)  # set union: arrival order and repeats do not matter
delta = a.missing_from(b.digests)  # anti-entropy: swap digests, ship only what the peer lacks
print(f"b needs {len(delta)} fragment(s): {len(delta.to_bytes()):,} bytes")
cache = CanonicalMerge().render(a.merge(b))  # one compact KVState, the same digest on every replica
assert cache.digest() == CanonicalMerge().render(b.merge(a)).digest()
print(agent.answer(question, message=cache).text)

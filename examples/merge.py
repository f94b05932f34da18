"""Merge: thinkers' caches are fragments of a FragmentSet (a CvRDT); CanonicalMerge renders it order-free."""
import os

from latentwire.agent import Agent
from latentwire.merge import CanonicalMerge, FragmentSet

MODEL = os.environ.get("LATENTWIRE_EXAMPLE_MODEL", "qwen2.5-coder-0.5b")
premises = ["The access code of the north warehouse is 7341.", "The blue crate holds 58 copper bolts."]
questions = ["What is the access code of the north warehouse?", "How many copper bolts are in the blue crate?"]

agent = Agent.from_pretrained(MODEL)
states = [agent.think(agent.prefill("Read this document.\n\n" + p), steps=8) for p in premises]  # one each
a, b = FragmentSet.of(states[0]), FragmentSet.of(states[1])  # two replicas, one fragment each
assert a.merge(b) == b.merge(a) == a.merge(b).merge(a)  # set union: arrival order and repeats do not matter
delta = a.missing_from(b.digests)  # anti-entropy: swap digests, ship only what the peer lacks
print(f"b needs {len(delta)} fragment(s): {len(delta.to_bytes()):,} bytes")
cache = CanonicalMerge().render(a.merge(b))  # one compact KVState, the same digest on every replica
assert cache.digest() == CanonicalMerge().render(b.merge(a)).digest()
for question in questions:  # one merged cache answers from either thinker's fragment
    print(question, "->", agent.answer(question, message=cache, max_new_tokens=16).text.strip())

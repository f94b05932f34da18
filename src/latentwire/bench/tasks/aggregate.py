"""`aggregate`: fan-in collection of one attribute over several people, spread across all senders.

Per episode one relation is asked about everyone ("Which musical instruments do the people mentioned
practise?"). 3-5 people state it (by full name, each with a distinct value), 1-2 in each of the 3 senders
and at least one in every sender; every other person sentence in the contexts states some other relation
(of those people or of 3-4 others), and office filler fills each context to ~330 tokens. The answer has one
part per stating person (`strict` accuracy needs all of them). The question is a collective paraphrase: it
shares no content word with any evidence sentence, and names nobody, so word overlap has nothing to hold on
to, and no single sender can answer alone.

`generate(..., tokens=T, per_sender=m)` makes the long form that agents holding their documents are measured on
(benchmarks/stored_states.py): ~T tokens per sender and m to m + 1 stating people in each, so a correct text
report must name several facts per sender.
"""
from __future__ import annotations

import random

from ...errors import ConfigError
from ..episode import Episode, Span
from .facts import CHARS_PER_TOKEN, _document
from .people import RELATIONS, Relation, answers, cast, say

SENDERS = 3
TOKENS = 330  # target tokens per sender context
PARTS = (3, 4, 5, 3, 4)  # stating people, per round of relations


def _episode(rng: random.Random, idx: int, rel: Relation, k: int, tokens: int = TOKENS,
             per_sender: int = 1) -> Episode:
    people = cast(rng, k + rng.randint(3, 4))
    stating, others = people[:k], people[k:]
    # each sender per_sender to per_sender + 1 of them
    where = list(range(SENDERS)) * per_sender + rng.sample(range(SENDERS), k - per_sender * SENDERS)
    rng.shuffle(where)
    pools = {r.name: rng.sample(r.values, len(r.values)) for r in RELATIONS}
    said = {}  # evidence sentence -> its value, in the order of `stating`
    for p in stating:
        v = pools[rel.name].pop()
        said[say(rng.choice(rel.templates), p.name, v)] = v
    known = {p.name: {rel.name} for p in people}  # each (person, relation) stated at most once
    contexts, spans = [], []
    for a in range(SENDERS):
        facts = [(s, True) for s, w in zip(said, where) if w == a]
        here = [p for p, w in zip(stating, where) if w == a] + rng.sample(others, rng.randint(2, 3))
        for j in range(rng.randint(5, 7)):
            p = here[j % len(here)]
            r = rng.choice([r for r in RELATIONS if r.name not in known[p.name]])
            known[p.name].add(r.name)
            facts.append((say(rng.choice(r.templates), p.name, pools[r.name].pop()), False))
        text, found = _document(rng, facts, int(tokens * CHARS_PER_TOKEN * rng.uniform(0.95, 1.03)))
        spans += [Span(a, s, e) for s, e in found]
        contexts.append(text)
    evidence = tuple(sorted(spans, key=lambda s: (s.agent, s.start)))
    meta = {"qtype": rel.name, "parts": k, "approx_tokens": [round(len(c) / CHARS_PER_TOKEN) for c in contexts],
            "evidence_depth": [round(s.start / len(contexts[s.agent]), 3) for s in evidence]}
    parts = {f"p{i}": answers(rel, said[contexts[s.agent][s.start:s.end]]) for i, s in enumerate(evidence)}
    return Episode(f"aggregate-{idx:04d}", "aggregate", "fanin", rel.agg, parts, tuple(contexts), evidence, meta)


def generate(seed: int, n: int = 120, tokens: int = TOKENS, per_sender: int = 1) -> list[Episode]:
    """`n` episodes cycling over the relations, each asked with 3, 4 and 5 parts in 120 (per_sender m: 3m, 3m + 1
    and 3m + 2 parts), ~`tokens` per sender; pure in (seed, tokens, per_sender)."""
    most = (min(len(r.values) for r in RELATIONS) - max(PARTS) + SENDERS) // SENDERS  # distinct values per answer
    if tokens < 100 or not 1 <= per_sender <= most:
        raise ConfigError(f"aggregate: want tokens ≥ 100 and 1 ≤ per_sender ≤ {most} (an answer's values are "
                          f"distinct, and the smallest relation has {min(len(r.values) for r in RELATIONS)}), "
                          f"got {tokens}, {per_sender}")
    rng = random.Random(seed)
    extra = (per_sender - 1) * SENDERS
    return [_episode(rng, i, RELATIONS[i % len(RELATIONS)], PARTS[i // len(RELATIONS) % len(PARTS)] + extra,
                     tokens, per_sender) for i in range(n)]

"""`paraphrase`: fan-in retrieval of one fact about a person, asked in words the fact does not use.

Each episode is about one target person, who appears in every one of the 3 senders: about 8 sentences per
sender state other attributes of the target (always by full name), a few state attributes of 3-4 other
people, and office filler fills each context to ~330 tokens. Exactly one sentence, in one sender, states the
asked attribute ("Petra Lund can play the cello."); the question paraphrases it ("Which musical instrument
does Petra Lund practise?") and shares no content word with it but the name. So every target sentence ties
with the evidence on the name, and some of them beat it on other words: word overlap cannot find the
evidence, only the meaning of the relation can. Values are unique within the episode (see `people`). A value
of another relation that would also answer the paraphrase (asked "What triggers a reaction in X?", the
sentence "X is terrified of hornets") is never drawn in that episode (`CROSS_ANSWERS`).
"""
from __future__ import annotations

import random

from ..episode import Episode, Span
from .facts import CHARS_PER_TOKEN, _document
from .people import RELATIONS, Relation, answers, cast, say

SENDERS = 3
TOKENS = 330  # target tokens per sender context
# Asked relation -> {other relation: its values that would answer the asked one's paraphrase too}: a stinging
# creature one fears triggers a reaction, and a sting one is allergic to frightens.
CROSS_ANSWERS = {"allergy": {"fear": {"hornets", "jellyfish", "scorpions"}},
                 "fear": {"allergy": {"wasps", "bee stings"}}}


def _episode(rng: random.Random, idx: int, rel: Relation) -> Episode:
    target, *others = cast(rng, 1 + rng.randint(3, 4))
    pools = {r.name: rng.sample(r.values, len(r.values)) for r in RELATIONS}  # pop() draws a fresh value
    for other, drop in CROSS_ANSWERS.get(rel.name, {}).items():  # drawn as before; a replaced value's other
        # length can still shift the filler drawn after it, and so later episodes of the same seed
        pools[other] = [v for v in pools[other] if v not in drop]
    counts = [rng.randint(7, 8) for _ in range(SENDERS)]
    gold_agent = rng.randrange(SENDERS)
    rest = rng.sample([r for r in RELATIONS if r is not rel], sum(counts) - 1)
    gold_value = pools[rel.name].pop()
    docs: list[list[tuple[str, bool]]] = [[] for _ in range(SENDERS)]
    for a in range(SENDERS):
        mine = [rel] if a == gold_agent else []
        mine += [rest.pop() for _ in range(counts[a] - len(mine))]
        for r in mine:
            value = gold_value if r is rel else pools[r.name].pop()
            docs[a].append((say(rng.choice(r.templates), target.name, value), r is rel))
    known = {p.name: set() for p in others}  # each (person, relation) stated at most once
    decoy = rng.randrange(SENDERS) if rng.random() < 0.5 else None  # another person with the asked relation
    for a in range(SENDERS):
        here = rng.sample(others, rng.randint(2, 3))
        for j in range(rng.randint(5, 7)):
            p = here[j % len(here)]
            if a == decoy and j == 0:
                r = rel
            else:
                r = rng.choice([r for r in RELATIONS if r is not rel and r.name not in known[p.name]])
            known[p.name].add(r.name)
            docs[a].append((say(rng.choice(r.templates), p.name, pools[r.name].pop()), False))
    contexts, evidence = [], []
    for a, facts in enumerate(docs):
        text, spans = _document(rng, facts, int(TOKENS * CHARS_PER_TOKEN * rng.uniform(0.95, 1.03)))
        evidence += [Span(a, s, e) for s, e in spans]
        contexts.append(text)
    meta = {"qtype": rel.name, "approx_tokens": [round(len(c) / CHARS_PER_TOKEN) for c in contexts],
            "evidence_depth": [round(s.start / len(contexts[s.agent]), 3) for s in evidence],
            "target_sentences": counts}
    return Episode(f"paraphrase-{idx:04d}", "paraphrase", "fanin", rel.para.format(person=target.name),
                   answers(rel, gold_value), tuple(contexts), tuple(evidence), meta)


def generate(seed: int, n: int = 120) -> list[Episode]:
    """`n` episodes cycling over the relations (each asked 5 times in 120); a pure function of `seed`."""
    rng = random.Random(seed)
    return [_episode(rng, i, RELATIONS[i % len(RELATIONS)]) for i in range(n)]

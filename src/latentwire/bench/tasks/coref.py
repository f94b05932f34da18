"""`coref`: fan-in retrieval where the evidence names its person only by a pronoun or a nickname.

Each sender's context is a few paragraphs, one per person, none shared between senders. A paragraph opens by
introducing its person by full name, sometimes with a nickname ("Petra Lund, whom everyone calls Birdie, joined
the choir in 2014."), then says things about them through "she"/"he" or the nickname only. Every person in the
episode has a sentence of the asked relation, all in the same words ("She can play the cello.", "He can play
the oboe.", ...), and every value of it is different. The question names the target in full ("Which instrument
can Petra Lund play?"): word overlap ties the evidence with every other person's sentence of that relation and
ranks the target's introduction (which holds the name, but not the answer) above them all. Only resolving the
pronoun or the nickname back to the introduction finds the answer. About 60% of the episodes use a pronoun, 40%
a nickname.

The evidence sender is dense with such ties: 9 short paragraphs (introduction, the asked relation, one more
attribute: ~30 tokens each) and at most one office filler sentence, the target's paragraph at a random place
among them. Its 9 tied relation sentences (~90 tokens) are about twice what a retriever keeps at 8× (ceil(T/8)
≈ 45 of its ~330 tokens, part of it spent on the target's introduction), so a word-overlap ranking keeps the
evidence only when the tie-break happens to reach it. The other two senders have 5-6 people each, 1-2 more
attributes apiece, and office filler between paragraphs, never inside one.
"""
from __future__ import annotations

import random

from ..episode import Episode, Span
from .facts import CHARS_PER_TOKEN, _filler
from .people import INTROS, INTROS_NICK, NICKNAMES, RELATIONS, Relation, answers, cast, say

SENDERS = 3
TOKENS = 330  # target tokens per sender context
EVIDENCE_PEOPLE = 9  # people in the evidence sender: ~2x the tied relation sentences an 8x budget keeps
OTHER_PEOPLE = (5, 6)  # people in each other sender
VIA = ("pronoun", "alias", "pronoun", "alias", "pronoun")  # per round of relations: 60% pronoun, 40% alias
assert all(len(r.values) >= EVIDENCE_PEOPLE + 2 * OTHER_PEOPLE[1] for r in RELATIONS)  # unique asked values


def _episode(rng: random.Random, idx: int, rel: Relation, via: str) -> Episode:
    ev = rng.randrange(SENDERS)  # the evidence sender
    per = [EVIDENCE_PEOPLE if a == ev else rng.randint(*OTHER_PEOPLE) for a in range(SENDERS)]
    first = sum(per[:ev])  # the evidence sender's people are first..first + per[ev] - 1
    people = cast(rng, sum(per))
    t = first + rng.randrange(per[ev])  # the target
    nicks = dict(zip(rng.sample(range(len(people)), len(people) * 2 // 5), rng.sample(NICKNAMES, len(people))))
    if via == "alias" and t not in nicks:
        nicks[t] = next(n for n in NICKNAMES if n not in nicks.values())
    pools = {r.name: rng.sample(r.values, len(r.values)) for r in RELATIONS}
    asked = rng.choice(rel.templates)  # one wording for everyone: the relation's sentences tie on words
    paragraphs = []  # (sentences, index of the evidence sentence or None)
    for i, p in enumerate(people):
        year = rng.randint(2008, 2022)
        intro = (rng.choice(INTROS_NICK).format(name=p.name, nick=nicks[i], year=year) if i in nicks
                 else rng.choice(INTROS).format(name=p.name, year=year))
        more = 1 if first <= i < first + per[ev] else rng.randint(1, 2)  # short paragraphs in the evidence sender
        body = [(rel, asked)] + [(r, rng.choice(r.templates))
                                 for r in rng.sample([r for r in RELATIONS if r is not rel], more)]
        rng.shuffle(body)
        sentences, gold = [intro], None
        for r, template in body:
            value = pools[r.name].pop()
            if i == t and r is rel:
                nick, gold, gold_value = via == "alias", len(sentences), value
            else:
                nick = i in nicks and rng.random() < 0.5
            sentences.append(say(template, nicks[i] if nick else p.pronoun, value))
        paragraphs.append((sentences, gold))
    contexts, evidence, start = [], [], 0
    for a, k in enumerate(per):
        mine = paragraphs[start:start + k]
        start += k
        rng.shuffle(mine)  # the target's paragraph lands at a random place
        size = sum(len(" ".join(s)) + 2 for s, _ in mine)
        budget = TOKENS * CHARS_PER_TOKEN * rng.uniform(0.95, 1.03)
        fill: list[list[str]] = [[] for _ in range(k + 1)]  # filler paragraphs before/between/after people
        seen: set[str] = set()  # no filler sentence twice in a context
        while size < budget and (a != ev or not seen):  # at most one filler sentence in the evidence sender
            s = _filler(rng)
            if s not in seen:
                seen.add(s)
                gap = rng.randrange(k + 1)
                fill[gap].append(s)
                size += len(s) + (1 if len(fill[gap]) > 1 else 2)
        blocks = [(fill[0], None)]
        for (sentences, gold), f in zip(mine, fill[1:]):
            blocks += [(sentences, gold), (f, None)]
        text = ""
        for sentences, gold in blocks:
            if not sentences:
                continue
            text += "\n\n" if text else ""
            if gold is not None:
                at = len(text) + len(" ".join(sentences[:gold])) + 1
                evidence.append(Span(a, at, at + len(sentences[gold])))
            text += " ".join(sentences)
        contexts.append(text)
    (span,) = evidence
    meta = {"qtype": rel.name, "via": via, "approx_tokens": [round(len(c) / CHARS_PER_TOKEN) for c in contexts],
            "evidence_depth": [round(span.start / len(contexts[span.agent]), 3)], "people_per_sender": per}
    return Episode(f"coref-{idx:04d}", "coref", "fanin", rel.ask.format(person=people[t].name),
                   answers(rel, gold_value), tuple(contexts), (span,), meta)


def generate(seed: int, n: int = 120) -> list[Episode]:
    """`n` episodes cycling over the relations, each asked via a pronoun 3 times and a nickname twice in 120."""
    rng = random.Random(seed)
    return [_episode(rng, i, RELATIONS[i % len(RELATIONS)], VIA[i // len(RELATIONS) % len(VIA)])
            for i in range(n)]

"""`reasoning`: multi-step problems whose premises are split between 2-5 thinkers (topology "merge").

Two kinds: arithmetic chains (a base count and k relations, each needed) and orderings (k adjacent comparisons
of k+1 items; every comparison is needed to pin down the extreme). Premises are shuffled and dealt disjointly,
every thinker holding at least one. Each problem is emitted twice, once per regime: "query_blind" (contexts
hold only premises) and "query_aware" (each context ends with the question); meta["problem"] pairs them.
"""
from __future__ import annotations

import random

from ..episode import Episode, Span

THINKERS = (2, 3, 4, 5)
KINDS = ("arithmetic", "ordering")
INSTRUCTION = "Here is what you know:"

NAMES = ("Ana", "Ben", "Cara", "Dan", "Eva", "Finn", "Gina", "Hal", "Iris", "Jack", "Kim", "Leo", "Maya",
         "Ned", "Olive", "Paul", "Rita", "Sam", "Tess", "Umar", "Vic", "Wes", "Yara", "Zoe")
ITEMS = ("apples", "marbles", "stickers", "books", "coins", "pencils", "stamps", "shells", "cards", "cookies")
COLOURS = ("red", "blue", "green", "yellow", "black", "white", "orange", "purple", "grey", "brown")
# (noun for a question, comparative, opposite, superlative, opposite superlative, items are boxes?)
RELATIONS = (
    ("box", "heavier", "lighter", "heaviest", "lightest", True),
    ("person", "taller", "shorter", "tallest", "shortest", False),
    ("person", "older", "younger", "oldest", "youngest", False),
    ("person", "faster", "slower", "fastest", "slowest", False),
)
WORD = {2: "twice", 3: "three times"}
FRACTION = {2: "half", 3: "a third"}


def _arithmetic(rng: random.Random, steps: int) -> tuple[list[str], str, str, dict]:
    people = rng.sample(NAMES, steps + 1)
    item = rng.choice(ITEMS)
    value = rng.randint(2, 12)
    premises = [f"{people[0]} has {value} {item}."]
    for prev, new in zip(people, people[1:]):
        ops = [("add", a) for a in range(2, 10)] + [("sub", a) for a in range(2, 10) if value - a >= 2]
        ops += [("mul", m) for m in (2, 3) if value * m <= 60] + ([("div", 2)] if value % 2 == 0 and value >= 4 else [])
        op, a = rng.choice(ops)
        forward = rng.random() < 0.6
        if op == "add":
            value += a
            s = f"{new} has {a} more {item} than {prev}." if forward else f"{prev} has {a} fewer {item} than {new}."
        elif op == "sub":
            value -= a
            s = f"{new} has {a} fewer {item} than {prev}." if forward else f"{prev} has {a} more {item} than {new}."
        elif op == "mul":
            value *= a
            s = (f"{new} has {WORD[a]} as many {item} as {prev}." if forward
                 else f"{prev} has {FRACTION[a]} as many {item} as {new}.")
        else:
            value //= a
            s = (f"{new} has {FRACTION[a]} as many {item} as {prev}." if forward
                 else f"{prev} has {WORD[a]} as many {item} as {new}.")
        premises.append(s)
    return premises, f"How many {item} does {people[-1]} have?", str(value), {}


def _ordering(rng: random.Random, steps: int) -> tuple[list[str], str, str, dict]:
    noun, more, less, most, least, boxes = rng.choice(RELATIONS)
    names = [f"the {c} box" for c in rng.sample(COLOURS, steps + 1)] if boxes else rng.sample(NAMES, steps + 1)
    premises = []  # names[0] is the most, names[-1] the least
    for hi, lo in zip(names, names[1:]):
        a, rel, b = (hi, more, lo) if rng.random() < 0.5 else (lo, less, hi)
        premises.append(f"{a[0].upper() + a[1:]} is {rel} than {b}.")
    top = rng.random() < 0.5
    answer = names[0] if top else names[-1]
    question = f"Which box is the {most if top else least}?" if boxes else f"Who is the {most if top else least}?"
    answers = [answer[4:], answer, answer[4:-4]] if boxes else [answer]  # "red box", "the red box", "red"
    return premises, question, answers, {"relation": more}


def _episodes(rng: random.Random, problem: int, n_thinkers: int, kind: str) -> list[Episode]:
    lo = max(2, n_thinkers - 1) if kind == "arithmetic" else max(2, n_thinkers)  # enough premises to deal
    steps = rng.randint(lo, max(6, lo + 2))
    premises, question, answer, extra = (_arithmetic if kind == "arithmetic" else _ordering)(rng, steps)
    answers = [answer] if isinstance(answer, str) else answer
    order = list(range(len(premises)))
    rng.shuffle(order)
    owner = {p: i for i, p in enumerate(order[:n_thinkers])}  # every thinker gets at least one premise
    owner.update({p: rng.randrange(n_thinkers) for p in order[n_thinkers:]})
    out = []
    for regime in ("query_blind", "query_aware"):
        contexts, spans = [], {}
        for t in range(n_thinkers):
            text = INSTRUCTION
            for p in order:
                if owner[p] == t:
                    text += "\n"
                    spans[p] = Span(t, len(text), len(text) + len(premises[p]))
                    text += premises[p]
            if regime == "query_aware":
                text += f"\nQuestion: {question}"
            contexts.append(text)
        meta = {"regime": regime, "thinkers": n_thinkers, "kind": kind, "steps": steps, "problem": problem, **extra}
        out.append(Episode(f"reasoning-{problem:03d}-{regime.split('_')[1]}", "reasoning", "merge", question,
                           answers, tuple(contexts), tuple(spans[p] for p in range(len(premises))), meta))
    return out


def generate(seed: int, n: int = 160) -> list[Episode]:
    """`n` episodes (n/2 problems x 2 regimes) cycling over thinkers 2..5 and both kinds; pure in `seed`."""
    rng = random.Random(seed)
    out: list[Episode] = []
    for problem in range((n + 1) // 2):
        out += _episodes(rng, problem, THINKERS[problem % 4], KINDS[(problem // 4) % 2])
    return out[:n]

"""`facts`: fan-in retrieval of relational facts hidden in office prose, single- and two-hop.

Each episode is a small world of projects (leader, city, budget). Every fact is stated exactly once in the
whole episode, spread over 3 senders and mixed with filler sentences (meetings, weather, logistics, office
life) that never name a person, project, city or amount. Every person leads one project, every city hosts at
most one project and budgets are distinct, so each answer string occurs exactly once: in the gold evidence.
Two-hop chains always cross senders (the bridge fact and the answer fact sit in different contexts).
"""
from __future__ import annotations

import random

from ...errors import ConfigError, UnknownNameError
from ..episode import Episode, Span

SENDERS = 3
CHARS_PER_TOKEN = 4.2
BUCKETS = (500, 1000, 2000, 4000)  # target tokens per sender context (all senders of an episode share one)
PER_QTYPE = (8, 7, 3, 2)  # episodes per question type in each bucket: 120 in all, ~1.9 MB of JSONL
QTYPES = (  # (name, hops)
    ("city", 1), ("leader", 1), ("budget", 1),
    ("city_of_leader", 2), ("budget_of_leader", 2), ("leader_of_city", 2),
)

FIRST = ("Ana", "Bruno", "Clara", "David", "Elena", "Felix", "Greta", "Hugo", "Irene", "Jonas", "Karin",
         "Lukas", "Mira", "Nils", "Olga", "Pavel", "Rosa", "Stefan", "Tania", "Viktor", "Wanda", "Yusuf")
LAST = ("Silva", "Novak", "Berg", "Moreau", "Kowalski", "Lindqvist", "Okafor", "Petrov", "Tanaka", "Haddad",
        "Fischer", "Romano", "Duarte", "Janssen", "Horvat", "Quinn", "Sato", "Varga", "Weber", "Zielinski")
PROJECTS = ("Heron", "Kestrel", "Osprey", "Falcon", "Plover", "Curlew", "Merlin", "Avocet", "Bittern",
            "Dunlin", "Egret", "Gannet", "Harrier", "Ibis", "Jacana", "Lapwing", "Nightjar", "Oriole",
            "Petrel", "Redstart", "Shrike", "Tern", "Wagtail", "Wren")
CITIES = ("Porto", "Lisbon", "Ghent", "Tampere", "Bergen", "Lyon", "Graz", "Leeds", "Turin", "Krakow",
          "Utrecht", "Malmo", "Brno", "Valencia", "Aarhus", "Dresden", "Cork", "Seville", "Bologna",
          "Tartu", "Ljubljana", "Bilbao", "Nantes", "Gdansk")

LEADS = ("{person} leads the {project} project.", "The {project} project is led by {person}.",
         "{person} is the lead of the {project} project.", "{project} is headed by {person}.")
BASED = ("The {project} project is based in {city}.", "The {project} team works out of {city}.",
         "{project}'s headquarters are in {city}.", "The {project} project operates from an office in {city}.")
BUDGET = ("{project}'s budget is {amount} million euros.",
          "The {project} project has a budget of {amount} million euros.",
          "{project} was allocated {amount} million euros.")
QUESTIONS = {
    "city": "In which city is the {project} project based?",
    "leader": "Who leads the {project} project?",
    "budget": "What is the budget of the {project} project?",
    "city_of_leader": "In which city is the project led by {person} based?",
    "budget_of_leader": "What is the budget of the project led by {person}?",
    "leader_of_city": "Who leads the project based in {city}?",
}

# Filler: first names disjoint from FIRST, no project/city names, no amounts, never "project"/"budget"/"lead".
NAMES = ("Marta", "Tomas", "Ines", "Pieter", "Sofia", "Rafael", "Lena", "Oskar", "Julia", "Mateo", "Nora",
         "Emil", "Carla", "Anton", "Vera", "Milan", "Hanna", "Diego", "Alma", "Kasper")
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday")
TIMES = ("9:15", "9:30", "10:00", "10:30", "11:45", "13:00", "14:30", "15:15", "16:00")
ROOMS = ("small meeting room", "large meeting room", "library corner", "kitchen", "reception",
         "quiet room", "training room", "east wing", "basement archive")
FLOORS = ("second", "third", "fourth", "fifth", "ground")
SUPPLIES = ("notebooks", "whiteboard markers", "printer cartridges", "coffee filters", "desk lamps",
            "extension cables", "folding chairs", "paper towels", "USB adapters", "sticky notes")
WEATHER = ("heavy rain", "strong wind", "a light drizzle", "thick fog", "bright sunshine", "sleet",
           "a sudden hailstorm", "unusual heat")
DISHES = ("lentil soup", "vegetable lasagne", "chicken curry", "mushroom risotto", "fish tacos", "bean chili")
TOPICS = ("the new badge system", "the parking rules", "the holiday rota", "the recycling bins",
          "the fire drill", "the visitor policy", "the shared calendar", "the expense forms")
FILLER = (
    "The {weekday} stand-up moved to {time} because {name} had a dentist appointment.",
    "{name} reminded everyone to water the plants on the {floor} floor.",
    "Forecasters expect {weather} on {weekday}, which may slow down the morning commute.",
    "The printer next to the {room} jammed twice this morning.",
    "A delivery of {count} boxes of {supply} arrived at the loading dock.",
    "{name} and {name2} will share the corner desk until the new chairs arrive.",
    "The canteen is serving {dish} on {weekday}.",
    "Someone left an umbrella in the {room}; it is now at reception.",
    "{name} asked whether the {room} could be booked for a longer session on {weekday}.",
    "The heating on the {floor} floor is being checked by a technician at {time}.",
    "After {weather} yesterday, the bike shed roof needs a small repair.",
    "{name} circulated a short note about {topic}.",
    "Please return borrowed {supply} to the cupboard in the {room}.",
    "The coffee machine on the {floor} floor is out of order again.",
    "{name} will give a short talk about {topic} at {time} on {weekday}.",
    "The lift was closed for maintenance for most of {weekday}.",
    "Visitors should sign in at reception and wear a badge at all times.",
    "{name} found {count} spare {supply} in the {room} and labelled them.",
    "Because of {weather}, several people worked from home on {weekday}.",
    "The cleaning crew will start earlier on {weekday}, at {time}.",
    "{name} proposed a quieter seating plan for the {floor} floor.",
    "The minutes of the last all-hands meeting are pinned up in the {room}.",
    "There was a long queue at the {room} around {time}.",
    "{name2} volunteered to organise the next team breakfast.",
    "The windows on the {floor} floor will be cleaned on {weekday}.",
    "Questions about {topic} should go to {name}.",
    "The Wi-Fi in the {room} dropped several times during the afternoon.",
    "{name} ordered {count} new {supply} for the shared cupboard.",
    "Facilities confirmed that {weather} is not expected to affect the shuttle bus.",
    "The {weekday} yoga session starts at {time} in the {room}.",
    "{name} thanked {name2} for tidying the {room} after the workshop.",
    "A reminder about {topic} will be sent before {weekday}.",
    "The fridge in the kitchen will be emptied on {weekday} afternoon.",
    "{name} noticed that the clock in the {room} is five minutes slow.",
    "The morning train was late again, so the first call started at {time}.",
    "{name2} brought homemade biscuits to share in the {room}.",
    "The fire door on the {floor} floor must stay closed.",
    "Most of the team agreed that {dish} was the best lunch this week.",
    "{name} is collecting ideas for {topic} in a shared document.",
    "The new monitors for the {floor} floor are still in their boxes.",
    "Parking near the entrance will be limited on {weekday} because of roadworks.",
    "{name} moved the {supply} from the {room} to the storage room.",
    "The courtyard stayed empty all afternoon because of {weather}.",
    "The quarterly office survey closes on {weekday} at {time}.",
    "{name} and {name2} tested the new video conferencing screen in the {room}.",
)


def _filler(rng: random.Random) -> str:
    name, name2 = rng.sample(NAMES, 2)
    return rng.choice(FILLER).format(
        name=name, name2=name2, weekday=rng.choice(WEEKDAYS), time=rng.choice(TIMES), room=rng.choice(ROOMS),
        floor=rng.choice(FLOORS), supply=rng.choice(SUPPLIES), weather=rng.choice(WEATHER),
        dish=rng.choice(DISHES), topic=rng.choice(TOPICS), count=rng.randint(2, 12))


def _document(rng: random.Random, facts: list[tuple[str, bool]], target_chars: int) -> tuple[str, list]:
    """Filler paragraphs with `facts` at random positions; returns text and the spans of the facts flagged True."""
    fill: list[str] = []
    seen: set[str] = set()  # membership only: no sentence twice in a document
    size = sum(len(f) + 1 for f, _ in facts)
    while size < target_chars or len(fill) < 3:
        s = _filler(rng)
        if s not in seen:
            fill.append(s)
            seen.add(s)
            size += len(s) + 1
    slots = set(rng.sample(range(len(fill) + len(facts)), len(facts)))
    order = list(facts)
    rng.shuffle(order)
    fi, fa = iter(fill), iter(order)
    sentences = [next(fa) if i in slots else (next(fi), False) for i in range(len(fill) + len(facts))]
    text, spans, in_par = "", [], 0
    par_len = rng.randint(3, 7)
    for s, gold in sentences:
        if text:
            if in_par >= par_len:
                text, in_par, par_len = text + "\n\n", 0, rng.randint(3, 7)
            else:
                text += " "
        if gold:
            spans.append((len(text), len(text) + len(s)))
        text += s
        in_par += 1
    return text, spans


NEED = {"city": ("based",), "leader": ("leads",), "budget": ("budget",), "city_of_leader": ("leads", "based"),
        "budget_of_leader": ("leads", "budget"), "leader_of_city": ("based", "leads")}


def _episode(rng: random.Random, idx: int, qtype_hops: tuple[str, int], bucket: int, senders: int = SENDERS,
             topology: str = "fanin", follow_ups: tuple[str, ...] = ()) -> Episode | list[Episode]:
    """One episode of `qtype_hops`' question; with `follow_ups` (question types), the list of that episode and one
    more per follow-up: the same contexts (the same world), asked about the same target project. Drawing from
    `rng` does not depend on `follow_ups`, so the first episode is the same either way."""
    qtype, hops = qtype_hops
    if senders < hops:
        raise ConfigError(f"a {hops}-hop question needs ≥ {hops} senders, got {senders}")
    k = rng.randint(6, 8)
    projects = rng.sample(PROJECTS, k)
    cities = rng.sample(CITIES, k)
    amounts = [f"{a / 10:.1f}" for a in rng.sample(range(10, 100), k)]
    firsts = rng.sample(FIRST, k - 2)
    firsts += rng.sample(firsts, 2)  # near misses: two first names are shared
    lasts = rng.sample(LAST, k)
    people = [f"{f} {l}" for f, l in zip(firsts, lasts)]
    facts = []  # (relation, project index, sentence)
    for i in range(k):
        facts.append(("leads", i, rng.choice(LEADS).format(person=people[i], project=projects[i])))
        facts.append(("based", i, rng.choice(BASED).format(project=projects[i], city=cities[i])))
        facts.append(("budget", i, rng.choice(BUDGET).format(project=projects[i], amount=amounts[i])))
    # Drop some facts about other projects (the world is not complete), keep every fact about the target (0).
    facts = [f for f in facts if f[1] == 0 or rng.random() < 0.8]
    need = NEED[qtype]
    gold_agents = rng.sample(range(senders), len(need))  # distinct senders for the two hops
    placement = {}
    for j, f in enumerate(facts):
        if f[1] == 0 and f[0] in need:
            placement[j] = gold_agents[need.index(f[0])]
        else:
            placement[j] = rng.randrange(senders)
    contexts, gold_spans, approx = [], {}, []
    for a in range(senders):  # every target fact's span is kept (flagging spends no randomness): follow-ups use them
        mine = [(f[2], f[1] == 0) for j, f in enumerate(facts) if placement[j] == a]
        text, spans = _document(rng, mine, int(bucket * CHARS_PER_TOKEN * rng.uniform(0.95, 1.03)))
        for st, en in spans:
            gold_spans[text[st:en]] = Span(a, st, en)
        contexts.append(text)
        approx.append(round(len(text) / CHARS_PER_TOKEN))
    gold_sentence = {f[0]: f[2] for f in facts if f[1] == 0}
    world = {"contexts": tuple(contexts), "gold": {r: gold_spans[gold_sentence[r]] for r in gold_sentence},
             "project": projects[0], "person": people[0], "city": cities[0], "amount": amounts[0], "k": k,
             "approx": approx, "bucket": bucket, "topology": topology}
    first = _ask(world, f"facts-{idx:04d}", qtype, hops)
    if not follow_ups:
        return first
    return [first] + [_ask(world, f"facts-{idx:04d}-f{j + 1}", q, dict(QTYPES)[q], group=f"facts-{idx:04d}")
                      for j, q in enumerate(follow_ups)]


def _ask(world: dict, eid: str, qtype: str, hops: int, group: str | None = None) -> Episode:
    """The episode asking `qtype` about the world's target project (its evidence: the needed facts' spans)."""
    evidence = tuple(world["gold"][r] for r in NEED[qtype])
    question = QUESTIONS[qtype].format(project=world["project"], person=world["person"], city=world["city"])
    answer_kind = {"city": "city", "leader": "person", "budget": "budget", "city_of_leader": "city",
                   "budget_of_leader": "budget", "leader_of_city": "person"}[qtype]
    amount = world["amount"]
    answers = {"city": [world["city"]], "person": [world["person"]],
               "budget": [f"{amount} million euros", f"{amount} million", f"€{amount} million",
                          f"EUR {amount} million"]}[answer_kind]
    contexts = world["contexts"]
    meta = {"hops": hops, "qtype": qtype, "length_bucket": world["bucket"], "approx_tokens": world["approx"],
            "bridge": world["project"] if hops == 2 else None, "n_projects": world["k"],
            "evidence_depth": [round(s.start / len(contexts[s.agent]), 3) for s in evidence]}
    if group is not None:
        meta["follow_up_of"] = group
    return Episode(eid, "facts", world["topology"], question, answers, contexts, evidence, meta)


def episodes(seed: int, n: int, tokens: int, senders: int, hops: int | None = None,
             topology: str = "fanin") -> list[Episode]:
    """`n` episodes of `senders` contexts of ~`tokens` tokens each (any size, any number of senders), cycling
    over the question types (of `hops` hops only, if given): for scaling sweeps and chains. Pure in `seed`."""
    if hops not in (None, *sorted({h for _, h in QTYPES})):
        raise ConfigError(f"facts: hops must be 1 or 2 (or None for both), got {hops!r}")
    qtypes = [q for q in QTYPES if hops is None or q[1] == hops]
    rng = random.Random(seed)
    return [_episode(rng, i, qtypes[i % len(qtypes)], tokens, senders, topology) for i in range(n)]


def generate(seed: int, n: int = 120) -> list[Episode]:
    """`n` episodes cycling over the 6 question types within each length bucket; a pure function of `seed`."""
    rng = random.Random(seed)
    schedule = [(q, b) for b, c in zip(BUCKETS, PER_QTYPE) for _ in range(c) for q in QTYPES]
    return [_episode(rng, i, *schedule[i % len(schedule)]) for i in range(n)]


def follow_up_episodes(seed: int, n: int, tokens: int, senders: int = SENDERS,
                       questions: tuple[str, ...] = ("city", "leader", "budget")) -> list[list[Episode]]:
    """`n` groups of episodes over the same documents (agents that hold their documents and answer several
    questions): group i asks `questions` in order about one world's target project, the first question
    cycling the one-hop types as `episodes` does. Pure in `seed`."""
    for q in questions:
        if q not in dict(QTYPES):
            raise UnknownNameError("facts question type", q, dict(QTYPES))
    rng = random.Random(seed)
    one_hop = [q for q in QTYPES if q[1] == 1]
    groups = []
    for i in range(n):
        first = one_hop[i % len(one_hop)]
        rest = tuple(q for q in questions if q != first[0])
        groups.append(_episode(rng, i, first, tokens, senders, follow_ups=rest))
    return groups

"""The person-attribute tasks (paraphrase, coref, aggregate): determinism, committed data, and the properties
that make word overlap fail (checked with the lexical selector's own `content_words`)."""
from __future__ import annotations

import collections
import re

import pytest

from latentwire.bench.tasks import SEED, TASKS, facts, generate, load_task, paraphrase, people, task_path
from latentwire.select.bm25 import terms
from latentwire.select.lexical import content_words

NAMES = ("aggregate", "coref", "paraphrase")
FIRST = {f for f, _ in people.FIRST}
SENTENCE_END = re.compile(r"(?<=\.)\s+")


@pytest.fixture(scope="module")
def fresh():
    return {name: generate(name) for name in NAMES}


def _lines(episodes):
    return [ep.to_json() for ep in episodes]


def _target(question: str) -> tuple[str, str]:
    words = re.findall(r"[A-Z]\w+", question)
    i = next(i for i, w in enumerate(words) if w in FIRST)
    return words[i], words[i + 1]


def _occurrences(value: str, contexts) -> list[tuple[int, int]]:
    pat = re.compile(rf"(?<!\w){re.escape(value)}(?!\w)", re.I)
    return [(a, m.start()) for a, c in enumerate(contexts) for m in pat.finditer(c)]


def _values(ep) -> list[str]:
    return [v[0] for v in ep.answers.values()] if ep.multipart else [ep.answers[0]]


# --- vocabulary -------------------------------------------------------------------------------------------

def _bare(template: str) -> set[str]:
    return content_words(re.sub(r"\{\w+\}", " ", template))


def test_vocabulary_paraphrases_share_no_word_and_values_are_distinct():
    rels = people.RELATIONS
    assert len(rels) >= 20 and len({r.name for r in rels}) == len(rels)
    values = [v.lower() for r in rels for v in r.values]
    value_words = collections.Counter(w for v in values for w in v.split())
    assert all(len(r.values) >= 20 for r in rels)
    assert max(value_words.values()) == 1  # no word in two values (so no value inside another)
    other_text = " ".join([s for r in rels for s in r.templates + (r.ask, r.para, r.agg)] + list(facts.FILLER)
                          + list(people.INTROS + people.INTROS_NICK) + list(people.NICKNAMES)
                          + [" ".join(x) for x in (facts.NAMES, facts.ROOMS, facts.SUPPLIES, facts.WEATHER,
                                                   facts.DISHES, facts.TOPICS, facts.WEEKDAYS, facts.FLOORS)]
                          + list(people.LAST) + sorted(FIRST)).lower()
    for v in values:
        assert v not in other_text and sum(v in w for w in values) == 1, v  # not even as a substring
    for r in rels:
        words = set().union(*map(_bare, r.templates))
        for q in (r.para, r.agg):
            assert not (_bare(q) & (words | set(value_words))), (r.name, q)
        assert all(_bare(r.ask) & _bare(t) for t in r.templates), r.name  # coref's tie on relation words
        assert not _bare(r.ask) & set(value_words), r.name
    names = FIRST | set(people.LAST) | set(people.NICKNAMES)
    assert not names & set(facts.FIRST + facts.LAST + facts.NAMES)
    assert len(set(people.NICKNAMES)) == len(people.NICKNAMES)
    assert not set(people.NICKNAMES) & (FIRST | set(people.LAST))


# --- registry, files, determinism -------------------------------------------------------------------------

def test_registered_committed_and_deterministic(fresh):
    for name in NAMES:
        assert name in TASKS and task_path(name).is_file()
        eps = fresh[name]
        assert len(eps) == 120 and len({e.id for e in eps}) == 120
        assert all(e.task == name and e.topology == "fanin" and len(e.contexts) == 3 for e in eps)
        assert [e.id for e in eps[:2]] == [f"{name}-0000", f"{name}-0001"]
        assert _lines(TASKS[name](SEED)) == _lines(eps)
        data = "".join(line + "\n" for line in _lines(eps)).encode("utf-8")
        assert task_path(name).read_bytes() == data, f"{name}: run `python tasks/generate.py`"
        assert load_task(name) == eps and len(data) < 1_000_000
        assert _lines(TASKS[name](SEED + 1, n=6)) != _lines(eps[:6])  # the seed matters
        assert collections.Counter(e.meta["qtype"] for e in eps) == {r.name: 5 for r in people.RELATIONS}


def test_evidence_is_whole_trimmed_sentences_and_lengths(fresh):
    for eps in fresh.values():
        for e in eps:
            assert e.evidence
            for s, text in zip(e.evidence, e.evidence_text()):
                ctx = e.contexts[s.agent]
                assert text == text.strip() and text[0].isupper() and text.endswith("."), e.id
                assert (s.start == 0 or ctx[s.start - 1] in " \n") and (s.end == len(ctx) or ctx[s.end] in " \n")
                assert "\n" not in text and len(SENTENCE_END.split(text)) == 1
            assert all(1200 <= len(c) <= 1700 for c in e.contexts), e.id
            assert e.meta["approx_tokens"] == [round(len(c) / 4.2) for c in e.contexts]
            assert e.meta["evidence_depth"] == [round(s.start / len(e.contexts[s.agent]), 3) for s in e.evidence]


def test_each_answer_occurs_once_inside_the_evidence(fresh):
    for eps in fresh.values():
        for e in eps:
            vals = _values(e)
            assert len(set(vals)) == len(vals) == len(e.evidence)
            for v, s in zip(vals, e.evidence):
                assert _occurrences(v, e.contexts) == [(s.agent, s.start + e.contexts[s.agent][s.start:s.end].index(v))]


def test_spans_map_to_tokens(fresh):
    from latentwire.bench.episode import span_token_positions
    from latentwire.models import tiny_tokenizer
    tok = tiny_tokenizer()
    for eps in fresh.values():
        for e in eps[:3]:
            for s, text in zip(e.evidence, e.evidence_text()):
                ctx = e.contexts[s.agent]
                pos = span_token_positions(ctx, [(s.start, s.end)], tok)
                ids = tok(ctx, add_special_tokens=False)["input_ids"]
                assert tok.decode([ids[i] for i in pos]) == text


# --- per task ---------------------------------------------------------------------------------------------

def test_paraphrase_question_shares_only_the_name_with_the_evidence(fresh):
    for e in fresh["paraphrase"]:
        first, last = _target(e.question)
        name = f"{first} {last}"
        (ev,) = e.evidence_text()
        assert ev.startswith(name) or f" {name} " in ev
        assert not (content_words(e.question) - {first.lower(), last.lower()}) & content_words(ev), e.id
        assert not set(terms(e.question)) - set(terms(name)) & set(terms(ev)), e.id  # stemmed (BM25's terms) too
        counts = [c.count(name) for c in e.contexts]
        assert min(counts) >= 6 and counts == e.meta["target_sentences"], e.id
        rel = people.BY_NAME[e.meta["qtype"]]
        assert e.question == rel.para.format(person=name)
        # Word overlap: every target sentence scores at least as high as the evidence.
        q = content_words(e.question)
        sentences = [t for c in e.contexts for t in SENTENCE_END.split(c.replace("\n\n", " ")) if name in t]
        assert len(sentences) == sum(counts) and all(len(q & content_words(t)) >= 2 for t in sentences)
        assert len(q & content_words(ev)) == 2
        for other, values in paraphrase.CROSS_ANSWERS.get(rel.name, {}).items():  # e.g. a feared hornet's sting
            assert not [v for c in e.contexts for v in values if re.search(rf"\b{v}\b", c)], (e.id, other)


def test_coref_evidence_names_the_target_only_by_pronoun_or_nickname(fresh):
    via = collections.Counter()
    for e in fresh["coref"]:
        first, last = _target(e.question)
        name = f"{first} {last}"
        (s,), (ev,) = e.evidence, e.evidence_text()
        ctx = e.contexts[s.agent]
        assert first not in ev and last not in ev, e.id
        assert sum(c.count(name) for c in e.contexts) == 1  # only its introduction
        assert e.question == people.BY_NAME[e.meta["qtype"]].ask.format(person=name)
        opens = ctx.rfind("\n\n", 0, s.start)
        paragraph = ctx[0 if opens < 0 else opens + 2:].split("\n\n")[0]
        assert paragraph.startswith(name + " ") or paragraph.startswith(name + ","), e.id
        subject = ev.split()[0] if ev.split()[0] not in ("Every", "Most", "On") else ev.split()[2]
        via[e.meta["via"]] += 1
        if e.meta["via"] == "alias":
            assert subject in people.NICKNAMES and paragraph.index(subject) < paragraph.index(ev), e.id
        else:
            assert subject.lower() in ("she", "he"), e.id
        rel_words = content_words(e.question) - {first.lower(), last.lower()}
        tie = rel_words & content_words(ev)
        same = [t for t in SENTENCE_END.split(ctx.replace("\n\n", " ")) if rel_words & content_words(t) == tie]
        assert tie and len(same) >= 4, e.id
        per = e.meta["people_per_sender"]
        assert len(per) == 3 and per[s.agent] == 9, e.id  # the evidence sender: 9 short paragraphs
        assert all(5 <= k <= 6 for a, k in enumerate(per) if a != s.agent), e.id
        for c, k in zip(e.contexts, e.meta["people_per_sender"]):  # one paragraph per person
            assert sum(p.split()[0] in FIRST for p in c.split("\n\n")) == k
    assert via == {"pronoun": 72, "alias": 48}


def test_coref_evidence_sender_holds_about_twice_an_8x_budget_of_ties(fresh):
    """At least 8 sentences of the evidence sender hold the question's relation words (the evidence ties with
    them), ~2x the ~45 tokens a retriever keeps of its ~330 at 8x; its paragraphs are short, with at most one
    filler sentence, and every asked value in the episode is distinct."""
    for e in fresh["coref"]:
        first, last = _target(e.question)
        (s,), (ev,) = e.evidence, e.evidence_text()
        ctx = e.contexts[s.agent]
        rel_words = content_words(e.question) - {first.lower(), last.lower()}
        tie = rel_words & content_words(ev)
        sentences = SENTENCE_END.split(ctx.replace("\n\n", " "))
        assert sum(tie <= content_words(t) for t in sentences) >= 8, e.id
        paragraphs = ctx.split("\n\n")
        people_paragraphs = [p for p in paragraphs if p.split()[0] in FIRST]
        assert len(people_paragraphs) == 9 and len(paragraphs) - 9 <= 1, e.id
        assert all(len(SENTENCE_END.split(p)) <= 3 for p in people_paragraphs), e.id
        rel = people.BY_NAME[e.meta["qtype"]]
        stated = [v for v in rel.values if _occurrences(v, e.contexts)]
        assert len(stated) == sum(e.meta["people_per_sender"]), e.id  # one distinct value per person


def test_aggregate_parts_spread_over_senders_and_no_question_word(fresh):
    parts = collections.Counter()
    for e in fresh["aggregate"]:
        k = e.meta["parts"]
        parts[k] += 1
        assert 3 <= k <= 5 and e.multipart and list(e.answers) == [f"p{i}" for i in range(k)]
        assert len(e.evidence) == k
        per_sender = collections.Counter(s.agent for s in e.evidence)
        assert sorted(per_sender) == [0, 1, 2] and max(per_sender.values()) <= 2
        assert list(e.evidence) == sorted(e.evidence, key=lambda s: (s.agent, s.start))
        q = content_words(e.question)
        assert e.question == people.BY_NAME[e.meta["qtype"]].agg
        for ev in e.evidence_text():
            assert not q & content_words(ev), (e.id, ev)
            assert not set(terms(e.question)) & set(terms(ev)), (e.id, ev)  # stemmed (BM25's terms) too
            assert ev.split()[0] in FIRST or ev.split()[2] in FIRST  # by full name
    assert parts == {3: 48, 4: 48, 5: 24}


def test_long_aggregate_states_several_facts_per_sender_and_keeps_the_default():
    from latentwire.bench.tasks import aggregate
    from latentwire.errors import ConfigError

    long = aggregate.generate(5, 12, tokens=1200, per_sender=2)
    assert [e.contexts for e in long] == [e.contexts for e in aggregate.generate(5, 12, tokens=1200, per_sender=2)]
    for e in long:
        per_sender = collections.Counter(s.agent for s in e.evidence)
        assert sorted(per_sender.values())[0] >= 2 and max(per_sender.values()) <= 3 and len(e.answers) == len(e.evidence)
        assert all(1000 < t < 1400 for t in e.meta["approx_tokens"]), e.meta
        for span, part in zip(e.evidence, e.answers.values()):  # each part's value is in its evidence sentence
            assert any(a in e.contexts[span.agent][span.start:span.end] for a in part), (e.id, part)
    # the default (the shipped task's episodes) is unchanged by the new arguments
    assert [e.contexts for e in aggregate.generate(1, 6)] == [e.contexts for e in aggregate.generate(1, 6, 330, 1)]
    with pytest.raises(ConfigError, match="per_sender"):
        aggregate.generate(1, 2, per_sender=0)

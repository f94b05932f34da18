"""HotpotQA, distractor setting: a JSON list of records

    {"_id": "5a8b57f25542995d1e6f1371", "question": "...", "answer": "yes", "type": "comparison",
     "level": "medium", "supporting_facts": [["Title A", 0], ["Title B", 1], ...],
     "context": [["Title A", ["Sentence 0.", " Sentence 1."]], ...]}     # usually 10 paragraphs

Each record becomes one "fanin" episode. The paragraphs are partitioned among `n_agents` senders:
`split="gold_apart"` (default) puts the gold paragraphs (titles named in `supporting_facts`) in different
agents and spreads the distractors to balance paragraph counts; `split="round_robin"` gives paragraph i to
agent i % n_agents. Within an agent paragraphs keep their order in `context`, rendered as
"Title: sentence sentence ..." (each sentence stripped of surrounding whitespace, joined by one space) and
separated by a blank line. Evidence: one character span per supporting fact, covering exactly that
(stripped) sentence; a fact naming a title not in the context, a sentence past its paragraph or an empty one
is dropped (counted in one SkippedRecordsWarning), its episode kept. answers: [answer]; meta: {type, level}.
"""
from __future__ import annotations

import warnings
from pathlib import Path

from ...errors import SkippedRecordsWarning, UnknownNameError
from ..episode import Episode, Span
from ._common import (SPLITS, Record, TextBuilder, UniqueIds, build_episodes, check_n_agents, dedupe, partition,
                      read_json_list)

TASK = "hotpotqa"


def load_hotpotqa(path: str | Path, *, n_agents: int = 2, split: str = "gold_apart",
                  skip_unscorable: bool = True) -> list[Episode]:
    """Episodes from a HotpotQA distractor-setting JSON file (see the module docstring)."""
    n_agents = check_n_agents(n_agents)
    if split not in SPLITS:
        raise UnknownNameError("split", split, SPLITS)
    if split == "gold_apart" and n_agents < 2:
        raise ValueError("split 'gold_apart' needs n_agents >= 2; use split='round_robin' for one agent")
    ids, dropped = UniqueIds(), []
    out = build_episodes(path, read_json_list(path), lambda rec: _episode(rec, ids, n_agents, split, dropped),
                         skip_unscorable=skip_unscorable)
    if dropped:
        warnings.warn(SkippedRecordsWarning(
            f"{path}: dropped {len(dropped)} supporting facts that point outside their paragraphs (released "
            f"HotpotQA files hold a few; their evidence spans are left out, the episodes kept); first: {dropped[0]}"),
            stacklevel=2)
    return out


def _episode(rec: Record, ids: UniqueIds, n_agents: int, split: str, dropped: list[str]) -> Episode:
    d = rec.data
    ep_id = ids.add(rec, rec.get(d, "_id", "str", nonempty=True), "_id")
    question = rec.get(d, "question", "str", nonempty=True)
    answer = rec.get(d, "answer", "str", nonempty=True)
    qtype = rec.get(d, "type", "str")
    level = rec.get(d, "level", "str")

    paragraphs: list[tuple[str, list[str]]] = []
    index_of: dict[str, int] = {}
    for i, item in enumerate(rec.get(d, "context", "list", nonempty=True)):
        field = f"context[{i}]"
        if not isinstance(item, list) or len(item) != 2:
            rec.fail(field, "want [title, [sentence, ...]]")
        title = rec.check(item[0], f"{field}[0]", "str", nonempty=True)
        sentences = rec.check(item[1], f"{field}[1]", "list")
        for j, s in enumerate(sentences):
            rec.check(s, f"{field}[1][{j}]", "str")
        if title in index_of:
            rec.fail(f"{field}[0]", f"duplicate title {title!r} (also context[{index_of[title]}])")
        index_of[title] = i
        paragraphs.append((title, sentences))

    facts: list[tuple[int, int]] = []
    for k, fact in enumerate(rec.get(d, "supporting_facts", "list", nonempty=True)):
        field = f"supporting_facts[{k}]"
        if not isinstance(fact, list) or len(fact) != 2:
            rec.fail(field, "want [title, sentence index]")
        title = rec.check(fact[0], f"{field}[0]", "str")
        sent = rec.check(fact[1], f"{field}[1]", "int")
        where = f"{rec.where}: {field}"
        if title not in index_of:
            dropped.append(f"{where}[0]: title {title!r} is not a paragraph of context")
            continue
        p = index_of[title]
        n_sent = len(paragraphs[p][1])
        if not 0 <= sent < n_sent:
            dropped.append(f"{where}[1]: sentence {sent} out of range ({title!r} has {n_sent} sentences)")
        elif not paragraphs[p][1][sent].strip():
            dropped.append(f"{where}[1]: sentence {sent} of {title!r} is empty")
        else:
            facts.append((p, sent))
    facts = dedupe(facts)

    if n_agents > len(paragraphs):
        rec.fail("context", f"{len(paragraphs)} paragraphs cannot fill {n_agents} agents")
    gold = sorted({p for p, _ in facts})
    groups = partition(len(paragraphs), gold, n_agents, split)

    contexts, where = [], {}  # where[(paragraph, sentence)] = (agent, start, end)
    for agent, group in enumerate(groups):
        text = TextBuilder()
        for n, p in enumerate(group):
            title, sentences = paragraphs[p]
            text.add(("\n\n" if n else "") + f"{title}:")
            for j, s in enumerate(sentences):
                s = s.strip()
                if s:
                    start = text.add(" ") + 1
                    text.add(s)
                    where[(p, j)] = (agent, start, start + len(s))
        contexts.append(text.text())

    return rec.episode(id=ep_id, task=TASK, topology="fanin", question=question, answers=[answer.strip()],
                       contexts=tuple(contexts), evidence=tuple(Span(*where[f]) for f in facts),
                       meta={"type": qtype, "level": level})

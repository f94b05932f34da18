"""MuSiQue: JSONL, one record per line

    {"id": "2hop__460946_294723", "question": "...", "answer": "Miquette Giraudy", "answer_aliases": [],
     "answerable": true,
     "paragraphs": [{"idx": 0, "title": "...", "paragraph_text": "...", "is_supporting": false}, ...],
     "question_decomposition": [{"id": 460946, "question": "Green >> performer", "answer": "...",
                                 "paragraph_support_idx": 10}, ...]}

Each answerable record becomes one "fanin" episode; unanswerable ones (`"answerable": false`, MuSiQue-Full)
are skipped unless `include_unanswerable=True`, in which case they keep the record's answer and aliases
and carry meta {"answerable": false} so a metric can treat them apart. A record without `answerable` is
taken as answerable. The paragraphs (in file order) are partitioned among `n_agents` senders as for HotpotQA:
`split="gold_apart"` (default) spreads the supporting paragraphs over different agents (in turn, so with
fewer agents than hops some agent holds two) and balances the rest; `split="round_robin"` deals them out in
order. A paragraph is rendered "Title: text" (text stripped), paragraphs separated by a blank line. Evidence:
one span per supporting paragraph covering its whole (stripped) paragraph_text. answers: [answer, *aliases]
(deduplicated); meta: {hops: len(question_decomposition), answerable}.
"""
from __future__ import annotations

from pathlib import Path

from ...errors import UnknownNameError
from ..episode import Episode, Span
from ._common import (SPLITS, Record, TextBuilder, UniqueIds, build_episodes, check_n_agents, dedupe, partition,
                      read_jsonl)

TASK = "musique"


def load_musique(path: str | Path, *, n_agents: int = 2, split: str = "gold_apart",
                 include_unanswerable: bool = False, skip_unscorable: bool = True) -> list[Episode]:
    """Episodes from a MuSiQue JSONL file (see the module docstring)."""
    n_agents = check_n_agents(n_agents)
    if split not in SPLITS:
        raise UnknownNameError("split", split, SPLITS)
    if split == "gold_apart" and n_agents < 2:
        raise ValueError("split 'gold_apart' needs n_agents >= 2; use split='round_robin' for one agent")
    ids = UniqueIds()
    return build_episodes(path, read_jsonl(path), lambda rec: _episode(rec, ids, n_agents, split, include_unanswerable),
                          skip_unscorable=skip_unscorable)


def _episode(rec: Record, ids: UniqueIds, n_agents: int, split: str, include_unanswerable: bool) -> Episode | None:
    d = rec.data
    ep_id = ids.add(rec, rec.get(d, "id", "str", nonempty=True))
    answerable = rec.get(d, "answerable", "bool", default=True)
    question = rec.get(d, "question", "str", nonempty=True)
    answer = rec.get(d, "answer", "str", nonempty=True)
    aliases = rec.get(d, "answer_aliases", "list")
    for k, a in enumerate(aliases):
        rec.check(a, f"answer_aliases[{k}]", "str")
    decomposition = rec.get(d, "question_decomposition", "list", nonempty=answerable)
    for k, step in enumerate(decomposition):
        rec.check(step, f"question_decomposition[{k}]", "dict")

    paragraphs: list[tuple[str, str, bool]] = []
    for i, para in enumerate(rec.get(d, "paragraphs", "list", nonempty=True)):
        field = f"paragraphs[{i}]"
        rec.check(para, field, "dict")
        rec.get(para, "idx", "int", prefix=field)
        title = rec.get(para, "title", "str", prefix=field)
        text = rec.get(para, "paragraph_text", "str", prefix=field)
        supporting = rec.get(para, "is_supporting", "bool", prefix=field)
        if supporting and not text.strip():
            rec.fail(f"{field}.paragraph_text", "empty, but the paragraph is supporting")
        paragraphs.append((title.strip(), text.strip(), supporting))
    gold = [i for i, (_, _, s) in enumerate(paragraphs) if s]
    if answerable and not gold:
        rec.fail("paragraphs", "no paragraph has is_supporting true in an answerable record")
    if not answerable and not include_unanswerable:
        return None
    if n_agents > len(paragraphs):
        rec.fail("paragraphs", f"{len(paragraphs)} paragraphs cannot fill {n_agents} agents")

    contexts, where = [], {}
    for agent, group in enumerate(partition(len(paragraphs), gold, n_agents, split)):
        builder = TextBuilder()
        for n, p in enumerate(group):
            title, text, _ = paragraphs[p]
            builder.add(("\n\n" if n else "") + (f"{title}: " if title else ""))
            where[p] = (agent, builder.add(text), builder.length)
        contexts.append(builder.text())

    return rec.episode(id=ep_id, task=TASK, topology="fanin", question=question,
                       answers=dedupe([answer.strip(), *(a.strip() for a in aliases if a.strip())]),
                       contexts=tuple(contexts), evidence=tuple(Span(*where[p]) for p in gold),
                       meta={"hops": len(decomposition), "answerable": answerable})

"""Split-evidence pairs for heterogeneous agents (docs/methods.md#translator-training): a sharer and a
receiver each hold half.

    pairs("facts", "train", n=200)   # two-hop facts: the bridge fact in one document, the answer in the other
    pairs("reasoning", "test", n=40) # 2-thinker premise split: every premise is needed

Neither document alone answers the question. Train, validation and test come from one candidate stream per
(task, seed), split by a hash of the documents, and are checked to never share a document (`check_disjoint`). Pure functions of (task, split, n, seed).
"""
from __future__ import annotations

import hashlib
import random
from dataclasses import astuple, dataclass

from ...errors import UnknownNameError
from . import facts, reasoning

PAIR_TASKS = ("facts", "reasoning")
SPLITS = {"train": 1, "val": 2, "test": 3}
FACTS_TOKENS = 110  # per document: 1 gold fact + distractors + filler; short enough to train on a CPU


@dataclass(frozen=True)
class Pair:
    id: str
    task: str
    sharer_doc: str
    receiver_doc: str
    question: str
    answers: tuple[str, ...]  # aliases; answers[0] is the training target

    @property
    def target(self) -> str:
        return self.answers[0]


def pairs(task: str, split: str, n: int, seed: int = 0) -> list[Pair]:
    """`n` split-evidence pairs of `task` in `split` ("train" | "val" | "test").

    One candidate stream per (task, seed); a candidate belongs to a split when both its documents hash
    into that split's bucket, so a document (even one generated twice) can only ever be in one split.
    """
    if task not in PAIR_TASKS:
        raise UnknownNameError("pair task", task, PAIR_TASKS)
    if split not in SPLITS:
        raise UnknownNameError("split", split, SPLITS)
    out: list[Pair] = []
    for cand in _candidates(task, seed):
        if _bucket(cand.sharer_doc) == _bucket(cand.receiver_doc) == SPLITS[split]:
            out.append(Pair(f"{task}-{split}-{len(out):04d}", *astuple(cand)[1:]))
            if len(out) == n:
                return out
    raise AssertionError("unreachable: the candidate stream is infinite")


def _candidates(task: str, seed: int):
    rng = random.Random(f"{task}-{seed}")
    i = 0
    while True:
        if task == "facts":
            e = facts._episode(rng, i, facts.QTYPES[3 + i % 3], FACTS_TOKENS, senders=2)  # the two-hop types
        else:
            e = reasoning._episodes(rng, i, 2, reasoning.KINDS[i % 2])[0]  # query-blind: premises only
        yield Pair("", task, e.contexts[0], e.contexts[1], e.question, tuple(e.answers))
        i += 1


def _bucket(doc: str) -> int:
    return int(doc_digest(doc)[:8], 16) % len(SPLITS) + 1


def doc_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def check_disjoint(*splits: list[Pair]) -> None:
    """ValueError naming the pairs if any document occurs in two splits."""
    seen: dict[str, str] = {}
    for group in splits:
        mine = {}
        for p in group:
            for doc in (p.sharer_doc, p.receiver_doc):
                d = doc_digest(doc)
                if d in seen:
                    raise ValueError(f"document of {p.id} also occurs in {seen[d]}: splits must not share documents")
                mine[d] = p.id
        seen |= mine

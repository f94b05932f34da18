"""LongBench v2: a JSON list of records (the released `data.json`)

    {"_id": "66f36490821e116aacb2cc22", "domain": "Single-Document QA", "sub_domain": "Financial",
     "difficulty": "easy", "length": "short", "question": "...", "choice_A": "...", "choice_B": "...",
     "choice_C": "...", "choice_D": "...", "answer": "B", "context": "<one long document>"}

Each record becomes one "fanin" episode. The context is cut into `n_agents` contiguous chunks of about
equal length: each cut goes, within half a chunk of its ideal position, after a blank line ("\\n\\n") if
there is one, else after a line break, else after any whitespace, nearest the ideal position first (with
no whitespace that close, mid-word at the ideal position). Chunks are exact slices, each ending with the
whitespace before the next, so "".join(contexts) == context. The question text is the question followed
by the four choices as "(A) ..." lines. answers: [letter, text of that choice]; evidence: none
(LongBench v2 marks no spans); meta: {domain, sub_domain, difficulty, length, answer_match: "choice"} (the
letter a reply chooses is scored: `metrics.chosen_letter`).
"""
from __future__ import annotations

import re
from pathlib import Path

from ..episode import Episode
from ._common import Record, UniqueIds, build_episodes, check_n_agents, dedupe, read_json_list

TASK = "longbench_v2"
LETTERS = ("A", "B", "C", "D")
_WS, _RUN = re.compile(r"\s"), re.compile(r"\s*")


def load_longbench_v2(path: str | Path, *, n_agents: int = 2, skip_unscorable: bool = True) -> list[Episode]:
    """Episodes from a LongBench v2 JSON file (see the module docstring)."""
    n_agents = check_n_agents(n_agents)
    ids = UniqueIds()
    return build_episodes(path, read_json_list(path), lambda rec: _episode(rec, ids, n_agents),
                          skip_unscorable=skip_unscorable)


def _episode(rec: Record, ids: UniqueIds, n_agents: int) -> Episode:
    d = rec.data
    ep_id = ids.add(rec, rec.get(d, "_id", "str", nonempty=True), "_id")
    meta = {k: rec.get(d, k, "str") for k in ("domain", "sub_domain", "difficulty", "length")}
    meta["answer_match"] = "choice"  # the chosen letter is scored, not any letter the reply contains
    question = rec.get(d, "question", "str", nonempty=True).strip()
    choices = {x: rec.get(d, f"choice_{x}", "str", nonempty=True).strip() for x in LETTERS}
    answer = rec.get(d, "answer", "str").strip()
    if answer not in LETTERS:
        rec.fail("answer", f"want one of {', '.join(LETTERS)}, got {answer!r}")
    context = rec.get(d, "context", "str", nonempty=True)
    if len(context) < n_agents:
        rec.fail("context", f"{len(context)} characters cannot be split among {n_agents} agents")
    text = question + "\n\n" + "\n".join(f"({x}) {choices[x]}" for x in LETTERS)
    return rec.episode(id=ep_id, task=TASK, topology="fanin", question=text,
                       answers=dedupe([answer, choices[answer]]), contexts=tuple(split_text(context, n_agents)),
                       evidence=(), meta=meta)


def split_text(text: str, n: int) -> list[str]:
    """`text` as `n` non-empty contiguous slices of about equal length, cut at whitespace where possible."""
    if n < 1 or len(text) < n:
        raise ValueError(f"cannot split {len(text)} characters into {n} non-empty chunks")
    bounds = [0]
    for k in range(1, n):
        target = round(k * len(text) / n)
        lo, hi = bounds[-1] + 1, len(text) - (n - k)  # every chunk keeps at least one character
        bounds.append(_cut(text, min(max(target, lo), hi), lo, hi, max(1, len(text) // (2 * n))))
    bounds.append(len(text))
    return [text[a:b] for a, b in zip(bounds, bounds[1:])]


def _cut(text: str, target: int, lo: int, hi: int, window: int) -> int:
    """Best cut in [lo, hi]: the end of a whitespace run followed by non-whitespace, near `target`;
    blank lines first, then line breaks, then any whitespace; `target` itself when there is no whitespace."""
    a, b = max(lo, target - window), min(hi, target + window)
    for sep in ("\n\n", "\n", None):
        if sep is None:
            right = _WS.search(text, target, b + 1)
            starts = [right.start()] if right else []
            q = target - 1
            while q >= a - 1 and not text[q].isspace():
                q -= 1
            starts += [q] if q >= a - 1 else []
        else:
            starts = [q for q in (text.rfind(sep, a - 1, target), text.find(sep, target, b + 1)) if q >= 0]
        ends = [_RUN.match(text, q).end() for q in starts]
        ends = [p for p in ends if a <= p <= b and p < len(text)]
        if ends:
            return min(ends, key=lambda p: (abs(p - target), p))
    return target

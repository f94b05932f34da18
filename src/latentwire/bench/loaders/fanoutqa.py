"""FanOutQA: the questions JSON (a JSON list, `fanout-final-dev.json`) plus a directory of evidence pages.

Dev-split record (the real file has no top-level `necessary_evidence`; it is derived, as the `fanoutqa`
package does, by walking `decomposition` depth-first and taking every non-null `evidence`):

    {"id": "7dcbbbdc7f1120cd", "question": "What is the batting hand of each of the first five picks ...?",
     "answer": {"Pat Burrell": "Right", "Mark Mulder": "Left", ...},      # dict, list, str, int, float or bool
     "categories": ["Sports", "Statistics"],
     "decomposition": [{"id": "...", "question": "...", "answer": [...], "depends_on": [],
                        "decomposition": [], "evidence": {"pageid": 18468611, "revid": 1172527864,
                                                          "title": "1998 Major League Baseball draft",
                                                          "url": "https://en.wikipedia.org/wiki/..."}}, ...]}

A record may instead list `necessary_evidence` [{pageid, title, ...}] directly (the test-split layout); it
is used when present. Test-split records have no `answer` and are rejected.

Pages: `pages_dir/<pageid>.txt`, `<pageid>.md` or `<pageid>-dated.md` (the first that exists; the last is
the name the `fanoutqa` package's `wiki_content` caches under ~/.cache/fanoutqa/wikicache, so that directory
works as is). UTF-8 plain text or markdown; a missing page raises TaskFormatError naming the record, the
evidence field, the page id and title.

Each question becomes one "fanin" episode. Pages (deduplicated by pageid, in evidence order) are dealt to
min(#pages, max_agents) agents, page i to agent i % n, so with the default cap of 8 most questions give one
page per agent. A page is rendered "# Title\\n\\n<text>" (text stripped, then cut to `max_chars_per_page`
characters if given), pages of one agent separated by a blank line.

answers: a dict answer becomes multi-part {key: [value]}; a list answer becomes multi-part {item: [item]}
(every item is required; a one-item list is a plain answer); a primitive is [value]. Values are written as
strings; booleans as "yes"/"no" (FanOutQA's own convention); integral floats also as the integer ("100").
Parts or items whose value is an empty string (the dev set has one: an unknown birthday) are dropped
and named in meta["dropped_answer_parts"]. Note the part names (dict keys) are not themselves scored, unlike
FanOutQA's own string accuracy.
evidence: none — FanOutQA marks no spans finer than a whole page, and every page is necessary, so a span
would cover the whole context. meta: {categories, pageids (per agent), n_pages, truncated_pages}.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Iterator

from ...errors import TaskFormatError
from ..episode import Episode
from ._common import Record, TextBuilder, UniqueIds, build_episodes, check_n_agents, dedupe, read_json_list

TASK = "fanoutqa"
PAGE_NAMES = ("{pageid}.txt", "{pageid}.md", "{pageid}-dated.md")
BUNDLED_DEV = "data/fanout-final-dev.json"


def bundled_dev_path() -> Path:
    """The dev questions shipped inside the `fanoutqa` PyPI wheel, found without importing the package
    (importing it needs spacy, httpx, ftfy and markdownify; `pip install --no-deps fanoutqa` is enough here)."""
    spec = importlib.util.find_spec("fanoutqa")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        path = Path(loc) / BUNDLED_DEV
        if path.is_file():
            return path
    raise FileNotFoundError("no FanOutQA questions file given and the `fanoutqa` package (which bundles "
                            f"{BUNDLED_DEV}) is not installed: pass the path to fanout-final-dev.json, or "
                            "`pip install --no-deps fanoutqa`")


def load_fanoutqa(path: str | Path | None = None, *, pages_dir: str | Path | None = None,
                  max_agents: int | None = 8, max_chars_per_page: int | None = None,
                  skip_unscorable: bool = True) -> list[Episode]:
    """Episodes from a FanOutQA questions JSON (None: the dev set bundled with the `fanoutqa` package) and a
    directory of evidence pages (see the module docstring). `max_agents=None` means one agent per page."""
    if pages_dir is None:
        raise ValueError("pages_dir: required — a directory of evidence pages named <pageid>.txt, <pageid>.md "
                         "or <pageid>-dated.md (e.g. ~/.cache/fanoutqa/wikicache)")
    pages_dir = Path(pages_dir).expanduser()
    if not pages_dir.is_dir():
        raise FileNotFoundError(f"pages_dir: {pages_dir} is not a directory")
    if max_agents is not None:
        max_agents = check_n_agents(max_agents, "max_agents")
    if max_chars_per_page is not None:
        max_chars_per_page = check_n_agents(max_chars_per_page, "max_chars_per_page")
    path = bundled_dev_path() if path is None else path
    ids, cache = UniqueIds(), {}
    return build_episodes(path, read_json_list(path),
                          lambda rec: _episode(rec, ids, pages_dir, cache, max_agents, max_chars_per_page),
                          skip_unscorable=skip_unscorable)


def _episode(rec: Record, ids: UniqueIds, pages_dir: Path, cache: dict, max_agents: int | None,
             max_chars: int | None) -> Episode:
    d = rec.data
    ep_id = ids.add(rec, rec.get(d, "id", "str", nonempty=True))
    question = rec.get(d, "question", "str", nonempty=True)
    if "answer" not in d:
        rec.fail("answer", "missing (FanOutQA's test split has no answers; use the dev split)")
    answers, dropped = _answers(rec, d["answer"])
    categories = rec.get(d, "categories", "list", default=[])
    for k, c in enumerate(categories):
        rec.check(c, f"categories[{k}]", "str")

    pages: dict[int, tuple[str, str]] = {}  # pageid -> (field, title), first occurrence wins
    for field, ev in _evidence(rec):
        pageid = rec.get(ev, "pageid", "int", prefix=field)
        title = rec.get(ev, "title", "str", prefix=field)
        pages.setdefault(pageid, (field, title))
    if not pages:
        rec.fail("decomposition", "no evidence pages")

    n_agents = len(pages) if max_agents is None else min(len(pages), max_agents)
    builders = [TextBuilder() for _ in range(n_agents)]
    pageids: list[list[int]] = [[] for _ in range(n_agents)]
    truncated = 0
    for i, (pageid, (field, title)) in enumerate(pages.items()):
        text = _page(rec, field, pageid, title, pages_dir, cache)
        if max_chars is not None and len(text) > max_chars:
            text, truncated = text[:max_chars].rstrip(), truncated + 1
        a = i % n_agents
        builders[a].add(("\n\n" if pageids[a] else "") + f"# {title}\n\n{text}")
        pageids[a].append(pageid)

    return rec.episode(id=ep_id, task=TASK, topology="fanin", question=question, answers=answers,
                       contexts=tuple(b.text() for b in builders), evidence=(),
                       meta={"categories": categories, "pageids": pageids, "n_pages": len(pages),
                             "truncated_pages": truncated} | ({"dropped_answer_parts": dropped} if dropped else {}))


def _evidence(rec: Record) -> Iterator[tuple[str, Any]]:
    """(field, evidence object) pairs: `necessary_evidence` if present, else walked from `decomposition`."""
    d = rec.data
    if "necessary_evidence" in d:
        for j, ev in enumerate(rec.get(d, "necessary_evidence", "list")):
            yield f"necessary_evidence[{j}]", ev
    elif "decomposition" not in d:
        rec.fail("decomposition", "missing (and no necessary_evidence)")
    else:
        yield from _walk(rec, rec.get(d, "decomposition", "list"), "decomposition")


def _walk(rec: Record, subs: list, prefix: str) -> Iterator[tuple[str, Any]]:
    for k, sub in enumerate(subs):
        field = f"{prefix}[{k}]"
        rec.check(sub, field, "dict")
        if "evidence" not in sub:
            rec.fail(f"{field}.evidence", "missing (null when the subquestion has a decomposition)")
        if sub["evidence"] is not None:
            yield f"{field}.evidence", sub["evidence"]
        yield from _walk(rec, rec.get(sub, "decomposition", "list", prefix=field), f"{field}.decomposition")


def _page(rec: Record, field: str, pageid: int, title: str, pages_dir: Path, cache: dict) -> str:
    if pageid not in cache:
        names = [n.format(pageid=pageid) for n in PAGE_NAMES]
        found = next((pages_dir / n for n in names if (pages_dir / n).is_file()), None)
        if found is None:
            rec.fail(field, f"page {pageid} ({title!r}) not found: looked for {', '.join(names)} in {pages_dir}")
        try:
            cache[pageid] = found.read_text(encoding="utf-8").strip()
        except UnicodeDecodeError as e:
            raise TaskFormatError(f"{found}: not UTF-8 ({e.reason} at byte {e.start})") from e
    return cache[pageid]


def _answers(rec: Record, answer: Any) -> tuple[list | dict, list[str]]:
    """(answers, names of parts dropped because their value is an empty string)."""
    if isinstance(answer, dict):
        kept = {k: v for k, v in answer.items() if not _blank(v)}
        if not kept:
            rec.fail("answer", "empty object" if not answer else "every part is an empty string")
        return {k: _aliases(rec, v, f"answer[{k!r}]") for k, v in kept.items()}, [k for k in answer if k not in kept]
    if isinstance(answer, list):
        parts = {}
        for k, item in enumerate(answer):
            if not _blank(item):
                aliases = _aliases(rec, item, f"answer[{k}]")
                parts.setdefault(aliases[0], aliases)
        if not parts:
            rec.fail("answer", "empty list" if not answer else "every item is an empty string")
        return (next(iter(parts.values())) if len(parts) == 1 else parts), []
    return _aliases(rec, answer, "answer"), []


def _blank(value: Any) -> bool:
    return isinstance(value, str) and not value.strip()


def _aliases(rec: Record, value: Any, field: str) -> list[str]:
    if isinstance(value, bool):
        return ["yes" if value else "no"]
    if isinstance(value, int):
        return [str(value)]
    if isinstance(value, float):
        return dedupe([str(int(value)), str(value)]) if value.is_integer() else [str(value)]
    if isinstance(value, str) and value.strip():
        return [value.strip()]
    rec.fail(field, f"want a non-empty string, number or boolean, got {value!r}"[:200])

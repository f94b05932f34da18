"""The episode format: one JSON object per line (JSONL), validated strictly.

    {"id": "facts-0007", "task": "facts", "topology": "fanin",
     "question": "In which city is the project led by Ana Silva based?",
     "answers": ["Lisbon"]                      # aliases; or {"part": [aliases], ...} for multi-part
     "contexts": ["sender 0 document", "sender 1 document", ...],   # one private context per agent
     "evidence": [{"agent": 1, "start": 120, "end": 164}, ...],     # gold character spans, end exclusive
     "meta": {"hops": 2, ...}}                   # free-form, JSON-serialisable

`meta["answer_match"]` ("text" or "code"; default "code" for the `code` task, else "text") picks how answers
are scored (`metrics.answer_scores`).

Topologies: "fanin" (M senders, one receiver), "chain" (contexts are hops in order), "merge" (N thinkers,
one judger). Character spans map to token positions for any fast tokenizer (`span_token_positions`).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Union

from ..errors import TaskFormatError, UnscorableAnswerError
from .metrics import MATCHES, scorable

TOPOLOGIES = ("fanin", "chain", "merge")
Answers = Union[list, dict]


@dataclass(frozen=True)
class Span:
    agent: int  # index into Episode.contexts
    start: int  # character offset, inclusive
    end: int  # character offset, exclusive


@dataclass(frozen=True)
class Episode:
    id: str
    task: str
    topology: str
    question: str
    answers: Answers  # list of aliases, or part name -> list of aliases
    contexts: tuple[str, ...]
    evidence: tuple[Span, ...] = ()
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        problems = _shape_problems(self)
        if problems:
            raise TaskFormatError(f"episode {self.id!r}: {problems[0]}")
        problems = unscorable_answers(self)
        if problems:
            raise UnscorableAnswerError(f"episode {self.id!r}: {problems[0]}")

    @property
    def multipart(self) -> bool:
        return isinstance(self.answers, dict)

    @property
    def answer_match(self) -> str:
        """How a prediction is matched against the answers: "code" keeps case and punctuation."""
        default = "code" if self.task == "code" else "text"
        return self.meta.get("answer_match", default) if isinstance(self.meta, dict) else default

    def evidence_text(self) -> list[str]:
        return [self.contexts[s.agent][s.start:s.end] for s in self.evidence]

    def to_json(self) -> str:
        d = asdict(self)
        d["contexts"], d["evidence"] = list(self.contexts), [asdict(s) for s in self.evidence]
        return json.dumps(d, ensure_ascii=False, sort_keys=True)


def validate_fields(ep: Episode) -> list[str]:
    """Every problem with an episode, each naming its field (empty list = valid): its shape, then (for a
    well-shaped episode) answers that could never score."""
    return _shape_problems(ep) or unscorable_answers(ep)


def _shape_problems(ep: Episode) -> list[str]:
    out = []
    if not isinstance(ep.id, str) or not ep.id:
        out.append("id: want a non-empty string")
    if ep.topology not in TOPOLOGIES:
        out.append(f"topology: want one of {', '.join(TOPOLOGIES)}, got {ep.topology!r}")
    if not isinstance(ep.question, str) or not ep.question.strip():
        out.append("question: want a non-empty string")
    if isinstance(ep.answers, list):
        if not ep.answers or not all(isinstance(a, str) for a in ep.answers):
            out.append("answers: want a non-empty list of strings")
    elif isinstance(ep.answers, dict):
        if not ep.answers or not all(isinstance(v, list) and v and all(isinstance(a, str) for a in v)
                                     for v in ep.answers.values()):
            out.append("answers: want part -> non-empty list of strings")
    else:
        out.append("answers: want a list of strings or a dict of lists")
    if not ep.contexts or not all(isinstance(c, str) for c in ep.contexts):
        out.append("contexts: want a non-empty list of strings")
    for i, s in enumerate(ep.evidence):
        if not isinstance(s, Span) or not (0 <= s.agent < len(ep.contexts)) or not (
                0 <= s.start < s.end <= len(ep.contexts[s.agent])):
            out.append(f"evidence[{i}]: span {s} is outside its context")
    if not isinstance(ep.meta, dict):
        out.append("meta: want an object")
    elif ep.answer_match not in MATCHES:
        out.append(f"meta.answer_match: want one of {', '.join(MATCHES)}, got {ep.answer_match!r}")
    return out


def unscorable_answers(ep: Episode) -> list[str]:
    """The answers (or parts) of a well-shaped episode none of whose aliases could ever be matched."""
    out = []
    groups = ep.answers.items() if isinstance(ep.answers, dict) else [("answers", ep.answers)]
    for name, aliases in groups:
        if not any(scorable(a, ep.answer_match) for a in aliases):
            where = "answers" if name == "answers" else f"answers[{name!r}]"
            out.append(f"{where}: every alias normalises to nothing ({aliases!r}), so no answer could score")
    return out


def episode_from_dict(d: dict) -> Episode:
    if not isinstance(d, dict):
        raise TaskFormatError(f"want a JSON object, got {type(d).__name__}")
    missing = [k for k in ("id", "task", "topology", "question", "answers", "contexts") if k not in d]
    if missing:
        raise TaskFormatError(f"missing field {missing[0]!r}")
    try:
        evidence = tuple(Span(int(s["agent"]), int(s["start"]), int(s["end"])) for s in d.get("evidence", []))
    except (KeyError, TypeError, ValueError) as e:
        raise TaskFormatError(f"evidence: want objects with integer agent/start/end ({e})") from e
    contexts = d["contexts"]
    return Episode(d["id"], d["task"], d["topology"], d["question"], d["answers"],
                   tuple(contexts) if isinstance(contexts, list) else contexts, evidence, d.get("meta", {}))


def load_episodes(path: str | Path) -> list[Episode]:
    """Read a JSONL task file; any bad line raises TaskFormatError naming file, line and field."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")  # a byte-order mark (some editors write one) is not JSON
    except UnicodeDecodeError as e:
        raise TaskFormatError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from e
    except OSError as e:  # missing, unreadable, a folder
        raise TaskFormatError(f"{path}: cannot be read ({e.strerror or type(e).__name__})") from e
    episodes, seen = [], set()
    for n, line in enumerate(text.split("\n"), 1):  # "\n" only, as `jsonl_lines`: keeps line numbers
        if not line.strip():
            continue
        try:
            ep = episode_from_dict(json.loads(line))
        except json.JSONDecodeError as e:
            raise TaskFormatError(f"{path}:{n}: not JSON ({e.msg})") from e
        except TaskFormatError as e:
            raise TaskFormatError(f"{path}:{n}: {e}") from e
        if ep.id in seen:
            raise TaskFormatError(f"{path}:{n}: id: duplicate {ep.id!r}")
        seen.add(ep.id)
        episodes.append(ep)
    return episodes


def write_episodes(path: str | Path, episodes: Iterable[Episode]) -> None:
    """Write JSONL deterministically (sorted keys, one episode per line, trailing newline)."""
    Path(path).write_text("".join(ep.to_json() + "\n" for ep in episodes), encoding="utf-8")


def span_token_positions(text: str, spans: Iterable[tuple[int, int]], tokenizer) -> list[int]:
    """Token indices (into `tokenizer(text, add_special_tokens=False)`) overlapping any character span."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    spans = list(spans)
    return [i for i, (a, b) in enumerate(enc["offset_mapping"])
            if b > a and any(a < end and b > start for start, end in spans)]


def jsonl_lines(text: str) -> list[str]:
    """The lines of a JSONL file, split at "\\n" only: a record written with `ensure_ascii=False` may hold U+2028,
    U+2029 or U+0085 inside a string, which `str.splitlines` would also break at (losing the record)."""
    return [line for line in text.split("\n") if line.strip()]

"""Shared helpers of the loaders: strict record access, JSON/JSONL readers, agent partitions."""
from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

from ...errors import SkippedRecordsWarning, TaskFormatError, UnknownNameError, UnscorableAnswerError
from ..episode import Episode

_MISSING = object()
_KINDS = {
    "str": (str, "a string"),
    "int": (int, "an integer"),
    "bool": (bool, "a boolean"),
    "list": (list, "a list"),
    "dict": (dict, "an object"),
}


class Record:
    """One raw record and where it came from; `get` checks a field and names it on failure."""

    def __init__(self, where: str, data: Any):
        self.where, self.data = where, data
        if not isinstance(data, dict):
            self.fail("record", f"want a JSON object, got {type(data).__name__}")

    def fail(self, field: str, problem: str) -> NoReturn:
        raise TaskFormatError(f"{self.where}: {field}: {problem}")

    def check(self, value: Any, field: str, kind: str, *, nonempty: bool = False) -> Any:
        """`value` (found at `field`) must be of `kind` (see _KINDS); bools are not integers."""
        if value is _MISSING:
            self.fail(field, "missing")
        typ, desc = _KINDS[kind]
        if not isinstance(value, typ) or (kind == "int" and isinstance(value, bool)):
            self.fail(field, f"want {desc}, got {_type_name(value)}")
        if nonempty and (not value or (kind == "str" and not value.strip())):
            self.fail(field, f"want a non-empty {kind}")
        return value

    def get(self, obj: Any, key: str, kind: str, *, prefix: str = "", nonempty: bool = False,
            default: Any = _MISSING) -> Any:
        """obj[key] checked against `kind`; the error names `prefix + key`. A `default` makes it optional."""
        field = f"{prefix}.{key}" if prefix else key
        if not isinstance(obj, dict):
            self.fail(prefix or "record", f"want an object, got {_type_name(obj)}")
        if key not in obj and default is not _MISSING:
            return default
        return self.check(obj.get(key, _MISSING), field, kind, nonempty=nonempty)

    def episode(self, **fields) -> Episode:
        try:
            return Episode(**fields)
        except TaskFormatError as e:
            raise type(e)(f"{self.where}: {e}") from e


def build_episodes(path: str | Path, records: Iterable[Record], build: Callable[[Record], Episode | None], *,
                   skip_unscorable: bool = True) -> list[Episode]:
    """`build` over every record, keeping the episodes it returns (None: left out by an option). A record whose
    answer could never score (UnscorableAnswerError) is skipped and counted in one SkippedRecordsWarning, or
    raises with `skip_unscorable=False`; every other malformed record raises."""
    out, skipped, n = [], [], 0
    for n, rec in enumerate(records, 1):
        try:
            ep = build(rec)
        except UnscorableAnswerError as e:
            if not skip_unscorable:
                raise
            skipped.append(str(e))
            continue
        if ep is not None:
            out.append(ep)
    if skipped:
        warnings.warn(SkippedRecordsWarning(
            f"{path}: skipped {len(skipped)} of {n} records whose answers could never score "
            f"(skip_unscorable=False raises instead); first: {skipped[0]}"), stacklevel=3)
    return out


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def read_json_list(path: str | Path) -> Iterator[Record]:
    """Records of a file holding one JSON list; each located as `path[index]`."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))  # a byte-order mark is not JSON
    except json.JSONDecodeError as e:
        raise TaskFormatError(f"{path}: not JSON ({e.msg} at line {e.lineno} column {e.colno})") from e
    except UnicodeDecodeError as e:
        raise TaskFormatError(f"{path}: not UTF-8 ({e.reason} at byte {e.start})") from e
    except OSError as e:  # missing, unreadable, a folder
        raise TaskFormatError(f"{path}: cannot be read ({e.strerror or type(e).__name__})") from e
    if not isinstance(data, list):
        raise TaskFormatError(f"{path}: want a JSON list of records, got {_type_name(data)}")
    for i, rec in enumerate(data):
        yield Record(f"{path}[{i}]", rec)


def read_jsonl(path: str | Path) -> Iterator[Record]:
    """Records of a JSONL file (blank lines skipped); each located as `path:line`."""
    path = Path(path)
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as e:
                raise TaskFormatError(f"{path}:{n}: not JSON ({e.msg} at column {e.colno})") from e
            yield Record(f"{path}:{n}", data)


class UniqueIds:
    def __init__(self):
        self.seen: set[str] = set()

    def add(self, rec: Record, value: str, field: str = "id") -> str:
        if value in self.seen:
            rec.fail(field, f"duplicate {value!r}")
        self.seen.add(value)
        return value


def check_n_agents(n_agents: Any, name: str = "n_agents") -> int:
    if not isinstance(n_agents, int) or isinstance(n_agents, bool) or n_agents < 1:
        raise ValueError(f"{name}: want an integer >= 1, got {n_agents!r}")
    return n_agents


SPLITS = ("gold_apart", "round_robin")


def partition(n_items: int, gold: Sequence[int], n_agents: int, split: str) -> list[list[int]]:
    """Deterministically assign item indices 0..n_items-1 to `n_agents` agents.

    "round_robin": item i goes to agent i % n_agents.
    "gold_apart": the gold items (in the order given) go to agents 0, 1, 2, ... in turn, so with at least
    as many agents as gold items no two gold items share an agent; every other item then goes, in order, to
    the agent holding the fewest items (lowest index on ties). Each agent's items stay in input order.
    """
    if split not in SPLITS:
        raise UnknownNameError("split", split, SPLITS)
    if split == "round_robin":
        return [list(range(a, n_items, n_agents)) for a in range(n_agents)]
    owner: dict[int, int] = {}
    for k, g in enumerate(dict.fromkeys(gold)):
        owner[g] = k % n_agents
    counts = [0] * n_agents
    for a in owner.values():
        counts[a] += 1
    for i in range(n_items):
        if i not in owner:
            a = min(range(n_agents), key=lambda j: (counts[j], j))
            owner[i] = a
            counts[a] += 1
    return [[i for i in range(n_items) if owner[i] == a] for a in range(n_agents)]


class TextBuilder:
    """Concatenates pieces into one context string, remembering where each piece starts."""

    def __init__(self):
        self.parts: list[str] = []
        self.length = 0

    def add(self, text: str) -> int:
        """Append `text`; returns its start offset."""
        start = self.length
        self.parts.append(text)
        self.length += len(text)
        return start

    def text(self) -> str:
        return "".join(self.parts)


def dedupe(items: Sequence) -> list:
    return list(dict.fromkeys(items))

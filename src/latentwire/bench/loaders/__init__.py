"""Loaders for public multi-document QA formats: each maps a dataset file to latentwire `Episode`s.

    load_dataset("hotpotqa", "hotpot_dev_distractor_v1.json", n_agents=2, split="gold_apart")
    load_dataset("musique", "musique_ans_v1.0_dev.jsonl", n_agents=3)
    load_dataset("fanoutqa", "fanout-final-dev.json", pages_dir="pages/", max_agents=8)
    load_dataset("longbench_v2", "data.json", n_agents=4)

Every loader is strict: a malformed record raises `TaskFormatError` naming the file, the record
(`file[3]` = index 3 of a JSON list, `file:3` = line 3 of a JSONL file) and the field
(`paragraphs[2].paragraph_text: missing`). A well-formed record whose answer could never score (every alias
normalises to nothing) is skipped and counted in one `SkippedRecordsWarning`; `skip_unscorable=False`
raises `UnscorableAnswerError` instead. Loading is deterministic: the same file and options give
byte-identical `Episode.to_json()`.

Shared helpers live in `_common.py`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from ...errors import UnknownNameError
from ..episode import Episode
from ._common import SPLITS
from .fanoutqa import load_fanoutqa
from .hotpotqa import load_hotpotqa
from .longbench import load_longbench_v2
from .musique import load_musique

LOADERS: dict[str, Callable[..., list[Episode]]] = {
    "fanoutqa": load_fanoutqa,
    "hotpotqa": load_hotpotqa,
    "longbench_v2": load_longbench_v2,
    "musique": load_musique,
}


def load_dataset(name: str, path: str | Path | None, **kw) -> list[Episode]:
    """Load a dataset file with the loader registered as `name` (options go to that loader)."""
    if name not in LOADERS:
        raise UnknownNameError("dataset loader", name, LOADERS)
    return LOADERS[name](path, **kw)


__all__ = ["LOADERS", "SPLITS", "load_dataset", "load_fanoutqa", "load_hotpotqa", "load_longbench_v2",
           "load_musique"]

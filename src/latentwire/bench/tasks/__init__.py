"""The shipped tasks: generators (pure functions of a seed) and their committed JSONL (package data, data/).

    load_task("facts")            # the committed episodes (what benchmarks run)
    TASKS["facts"](SEED)          # the same episodes, regenerated in memory
    task_path("facts")            # <package>/bench/tasks/data/facts.jsonl

`python tasks/generate.py` rewrites the files; `--check` fails if any differs from a fresh generation.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from ...errors import UnknownNameError
from ..episode import Episode, load_episodes
from . import aggregate, code, coref, facts, paraphrase, reasoning

SEED = 0  # the seed the committed files were generated with
# Package data (pyproject.toml [tool.setuptools.package-data]): beside this file in the source tree and in
# an installed wheel alike (pip always unpacks wheels, so a plain path is enough).
DATA_DIR = Path(__file__).resolve().parent / "data"

TASKS: dict[str, Callable[..., list[Episode]]] = {
    "aggregate": aggregate.generate,
    "code": code.generate,
    "coref": coref.generate,
    "facts": facts.generate,
    "paraphrase": paraphrase.generate,
    "reasoning": reasoning.generate,
}


def _check(name: str) -> None:
    if name not in TASKS:
        raise UnknownNameError("task", name, TASKS)


def task_path(name: str) -> Path:
    """Where the committed JSONL of a shipped task lives."""
    _check(name)
    return DATA_DIR / f"{name}.jsonl"


def load_task(name: str) -> list[Episode]:
    """The committed episodes of a shipped task (validated by `load_episodes`)."""
    return load_episodes(task_path(name))


def generate(name: str, seed: int = SEED) -> list[Episode]:
    """A fresh in-memory generation of a shipped task (the committed file is `generate(name)`)."""
    _check(name)
    return TASKS[name](seed)

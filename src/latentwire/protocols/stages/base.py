"""What every message stage shares: the `Stage` base, its registry, and `Held`, what one sender holds when a question
comes (its read, where its document sits in it, the units ranked).

A stage is a small dataclass of one kind — "score", "units", "budget" or "encoding" — validated on its own in
`__post_init__`. A protocol built from stages hands itself to each stage's `check`, so a composition a stage cannot
serve is refused by that stage (a text scorer has no attention to calibrate), not by a central list of pairs.
`repr(stage)` is its spec (`probe(16, mix='and')`): what a record's label and `parse` read back.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from ...errors import ConfigError, UnknownNameError
from ...registry import Registry, construct

STAGES = Registry("stage")
KINDS = ("score", "units", "budget", "encoding")


@dataclass(repr=False)
class Stage:
    """One step of a message; subclasses add their parameters as fields and override what they do."""
    kind: ClassVar[str]
    name: ClassVar[str]
    positional: ClassVar[bool] = False  # the first field may be given without its name: probe(16)

    def check(self, protocol) -> None:
        """Refuse (ConfigError naming this stage) a protocol whose other stages or read this stage cannot serve."""

    def refuse(self, why: str) -> ConfigError:
        """A ConfigError that names this stage: raise it from `check` or `__post_init__`."""
        return ConfigError(f"{self.kind} stage {self!r}: {why}")

    def __repr__(self) -> str:
        """The stage as its spec: its name and the fields that differ from their defaults, the first one bare
        where the stage takes it positionally (`positional`)."""
        args = []
        for i, f in enumerate(f for f in dataclasses.fields(self) if f.init):
            value = getattr(self, f.name)
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            if value == default and not (i == 0 and self.positional):
                continue
            args.append(repr(value) if i == 0 and self.positional else f"{f.name}={value!r}")
        return f"{self.name}({', '.join(args)})"


def stage(kind: str, value, **params) -> Stage:
    """A stage of `kind` from a stage, or from its registered name with `params` (typed errors, as protocols)."""
    if isinstance(value, Stage):
        if value.kind != kind:
            raise ConfigError(f"{value!r} is a {value.kind} stage, given where a {kind} stage goes")
        return value
    if not isinstance(value, str):
        raise ConfigError(f"a {kind} stage is a stage or its name, got {value!r}")
    names = [n for n, c in STAGES.items() if c.kind == kind]
    if value not in names:
        raise UnknownNameError(f"{kind} stage", value, names)
    return construct("stage", value, STAGES[value], **params)


@dataclass
class Held:
    """One sender's read as a question meets it: its agent and state (None for retrieval, which reads nothing), its
    prompt rows' document spans (`per_row`: (T,) (start, end) or None), which rows may be sent, the span units of the
    document (`groups`, None for fixed spans) and the units ranked (`units`), and the protocol's per-state memo
    (an answer draft, a background) so a follow-up on the same state reuses what does not depend on it."""
    sender: object  # Agent
    state: object | None  # KVState
    per_row: list | None
    document: str | None
    eligible: torch.Tensor | None  # (T,) bool
    keep: torch.Tensor  # (T,) bool: always sent (the first row and the latent rows)
    groups: list[list[int]] | None
    units: list[list[int]]
    memo: dict = field(default_factory=dict)
    query_aware: bool = False
    index: object = None  # a text scorer's held index of the units' text (retrieval read="held")

    @property
    def n_rows(self) -> int:
        return len(self.keep)

    @property
    def device(self):
        return self.keep.device

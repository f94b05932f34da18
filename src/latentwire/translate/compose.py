"""What the receiver answers over, per translator, from the states of one split-evidence pair.

    sharer        S      the sharer's prefill of its own document (+ question)
    receiver      R      the receiver's prefill of its own document (+ question)
    sharer_both   S_b    the sharer's prefill of both documents (C2C: both models read the same input)
    receiver_both R_b    the receiver's prefill of both documents (context-aware dense alignment, C2C)
    align, mask          receiver row -> sharer row of the same text: R_b -> S_b (C2C); receiver_on_sharer
                         -> S (dense stage I, when the two tokenize the prompt differently)
    receiver_on_sharer   the receiver's prefill of the sharer's document (dense stage-I target)

    xkv, lcfx      T(S, R)                       residuals on the receiver's own cache
    dense          concat(T(S), R)               context-unaware: the receiver never sees the sharer's text
    dense (aware)  concat(T(S), R_b)             context-aware: the receiver read both documents itself
                                                 (a dense translator trained in one mode refuses the other)
    c2c            T(S_b, R_b, align, mask)      C2C's precondition: both read the same input
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ..state import KVState
from .base import Translator, cast


@dataclass(frozen=True, eq=False)
class PairStates:
    sharer: KVState | None = None
    receiver: KVState | None = None
    sharer_both: KVState | None = None
    receiver_both: KVState | None = None
    align: torch.Tensor | None = None  # (T_rb,) int64 rows of S_b (C2C); (T_rs,) rows of S (dense stage I)
    mask: torch.Tensor | None = None  # same shape, bool
    receiver_on_sharer: KVState | None = None


def needs(method: str, context_aware: bool = False) -> tuple[str, ...]:
    """Which PairStates fields a method reads (so callers prefill only those)."""
    if method == "c2c":
        return ("sharer_both", "receiver_both", "align", "mask")
    if method == "dense":
        return ("sharer", "receiver_both" if context_aware else "receiver")
    return ("sharer", "receiver")


def compose(translator: Translator, states: PairStates, context_aware: bool = False) -> KVState:
    """The receiver-side state (compact) the receiver answers over, on the translator's device.

    The translator runs where its parameters are (the receiver's device): states prefilled elsewhere
    (a sharer on another device) are moved there first.
    """
    name = translator.name
    missing = [f for f in needs(name, context_aware) if getattr(states, f) is None]
    if missing:
        raise ValueError(f"{name}: missing pair states {missing}")
    states = _on(states, next(translator.parameters()).device)
    if name == "c2c":
        out = translator(states.sharer_both, states.receiver_both, align=states.align, mask=states.mask)
    elif name == "dense":
        translator.check_mode(context_aware)  # ContextModeError if trained for the other mode
        own = states.receiver_both if context_aware else states.receiver
        translated = translator(states.sharer, None)
        out = KVState.concat([cast(translated, own.dtype), own])  # the receiver's own cache keeps its precision
    else:
        out = translator(states.sharer, states.receiver)
    return out if out.is_compact else out.compact()


def _on(states: PairStates, device: torch.device) -> PairStates:
    """The same pair states with every state and tensor on `device` (those already there are kept)."""
    moved = {}
    for f in dataclasses.fields(states):
        x = getattr(states, f.name)
        if isinstance(x, KVState):
            moved[f.name] = cast(x, x.dtype, device)
        elif isinstance(x, torch.Tensor):
            moved[f.name] = x.to(device)
        else:
            moved[f.name] = x
    return PairStates(**moved)

"""Split-evidence pair protocols (docs/methods.md#translators): a sharer holds one document, the receiver the other.

The receiver answers `question`; neither document alone suffices. Sharer and receiver may be
different model families (a translator bridges them) or the same model.

    alone        the receiver reads its own document only                        (floor)
    t2t          the sharer writes notes as text; the receiver reads doc + notes (text baseline)
    fullcontext  the receiver reads both documents itself                        (ceiling)
    translated   a trained translator turns the sharer's KV into receiver K/V    (XKV, dense, LCF-X, C2C)

Timing (`Outcome.tteoa` = slowest party of the parallel phase + the receiver's sequential part):

    alone / fullcontext  sender_seconds = ()                      receiver_seconds = prefill + answer
    t2t                  sender_seconds = (notes decode,)         receiver_seconds = prefill(doc + notes) + answer
    translated           sender_seconds = (sharer prefill,        receiver_seconds = translator + answer
                                           receiver prefill)

In `translated` the receiver's prefill of its own prompt needs nothing from the sharer, so it runs in
parallel with the sharer's prefill and is listed as a second party of the parallel phase; only the
translator forward and the answer wait for the sharer. In `t2t` the receiver prefills its document
and the notes together after the notes arrive (as implemented; `details["receiver_prefill_s"]` says
how much of that an incremental prefill could have overlapped).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch

from ..agent import Agent
from ..clock import now
from ..registry import Registry
from ..translate import load
from ..translate.base import WEIGHTS, Translator, read_header
from ..translate.compose import PairStates, compose, needs
from .base import after_first, QUESTION_SUFFIX, SENDER_PROMPT, Outcome, timed
from .text import REPORT_PROMPTS
from ..errors import ConfigError

BOTH_PROMPT = "Read these documents.\n\n{first}\n\n{second}"
NOTES_HEADER = "\n\nNotes from a colleague who read another document:\n"


def own_prompt(document: str, question: str) -> str:
    """What one party prefills: its own document, then the question."""
    return SENDER_PROMPT.format(document=document) + QUESTION_SUFFIX.format(question=question)


def both_prompt(sharer_doc: str, receiver_doc: str, question: str) -> str:
    """Both documents (sharer's first), then the question: full context, and C2C's shared input."""
    return BOTH_PROMPT.format(first=sharer_doc, second=receiver_doc) + QUESTION_SUFFIX.format(question=question)


@dataclass
class PairProtocol(ABC):
    """How a sharer's document reaches a receiver (possibly another model) that holds the other document;
    subclasses add their parameters as fields. Every pair protocol has `max_new_tokens` (the answer length)."""
    name: ClassVar[str]
    max_new_tokens: int = 32  # receiver answer length

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be ≥ 1, got {self.max_new_tokens}")

    @abstractmethod
    def run(self, sharer: Agent, receiver: Agent, sharer_doc: str, receiver_doc: str, question: str) -> Outcome:
        """The sharer reads `sharer_doc`, the receiver `receiver_doc`; the receiver answers `question`."""

    def _answer(self, receiver: Agent, state, question: str):
        return receiver.answer(question, message=state, max_new_tokens=self.max_new_tokens)


PAIR_PROTOCOLS = Registry("pair protocol")
register = PAIR_PROTOCOLS.register


def get_pair_protocol(name: str, **params) -> PairProtocol:
    """A split-evidence pair protocol (alone, t2t, fullcontext, translated) with its hyper-parameters,
    e.g. `get_pair_protocol("translated", checkpoint="runs/xkv")`; errors as for `get_protocol`."""
    return PAIR_PROTOCOLS.create(name, **params)


@register
@dataclass
class Alone(PairProtocol):
    """The receiver answers from its own document: the floor every protocol must beat."""
    name = "alone"

    def run(self, sharer, receiver, sharer_doc, receiver_doc, question) -> Outcome:
        state, prefill_s = timed(receiver.device, receiver.prefill, own_prompt(receiver_doc, question))
        reply, answer_s = timed(receiver.device, self._answer, receiver, state, question)
        return Outcome(self.name, reply.text, 0, reply.context, (), prefill_s + answer_s,
                       {"receiver_prefill_s": prefill_s, "answer_s": answer_s}, after_first=after_first(reply))


@register
@dataclass
class T2T(PairProtocol):
    """The sharer decodes notes for the question (text.py's "notes" report); the receiver reads them
    after its own document. Decoding the notes is the sharer's time."""
    name = "t2t"
    max_note_tokens: int = 64

    def __post_init__(self):
        super().__post_init__()
        if self.max_note_tokens < 1:
            raise ConfigError(f"max_note_tokens must be ≥ 1, got {self.max_note_tokens}")

    def run(self, sharer, receiver, sharer_doc, receiver_doc, question) -> Outcome:
        ask = REPORT_PROMPTS["notes"].format(document=sharer_doc, question=question)
        notes, sharer_s = timed(sharer.device, sharer.answer, ask, max_new_tokens=self.max_note_tokens)
        own = own_prompt(receiver_doc + NOTES_HEADER + notes.text, question)
        state, prefill_s = timed(receiver.device, receiver.prefill, own)
        reply, answer_s = timed(receiver.device, self._answer, receiver, state, question)
        return Outcome(self.name, reply.text, len(notes.text.encode()), reply.context, (sharer_s,),
                       prefill_s + answer_s, {"notes": notes.text, "note_tokens": len(notes.token_ids),
                                              "receiver_prefill_s": prefill_s, "answer_s": answer_s},
                       after_first=after_first(reply))


@register
@dataclass
class FullContext(PairProtocol):
    """The receiver reads both documents itself: the ceiling. The "message" is the sharer's document."""
    name = "fullcontext"

    def run(self, sharer, receiver, sharer_doc, receiver_doc, question) -> Outcome:
        state, prefill_s = timed(receiver.device, receiver.prefill, both_prompt(sharer_doc, receiver_doc, question))
        reply, answer_s = timed(receiver.device, self._answer, receiver, state, question)
        return Outcome(self.name, reply.text, len(sharer_doc.encode()), reply.context, (), prefill_s + answer_s,
                       {"receiver_prefill_s": prefill_s, "answer_s": answer_s}, after_first=after_first(reply))


# (resolved checkpoint folder, weights mtime, device) -> translator
_LOADED: dict[tuple[str, int, str], Translator] = {}


def load_translator(checkpoint: str | Path, device: torch.device | None = None) -> Translator:
    """A checkpoint's translator on `device` (None: where `load` puts it), loaded once per folder and
    device (reloaded if its weights file changes)."""
    folder = Path(checkpoint).resolve()
    weights = folder / WEIGHTS
    key = (str(folder), weights.stat().st_mtime_ns if weights.exists() else -1, str(device))
    if key not in _LOADED:
        _LOADED[key] = load(folder, device=device)
    return _LOADED[key]


@register
@dataclass
class Translated(PairProtocol):
    """A trained translator (checkpoint folder) maps the sharer's state into the receiver's geometry.

    Both parties prefill fresh states (in the dtype the models were loaded in) of exactly the prompts the method
    reads (`needs`):
    XKV / LCF-X / dense read the sharer's and the receiver's own prompts (dense with
    `context_aware=True` the receiver's prefill of both documents instead); C2C reads both parties'
    prefills of both documents, with the receiver->sharer token alignment (computed on the
    receiver's side, in its parallel time). The message is the sharer's state as serialised
    (`KVState.to_bytes`): what would cross the wire.
    """
    name = "translated"
    checkpoint: str = ""
    context_aware: bool = False  # dense only: the receiver read both documents itself

    def __post_init__(self):
        super().__post_init__()
        if not self.checkpoint:
            raise ConfigError("needs checkpoint='<translator folder>' (see `latentwire train`)")
        self.method = read_header(self.checkpoint).get("method")
        if self.context_aware and self.method != "dense":
            raise ConfigError(f"context_aware applies to dense alignment only; {self.checkpoint} is {self.method}")

    @property
    def translator(self) -> Translator:
        return load_translator(self.checkpoint)

    def run(self, sharer, receiver, sharer_doc, receiver_doc, question) -> Outcome:
        translator = load_translator(self.checkpoint, receiver.device)  # it writes into the receiver's cache
        translator.check_pair(sharer.geometry, receiver.geometry)  # GeometryMismatchError naming both pairs
        fields = needs(translator.name, self.context_aware)
        own_s, own_r = own_prompt(sharer_doc, question), own_prompt(receiver_doc, question)
        both = both_prompt(sharer_doc, receiver_doc, question)
        kw, extra = {}, {}
        t0 = now(sharer.device)  # the sharer's side of the parallel phase
        if "sharer" in fields:
            kw["sharer"] = sharer.prefill(own_s)
        if "sharer_both" in fields:
            kw["sharer_both"] = sharer.prefill(both)
        sharer_s = now(sharer.device) - t0
        t0 = now(receiver.device)  # the receiver's side, independent of the sharer
        if "receiver" in fields:
            kw["receiver"] = receiver.prefill(own_r)
        if "receiver_both" in fields:
            kw["receiver_both"] = receiver.prefill(both)
        if "align" in fields:
            from ..translate.token_alignment import align

            t1 = now(receiver.device, sharer.device)
            al = align(receiver, sharer, both)
            kw["align"], kw["mask"] = al.index, al.mask
            extra["align_ms"] = 1e3 * (now(receiver.device, sharer.device) - t1)
        receiver_s = now(receiver.device, sharer.device) - t0
        sent = kw.get("sharer", kw.get("sharer_both"))
        with torch.inference_mode():
            state, translate_s = timed(receiver.device, compose, translator, PairStates(**kw), self.context_aware)
        reply, answer_s = timed(receiver.device, self._answer, receiver, state, question)
        details = {"method": translator.name, "parameters": translator.num_parameters,
                   "context_aware": self.context_aware, "translator_ms": 1e3 * translate_s,
                   "sharer_prefill_s": sharer_s, "receiver_prefill_s": receiver_s, "answer_s": answer_s,
                   "sharer_rows": len(sent), "receiver_rows": len(state), **extra}
        return Outcome(self.name, reply.text, len(sent.to_bytes()), reply.context, (sharer_s, receiver_s),
                       translate_s + answer_s, details, after_first=after_first(reply))

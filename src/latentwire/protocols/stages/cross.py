"""Encodings for a receiver of another model: the selected rows travel as the document text they cover.

    spans()                          the exact character spans of the sender's document its selected rows cover
                                     (`message.Spans`), re-tokenised by the receiver and re-prefilled in its slot
    spans_latent(latent_map=...)     the same text, then the sender's G latent rows mapped into the receiver's input
                                     space by a `LatentMap` fitted for the pair
    translated(translator=...)       the selected rows' K/V through a trained dense-alignment translator of the pair,
                                     on the sender: the receiver attends to them as a full-KV prefix

Rows of one model do not transfer to another (other embeddings, other vocabulary); docs/methods.md#cacheback-x says
what each costs and where each was measured. `cacheback_x` is CacheBack with `spans()` by default.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from ...errors import ConfigError, ContextOverflowError
from ...message import Rows, Spans
from ...select import fanin_budget
from ...state import KVState
from ...templates import MESSAGE_PROMPT
from ...translate import load as load_translator
from ...translate.base import Translator, cast, read_header
from ...translate.latent_map import LatentMap
from ..documents import sent_spans
from .base import STAGES
from .encoding import Encoding

ROW_TRANSLATORS = ("dense",)  # translators that map rows on their own (needs_receiver=False)
SENDER_SEPARATOR = "\n\n"  # between two senders' texts in the receiver's slot


class MessageOverflowError(ContextOverflowError):
    """A message (spans text + latent rows, or translated rows) that would overflow the receiver's context window;
    names both sides' models."""

    def __init__(self, needed: int, window: int, breakdown: dict[str, int], senders: Sequence[str], receiver: str):
        super().__init__(needed, window, breakdown)
        self.senders, self.receiver = tuple(senders), receiver
        self.args = (f"message from sender {', '.join(self.senders)} to receiver {receiver}: {self.args[0]}",)

    def __reduce__(self):
        return type(self), (self.needed, self.window, self.breakdown, self.senders, self.receiver)


class _Cross(Encoding):
    cross_model = True
    receive_key = "receiver_build_s"  # the receiver's tokenising, mapping and placing: its seconds

    def check_receiver_window(self, protocol, prompts, receiver, question: str, senders=()) -> None:
        """Spans are re-tokenised by the receiver: their length is known at receipt (`receiver_rows` checks it)."""


@STAGES.register
@dataclass(repr=False)
class SpansText(_Cross):
    """The document spans the selected rows cover, as text (the first and latent rows dropped)."""
    name = "spans"
    delivery = "spans"

    def latents(self, sender, state: KVState, rows: torch.Tensor):
        return None

    def pack(self, sender, state: KVState, rows: torch.Tensor, per_row: list, document: str, index: int) -> Spans:
        return Spans.of(document, sent_spans(per_row, rows, document), index,
                        (sender.geometry.model, sender.geometry.tokenizer), self.latents(sender, state, rows))

    def receive(self, receiver, question: str, parts, max_new_tokens: int) -> Rows:
        wrong = sorted({type(m).__name__ for m in parts if not isinstance(m, Spans)})
        if wrong:
            raise ConfigError(f"cacheback_x with delivery {self.delivery!r} receives Spans messages, got "
                              f"{', '.join(wrong)}: the senders ran another delivery")
        return receiver_rows(receiver, question, parts, self.map_for(receiver), max_new_tokens)

    def map_for(self, receiver) -> LatentMap | None:
        return None

    def cost(self, parts, message) -> tuple[int, dict]:
        n_lat = int((message.token_ids == -1).sum())
        text_bytes = sum(len(m.text.encode("utf-8")) for m in parts)
        nbytes = sum(m.nbytes for m in parts)
        return nbytes, {"delivery": self.delivery, "message_rows": len(message), "text_rows": len(message) - n_lat,
                        "latent_rows": n_lat, "text_bytes": text_bytes, "latent_bytes": nbytes - text_bytes}

    def sent(self, part) -> dict:
        return {"spans": len(part.spans), "text_chars": len(part.text),
                "latent_rows": 0 if part.latents is None else len(part.latents)}

    def kept(self, parts, kept):
        return tuple(m.spans for m in parts)


@STAGES.register
@dataclass(repr=False)
class SpansLatent(SpansText):
    """The spans' text, then the sender's G latent rows mapped by `latent_map` (a folder written by `LatentMap.save`,
    or the map) and rescaled to the receiver's mean token-embedding norm."""
    name = "spans_latent"
    delivery = "spans+latent"
    latent_map: str | Path | LatentMap | None = None

    def __post_init__(self):
        if not isinstance(self.latent_map, (str, Path, LatentMap)):
            raise self.refuse(f"latent_map: want a folder written by LatentMap.save or a LatentMap, got "
                              f"{type(self.latent_map).__name__}")
        self._maps: dict[str, LatentMap] = {}  # receiver device -> the map there

    def __getstate__(self):  # pickled to nodes without its loaded maps (each node loads its own)
        return self.__dict__ | {"_maps": {}}

    def check(self, protocol) -> None:
        given = isinstance(self.latent_map, LatentMap)
        mode = self.latent_map.latent_mode if given else LatentMap.read_header(self.latent_map).get("latent_mode")
        if mode != protocol.latent_mode:
            raise ConfigError(f"latent map {self.latent_map.pair if given else self.latent_map} was fitted on "
                              f"{mode!r} latent rows; this protocol's senders think with "
                              f"latent_mode={protocol.latent_mode!r}")

    def latents(self, sender, state: KVState, rows: torch.Tensor):
        lat = rows[state.is_latent[rows]]  # (G,) every latent row is always kept
        return (sender.rows(state.select(lat)).embeds if len(lat) else  # (G, d_A), as CacheBack sends them
                torch.zeros(0, sender.geometry.hidden_size, dtype=sender.dtype, device=sender.device))

    def map_for(self, receiver) -> LatentMap:
        """The latent map on the receiver's device, loaded once."""
        key = str(receiver.device)
        if key not in self._maps:
            m = self.latent_map if isinstance(self.latent_map, LatentMap) else LatentMap.load(self.latent_map)
            self._maps[key] = m.to(receiver.device)
        return self._maps[key]

    def check_pair(self, senders: Sequence, receiver) -> None:
        latent_map = self.map_for(receiver)
        for sender in senders:
            latent_map.check(sender, receiver)


@STAGES.register
@dataclass(repr=False)
class Translated(_Cross):
    """The selected rows' K/V (first and latent rows included) through a dense translator of the pair (a checkpoint
    folder or the translator), on the sender: a compact KV state in the receiver's geometry, attached as its prefix."""
    name = "translated"
    delivery = "translated"
    attached = False  # attached as the receiver's prefix by `Agent.answer`, as `fullkv` is
    translator: str | Path | Translator | None = None

    def __post_init__(self):
        if not isinstance(self.translator, (str, Path, Translator)):
            raise self.refuse(f"translator: want a checkpoint folder or a Translator, got "
                              f"{type(self.translator).__name__}")
        method = self.translator.name if isinstance(self.translator, Translator) else \
            read_header(self.translator).get("method")
        if method not in ROW_TRANSLATORS:
            raise self.refuse(f"needs a translator that maps rows on their own ({', '.join(ROW_TRANSLATORS)}); "
                              f"{method!r} writes residuals into the receiver's own cache of the same text, which a "
                              "cacheback_x receiver never reads")
        self._translators: dict[str, Translator] = {}  # "" -> as given; sender device -> the translator there

    def __getstate__(self):  # pickled to nodes without its loaded translators (each node loads its own)
        return self.__dict__ | {"_translators": {}}

    def reference(self) -> Translator:
        """The translator as given (or loaded from its folder once, on the host): what pair checks read."""
        if "" not in self._translators:
            t = self.translator if isinstance(self.translator, Translator) else load_translator(self.translator)
            t.check_mode(False)  # ContextModeError if trained context-aware (docs/methods.md#cacheback-x)
            self._translators[""] = t
        return self._translators[""]

    def translator_for(self, device) -> Translator:
        """The translator on `device`: the given one where it already is, otherwise a copy placed there once."""
        ref, key = self.reference(), str(torch.device(device))
        if key not in self._translators:
            here = next(ref.parameters()).device == torch.device(device)
            self._translators[key] = ref if here else copy.deepcopy(ref).to(device)
        return self._translators[key]

    def prepare(self, sender) -> None:
        self.translator_for(sender.device)  # loaded or placed before the read: not charged as selection

    def pack(self, sender, state: KVState, rows: torch.Tensor, per_row: list, document: str, index: int) -> KVState:
        with torch.inference_mode():
            return self.translator_for(sender.device)(state.select(rows))  # (B' rows) compact, receiver's

    def receive(self, receiver, question: str, parts, max_new_tokens: int) -> KVState:
        wrong = sorted({type(m).__name__ for m in parts if not isinstance(m, KVState)})
        if wrong:
            raise ConfigError(f"cacheback_x with delivery {self.delivery!r} receives KVState messages, got "
                              f"{', '.join(wrong)}: the senders ran another delivery")
        return receiver_state(receiver, question, parts, max_new_tokens, [self.reference().sharer.model])

    def cost(self, parts, message) -> tuple[int, dict]:
        nbytes = sum(m.nbytes for m in parts)
        return nbytes, {"delivery": self.delivery, "message_rows": len(message), "translated_rows": len(message),
                        "kv_bytes": nbytes}

    def sent(self, part) -> dict:
        return {"translated_rows": len(part)}

    def check_pair(self, senders: Sequence, receiver) -> None:
        translator = self.reference()
        for sender in senders:
            translator.check_pair(getattr(sender, "geometry", sender), receiver.geometry)

    def check_receiver_window(self, protocol, prompts, receiver, question: str, senders: Sequence[str] = ()) -> None:
        """MessageOverflowError unless the largest translated message the budgets allow fits: per sender (prompt P)
        min(B, P − 1) document rows + its first row + G latent rows, B = ceil((P + G) / ratio)."""
        G = protocol.latent_steps
        rows = sum(min(fanin_budget(P + G, protocol.ratio), P - 1) + 1 + G for P in prompts)
        check_translated_fit(receiver, question, rows, protocol.max_new_tokens, sorted(set(senders)))


@torch.no_grad()
def receiver_rows(receiver, question: str, messages: Sequence[Spans], latent_map: LatentMap | None = None,
                  max_new_tokens: int = 48) -> Rows:
    """The receiver's input for these messages, as `Rows` in its own space: per message (sender order) its text
    as the receiver tokenizes it (SENDER_SEPARATOR before each but the first), then its latent rows mapped by
    `latent_map` and rescaled to the receiver's mean embedding norm.

    Before any compute: MessageOverflowError unless rows + prompt + `max_new_tokens` fit the receiver's window;
    a message with latent rows needs `latent_map`, fitted for its sender and this receiver
    (LatentMapMismatchError otherwise).
    """
    tok = receiver.tokenizer
    ids = [receiver.ids(tok((SENDER_SEPARATOR if i else "") + m.text, add_special_tokens=False)["input_ids"])
           for i, m in enumerate(messages)]  # per message (n_i,) int64
    n_lat = [0 if m.latents is None else m.latents.shape[0] for m in messages]
    pre, post = receiver.slot_ids(receiver.chat_text(MESSAGE_PROMPT.format(question=question)))
    parts = {"spans_text": sum(len(i) for i in ids), "latent_rows": sum(n_lat), "prompt": len(pre) + len(post),
             "max_new_tokens": max_new_tokens}
    if sum(parts.values()) > receiver.context_window:
        names = sorted({m.space[0] if m.space else f"#{m.document}" for m in messages})
        raise MessageOverflowError(sum(parts.values()), receiver.context_window, parts, names, receiver.model_name)
    embeds, token_ids = [], []
    for m, m_ids, g in zip(messages, ids, n_lat):
        embeds.append(receiver.embed(m_ids))  # (n_i, d_B)
        token_ids.append(m_ids)
        if m.latents is None:
            continue
        if latent_map is None:
            raise ConfigError(f"spans from {m.space[0] if m.space else 'a sender'} carry {g} latent rows: the "
                              "receiver needs a latent_map fitted for that sender and itself")
        if m.space is None:
            raise ConfigError("spans with latent rows must name their sender (space=(model, tokenizer)): the latent "
                              "map for the pair is checked against it")
        mapped = latent_map.apply(m.latents, sender=m.space, receiver=receiver)  # (G, d_B) float32
        mapped = mapped * (receiver.mean_embedding_norm / mapped.norm(dim=-1, keepdim=True).clamp_min(1e-12))
        embeds.append(mapped.to(receiver.device, receiver.dtype))
        token_ids.append(torch.full((g,), -1, dtype=torch.int64, device=receiver.device))
    d = receiver.geometry.hidden_size
    return Rows(torch.cat(embeds) if embeds else torch.zeros(0, d, dtype=receiver.dtype, device=receiver.device),
                torch.cat(token_ids) if token_ids else torch.zeros(0, dtype=torch.int64, device=receiver.device),
                (receiver.geometry.model, receiver.geometry.tokenizer))


def receiver_state(receiver, question: str, states: Sequence[KVState], max_new_tokens: int = 48,
                   senders: Sequence[str] = ("(translated)",)) -> KVState:
    """The receiver's full-KV prefix for translated messages: the states one after another (in sender order, keys
    re-rotated), in the receiver's dtype and on its device. Before any compute: GeometryMismatchError unless each
    state is in the receiver's geometry (a translator made for another receiver), MessageOverflowError unless the
    rows, the receiver's continuation prompt and `max_new_tokens` fit its window (`senders`: the models the
    states were translated from, for the error)."""
    for s in states:
        receiver.geometry.check_same(s.geometry)
    check_translated_fit(receiver, question, sum(len(s) for s in states), max_new_tokens, senders)
    return KVState.concat([cast(s, receiver.dtype, receiver.device) for s in states])


def check_translated_fit(receiver, question: str, rows: int, max_new_tokens: int, senders: Sequence[str]) -> None:
    """MessageOverflowError naming the sender models and the receiver unless `rows` translated rows, the receiver's
    continuation prompt and `max_new_tokens` fit its window (before the reads: the budgets' bound; at receipt:
    the rows that came)."""
    parts = {"translated_rows": rows, "prompt": len(receiver.kv_prompt_ids(question)), "max_new_tokens": max_new_tokens}
    if sum(parts.values()) > receiver.context_window:
        raise MessageOverflowError(sum(parts.values()), receiver.context_window, parts, list(senders),
                                   receiver.model_name)

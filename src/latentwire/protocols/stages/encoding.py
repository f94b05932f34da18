"""Encoding stages: what a sender sends for its selected rows, and how the receiver takes it in.

    rows()                   hidden-size input rows the receiver re-prefills in its message slot
    token_ids()              the same rows as token ids (+ latent rows): fewer bytes, the same receiver input
    kv()                     the rows' own K/V, keys re-rotated to consecutive positions, attached as the receiver's
                             prefix: no re-prefill, so a row keeps what its sender's context wrote into it (a
                             pronoun's antecedent)
    kv_reencoded(recompute=0.0)  the K/V the rows get when their sender re-reads them alone in the receiver's
                             message slot (`Agent.encode_rows`), attached there (`Agent.answer_attached`)
    kv_blend(recompute=0.15) the read's K/V attached in the slot, where the receiver recomputes the share of rows its
                             own context changes most (CacheBlend's selective recompute, 0.15 its operating point)

Why attached read K/V lose accuracy where rows do not: docs/methods.md#kv-delivery.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ...blend import check_blend, recompute_count
from ...errors import ContextOverflowError
from ...message import Rows
from ...state import KVState
from ...templates import MESSAGE_PROMPT
from .base import STAGES, Stage


@dataclass(repr=False)
class Encoding(Stage):
    kind = "encoding"
    attached = False  # K/V attached by the receiver, not re-prefilled
    full_history = False  # packs the read's own K/V: a sender with sliding layers keeps every row there
    slot = False  # attached inside the receiver's message slot (`Agent.answer_attached`)
    recompute = 0.0  # the share of attached rows the receiver recomputes
    cross_model = False  # for a receiver of another model (stages/cross.py)

    @property
    def receive_key(self) -> str | None:
        """The details key of the receiver's seconds to take the message in, counted in its seconds (None: rows
        concatenated, nothing to count)."""
        return "place_s" if self.attached else None  # re-rotating K/V is real work

    def prepare(self, sender) -> None:
        """What a sender loads before its read (not charged to it); nothing by default."""

    def pack(self, sender, state: KVState, rows: torch.Tensor, per_row: list, document: str, index: int):
        """What sender `index` sends for its selected `rows` (the budgeted document rows, its first and latent rows;
        `per_row`: where its document sits in the read)."""
        return sender.rows(state.select(rows))

    def receive(self, receiver, question: str, parts, max_new_tokens: int):
        """The receiver's input from the senders' parts, in sender order."""
        return Rows.cat(parts)

    def sent(self, part) -> dict:
        """What a sender's timing record notes of its part (beyond CacheBack's own)."""
        return {}

    def kept(self, parts, kept: tuple) -> tuple:
        """Per sender, the document spans the message carries (`Outcome.kept_spans`): those of the selected rows."""
        return kept

    def cost(self, parts, message) -> tuple[int, dict]:
        """(bytes on the wire, the details a record keeps) of a message."""
        return message.nbytes, {"message_rows": len(message), "rows_bytes": message.nbytes,
                                "token_id_bytes": message.token_id_nbytes}

    def reply(self, receiver, question: str, message, max_new_tokens: int):
        """The receiver's answer over the message."""
        return receiver.answer(question, message=message, max_new_tokens=max_new_tokens)

    def prompt_rows(self, receiver, question: str) -> int:
        """The receiver's own prompt rows beside the message (its window check)."""
        pre, post = receiver.slot_ids(receiver.chat_text(MESSAGE_PROMPT.format(question=question)))
        return len(pre) + len(post)

    def check_receiver(self, receiver) -> None:
        """Refuse a receiver that cannot take this message in (before any sender reads)."""

    def check_pair(self, senders, receiver) -> None:
        """Refuse senders and a receiver this message was not made for (a latent map or translator of another
        pair); `senders`: Agents or their Geometries."""

    def check_receiver_window(self, protocol, prompts, receiver, question: str, senders=()) -> None:
        """ContextOverflowError unless the largest message the budgets allow (per sender `_max_rows` + its first
        row + G latent rows), the receiver's prompt and answer fit its window."""
        parts = {"budget_rows": sum(protocol._max_rows(p) for p in prompts), "first_rows": len(prompts),
                 "latent_rows": len(prompts) * protocol.latent_steps, "prompt": self.prompt_rows(receiver, question),
                 "max_new_tokens": protocol.max_new_tokens}
        if sum(parts.values()) > receiver.context_window:
            raise ContextOverflowError(sum(parts.values()), receiver.context_window, parts)

    def check_reread(self, sender, label: str, rows: int, question: str) -> None:
        """Refuse a sender whose re-read of its `rows` largest message would overflow its window."""


@STAGES.register
@dataclass(repr=False)
class RowsEncoding(Encoding):
    name = "rows"


@STAGES.register
@dataclass(repr=False)
class TokenIds(Encoding):
    name = "token_ids"

    def cost(self, parts, message) -> tuple[int, dict]:
        return message.token_id_nbytes, super().cost(parts, message)[1]


class _KV(Encoding):
    attached = True

    def receive(self, receiver, question: str, parts, max_new_tokens: int):
        return KVState.concat(parts)  # placed one after another, keys re-rotated

    def cost(self, parts, message) -> tuple[int, dict]:
        nbytes = sum(len(p.to_bytes()) for p in parts)  # each sender ships its selected rows' state
        return nbytes, {"message_rows": len(message), "kv_bytes": nbytes}


@STAGES.register
@dataclass(repr=False)
class KV(_KV):
    name = "kv"
    full_history = True

    def pack(self, sender, state: KVState, rows: torch.Tensor, per_row: list, document: str, index: int):
        return state.select(rows).compact()  # keys re-rotated to positions 0..n−1

    def prompt_rows(self, receiver, question: str) -> int:
        return len(receiver.kv_prompt_ids(question))  # the prompt continues after the attached rows


class _SlotKV(_KV):
    slot = True

    def __post_init__(self):
        recompute_count(self.recompute, 1)  # ConfigError unless a fraction in [0, 1]

    def reply(self, receiver, question: str, message, max_new_tokens: int):
        return receiver.answer_attached(question, message, max_new_tokens=max_new_tokens, recompute=self.recompute)

    def check_receiver(self, receiver) -> None:
        if self.recompute:  # the receiver's attention must take the recompute's prepared mask
            check_blend(receiver)


@STAGES.register
@dataclass(repr=False)
class KVReencoded(_SlotKV):
    name = "kv_reencoded"
    positional = True
    recompute: float = 0.0

    def pack(self, sender, state: KVState, rows: torch.Tensor, per_row: list, document: str, index: int):
        return sender.encode_rows(sender.rows(state.select(rows)))  # positions 0..n−1 in the message slot

    def check_reread(self, sender, label: str, rows: int, question: str) -> None:
        pre = sender.slot_ids(sender.chat_text(MESSAGE_PROMPT.format(question=question)))[0]
        sender.check_window(**{f"{label} slot prompt": len(pre), "sent_rows": rows})


@STAGES.register
@dataclass(repr=False)
class KVBlend(_SlotKV):
    name = "kv_blend"
    positional = True
    full_history = True
    recompute: float = 0.15

    def pack(self, sender, state: KVState, rows: torch.Tensor, per_row: list, document: str, index: int):
        return state.select(rows).compact()

"""Full-KV (LatentMAS): each sender's whole finished state (prefill + G latent steps) is the message.

The receiver places the concatenated states (keys re-rotated to consecutive positions) before its
own prompt, so its context grows by Σ T_i rows ("context re-expansion").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..agent import LATENT_MODES, Agent
from ..errors import ConfigError, ContextOverflowError, UnknownNameError
from ..state import KVState
from .base import after_first, QUESTION_SUFFIX, SENDER_PROMPT, Outcome, Protocol, register, sender_prompt_lengths, timed
from ..blend import check_blend
from .prefix import attach, common_prefix, first_rows, prefix_state, read_after, split
from .reads import Read, read

PREFIXES = ("own", "shared")


@register
@dataclass
class FullKV(Protocol):
    """Each sender sends its whole finished state (prefill + G latent steps); the receiver answers after the
    concatenated states. Key parameters: `latent_steps` (G), `latent_mode`, `query_aware`."""
    name = "fullkv"
    latent_steps: int = 8  # G (docs/methods.md#latentmas, "Default G"); 0 sends the prefill state alone, logged
    latent_mode: str = "rescale"  # "rescale" (CacheBack) or "realign" (LatentMAS W_a)
    query_aware: bool = False  # blind: senders read only their document (docs/methods.md#full-kv, "Regime")
    # "own": each sender's whole read, its template and system text included, concatenated; "shared": the text
    # before the documents is one prefix read once and attached once, each sender sending its rows after it
    # (prefix.py, docs/methods.md#shared-prefix-reads).
    prefix: str = "own"
    # prefix="shared" only: the receiver recomputes each attached document's first k rows in its own context (EPIC's
    # choice: where a read's rows differ most from their place among the others); every row is the re-prefill.
    recompute_first: int = 0

    def __post_init__(self):
        super().__post_init__()
        if self.latent_steps < 0:
            raise ConfigError(f"latent_steps must be ≥ 0, got {self.latent_steps}")
        if self.latent_mode not in LATENT_MODES:
            raise UnknownNameError("latent mode", self.latent_mode, LATENT_MODES)
        if self.prefix not in PREFIXES:
            raise UnknownNameError("fullkv prefix", self.prefix, PREFIXES)
        if isinstance(self.recompute_first, bool) or self.recompute_first < 0:
            raise ConfigError(f"recompute_first must be an int ≥ 0, got {self.recompute_first!r}")
        if self.recompute_first and self.prefix != "shared":
            raise ConfigError("recompute_first recomputes each document's first rows after one shared prefix: it "
                              "needs prefix='shared'")

    def sender_read(self, sender: Agent, document: str, question: str) -> Read:
        """The sender's finished state and its measured read time (shared inside `shared_reads()`)."""
        return read(sender, self.sender_prompt(document, question), self.latent_steps, self.latent_mode)

    def sender_state(self, sender: Agent, document: str, question: str) -> KVState:
        return self.sender_read(sender, document, question).state

    def sender_prompt(self, document: str, question: str) -> str:
        prompt = SENDER_PROMPT.format(document=document)
        return prompt + QUESTION_SUFFIX.format(question=question) if self.query_aware else prompt

    def check_window(self, senders: Sequence[Agent], documents: Sequence[str], receiver: Agent, question: str) -> None:
        """ContextOverflowError, before any sender reads, unless every sender's state and the whole message (each
        sender's prompt rows + G latent rows) fit, then the receiver's prompt and answer."""
        self.check_receiver_window(self.check_senders(senders, documents, question), receiver, question)

    def check_senders(self, senders: Sequence[Agent], documents: Sequence[str], question: str) -> list[int]:
        """Each sender's prompt length, checked against its window before any sender reads."""
        pairs = self._pair(senders, documents)
        return sender_prompt_lengths([s for s, _ in pairs], [self.sender_prompt(d, question) for _, d in pairs],
                                     self.latent_steps)

    def check_receiver_window(self, prompts: Sequence[int], receiver: Agent, question: str) -> None:
        """The receiver's half of `check_window`, from the senders' prompt lengths (what a transport checks on the
        receiver's node before any sender's node reads)."""
        follow = receiver.kv_prompt_ids(question)
        parts = {"sender_rows": sum(prompts), "latent_rows": len(prompts) * self.latent_steps, "prompt": len(follow),
                 "max_new_tokens": self.max_new_tokens}
        if sum(parts.values()) > receiver.context_window:
            raise ContextOverflowError(sum(parts.values()), receiver.context_window, parts)

    def run(self, senders: Sequence[Agent], documents: Sequence[str], receiver: Agent, question: str) -> Outcome:
        if self.prefix == "shared":
            return self.run_shared(senders, documents, receiver, question)
        self.check_window(senders, documents, receiver, question)
        reads = [self.sender_read(sender, doc, question) for sender, doc in self._pair(senders, documents)]
        states, seconds = [r.state for r in reads], [r.seconds for r in reads]
        where = {receiver.device, *(s.device for s in states)}  # the states are placed (re-rotated) where they lie
        message, concat_s = timed(where, KVState.concat, states)
        nbytes = sum(len(s.to_bytes()) for s in states)  # each sender ships its own state
        reply = receiver.answer(question, message=message, max_new_tokens=self.max_new_tokens)
        kept = tuple(((0, len(d)),) for d in documents)  # every position travels
        return Outcome(self.name, reply.text, nbytes, reply.context, tuple(seconds), reply.seconds + concat_s,
                       {"message_rows": len(message), "latent_steps": self.latent_steps,
                        "shared_reads": sum(r.shared for r in reads)}, kept,
                       None if self.query_aware else tuple(seconds),  # a held state is the whole message
                       after_first=after_first(reply))

    def run_shared(self, senders: Sequence[Agent], documents: Sequence[str], receiver: Agent, question: str) -> Outcome:
        """prefix="shared": the common prefix read once (held), each sender's rows after it, attached after it once.
        The prefix is not sent (every agent of the model holds it); each sender is charged it in its read."""
        pairs = self._pair(senders, documents)
        splits = [split(s, self.sender_prompt(d, question), d) for s, d in pairs]
        ids = common_prefix([s for s, _ in pairs], splits, receiver)  # PrefixMismatchError before any compute
        self.check_senders(senders, documents, question)
        parts = {"prefix_rows": len(ids), "sender_rows": sum(len(x.ids) - x.cut for x in splits),
                 "latent_rows": len(pairs) * self.latent_steps, "prompt": len(receiver.kv_prompt_ids(question)),
                 "max_new_tokens": self.max_new_tokens}
        if sum(parts.values()) > receiver.context_window:
            raise ContextOverflowError(sum(parts.values()), receiver.context_window, parts)
        full = self.recompute_first > 0  # recomputing attached rows needs every row on sliding layers
        if full:
            check_blend(receiver)
        prefix, prefix_s, _ = prefix_state(senders[0], ids, full)
        reads = [read_after(s, prefix, x, self.latent_steps, self.latent_mode, full) for (s, _), x in zip(pairs, splits)]
        seconds = [prefix_s + r_s for _, r_s in reads]
        own, own_s = (prefix, 0.0) if receiver.uid == senders[0].uid else prefix_state(receiver, ids, full)[:2]
        rows = [m.to(receiver.device, receiver.dtype) for m, _ in reads]
        message, attach_s = timed({receiver.device}, attach, own, rows)
        nbytes = sum(len(m.to_bytes()) for m, _ in reads)  # each sender ships its rows after the prefix
        if full:
            reply = receiver.answer_recomputed(question, message, len(own), first_rows(rows, self.recompute_first),
                                               max_new_tokens=self.max_new_tokens)
        else:
            reply = receiver.answer(question, message=message, max_new_tokens=self.max_new_tokens)
        kept = tuple(((0, len(d)),) for d in documents)
        return Outcome(self.name, reply.text, nbytes, reply.context, tuple(seconds), reply.seconds + attach_s + own_s,
                       {"message_rows": len(message), "prefix_rows": len(prefix), "latent_steps": self.latent_steps},
                       kept, None if self.query_aware else tuple(seconds), after_first=after_first(reply))

"""Shared-prefix reads (docs/methods.md#shared-prefix-reads): senders of one fan-in read `[prefix][document]`, where
the prefix — the chat template, system text and instruction up to the document — is token for token the same for
every sender. Its K/V are computed once and held; each sender reads only its document on top of them (and thinks G
latent steps), and its message is the rows after the prefix. The receiver attaches the prefix once, then each
sender's rows: one template, one system text, one set of attention-sink rows, where concatenating whole reads
repeats them per sender.

For one sender, the prefix and its rows attached are the state of reading `[prefix][document]` in one prefill
(`tests/unit/test_prefix.py`, 1e-5 in float32).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..agent import Agent
from ..clock import now
from ..errors import ConfigError
from ..state import KVState
from .documents import chat_document, token_document_spans
from .reads import held_value, text_key


class PrefixMismatchError(ConfigError):
    """Senders (or a receiver) whose prefixes before the document are not the same tokens of the same model: no
    one prefix can serve them. Raised before any compute; names the first two that differ."""


@dataclass(frozen=True)
class Split:
    """One sender's prompt as token ids, cut where its document starts: ids[:cut] is the prefix."""
    ids: list[int]
    cut: int


def split(sender: Agent, prompt: str, document: str) -> Split:
    """The sender's chat prompt ids and the index of its first document token (`chat_document`: the document where
    the prompt places it). A token that straddles the document's start belongs to the document."""
    text, start = chat_document(sender, prompt, document)
    spans = token_document_spans(sender, text, document, start)
    ids = sender.encode(text)
    cut = next((i for i, sp in enumerate(spans) if sp is not None), len(ids))
    return Split(ids, cut)


def common_prefix(agents: Sequence[Agent], splits: Sequence[Split], receiver: Agent | None = None) -> list[int]:
    """The prefix ids every sender's split shares; PrefixMismatchError, before any compute, unless every sender (and
    the receiver, which attaches the prefix itself) runs one model and every prefix is the same tokens."""
    first, want = agents[0], splits[0].ids[:splits[0].cut]
    for i, (agent, s) in enumerate(zip(agents, splits)):
        if agent.geometry != first.geometry:
            raise PrefixMismatchError(f"shared prefix: sender {i} runs {agent.model_name}, sender 0 "
                                      f"{first.model_name}; one prefix serves the senders of one model")
        if s.ids[:s.cut] != want:
            raise PrefixMismatchError(f"shared prefix: sender {i}'s text before its document is not sender 0's "
                                      f"({s.cut} vs {len(want)} tokens): its chat template or instruction differs")
    if receiver is not None and receiver.geometry != first.geometry:
        raise PrefixMismatchError(f"shared prefix: the receiver runs {receiver.model_name}, the senders "
                                  f"{first.model_name}; the receiver attaches the prefix it holds itself")
    if not want:
        raise PrefixMismatchError("shared prefix: the document starts the prompt; there is no prefix to share")
    return want


def prefix_state(agent: Agent, ids: list[int], full_history: bool = False) -> tuple[KVState, float, bool]:
    """The prefix's K/V, computed once per agent and held (`held_value`: inside `shared_reads`, across questions
    with `HeldReads`): (state, seconds charged, held?). `full_history`: every row kept on sliding layers (what a
    receiver that recomputes attached rows needs)."""
    key = ("index", "prefix", agent.uid, agent.model_name, str(agent.dtype), str(agent.device),
           text_key(" ".join(map(str, ids)))) + (("full",) if full_history else ())
    return held_value(key, lambda: agent.read_on(None, ids, full_history), agent.device)


def read_after(agent: Agent, prefix: KVState, s: Split, latent_steps: int, latent_mode: str,
               full_history: bool = False) -> tuple[KVState, float]:
    """One sender's read on the held prefix: its rows after the prefix (document, template tail and G latent rows,
    at positions P..), and its seconds."""
    t0 = now(agent.device)
    state = agent.think(agent.read_on(prefix, s.ids[s.cut:], full_history), latent_steps, latent_mode, full_history)
    rows = state.select(list(range(len(prefix), len(state))))  # (T_i − P rows) what it sends
    return rows, now(agent.device) - t0


def attach(prefix: KVState, messages: Sequence[KVState]) -> KVState:
    """What the receiver attaches: the prefix, then each sender's rows, keys re-rotated to consecutive positions."""
    return KVState.concat([prefix, *messages])


def first_rows(messages: Sequence[KVState], k: int) -> list[int]:
    """EPIC's choice of rows to recompute: each message's first `k` rows (all of a shorter one), as indices into
    the messages placed one after another."""
    pick, offset = [], 0
    for m in messages:
        pick += range(offset, offset + min(k, len(m)))
        offset += len(m)
    return pick

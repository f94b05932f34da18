"""One read per sender, shared by every protocol that starts from it.

A sender's finished state (prefill + G latent steps) depends only on the sender's model and dtype,
the prompt it reads, G and the latent mode. Inside `shared_reads()` (the benchmark runner opens one
per episode) `read` computes each such state once and hands the same state to every protocol that
asks for it again: full KV, CacheBack at every ratio, selector and encoding, merge, a chain's first
hop. The prefill is shared too, so G = 0 and G = 8 pay one prefill between them.

Each protocol is still charged the time it would pay alone: `read` returns the *measured* seconds of
the read it hands out (prefill + latent steps, as first computed), whether it computed it now or not,
so TTEOA keeps its meaning. `Read.shared` says which it was; protocols record it.

Outside `shared_reads()` nothing is kept: `read` is `sender.think(sender.prefill(prompt), G, mode)`.
States are values (protocols never mutate them), so handing one state to several protocols is safe.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator, NamedTuple

from ..agent import Agent
from ..state import KVState

_MEMO: ContextVar[dict | None] = ContextVar("latentwire_shared_reads", default=None)


class Read(NamedTuple):
    state: KVState
    seconds: float  # measured prefill + latent steps of this state (charged to every protocol using it)
    shared: bool  # True when an earlier protocol in the same `shared_reads()` block computed it


@contextmanager
def shared_reads() -> Iterator[dict]:
    """Within the block, each (sender, prompt, G, mode) is read once; yields the memo (for inspection)."""
    memo: dict = {}
    token = _MEMO.set(memo)
    try:
        yield memo
    finally:
        _MEMO.reset(token)
        memo.clear()


def read(sender: Agent, prompt: str, latent_steps: int, latent_mode: str) -> Read:
    """The sender's finished state after reading `prompt` (a chat user turn) and thinking G steps."""
    memo = _MEMO.get()
    if memo is None:
        t0 = time.perf_counter()
        state = sender.think(sender.prefill(prompt), latent_steps, latent_mode)
        return Read(state, time.perf_counter() - t0, False)
    who = (id(sender), sender.model_name, str(sender.dtype), str(sender.device), prompt)
    key = who + (latent_steps, latent_mode)
    if key in memo:
        state, seconds = memo[key]
        return Read(state, seconds, True)
    if who in memo:  # the prefill is shared between latent-step counts and modes
        prefilled, prefill_s = memo[who]
    else:
        t0 = time.perf_counter()
        prefilled = sender.prefill(prompt)
        prefill_s = time.perf_counter() - t0
        memo[who] = (prefilled, prefill_s)
    t0 = time.perf_counter()
    state = sender.think(prefilled, latent_steps, latent_mode)
    memo[key] = (state, prefill_s + time.perf_counter() - t0)
    return Read(state, memo[key][1], False)

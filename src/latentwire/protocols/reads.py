"""One read per sender, shared by every protocol that starts from it.

A sender's finished state (prefill + G latent steps) depends only on the sender's model and dtype,
the prompt it reads, G and the latent mode. Inside `shared_reads()` (the benchmark runner opens one
per episode) `read` computes each such state once and hands the same state to every protocol that
asks for it again: full KV, CacheBack at every ratio, selector and encoding, merge, a chain's first
hop. The prefill is shared too, so G = 0 and G = 8 pay one prefill between them.

Each protocol is still charged the time it would pay alone: `read` returns the *measured* seconds of
the read it hands out (prefill + latent steps, as first computed), whether it computed it now or not,
so TTEOA keeps its meaning. `Read.shared` says which it was; protocols record it.

Text reports share the same way (`report`): greedy decoding is deterministic, so one decode of a
sender's report prompt serves every cap it covers (`text` and `text(ratio=r)` ask for the same report
with different token budgets) with exactly the tokens a decode at that cap gives, charged the time that
decode takes up to its last choice.

Outside `shared_reads()` nothing is kept: `read` is `sender.think(sender.prefill(prompt), G, mode)` and
`report` is `sender.answer(prompt, max_new_tokens=cap)`.
States are values (protocols never mutate them), so handing one state to several protocols is safe.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator, NamedTuple

from ..agent import Agent, Answer
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


class Report(NamedTuple):
    answer: Answer  # the report, as a decode capped at the asked budget gives it, with that decode's seconds
    shared: bool  # True when an earlier, longer decode of the same prompt in this block served it


def report(sender: Agent, prompt: str, max_new_tokens: int) -> Report:
    """The sender's greedy answer to `prompt` (a report) capped at `max_new_tokens`. Inside `shared_reads()`
    one decode per (sender, prompt) serves every cap it covers (`Answer.truncated`); a cap beyond what a
    capped decode reached decodes again, and that longer decode is kept for the next."""
    memo = _MEMO.get()
    if memo is None:
        return Report(sender.answer(prompt, max_new_tokens=max_new_tokens), False)
    key = ("report", id(sender), sender.model_name, str(sender.dtype), str(sender.device), prompt)
    if key in memo:
        full = memo[key]
        sender.check_window(prompt=full.prompt_tokens, max_new_tokens=max_new_tokens)  # as answer() would
        served = full.truncated(max_new_tokens, sender.tokenizer)
        if served is not None:
            return Report(served, True)
    ans = sender.answer(prompt, max_new_tokens=max_new_tokens)
    memo[key] = ans
    return Report(ans, False)

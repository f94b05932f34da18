"""One read per sender, shared by every protocol that starts from it.

A sender's finished state (prefill + G latent steps) depends only on the sender's model and dtype,
the prompt it reads, G and the latent mode (and, on models with sliding layers, whether it keeps every row). Inside `shared_reads()` (the benchmark runner opens one
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

Held reads (agents that already hold their documents): `shared_reads(held)` with a `HeldReads` keeps the
memo across blocks, one block per question. A read computed in an earlier block was done before this
question arrived, so it is charged 0 s: the protocol's sender seconds and TTEOA are then *question-time*
(`Read.held` says so). `HeldReads` bounds the bytes it keeps (least recently used reads go first) and
counts the reads it computed, so "read once for k questions" is checkable. A retriever that holds its document
keeps its index in the same memo (`held_value`), bounded and dropped with the reads. Memo keys name prompts and
documents by their SHA-256 (`text_key`), so a held entry's key costs 71 bytes of text, not a copy of its document.
"""
from __future__ import annotations

import hashlib
import sys
import types
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Callable, Iterator, NamedTuple

import numpy as np
import torch

from ..agent import Agent, Answer
from ..clock import now
from ..errors import ConfigError, HeldMemoryError
from ..state import KVState

_MEMO: ContextVar[dict | None] = ContextVar("latentwire_shared_reads", default=None)
_HELD: ContextVar["HeldReads | None"] = ContextVar("latentwire_held_reads", default=None)


class Read(NamedTuple):
    state: KVState
    seconds: float  # measured prefill + latent steps of this state (charged to every protocol using it); 0 if held
    shared: bool  # True when an earlier protocol in the same `shared_reads()` block computed it
    held: bool = False  # True when it was read before this question (an earlier block of the same HeldReads)


def text_key(text: str) -> str:
    """A prompt's or document's name in a memo key: its SHA-256, so the key does not hold a copy of the text."""
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


class HeldReads:
    """Reads, retriever indexes and CacheBack's document layouts kept across questions, within `max_bytes`
    (least recently used go first).

        held = HeldReads(max_bytes=2 * 2**30)
        with shared_reads(held):
            first = protocol.run(senders, docs, receiver, "Who ...?")  # reads: cold
        with shared_reads(held):
            again = protocol.run(senders, docs, receiver, "And when ...?")  # reads held: charged 0 s
    """

    def __init__(self, max_bytes: int = 4 * 2**30):
        whole = isinstance(max_bytes, int) or isinstance(max_bytes, float) and max_bytes.is_integer()  # 2e9 is fine
        if isinstance(max_bytes, bool) or not whole or max_bytes < 0:
            raise ConfigError(f"max_bytes must be a whole number of bytes ≥ 0, got {max_bytes!r}")
        self.max_bytes = int(max_bytes)
        self.memo: dict = {}
        self.block = 0  # increments at each `shared_reads(self)`: entries from an earlier block are held
        self.born: dict = {}  # memo key -> block that computed it
        self.used: dict = {}  # memo key -> last block that used it (LRU order)
        self.reads_computed = 0  # prefills + latent-step runs actually computed (not served)
        self.served_held = 0  # finished states served from an earlier block (read before the question)
        self.dropped = 0  # entries dropped to stay within max_bytes
        self.indexes_computed = 0  # retriever indexes and document layouts built (`held_value`), not reads
        self.indexes_served_held = 0  # indexes served from an earlier block (built before the question)

    @property
    def nbytes(self) -> int:
        """Bytes held: each read's KV (a prefill and its latent-step continuations count separately) and each
        retriever index (`_held_bytes`)."""
        return sum(_entry_bytes(v) for v in self.memo.values())

    def release(self) -> None:
        """Drop every held read."""
        self.memo.clear(), self.born.clear(), self.used.clear()

    def _charge(self, key, seconds: float) -> tuple[float, bool]:
        """(seconds to charge, held?) for an entry served now; marks it used."""
        self.used[key] = self.block
        held = self.born.get(key, self.block) < self.block
        return (0.0 if held else seconds), held

    def _add(self, key, value) -> None:
        self.memo[key] = value
        self.born[key] = self.used[key] = self.block
        kind = key[0] if isinstance(key, tuple) and key else None
        if kind == "index":
            self.indexes_computed += 1
        elif kind != "report":
            self.reads_computed += 1

    def check_fits(self, needed: int) -> None:
        """HeldMemoryError unless a new read of about `needed` bytes fits the bound on its own; `read` asks before
        that read computes (each sender in turn). Older reads make room when the question's block ends (`_fit`), so
        within one block the held bytes may exceed the bound. `max_bytes = 0` holds nothing and refuses nothing."""
        if 0 < self.max_bytes < needed:
            raise HeldMemoryError(needed, self.max_bytes)

    def _fit(self) -> None:
        """Drop least recently used entries until the held bytes fit `max_bytes` (a report holds no KV: dropping it
        frees nothing, so it stays)."""
        over = self.nbytes - self.max_bytes
        for key in sorted(self.memo, key=lambda k: self.used.get(k, -1)):
            if over <= 0:
                break
            if not (size := _entry_bytes(self.memo[key])):
                continue
            del self.memo[key]
            over -= size
            self.born.pop(key, None), self.used.pop(key, None)
            self.dropped += 1


def read_bytes(sender: Agent, rows: int, full_history: bool = False) -> int:
    """KV bytes of a state of `rows` rows on `sender` (sliding layers keep their last window − 1 rows, unless
    `full_history`): what holding it costs."""
    g = sender.geometry
    kept = sum(rows if kind == "global" or full_history else min(rows, g.sliding_window - 1)
               for kind in g.layer_types)
    return 2 * g.num_kv_heads * g.head_dim * sender.dtype.itemsize * kept


def _entry_bytes(value) -> int:
    """Bytes a memo entry holds: a state's KV; for a retriever's index (`held_value`) everything it keeps (`_held_bytes`:
    a dense encoder's unit embeddings, BM25's arrays and vocabulary, the units' rows and words); 0 for a report."""
    kept = value[0] if isinstance(value, tuple) else None
    if isinstance(kept, KVState):
        return kept.nbytes
    return _held_bytes(kept) if isinstance(kept, tuple) else 0


_LEAVES = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType)


def _held_bytes(obj, seen: set[int] | None = None) -> int:
    """Bytes `obj` keeps alive, each object once: a tensor's or array's data, a state's KV, and for Python values
    their own `sys.getsizeof` plus their contents' (containers, and the attributes of plain objects such as a bm25s
    index). Classes, modules, functions, models and agents are shared, not held: they count 0."""
    seen = set() if seen is None else seen
    if id(obj) in seen or isinstance(obj, _LEAVES) or isinstance(obj, (torch.nn.Module, Agent)):
        return 0  # shared by the process (a model, an agent, a class): not what an entry holds
    seen.add(id(obj))
    if isinstance(obj, KVState):
        return obj.nbytes
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        return size + sum(_held_bytes(k, seen) + _held_bytes(v, seen) for k, v in obj.items())
    if isinstance(obj, (list, tuple, set, frozenset)):
        return size + sum(_held_bytes(x, seen) for x in obj)
    if hasattr(obj, "__dict__"):
        return size + _held_bytes(vars(obj), seen)
    return size


@contextmanager
def shared_reads(held: HeldReads | None = None) -> Iterator[dict]:
    """Within the block, each (sender, prompt, G, mode) is read once; yields the memo (for inspection). With
    `held`, the memo outlives the block (reads from earlier blocks are charged 0 s) and is trimmed to its bound."""
    if held is not None:
        held.block += 1
    memo: dict = {} if held is None else held.memo
    token, held_token = _MEMO.set(memo), _HELD.set(held)
    try:
        yield memo
    finally:
        _MEMO.reset(token)
        _HELD.reset(held_token)
        if held is None:
            memo.clear()
        else:
            held._fit()


def read(sender: Agent, prompt: str, latent_steps: int, latent_mode: str, full_history: bool = False) -> Read:
    """The sender's finished state after reading `prompt` (a chat user turn) and thinking G steps. With
    `full_history`, a sender with sliding-window layers keeps every row's K/V there (a read of its own)."""
    full = full_history and "sliding" in sender.geometry.layer_types  # elsewhere every layer keeps every row
    memo = _MEMO.get()
    if memo is None:
        t0 = now(sender.device)
        state = sender.think(sender.prefill(prompt, full_history=full), latent_steps, latent_mode, full)
        return Read(state, now(sender.device) - t0, False)
    held = _HELD.get()
    who = (sender.uid, sender.model_name, str(sender.dtype), str(sender.device), text_key(prompt)) + (
        ("full",) if full else ())
    key = who + (latent_steps, latent_mode) if latent_steps else who  # G = 0: the finished state is the prefill
    if key in memo:
        state, charged, was_held = _serve(memo, held, key)
        if held is not None:
            held.served_held += was_held
        return Read(state, charged, not was_held, was_held)
    put = _store(memo, held)
    if held is not None:  # refused before this read computes: the prefill and the finished state are both held
        rows = len(sender.chat_ids(prompt))
        held.check_fits(read_bytes(sender, rows, full) * (who not in memo)
                        + (read_bytes(sender, rows + latent_steps, full) if latent_steps else 0))
    if who in memo:  # the prefill is shared between latent-step counts and modes
        prefilled, prefill_s = memo[who]
        if held is not None:
            prefill_s = held._charge(who, prefill_s)[0]
    else:
        t0 = now(sender.device)
        prefilled = sender.prefill(prompt, full_history=full)
        prefill_s = now(sender.device) - t0
        put(who, (prefilled, prefill_s))
        if not latent_steps:
            return Read(prefilled, prefill_s, False)
    t0 = now(sender.device)
    state = sender.think(prefilled, latent_steps, latent_mode, full)
    seconds = prefill_s + now(sender.device) - t0
    put(key, (state, seconds))
    return Read(state, seconds, False)


def held_value(key: tuple, compute: Callable[[], Any], device: torch.device | None = None) -> tuple[Any, float, bool]:
    """A query-blind value other than a KV read (a retriever's index of its document, `retrieval(read="held")`),
    computed once per `shared_reads()` block and, with `HeldReads`, kept across blocks as reads are: (value, seconds
    charged, held?). Charged its measured seconds, or 0 s when an earlier block (before this question) computed it.
    `key` starts with "index" (`HeldReads.indexes_computed` counts them apart from reads); outside `shared_reads()`
    nothing is kept. `device`: where `compute` queues work, waited for by its clock (`clock.now`)."""
    if not (isinstance(key, tuple) and key and key[0] == "index"):
        raise ValueError(f"held_value keys start with 'index', got {key!r}")
    memo, held = _MEMO.get(), _HELD.get()
    if memo is not None and key in memo:
        return _serve(memo, held, key)
    t0 = now(device)
    value = compute()
    seconds = now(device) - t0
    if memo is not None:
        _store(memo, held)(key, (value, seconds))
    return value, seconds, False


def _serve(memo: dict, held: HeldReads | None, key) -> tuple[Any, float, bool]:
    """(value, seconds charged, held?) of a memo entry: its measured seconds within a block, 0 s when an earlier
    block of `held` computed it."""
    value, seconds = memo[key]
    if held is None:
        return value, seconds, False
    charged, was_held = held._charge(key, seconds)
    held.indexes_served_held += was_held and key[0] == "index"
    return value, charged, was_held


def _store(memo: dict, held: HeldReads | None) -> Callable:
    """How a new entry enters the memo: plainly, or through `held` (which dates and counts it)."""
    return memo.__setitem__ if held is None else held._add


class Report(NamedTuple):
    answer: Answer  # the report, as a decode capped at the asked budget gives it, with that decode's seconds
    shared: bool  # True when an earlier, longer decode of the same prompt in this block served it


def report(sender: Agent, prompt: str, max_new_tokens: int) -> Report:
    """The sender's greedy answer to `prompt` (a report) capped at `max_new_tokens`. Inside `shared_reads()`
    one decode per (sender, prompt) serves every cap it covers (`Answer.truncated`); a cap beyond what a
    capped decode reached decodes again, and that longer decode is kept for the next."""
    key = ("report", sender.uid, sender.model_name, str(sender.dtype), str(sender.device), text_key(prompt))
    return _capped(sender, key, lambda cap: sender.answer(prompt, max_new_tokens=cap), max_new_tokens)


def report_after(sender: Agent, prompt: str, user: str, max_new_tokens: int) -> tuple[Report, Read]:
    """A report from a sender that holds its read: it read `prompt` (a chat user turn, no latent steps) before
    the question, shared like any `read`; the question comes as a new turn `user` after it, and only that turn
    is prefilled (`Agent.answer_after`). Decodes are shared across caps as in `report`."""
    r = read(sender, prompt, 0, "rescale")
    key = ("report", sender.uid, sender.model_name, str(sender.dtype), str(sender.device), text_key(prompt), "after",
           text_key(user))
    return _capped(sender, key, lambda cap: sender.answer_after(r.state, user, max_new_tokens=cap), max_new_tokens), r


def _capped(sender: Agent, key: tuple, decode, max_new_tokens: int) -> Report:
    """`decode(cap)` once per key inside `shared_reads()`, serving every cap the kept decode covers."""
    memo = _MEMO.get()
    if memo is None:
        return Report(decode(max_new_tokens), False)
    if key in memo:
        full = memo[key]
        sender.check_window(prompt=full.message_rows + full.prompt_tokens,  # as the decode itself would
                            max_new_tokens=max_new_tokens)
        served = full.truncated(max_new_tokens, sender.tokenizer, sender.turn_marker)
        if served is not None:
            return Report(served, True)
    ans = decode(max_new_tokens)
    memo[key] = ans
    return Report(ans, False)

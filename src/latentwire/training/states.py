"""The frozen models' states for split-evidence pairs, prefilled once and cached on disk in bf16.

Both models are frozen, so a (model, prompt) pair always gives the same state: the cache keys files by
SHA-256 of (cache format, model, tokenizer fingerprint, the model's dtype, the prompt's token ids as the chat
template gives them: a changed template is a new entry) and stops writing once the folder reaches its size
limit (16 GiB by default; later states are then computed on the fly, every time they are read: watch `hits` /
`misses`). A hit whose rows are not those token ids is refused. Reads come back in float32, on the agent's
device. New weights under an old model name are not detected: clear the folder (`StateCache.folder`) then.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from ..agent import Agent
from ..bench.tasks.pairs import Pair
from ..errors import StateFormatError
from ..models.zoo import cache_root
from ..protocols.pair import both_prompt, own_prompt
from ..state import KVState
from ..translate.base import cast
from ..translate.compose import PairStates, needs

FORMAT = "latentwire.statecache.v2"  # in every key: a change of what a file holds starts a new entry


class StateCache:
    def __init__(self, folder: str | Path | None = None, limit_mb: float = 16384):
        self.folder = Path(folder) if folder else cache_root() / "states"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.limit = limit_mb * 2**20
        self.used = sum(f.stat().st_size for f in self.folder.glob("*.kv"))
        self.hits = self.misses = 0

    def _path(self, agent: Agent, ids: list[int]) -> Path:
        g = agent.geometry
        text = f"{FORMAT}\x00{g.model}\x00{g.tokenizer}\x00{agent.dtype}\x00{','.join(map(str, ids))}"
        return self.folder / f"{hashlib.sha256(text.encode()).hexdigest()}.kv"

    def get(self, agent: Agent, prompt: str) -> KVState:
        ids = agent.chat_ids(prompt)
        path = self._path(agent, ids)
        if path.exists():
            state = KVState.from_bytes(path.read_bytes())  # host tensors: moved to the agent's device
            agent.geometry.check_same(state.geometry)
            if state.token_ids.tolist() != ids:
                raise StateFormatError(f"{path}: a cached state of other tokens than its key's prompt (a corrupt or "
                                       f"foreign cache file); delete it")
            self.hits += 1
            return cast(state, torch.float32, agent.device)
        self.misses += 1
        state = agent.prefill(prompt)
        data = cast(state, torch.bfloat16).to_bytes()
        if self.used + len(data) <= self.limit:
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(data)
            tmp.replace(path)
            self.used += len(data)
        return cast(cast(state, torch.bfloat16), torch.float32)  # same values whether cached or not


def pair_states(pair: Pair, sharer: Agent, receiver: Agent, method: str, cache: StateCache | None = None,
                context_aware: bool = False, stage1: bool = False) -> PairStates:
    """The states `method` reads for one pair (from the cache when given, else fresh float32 prefills).

    `stage1` (dense): only what the reconstruction reads instead: the sharer's state S of its own
    prompt, the receiver's state of that same prompt (`receiver_on_sharer`) and, unless both hold the
    same tokens, the receiver-row -> sharer-row token alignment of that prompt (`align`, `mask`).
    """
    get = cache.get if cache is not None else (lambda agent, prompt: agent.prefill(prompt))
    if stage1:
        return _stage1_states(pair, sharer, receiver, get)
    fields = needs(method, context_aware)
    kw = {}
    if "sharer" in fields:
        kw["sharer"] = get(sharer, own_prompt(pair.sharer_doc, pair.question))
    if "receiver" in fields:
        kw["receiver"] = get(receiver, own_prompt(pair.receiver_doc, pair.question))
    if "receiver_both" in fields:
        kw["receiver_both"] = get(receiver, both_prompt(pair.sharer_doc, pair.receiver_doc, pair.question))
    if "sharer_both" in fields:
        from ..translate.token_alignment import align

        both = both_prompt(pair.sharer_doc, pair.receiver_doc, pair.question)
        kw["sharer_both"] = get(sharer, both)
        al = align(receiver, sharer, both)
        kw["align"], kw["mask"] = al.index, al.mask
    return PairStates(**kw)


def _stage1_states(pair: Pair, sharer: Agent, receiver: Agent, get) -> PairStates:
    prompt = own_prompt(pair.sharer_doc, pair.question)
    S, target = get(sharer, prompt), get(receiver, prompt)  # (T_s rows), (T_r rows)
    if S.geometry.tokenizer == target.geometry.tokenizer and torch.equal(S.token_ids.cpu(), target.token_ids.cpu()):
        return PairStates(sharer=S, receiver_on_sharer=target)  # the same tokens: row t is row t
    from ..translate.token_alignment import align

    al = align(receiver, sharer, prompt)  # (T_r,) target row -> sharer row, on the receiver's device
    if len(al) != len(target) or len(al.sharer_ids) != len(S):
        raise ValueError(f"stage I: the alignment of {len(al)} x {len(al.sharer_ids)} tokens does not match the "
                         f"states' {len(target)} x {len(S)} rows")
    return PairStates(sharer=S, receiver_on_sharer=target, align=al.index, mask=al.mask)

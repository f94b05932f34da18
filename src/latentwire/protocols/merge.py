"""Merge (docs/methods.md#merge-protocol): N thinkers each read their part and think; their
finished states become content-addressed fragments, merged as a set (FragmentSet: a duplicate is
absorbed) and rendered into one cache the judger answers over.

`render="canonical"` orders the blocks by content (CanonicalMerge: the same bytes whatever the order
the thinkers finish in); `render="bag"` concatenates them in thinker order, or in `order` (a
permutation of the thinkers: `order=(1, 0)` puts thinker 1's block first). `dedupe` (bag only): True
renders identical thinker states once, as the set does; False renders one block per thinker, repeats
included (BagMerge over the bag: a re-delivered fragment is concatenated again, the contrast to the
set absorbing it). `query_aware` is the regime: thinkers see the question before thinking (aware) or not (blind).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..agent import Agent
from ..clock import now
from ..errors import ConfigError, UnknownNameError
from ..merge import RENDERS, Fragment, FragmentSet, get_render
from ..state import KVState
from .base import Outcome, register
from .fullkv import FullKV


@register
@dataclass
class Merge(FullKV):
    """Sends each thinker's whole finished state as a fragment; the fragments are merged as a set and rendered
    into one cache. Key parameters: `render` ("canonical" or "bag"), `order`, `dedupe`, `latent_steps`."""
    name = "merge"
    render: str = "canonical"  # "canonical" or "bag"
    order: tuple[int, ...] | None = None  # bag only: thinker index per slot
    layer: int | None = None  # canonical only: the layer whose mean K-norm orders the blocks (None: middle)
    direction: str = "ascending"  # canonical only: "descending" reverses the K-norm order (an ablation)
    dedupe: bool = True  # identical thinker states render once; False (bag only): once per thinker

    def __post_init__(self):
        super().__post_init__()
        if self.render not in RENDERS:
            raise UnknownNameError("render", self.render, RENDERS)
        if self.order is not None and self.render != "bag":
            raise ConfigError("order applies to render='bag' only (CanonicalMerge chooses its own order)")
        if self.layer is not None and self.render != "canonical":
            raise ConfigError("layer applies to render='canonical' only")
        if self.direction != "ascending" and self.render != "canonical":
            raise ConfigError("direction applies to render='canonical' only")
        if type(self.dedupe) is not bool:
            raise ConfigError(f"dedupe must be True or False, got {self.dedupe!r}")
        if not self.dedupe and self.render != "bag":
            raise ConfigError("dedupe=False applies to render='bag' only (CanonicalMerge renders the FragmentSet, "
                             "which absorbs identical states)")
        params = {"order": self.order} if self.render == "bag" else {"layer": self.layer, "direction": self.direction}
        self._render = get_render(self.render, **params)

    def run(self, senders: Sequence[Agent], documents: Sequence[str], receiver: Agent, question: str) -> Outcome:
        fragments, seconds, shared = [], [], 0
        for sender, doc in self._pair(senders, documents):
            r = self.sender_read(sender, doc, question)
            t0 = now(sender.device)
            fragments.append(Fragment.of(r.state))
            seconds.append(r.seconds + now(sender.device) - t0)  # read (measured) + content addressing
            shared += r.shared
        where = {receiver.device, *(f.state.device for f in fragments)}  # the blocks are combined where they lie
        t0 = now(*where)
        state, slots, merged = self.combine(fragments)
        render_s = now(*where) - t0
        reply = receiver.answer(question, message=state, max_new_tokens=self.max_new_tokens)
        nbytes = sum(len(fragments[i].state.to_bytes()) for i in slots)  # every block sent, repeats included
        return Outcome(self.name, reply.text, nbytes, reply.context,
                       tuple(seconds), reply.seconds + render_s,
                       {"message_rows": len(state), "slots": slots, "digest": state.digest(),
                        "fragments": len(merged), "blocks": len(slots), "render_s": render_s,
                        "shared_reads": shared},
                       tuple(((0, len(d)),) for d in documents))

    def combine(self, fragments: Sequence[Fragment]) -> tuple[KVState, list[int], FragmentSet]:
        """The judger's cache from the thinkers' fragments (in thinker order), the thinker of each block
        in cache order, and the FragmentSet they converge to (identical thinker states count once)."""
        merged = FragmentSet(fragments)
        first: dict[str, int] = {}  # digest -> the first thinker that produced it
        for i, f in enumerate(fragments):
            first.setdefault(f.digest, i)
        given = list(range(len(fragments))) if not self.dedupe else list(first.values())  # thinker indices
        if self.order is not None and len(given) != len(fragments):
            raise ValueError("order names every thinker, but some thinkers produced identical states "
                             "(dedupe=False renders one block per thinker)")
        blocks = [fragments[i] for i in given]
        state = self._render.render(blocks if self.render == "bag" else merged)
        ordered = self._render.order(blocks)  # the same order render() used (orders are pure)
        slots, used = [], set()  # a repeated fragment: each copy is matched to its own thinker
        for o in ordered:
            k = next(k for k, b in enumerate(blocks) if b is o and k not in used)
            used.add(k)
            slots.append(given[k])
        return state, slots, merged

"""Merge (SPEC §2): N thinkers each read their part and think; their finished states become content-
addressed fragments, merged as a set (FragmentSet: a duplicate is absorbed) and rendered into one cache
the judger answers over.

`render="canonical"` orders the blocks by content (CanonicalMerge: the same bytes whatever the order
the thinkers finish in); `render="bag"` concatenates them in thinker order, or in `order` (a
permutation of the thinkers: `order=(1, 0)` puts thinker 1's block first). `query_aware` is the
regime: thinkers see the question before thinking (aware) or not (blind).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

from ..agent import Agent
from ..errors import UnknownNameError
from ..merge import RENDERS, Fragment, FragmentSet, get_render
from .base import Outcome, register
from .fullkv import FullKV


@register
@dataclass
class Merge(FullKV):
    name = "merge"
    render: str = "canonical"  # "canonical" or "bag"
    order: tuple[int, ...] | None = None  # bag only: thinker index per slot
    layer: int | None = None  # canonical only: the layer whose mean K-norm orders the blocks (None: middle)

    def __post_init__(self):
        super().__post_init__()
        if self.render not in RENDERS:
            raise UnknownNameError("render", self.render, RENDERS)
        if self.order is not None and self.render != "bag":
            raise ValueError("order applies to render='bag' only (CanonicalMerge chooses its own order)")
        if self.layer is not None and self.render != "canonical":
            raise ValueError("layer applies to render='canonical' only")
        params = {"order": self.order} if self.render == "bag" else {"layer": self.layer}
        self._render = get_render(self.render, **params)

    def run(self, senders: Sequence[Agent], documents: Sequence[str], receiver: Agent, question: str) -> Outcome:
        fragments, seconds, shared = [], [], 0
        for sender, doc in self._pair(senders, documents):
            r = self.sender_read(sender, doc, question)
            t0 = time.perf_counter()
            fragments.append(Fragment.of(r.state))
            seconds.append(r.seconds + time.perf_counter() - t0)  # read (measured) + content addressing
            shared += r.shared
        t0 = time.perf_counter()
        merged = FragmentSet(fragments)  # what replicas converge to; identical thinker states count once
        unique = list({f.digest: f for f in fragments}.values())  # thinker order, duplicates dropped
        if self.order is not None and len(unique) != len(fragments):
            raise ValueError("order names every thinker, but some thinkers produced identical states")
        state = self._render.render(unique if self.render == "bag" else merged)
        ordered = self._render.order(unique)  # the same order render() used (orders are pure)
        render_s = time.perf_counter() - t0
        reply = receiver.answer(question, message=state, max_new_tokens=self.max_new_tokens)
        slots = [next(i for i, f in enumerate(fragments) if f.digest == o.digest) for o in ordered]
        return Outcome(self.name, reply.text, sum(len(f.state.to_bytes()) for f in merged), reply.context,
                       tuple(seconds), reply.seconds + render_s,
                       {"message_rows": len(state), "slots": slots, "digest": state.digest(),
                        "fragments": len(merged), "render_s": render_s, "shared_reads": shared},
                       tuple(((0, len(d)),) for d in documents))

"""LatentMAS's own multi-agent form: a sequential chain of full KV, one growing cache.

Agent 1 reads its document and thinks G latent steps; agent i reads its document as a new turn after
agent i-1's whole state (`Agent.extend`) and thinks on; the receiver answers after the last agent's
state. Every agent attends to everything before it, so the agents cannot run in parallel: the
critical path is the sum of the hops (reported as one "sender"). The wire carries each hop's whole
cache to the next agent and the last one to the receiver: `message_bytes` is the sum of those states.

Fields as `fullkv` (G, latent mode, regime: with `query_aware` each agent reads the question after
its document, as LatentMAS's agents do). The first hop is the same read as a full-KV sender's, so
inside `shared_reads()` it is shared with full KV of the same G and regime.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..agent import Agent
from ..clock import now
from .base import Outcome, register
from .fullkv import FullKV


@register
@dataclass
class LatentMASSequential(FullKV):
    """Full KV as one growing cache: each agent reads its document after the previous agent's whole state and
    the last state goes to the receiver. Key parameters as `fullkv`: `latent_steps`, `latent_mode`, `query_aware`."""
    name = "latentmas_sequential"

    def run(self, senders: Sequence[Agent], documents: Sequence[str], receiver: Agent, question: str) -> Outcome:
        pairs = self._pair(senders, documents)
        first = self.sender_read(pairs[0][0], pairs[0][1], question)
        state, seconds, nbytes, hops = first.state, first.seconds, 0, [len(first.state)]
        for sender, doc in pairs[1:]:
            nbytes += len(state.to_bytes())  # the growing cache travels to the next agent
            t0 = now(sender.device)
            turn = self.sender_prompt(doc, question)  # the same read as a full-KV sender's, regime included
            state = sender.think(sender.extend(state, turn), self.latent_steps, self.latent_mode)
            seconds += now(sender.device) - t0
            hops.append(len(state))
        nbytes += len(state.to_bytes())  # the last agent's state travels to the receiver
        reply = receiver.answer(question, message=state, max_new_tokens=self.max_new_tokens)
        return Outcome(self.name, reply.text, nbytes, reply.context, (seconds,), reply.seconds,
                       {"message_rows": len(state), "rows_after_hop": hops, "latent_steps": self.latent_steps,
                        "shared_reads": int(first.shared)}, tuple(((0, len(d)),) for d in documents))

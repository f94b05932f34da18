"""No message: the receiver answers from its own prompt. The floor every protocol must beat."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..agent import Agent
from .base import after_first, Outcome, Protocol, register


@register
@dataclass
class Alone(Protocol):
    """Sends nothing: the receiver answers the question alone. Key parameter: `max_new_tokens`."""
    name = "alone"

    def run(self, senders: Sequence[Agent], documents: Sequence[str], receiver: Agent, question: str) -> Outcome:
        reply = receiver.answer(question, max_new_tokens=self.max_new_tokens)
        return Outcome(self.name, reply.text, 0, reply.context, (), reply.seconds, read_seconds=(),
                       after_first=after_first(reply))

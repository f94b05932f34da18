"""Full context: no communication protocol at all — one agent reads every sender's document itself.

The ceiling a protocol is measured against (the "single agent seeing everything" of the merge experiments and the
"full context" reference of the CacheBack experiments): the receiver prefills all documents as text,
in sender order, with the question after them. Nothing is selected, so evidence recall is 1 and the
"message" is the documents' UTF-8 bytes. Limited by the receiver's window (ContextOverflowError).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..agent import Agent
from .base import after_first, Outcome, Protocol, register

CONTEXT_PROMPT = "Read these documents.\n\n{documents}\n\nQuestion: {question}\nAnswer briefly."


@register
@dataclass
class FullContext(Protocol):
    """Sends the documents themselves: the receiver reads every document as text, then the question.
    Key parameter: `max_new_tokens`."""
    name = "fullcontext"

    def run(self, senders: Sequence[Agent], documents: Sequence[str], receiver: Agent, question: str) -> Outcome:
        self._pair(senders, documents)
        joined = "\n\n".join(f"Document {i + 1}:\n{doc}" for i, doc in enumerate(documents))
        reply = receiver.answer(CONTEXT_PROMPT.format(documents=joined, question=question),
                                max_new_tokens=self.max_new_tokens)
        return Outcome(self.name, reply.text, len(joined.encode()), reply.context, (), reply.seconds,
                       kept_spans=tuple(((0, len(doc)),) for doc in documents), after_first=after_first(reply),
                       read_seconds=())  # nothing is read before the question: every second follows it

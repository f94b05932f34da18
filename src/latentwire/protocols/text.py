"""Text (T2T): each sender decodes a report for the receiver's question; the receiver reads the reports.

Decoding the report is on the critical path: it is counted in the sender's time.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..agent import Agent
from .base import Outcome, Protocol, register, timed

REPORT_PROMPT = ("Read this document.\n\n{document}\n\nQuote the one sentence of the document that best answers: "
                 "{question}")


@register
@dataclass
class Text(Protocol):
    name = "text"
    max_report_tokens: int = 64

    def __post_init__(self):
        super().__post_init__()
        if self.max_report_tokens < 1:
            raise ValueError(f"max_report_tokens must be ≥ 1, got {self.max_report_tokens}")

    def run(self, senders: Sequence[Agent], documents: Sequence[str], receiver: Agent, question: str) -> Outcome:
        reports, seconds = [], []
        for sender, doc in self._pair(senders, documents):
            rep, dt = timed(sender.answer, REPORT_PROMPT.format(document=doc, question=question),
                            max_new_tokens=self.max_report_tokens)
            reports.append(rep.text)
            seconds.append(dt)
        message = "\n".join(reports)
        reply = receiver.answer(question, message=message, max_new_tokens=self.max_new_tokens)
        return Outcome(self.name, reply.text, len(message.encode()), reply.context, tuple(seconds), reply.seconds,
                       {"reports": reports})

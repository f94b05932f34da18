"""Text (T2T): each sender decodes a report for the receiver's question; the receiver reads the reports.

Decoding the report is on the critical path: it is counted in the sender's time. Inside `shared_reads()`
(the benchmark runner's episodes) one decode per (sender, prompt) serves every budget it covers, each charged
the time its own capped decode takes (`reads.report`).

`ratio=r` is text at the same message size as CacheBack at r: each report may use as many tokens as
CacheBack would send rows for that document, ceil(T / r) with T the sender's prompt tokens for it
(SENDER_PROMPT, the state CacheBack selects from, latent rows aside); `max_report_tokens` is then unused.

`read="held"` is the text sender of an agent that already holds its document: it read SENDER_PROMPT before the
question (the same read CacheBack's senders start from, shared with them), and at question time prefills only
the question's turn onto that state (`Agent.answer_after`) and decodes. Its `read_seconds` give the
question-time TTEOA; over held reads (`HeldReads`) a follow-up question pays no read at all.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from ..agent import Agent
from ..clock import now
from ..errors import ConfigError, UnknownNameError
from ..select import fanin_budget
from .base import after_first, SENDER_PROMPT, Outcome, Protocol, register
from .reads import report, report_after

REPORT_PROMPTS = {  # what the sender is asked to write
    "quote": ("Read this document.\n\n{document}\n\nQuote the one sentence of the document that best answers: "
              "{question}"),
    "notes": "Read this document.\n\n{document}\n\nWrite down every fact from it that helps answer: {question}",
}
REPORT_PROMPT = REPORT_PROMPTS["quote"]
# The same asks, as a turn after a document the sender already holds (`read="held"`).
REPORT_TURNS = {
    "quote": "Quote the one sentence of the document above that best answers: {question}",
    "notes": "Write down every fact from the document above that helps answer: {question}",
}
READS = ("with_question", "held")


@register
@dataclass
class Text(Protocol):
    """Sends a text report per sender, decoded for the question. Key parameters: `report` ("quote" or "notes"),
    `max_report_tokens`, `ratio` (reports at CacheBack's message size), `read` ("with_question": the sender reads
    its document and the question in one prompt; "held": it read the document before, as CacheBack's senders
    do, and prefills only the question's turn onto that state)."""
    name = "text"
    max_report_tokens: int = 64
    ratio: float | None = None  # report budget ceil(T / ratio): text at CacheBack's message size
    report: str = "quote"  # "quote" (one sentence: retrieval) or "notes" (every useful fact: reasoning)
    read: str = "with_question"  # or "held": the document read before the question (question-time TTEOA)

    def __post_init__(self):
        super().__post_init__()
        if self.max_report_tokens < 1:
            raise ConfigError(f"max_report_tokens must be ≥ 1, got {self.max_report_tokens}")
        if self.ratio is not None and not (1 <= self.ratio < math.inf):  # NaN fails it too
            raise ConfigError(f"ratio must be a finite number ≥ 1, got {self.ratio}")
        if self.report not in REPORT_PROMPTS:
            raise UnknownNameError("report kind", self.report, REPORT_PROMPTS)
        if self.read not in READS:
            raise UnknownNameError("text read", self.read, READS)

    def report_budget(self, sender: Agent, document: str) -> int:
        if self.ratio is None:
            return self.max_report_tokens
        return fanin_budget(len(sender.chat_ids(SENDER_PROMPT.format(document=document))), self.ratio)  # as CacheBack

    def check_window(self, senders: Sequence[Agent], documents: Sequence[str], question: str) -> None:
        """ContextOverflowError, before any sender reads, unless each sender's report fits its window: its prompt
        (held: the document's read, then the question's turn) and the report's token budget."""
        for sender, doc in self._pair(senders, documents):
            if self.read == "held":
                sender.check_window(document=len(sender.chat_ids(SENDER_PROMPT.format(document=doc))),
                                    prompt=len(sender.turn_ids(REPORT_TURNS[self.report].format(question=question))),
                                    max_new_tokens=self.report_budget(sender, doc))
            else:
                prompt = REPORT_PROMPTS[self.report].format(document=doc, question=question)
                sender.check_window(prompt=len(sender.chat_ids(prompt)), max_new_tokens=self.report_budget(sender, doc))

    def run(self, senders: Sequence[Agent], documents: Sequence[str], receiver: Agent, question: str) -> Outcome:
        self.check_window(senders, documents, question)
        reports, seconds, budgets, used, shared, reads = [], [], [], [], [], []
        for sender, doc in self._pair(senders, documents):
            t0 = now(sender.device)
            budgets.append(self.report_budget(sender, doc))
            budget_s = now(sender.device) - t0
            if self.read == "held":
                (rep, was_shared), r = report_after(sender, SENDER_PROMPT.format(document=doc),
                                                    REPORT_TURNS[self.report].format(question=question), budgets[-1])
                reads.append(r.seconds)
            else:
                rep, was_shared = report(sender, REPORT_PROMPTS[self.report].format(document=doc, question=question),
                                         budgets[-1])
            # a shared decode is charged what this cap's decode takes; a held read what the read took (0 if held)
            seconds.append(budget_s + rep.seconds + (reads[-1] if reads else 0.0))
            reports.append(rep.text)
            used.append(len(rep.token_ids))
            shared.append(was_shared)
        message = "\n".join(reports)
        reply = receiver.answer(question, message=message, max_new_tokens=self.max_new_tokens)
        return Outcome(self.name, reply.text, len(message.encode()), reply.context, tuple(seconds), reply.seconds,
                       {"reports": reports, "report_budgets": budgets, "report_tokens": used,
                        "shared_reports": shared}, after_first=after_first(reply),
                       read_seconds=tuple(reads) if self.read == "held" else None)

"""Window checks of a staged fan-in (`CacheBack` and its kin), made before any sender reads: each sender's read fits
its window, and the largest message the budgets allow fits the receiver's with its prompt and answer."""
from __future__ import annotations

from typing import Sequence

from ..agent import Agent
from ..errors import ContextOverflowError
from .base import sender_prompt_lengths


class FanInWindow:
    """Mixin for a protocol with `sender_prompt`, `latent_steps`, `max_new_tokens` and the `budget`, `units` and
    `encoding` stages."""

    def check_senders(self, senders: Sequence[Agent], documents: Sequence[str], question: str) -> list[int]:
        """Each sender's prompt length, checked against its window before any sender reads."""
        pairs = self._pair(senders, documents)
        return sender_prompt_lengths([s for s, _ in pairs], [self.sender_prompt(d, question) for _, d in pairs],
                                     self.latent_steps)

    def check_window(self, senders: Sequence[Agent], documents: Sequence[str], receiver: Agent, question: str) -> None:
        """ContextOverflowError, before any sender reads, unless every sender's read and the largest message the
        budgets allow fit (per sender `_max_rows` + its first row + G latent rows, then the receiver's prompt and
        answer; the encoding's own checks, e.g. a sender's re-read of its rows, too)."""
        prompts = self.check_senders(senders, documents, question)
        for i, (sender, prompt) in enumerate(zip(senders, prompts)):
            self.check_reread(sender, f"sender {i}", prompt, question)
        self.check_receiver_window(prompts, receiver, question)

    def check_reread(self, sender: Agent, label: str, prompt: int, question: str) -> None:
        """The encoding's check of a sender's re-read of its largest message (kv_reencoded), before it reads."""
        self.encoding.check_reread(sender, label, self._max_rows(prompt) + 1 + self.latent_steps, question)

    def _max_rows(self, prompt: int) -> int:
        """The most document rows a sender whose prompt has `prompt` rows may send."""
        return min(self.units.most(self.budget.cap(prompt + self.latent_steps)), prompt - 1)

    def check_receiver_window(self, prompts: Sequence[int], receiver: Agent, question: str) -> None:
        """The receiver's half of `check_window`, from the senders' prompt lengths (`check_senders`): what a
        transport checks on the receiver's node before any sender's node reads."""
        self.encoding.check_receiver(receiver)
        parts = {"budget_rows": sum(self._max_rows(p) for p in prompts), "first_rows": len(prompts),
                 "latent_rows": len(prompts) * self.latent_steps,
                 "prompt": self.encoding.prompt_rows(receiver, question), "max_new_tokens": self.max_new_tokens}
        if sum(parts.values()) > receiver.context_window:
            raise ContextOverflowError(sum(parts.values()), receiver.context_window, parts)

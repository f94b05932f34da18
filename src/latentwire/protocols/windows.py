"""Window checks of a staged fan-in (`CacheBack` and its kin), made before any sender reads: each sender's read fits
its window, and the largest message the budgets allow fits the receiver's with its prompt and answer."""
from __future__ import annotations

from typing import Sequence

from ..agent import Agent
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
        self.encoding.check_pair(senders, receiver)  # a latent map or translator of another pair: refused first
        prompts = self.check_senders(senders, documents, question)
        for i, (sender, prompt) in enumerate(zip(senders, prompts)):
            self.check_reread(sender, f"sender {i}", prompt, question)
        self.check_receiver_window(prompts, receiver, question, [s.model_name for s in senders])

    def check_reread(self, sender: Agent, label: str, prompt: int, question: str) -> None:
        """The encoding's check of a sender's re-read of its largest message (kv_reencoded), before it reads."""
        self.encoding.check_reread(sender, label, self._max_rows(prompt) + 1 + self.latent_steps, question)

    def _max_rows(self, prompt: int) -> int:
        """The most document rows a sender whose prompt has `prompt` rows may send."""
        return min(self.units.most(self.budget.cap(prompt + self.latent_steps)), prompt - 1)

    def check_receiver_window(self, prompts: Sequence[int], receiver: Agent, question: str,
                              senders: Sequence[str] = ()) -> None:
        """The receiver's half of `check_window`, from the senders' prompt lengths (`check_senders`; `senders`: their
        model names): what a transport checks on the receiver's node before any sender's node reads."""
        self.encoding.check_receiver(receiver)
        self.encoding.check_receiver_window(self, prompts, receiver, question, senders)

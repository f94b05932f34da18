"""A protocol moves what M senders learned from their private documents to one receiver.

One file per protocol; each is a dataclass whose fields are its hyper-parameters (validated in
`__post_init__`) with one required method, `run`. `PROTOCOLS` (a `Registry`) holds them by name.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar, Sequence

from ..agent import Agent
from ..clock import now
from ..errors import ConfigError, ContextOverflowError
from ..registry import Registry

SENDER_PROMPT = "Read this document.\n\n{document}"
QUESTION_SUFFIX = "\n\nQuestion: {question}"


LINK_GBIT_S = 1.0  # the declared link of question-time TTEOA with transfer; study pages also show 0.1 and 10
LINKS_GBIT_S = (None, 0.1, 1.0, 10.0)  # None: one process, nothing moves


def transfer_seconds(nbytes: int, gbit_per_s: float | None = LINK_GBIT_S) -> float:
    """Seconds to move `nbytes` over a link of `gbit_per_s` (10⁹ bits a second; None: one process, 0 s)."""
    if gbit_per_s is None:
        return 0.0
    if not gbit_per_s > 0:
        raise ConfigError(f"a link speed is > 0 Gbit/s (or None: one process), got {gbit_per_s!r}")
    return 8.0 * nbytes / (gbit_per_s * 1e9)


@dataclass(frozen=True)
class Outcome:
    protocol: str
    answer: str
    message_bytes: int  # what crossed the wire, summed over senders
    receiver_context: int  # rows in the receiver's context at the end of its answer
    sender_seconds: tuple[float, ...]  # each sender's own compute (prefill, latent steps, report decoding)
    receiver_seconds: float  # receiver prefill + decode
    details: dict = field(default_factory=dict)
    # Per sender, the character spans of its document whose positions the message carries (evidence
    # recall and compression ratio derive from them); None where it does not apply (text).
    kept_spans: tuple[tuple[tuple[int, int], ...], ...] | None = None
    # Per sender, the part of its seconds spent reading its document before any question (a query-blind prefill +
    # latent steps): what an agent that already holds its document has done. () for no senders; None where the
    # protocol's senders read their documents with the question (text reports unless read="held", query-aware reads).
    read_seconds: tuple[float, ...] | None = None
    # Receiver seconds spent decoding after its first answer token was chosen: the answer's length. None = not
    # recorded. TTEOA − this = time to first token (`ttft`), which compares protocols whose answers differ in length.
    after_first: float | None = None

    @property
    def tteoa(self) -> float:
        """Time to end of answer with senders running in parallel: slowest sender, then the receiver (cold: every
        sender's read included)."""
        return max(self.sender_seconds, default=0.0) + self.receiver_seconds

    @property
    def ttft(self) -> float | None:
        """Time to the receiver's first answer token (cold, as `tteoa`): TTEOA without the decode after it."""
        return None if self.after_first is None else self.tteoa - self.after_first

    @property
    def question_tteoa(self) -> float | None:
        """TTEOA from the question's arrival, for agents that already hold their read documents: each sender's
        seconds without its read, slowest first, then the receiver. None where reads are not separable."""
        if self.read_seconds is None:
            return None
        return max((s - r for s, r in zip(self.sender_seconds, self.read_seconds)), default=0.0) + self.receiver_seconds

    def moved_tteoa(self, gbit_per_s: float | None = LINK_GBIT_S) -> float | None:
        """Question-time TTEOA with the message moved over a link of `gbit_per_s` (None: one process, nothing
        moves): every sender's bytes cross one link, one after another (`transfer_seconds`)."""
        q = self.question_tteoa
        return None if q is None else q + transfer_seconds(self.message_bytes, gbit_per_s)


@dataclass
class Protocol(ABC):
    """How M senders' documents reach one receiver; subclasses add their parameters as fields. Every protocol
    has `max_new_tokens` (the receiver's answer length)."""
    name: ClassVar[str]
    max_new_tokens: int = 48  # receiver answer length

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be ≥ 1, got {self.max_new_tokens}")

    @abstractmethod
    def run(self, senders: Sequence[Agent], documents: Sequence[str], receiver: Agent, question: str) -> Outcome:
        """Each sender reads its document; the receiver answers `question` from what they send."""

    @staticmethod
    def _pair(senders: Sequence[Agent], documents: Sequence[str]) -> list[tuple[Agent, str]]:
        """(sender, document) pairs; ConfigError, before any compute, unless there is one document per sender
        and at least one of each."""
        if len(senders) != len(documents):
            raise ConfigError(f"{len(senders)} senders for {len(documents)} documents: give one document per sender")
        if not documents:
            raise ConfigError("no documents: a protocol needs at least one sender with its document")
        return list(zip(senders, documents))


def sender_prompt_lengths(senders: Sequence[Agent], prompts: Sequence[str], latent_steps: int) -> list[int]:
    """Each sender's chat-prompt length; ContextOverflowError (naming the sender and its model), before any
    sender reads, unless every prompt + G latent rows fits that sender's window."""
    lengths = []
    for i, (sender, prompt) in enumerate(zip(senders, prompts)):
        n = len(sender.chat_ids(prompt))
        if n + latent_steps > sender.context_window:
            raise ContextOverflowError(n + latent_steps, sender.context_window,
                                       {f"sender {i} ({sender.model_name}) prompt": n, "latent_steps": latent_steps})
        lengths.append(n)
    return lengths


def after_first(reply) -> float:
    """An `Answer`'s decode seconds after its first token was chosen (`Outcome.after_first`)."""
    return reply.decode_seconds - reply.token_seconds[0] if reply.token_seconds else 0.0


def timed(devices, fn, *args, **kw):
    """(fn(*args, **kw), its seconds), the work it queued on `devices` (one device, or several) included
    (`clock.now`)."""
    devices = tuple(devices) if isinstance(devices, (tuple, list, set)) else (devices,)
    t0 = now(*devices)
    out = fn(*args, **kw)
    return out, now(*devices) - t0


PROTOCOLS = Registry("protocol")
register = PROTOCOLS.register


def get_protocol(name: str, **params) -> Protocol:
    """A protocol by name with its hyper-parameters, ready to `run`:

        get_protocol("cacheback", ratio=8)

    `PROTOCOLS.names()` lists the names. An unknown name raises UnknownNameError listing them, a
    misspelt parameter UnknownParameterError listing the protocol's fields, a bad value ConfigError.
    """
    return PROTOCOLS.create(name, **params)

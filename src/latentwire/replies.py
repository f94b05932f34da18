"""What an agent's calls give back: a `CallRecord` per call, a greedy `Answer` with its timing, and an open `Stream`
(a decode that several agents can step with the same tokens, for output-level fusion)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicCache


@dataclass(frozen=True)
class CallRecord:
    op: str  # "prefill" | "think" | "answer" | "stream"
    seconds: float
    rows_in: int  # rows this call ran through the model (prompt tokens, message rows, latent steps)
    tokens_out: int  # tokens generated
    context: int  # rows in the model's cache when the call ended


@dataclass(frozen=True)
class Answer:
    text: str
    token_ids: tuple[int, ...]
    prompt_tokens: int  # the receiver's own prompt tokens
    message_rows: int  # context rows contributed by the message (KV rows, re-prefilled rows or text tokens)
    context: int  # receiver context at the end: message + prompt + generated
    prefill_seconds: float
    decode_seconds: float
    # seconds into the decode when each token was chosen, then (if a stop token ended it) when the stop was
    token_seconds: tuple[float, ...] = ()
    turn_ended: bool = False  # what stopped it was a templateless model beginning the next turn (`turn_begun`)

    @property
    def seconds(self) -> float:
        return self.prefill_seconds + self.decode_seconds

    @property
    def stopped(self) -> bool:
        """True when a stop token (or a templateless model's next-turn marker, `Agent.turn_marker`) ended the answer,
        not `max_new_tokens`."""
        return len(self.token_seconds) == len(self.token_ids) + 1

    def truncated(self, max_new_tokens: int, tokenizer, turn: str | None = None) -> "Answer | None":
        """This greedy answer as a decode capped at `max_new_tokens` would have produced it — the same tokens,
        charged the decode time up to the choice that ended it — or None when this decode stopped at its own
        cap before reaching that one (its continuation is unknown). `turn`: as `answer_text`."""
        n = len(self.token_ids)
        if max_new_tokens > n and not self.stopped:
            return None
        k = min(n, max_new_tokens)
        stopped = k == n and self.stopped
        marks = self.token_seconds[:k + 1] if stopped else self.token_seconds[:k]
        ids = self.token_ids[:k]
        by_token = stopped and not self.turn_ended
        return Answer(answer_text(tokenizer, ids, None if by_token else turn), ids, self.prompt_tokens,
                      self.message_rows, self.context - n + k, self.prefill_seconds, marks[-1] if marks else 0.0,
                      marks, stopped and self.turn_ended)  # a cap of 0 chooses nothing: no decode time


TURN_TAIL = 16  # tokens: a marker completed by the newest token lies within the last few


def turn_starts(text: str, turn: str) -> bool:
    """Whether decoded `text` has begun a new `turn` of a plain transcript (`Agent.turn_marker`, e.g. "User:"): the
    marker at the start of a line, or as the answer's first word."""
    return f"\n{turn}" in text or text.lstrip().startswith(turn)


def turn_begun(tokenizer, ids: list[int], turn: str) -> bool:
    """`turn_starts` for a greedy decode checked after each token (`ids`, the newest last): a marker that was not
    there a token ago ends within the newest token, so past the first TURN_TAIL tokens only the tail is decoded
    (decoding the whole answer at every step would be quadratic in its length)."""
    if len(ids) <= TURN_TAIL:
        return turn_starts(tokenizer.decode(ids, skip_special_tokens=True), turn)
    return f"\n{turn}" in tokenizer.decode(ids[-TURN_TAIL:], skip_special_tokens=True)


def answer_text(tokenizer, ids, turn: str | None = None) -> str:
    """The text of answer tokens `ids` (special tokens skipped, stripped). With `turn` (a templateless model's
    transcript marker, "User:"), a decode stopped as the marker completed still holds the marker's first tokens
    ("Lisbon\n\nUser" before the ":" that stopped it): a last line that is the start of the marker is dropped
    (as is an answer that is only its first word), so the answer reads "Lisbon". Callers pass `turn` for a decode
    the marker stopped or its cap cut (a cut "\n\nUs" most likely began the marker), not for one a stop token
    ended: its last line "U" is the model's answer."""
    text = tokenizer.decode(list(ids), skip_special_tokens=True)
    if turn:
        head, newline, last = text.rpartition("\n")
        if newline and last.strip() and turn.startswith(last.strip()):
            text = head
        elif text.strip() == turn.rstrip(":"):
            text = ""
    return text.strip()


@dataclass
class Stream:
    """An open greedy decode over one prompt: the cache, the next position and the next-token log-probs.

    `Agent.stream(prompt)` opens one; `push(token)` appends a token. Output-level fusion (PackLLM)
    steps several streams with the same tokens.
    """
    agent: object  # the Agent that opened it (not imported: agent.py imports this module)
    cache: DynamicCache
    position: int
    logprobs: torch.Tensor  # (V,) float32: log-probabilities of the next token
    prompt_nll: torch.Tensor  # (n - 1,) negative log-likelihood of each prompt token after the first

    @torch.inference_mode()
    def push(self, token: int) -> None:
        hidden = self.agent._forward(self.cache, self.position, ids=self.agent.ids([token]))[-1]
        self.position += 1
        self.logprobs = torch.log_softmax(self.agent.logits(hidden).float(), dim=-1)

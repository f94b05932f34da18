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

    @property
    def seconds(self) -> float:
        return self.prefill_seconds + self.decode_seconds

    @property
    def stopped(self) -> bool:
        """True when a stop token ended the answer (not `max_new_tokens`)."""
        return len(self.token_seconds) == len(self.token_ids) + 1

    def truncated(self, max_new_tokens: int, tokenizer) -> "Answer | None":
        """This greedy answer as a decode capped at `max_new_tokens` would have produced it — the same tokens,
        charged the decode time up to the choice that ended it — or None when this decode stopped at its own
        cap before reaching that one (its continuation is unknown)."""
        n = len(self.token_ids)
        if max_new_tokens > n and not self.stopped:
            return None
        k = min(n, max_new_tokens)
        marks = self.token_seconds[:k + 1] if k == n and self.stopped else self.token_seconds[:k]
        ids = self.token_ids[:k]
        return Answer(tokenizer.decode(list(ids), skip_special_tokens=True).strip(), ids, self.prompt_tokens,
                      self.message_rows, self.context - n + k, self.prefill_seconds, marks[-1] if marks else 0.0,
                      marks)  # a cap of 0 chooses nothing: no decode time


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

"""StreamingLLM: attention sinks plus the most recent rows; receiver-agnostic, needs no model call.

Under the CacheBack protocol only document rows compete for the budget and row 0 is always kept, so
the first `sinks` rows (template tokens) do not compete: the baseline there is recency over the document.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..agent import Agent
from ..state import KVState
from .base import Selector, register
from ..errors import ConfigError


@register
@dataclass
class StreamingLLMSelector(Selector):
    name = "streaming_llm"
    sinks: int = 4  # first rows always favoured (attention sinks)

    def __post_init__(self):
        if self.sinks < 0:
            raise ConfigError(f"sinks must be ≥ 0, got {self.sinks}")

    def score(self, agent: Agent, state: KVState, query: str) -> torch.Tensor:
        T = len(state)
        scores = torch.arange(T, dtype=torch.float64, device=state.device) / max(T, 1)  # recency
        scores[: self.sinks] = 2.0
        return scores

"""Random scores: the floor. Seeded by the seed field and the state's content, so runs repeat exactly."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from ..agent import Agent
from ..state import KVState
from .base import Selector, register


@register
@dataclass
class RandomSelector(Selector):
    name = "random"
    seed: int = 0

    def score(self, agent: Agent, state: KVState, query: str) -> torch.Tensor:
        h = hashlib.sha256(state.token_ids.cpu().numpy().tobytes() + str(self.seed).encode()).digest()
        # Drawn on torch's default (host) generator, then moved: the same scores on every device
        # (a CUDA generator draws other numbers, and a host generator cannot fill a CUDA tensor).
        gen = torch.Generator().manual_seed(int.from_bytes(h[:8], "little") & (2**63 - 1))
        return torch.rand(len(state), generator=gen, dtype=torch.float64, device=gen.device).to(state.device)

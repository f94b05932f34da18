"""What one agent can hand another, besides plain text and a whole KVState.

`Rows` are continuous input-embedding rows (CacheBack's representation map): the receiver
re-prefills them inside a slot of its chat template, which re-derives their positions and KV.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import StateFormatError


@dataclass(frozen=True, eq=False)
class Rows:
    embeds: torch.Tensor  # (n, hidden), in the receiver's input-embedding space (Gemma: already × √d)
    token_ids: torch.Tensor  # (n,) int64: the source token of each row, -1 for a latent row

    def __post_init__(self):
        if self.embeds.dim() != 2 or self.token_ids.shape != (self.embeds.shape[0],):
            raise StateFormatError(f"rows: embeds (n, hidden) and token_ids (n,) disagree: "
                                   f"{tuple(self.embeds.shape)} vs {tuple(self.token_ids.shape)}")

    def __len__(self) -> int:
        return self.embeds.shape[0]

    @property
    def nbytes(self) -> int:
        """Bytes of the continuous encoding (one hidden-size row per position)."""
        return self.embeds.numel() * self.embeds.element_size()

    @property
    def token_id_nbytes(self) -> int:
        """Bytes of the token-id encoding: int32 ids for source rows, full rows only for latent rows."""
        latent = int((self.token_ids == -1).sum())
        return 4 * (len(self) - latent) + latent * self.embeds.shape[1] * self.embeds.element_size()

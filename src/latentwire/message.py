"""What one agent can hand another, besides plain text and a whole KVState.

`Rows` are continuous input-embedding rows (CacheBack's representation map): the receiver
re-prefills them inside a slot of its chat template, which re-derives their positions and KV.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import GeometryMismatchError, StateFormatError


@dataclass(frozen=True, eq=False)
class Rows:
    embeds: torch.Tensor  # (n, hidden), in the receiver's input-embedding space (Gemma: already × √d)
    token_ids: torch.Tensor  # (n,) int64: the source token of each row, -1 for a latent row
    # Whose input-embedding space and vocabulary the rows live in: (model, tokenizer fingerprint), as in
    # the sender's Geometry. None = unknown (hand-built rows); a receiver then checks the width only.
    space: tuple[str, str] | None = None

    def __post_init__(self):
        if self.embeds.dim() != 2 or self.token_ids.shape != (self.embeds.shape[0],):
            raise StateFormatError(f"rows: embeds (n, hidden) and token_ids (n,) disagree: "
                                   f"{tuple(self.embeds.shape)} vs {tuple(self.token_ids.shape)}")

    def __len__(self) -> int:
        return self.embeds.shape[0]

    def check_space(self, model: str, tokenizer: str) -> None:
        """GeometryMismatchError unless the rows were made by this model and tokenizer (or are unlabelled)."""
        if self.space is not None and tuple(self.space) != (model, tokenizer):
            raise GeometryMismatchError(
                f"rows were embedded by {self.space[0]} (tokenizer {self.space[1][:12]}), this receiver is {model} "
                f"(tokenizer {tokenizer[:12]}): input embeddings and token ids do not transfer between models")

    @staticmethod
    def cat(parts: "list[Rows]") -> "Rows":
        """Concatenate messages of one space (a fan-in receiver's rows, sender after sender)."""
        spaces = {p.space for p in parts} - {None}
        if len(spaces) > 1:
            raise GeometryMismatchError(f"rows from different models cannot share a message: {sorted(spaces)}")
        return Rows(torch.cat([p.embeds for p in parts]), torch.cat([p.token_ids for p in parts]),
                    spaces.pop() if spaces else None)

    @property
    def nbytes(self) -> int:
        """Bytes of the continuous encoding (one hidden-size row per position)."""
        return self.embeds.numel() * self.embeds.element_size()

    @property
    def token_id_nbytes(self) -> int:
        """Bytes of the token-id encoding: int32 ids for source rows, full rows only for latent rows."""
        latent = int((self.token_ids == -1).sum())
        return 4 * (len(self) - latent) + latent * self.embeds.shape[1] * self.embeds.element_size()

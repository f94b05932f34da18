"""What one agent can hand another, besides plain text and a whole KVState.

`Rows` are continuous input-embedding rows (CacheBack's representation map): the receiver
re-prefills them inside a slot of its chat template, which re-derives their positions and KV.
`Spans` are the character spans of a sender's document that its selected rows cover, sent as their
text (cross-model CacheBack): a receiver of any model tokenises the text itself.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import ConfigError, GeometryMismatchError, StateFormatError


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
        if not parts:
            raise ConfigError("Rows.cat needs at least one message")
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


SEPARATOR = "\n…\n"  # between two spans of one document that do not touch: marks the text left out


def merge_spans(spans) -> tuple[tuple[int, int], ...]:
    """Character spans [a, b) in document order, overlapping or adjacent ones merged, empty ones dropped."""
    out: list[tuple[int, int]] = []
    for a, b in sorted((int(a), int(b)) for a, b in spans):
        if a >= b:
            continue
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return tuple(out)


@dataclass(frozen=True, eq=False)
class Spans:
    """Spans of one sender's document, as their exact text (`SEPARATOR` between two spans), plus optionally
    the sender's latent rows. Build one with `Spans.of(document, spans)`; `text` is checked against `spans`
    (lengths and separators), so a message cannot claim spans its text does not hold."""

    text: str  # the spans' characters in document order, SEPARATOR between consecutive spans
    spans: tuple[tuple[int, int], ...]  # (k, 2): [start, end) in the document, increasing, never touching
    document: int = 0  # which document (the sender's index among the senders)
    space: tuple[str, str] | None = None  # the sender's (model, tokenizer): the latents live in its input space
    latents: torch.Tensor | None = None  # (G, d_sender) latent rows as `Agent.rows` gives them; None: text only

    def __post_init__(self):
        try:
            spans = tuple((int(a), int(b)) for a, b in self.spans)
        except (TypeError, ValueError) as e:
            raise StateFormatError(f"spans: want (start, end) pairs of integers ({e})") from None
        object.__setattr__(self, "spans", spans)
        if not isinstance(self.text, str):
            raise StateFormatError(f"spans: text must be a str, got {type(self.text).__name__}")
        if type(self.document) is not int or self.document < 0:
            raise StateFormatError(f"spans: document must be an integer ≥ 0, got {self.document!r}")
        prev = -1
        for a, b in spans:
            if not prev < a < b:  # the first from 0; each after the previous one's end, with a gap
                raise StateFormatError(f"spans: want non-empty [start, end) spans in increasing order that neither "
                                       f"overlap nor touch, got {spans[:8]}")
            prev = b
        want = sum(b - a for a, b in spans) + max(len(spans) - 1, 0) * len(SEPARATOR)
        if len(self.text) != want:
            raise StateFormatError(f"spans: text has {len(self.text)} characters, the spans and separators "
                                   f"{want}")
        at = 0
        for a, b in spans[:-1]:
            at += b - a
            if self.text[at:at + len(SEPARATOR)] != SEPARATOR:
                raise StateFormatError(f"spans: no separator {SEPARATOR!r} at character {at} of the text")
            at += len(SEPARATOR)
        if self.latents is not None and (self.latents.dim() != 2 or not self.latents.is_floating_point()):
            raise StateFormatError(f"spans: latents must be (G, hidden) floating point, got "
                                   f"{tuple(self.latents.shape)} {self.latents.dtype}")

    @classmethod
    def of(cls, document: str, spans, index: int = 0, space: tuple[str, str] | None = None,
           latents: torch.Tensor | None = None) -> "Spans":
        """The message for these character spans of `document` (merged when they overlap or touch)."""
        merged = merge_spans(spans)
        if merged and merged[-1][1] > len(document):
            raise StateFormatError(f"spans: span {merged[-1]} ends past the document ({len(document)} characters)")
        return cls(SEPARATOR.join(document[a:b] for a, b in merged), merged, index, space, latents)

    def pieces(self) -> list[str]:
        """The text of each span (the text without its separators)."""
        out, at = [], 0
        for a, b in self.spans:
            out.append(self.text[at:at + b - a])
            at += b - a + len(SEPARATOR)
        return out

    @property
    def nbytes(self) -> int:
        """Bytes of the content: the UTF-8 text plus the latent rows (the span table is metadata, as a
        `Rows`' token ids are)."""
        lat = 0 if self.latents is None else self.latents.numel() * self.latents.element_size()
        return len(self.text.encode("utf-8")) + lat

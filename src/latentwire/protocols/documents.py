"""Where a document sits in a sender's state: per row, the character span of the document it covers (template,
question and latent rows: None), and back from selected rows to document spans. CacheBack, its chain and
cross-model variants, and retrieval all map rows to text through these."""
from __future__ import annotations

import torch

from ..agent import Agent
from ..errors import TaskFormatError
from .base import SENDER_PROMPT


def document_rows(sender: Agent, document: str, n_rows: int, prompt: str | None = None
                  ) -> tuple[list[tuple[int, int] | None], torch.Tensor]:
    """Map a sender state's rows to its document: per prompt row the character span of `document` it
    covers (None for template and question rows), and an (n_rows,) bool mask of document rows (latent
    rows: False). `prompt`: what the sender read (default: SENDER_PROMPT around the document).

    Only document rows compete for the budget: template tokens would be wasted in a message the
    receiver re-prefills inside its own template.
    """
    prompt = SENDER_PROMPT.format(document=document) if prompt is None else prompt
    per_row = token_document_spans(sender, sender.chat_text(prompt), document)
    eligible = torch.zeros(n_rows, dtype=torch.bool, device=sender.device)  # with the sender's state
    eligible[: len(per_row)] = torch.tensor([span is not None for span in per_row], dtype=torch.bool,
                                            device=sender.device)
    return per_row, eligible


def token_document_spans(sender: Agent, text: str, document: str) -> list[tuple[int, int] | None]:
    """Per token of `text` (as the sender tokenises it): the character span of `document` it covers, or None."""
    offsets = sender.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    start = text.find(document)
    if start < 0:
        raise TaskFormatError("the chat template altered the document (e.g. trimmed its whitespace); "
                              "strip leading/trailing whitespace from the contexts")
    spans = []
    for a, b in offsets:
        a, b = max(a, start), min(b, start + len(document))
        spans.append((a - start, b - start) if a < b else None)
    return spans


def kept_document_spans(per_row: list, rows: torch.Tensor) -> tuple[tuple[int, int], ...]:
    return tuple(per_row[r] for r in rows.tolist() if r < len(per_row) and per_row[r] is not None)

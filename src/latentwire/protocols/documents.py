"""Where a document sits in a sender's state: per row, the character span of the document it covers (template,
question and latent rows: None), and back from selected rows to document spans. CacheBack, its chain and
cross-model variants, and retrieval all map rows to text through these."""
from __future__ import annotations

import torch

from ..agent import Agent
from ..errors import TaskFormatError
from ..message import merge_spans
from .base import SENDER_PROMPT

LEAD = SENDER_PROMPT.split("{document}")[0]  # "Read this document.\n\n": what every library prompt puts before it
_SENTINEL = "\ue000document\ue000"  # a private-use mark standing in for the document (checked to occur once)
_ALTERED = ("the chat template altered the document (e.g. trimmed its whitespace); "
            "strip leading/trailing whitespace from the contexts")


def document_rows(sender: Agent, document: str, n_rows: int, prompt: str | None = None
                  ) -> tuple[list[tuple[int, int] | None], torch.Tensor]:
    """Map a sender state's rows to its document: per prompt row the character span of `document` it
    covers (None for template and question rows), and an (n_rows,) bool mask of document rows (latent
    rows: False). `prompt`: what the sender read (default: SENDER_PROMPT around the document); the document is
    where the prompt places it (`chat_document`), never a copy of it in the template, instruction or question.

    Only document rows compete for the budget: template tokens would be wasted in a message the
    receiver re-prefills inside its own template.
    """
    prompt = SENDER_PROMPT.format(document=document) if prompt is None else prompt
    text, start = chat_document(sender, prompt, document)
    per_row = token_document_spans(sender, text, document, start)
    eligible = torch.zeros(n_rows, dtype=torch.bool, device=sender.device)  # with the sender's state
    eligible[: len(per_row)] = torch.tensor([span is not None for span in per_row], dtype=torch.bool,
                                            device=sender.device)
    return per_row, eligible


def document_offset(text: str, document: str) -> int:
    """Where `document` starts in `text` (a prompt, or its chat rendering): just after the first `LEAD` followed by
    it, where every prompt the library builds puts it (SENDER_PROMPT; + QUESTION_SUFFIX; a chain hop's notes, then
    SENDER_PROMPT), else at its one occurrence. Neither its first nor its last occurrence would do: the instruction
    before it may hold it ("Read this document." holds "document."), a question after it too. 0 for an empty
    document. TaskFormatError if `text` does not hold it, or holds it more than once with no `LEAD` before it."""
    if not document:
        return 0
    at = text.find(LEAD + document)
    if at >= 0:
        return at + len(LEAD)
    at = text.find(document)
    if at < 0:
        raise TaskFormatError(f"the prompt does not hold the document; or {_ALTERED}")
    if text.find(document, at + 1) >= 0:
        raise TaskFormatError(f"the document occurs more than once in its prompt: put {LEAD!r} right before it "
                              "to say which occurrence is the document")
    return at


def chat_document(sender: Agent, prompt: str, document: str) -> tuple[str, int]:
    """`sender.chat_text(prompt)` and where the document starts in it: the prompt is rendered again with a sentinel
    in the document's place (`document_offset` in the prompt), and the sentinel's offset is the document's, so
    nothing of the chat template (a system prompt that holds the document) is taken for it. TaskFormatError unless
    the rendered text holds the document there after the same text as the sentinel's rendering."""
    at = document_offset(prompt, document)
    text = sender.chat_text(prompt)
    marked = sender.chat_text(prompt[:at] + _SENTINEL + prompt[at + len(document):])
    start = marked.find(_SENTINEL)
    if marked.count(_SENTINEL) != 1 or text[:start] != marked[:start] or \
            text[start:start + len(document)] != document:
        raise TaskFormatError(_ALTERED)
    return text, start


def token_document_spans(sender: Agent, text: str, document: str, start: int | None = None
                         ) -> list[tuple[int, int] | None]:
    """Per token of `text` (as the sender tokenises it): the character span of `document` it covers, or None.
    `start`: where the document starts in `text` (`chat_document` finds it); None: `document_offset(text,
    document)`. TaskFormatError unless `text` holds the document there."""
    start = document_offset(text, document) if start is None else start
    if text[start:start + len(document)] != document:
        raise TaskFormatError(_ALTERED)
    offsets = sender.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    spans = []
    for a, b in offsets:
        a, b = max(a, start), min(b, start + len(document))
        spans.append((a - start, b - start) if a < b else None)
    return spans


def kept_document_spans(per_row: list, rows: torch.Tensor) -> tuple[tuple[int, int], ...]:
    return tuple(per_row[r] for r in rows.tolist() if r < len(per_row) and per_row[r] is not None)


def sent_spans(per_row: list, rows: torch.Tensor, document: str) -> tuple[tuple[int, int], ...]:
    """The `document` character spans that the selected `rows` cover (`per_row`: `document_rows`' spans), merged:
    selected rows with no text-bearing row between them form one span (the characters between them, which no
    token's offsets cover, are whitespace the tokenizer trimmed from its offsets, e.g. a newline or an
    indentation token: they are kept, never replaced by a separator), spans that overlap or touch are merged, and
    so are spans with only whitespace between them (a blank line between two selected lines of code: its rows
    belong to no sentence unit and are never selected, yet nothing was left out there)."""
    out: list[tuple[int, int]] = []
    prev = -2
    for r in sorted(set(rows.tolist())):
        span = per_row[r] if r < len(per_row) else None
        if span is None:  # template, question, latent or empty-offset (whitespace) row
            continue
        if out and all(per_row[k] is None for k in range(prev + 1, r)):  # the same run of text
            out[-1] = (out[-1][0], max(out[-1][1], span[1]))
        else:
            out.append(tuple(span))
        prev = r
    joined: list[tuple[int, int]] = []
    for a, b in merge_spans(out):
        if joined and not document[joined[-1][1]:a].strip():  # only whitespace left out between them
            joined[-1] = (joined[-1][0], b)
        else:
            joined.append((a, b))
    return tuple(joined)

"""Cross-model CacheBack: senders of one model select as CacheBack does, a receiver of another model reads it.

Each sender (model A) reads its document query-blind (prefill + G latent steps), scores its finished
state against the receiver's question and selects rows within B = ceil(T / r) exactly as `CacheBack`
(same read and score, units and budget stages). Rows of A do not transfer to a receiver of model B (other
embeddings, other vocabulary), so the selection travels by a cross-model encoding stage (stages/cross.py), named
by the flat keyword `delivery` as before:

    "spans"         spans(): the selected document rows become the exact character spans of the sender's document
                    they cover (`message.Spans`): rows that follow each other in the sender's prompt form
                    one span (so whitespace some tokenizers leave out of their offsets stays in), spans
                    that overlap or touch are merged, in document order, `SEPARATOR` ("\\n…\\n") between
                    two spans that do not touch. The first row (template) and the latent rows are
                    dropped. No training; any pair of models.
    "spans+latent"  spans_latent(latent_map=...): the same text, then the sender's G latent rows mapped into B's input-embedding space
                    by a `LatentMap` fitted for the pair (translate/latent_map.py, ridge in closed form),
                    each rescaled to B's mean token-embedding norm as `Agent.rows` does for a model's own
                    latent rows. A map of another pair, or of another latent mode, is refused.
    "translated"    translated(translator=...): the selected rows' K/V (first and latent rows included, as CacheBack sends them) go through
                    a trained dense-alignment translator of the pair (translate/dense_alignment.py), on the
                    sender: the message is a compact KV state in the receiver's geometry, which the receiver
                    attends to as a full-KV prefix (`Agent.answer(question, message=state)`), never re-prefills.
                    Dense alignment maps each row on its own, so translating the selection equals selecting
                    from the translated state (test). XKV, LCF-X and C2C write residuals into the receiver's
                    own cache of the same text, which this receiver never reads: refused. Neither trained
                    mode matches this use (training saw a sender's whole query-aware prompt, contiguous and
                    without latent rows, followed by the receiver's own read of its document; here a sparse
                    query-blind selection with latent rows is followed by the question alone, the translated
                    first row standing in for the receiver's own first row); context-unaware is the nearer one,
                    so a translator trained context-aware is refused (ContextModeError).

The receiver builds one `Rows` in its own space (`receiver_rows`): per sender, in sender order, the
spans' text as its own tokenizer splits it, then that sender's mapped latent rows; senders separated by
"\\n\\n". The rows are re-prefilled in its template slot (`Agent.answer(question, message=rows)`), so both
deliveries take one path and "spans+latent" with G = 0 is "spans" exactly. Overflowing the receiver's
window raises MessageOverflowError (a ContextOverflowError naming the senders' and the receiver's
models) before the receiver computes anything.

Bytes: each message's UTF-8 text plus its latent rows (`Spans.nbytes`); on the wire a `Spans` is the
"spans" / "spans_latent" encoding (wire/format.py, version 2). "translated": the K/V bytes of the
translated states (`KVState.nbytes`), the "kv" encoding in the receiver's geometry, whose wire bytes also carry
one zero input-embedding row per translated row (rows with no token; +15% on a Qwen2.5-0.5B receiver); the
translator's forward counts in the sender's seconds (inside `select_s`; loading it does not). The receiver's map and embedding time
counts in its seconds. `kept_spans` are the spans sent, per sender, so evidence recall is measured as
for CacheBack.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from ..agent import Agent
from ..errors import ConfigError
from ..message import SEPARATOR
from ..translate.base import Translator
from ..translate.latent_map import LatentMap
from .base import register
from .cacheback import CacheBack
from .documents import sent_spans
from .stages import Stage, flat_keywords
from .stages.cross import (ROW_TRANSLATORS, SENDER_SEPARATOR, MessageOverflowError, SpansText, check_translated_fit,
                           receiver_rows, receiver_state)

DELIVERIES = ("spans", "spans+latent", "translated")  # the flat `delivery` keyword's values
__all__ = ["DELIVERIES", "ROW_TRANSLATORS", "SENDER_SEPARATOR", "SEPARATOR", "CacheBackX", "MessageOverflowError",
           "check_translated_fit", "receiver_rows", "receiver_state", "sent_spans"]


@register
@flat_keywords
@dataclass
class CacheBackX(CacheBack):
    """CacheBack to a receiver of another model: the selected rows travel as document text spans (plus mapped
    latent rows, or translated K/V). Key parameters: `encoding` (spans(), spans_latent(latent_map=...),
    translated(translator=...); flat: `delivery`, `latent_map`, `translator`), and CacheBack's `ratio` and
    `latent_steps`."""
    name = "cacheback_x"
    cross_model = True
    encoding: Stage = field(default_factory=SpansText)

    def __post_init__(self):
        super().__post_init__()
        if not getattr(self.encoding, "cross_model", False):
            raise ConfigError(f"cacheback_x sends document spans (spans(), spans_latent(latent_map=...)) or translated "
                              f"K/V (translated(translator=...)), not {self.encoding!r}: leave `encoding` at its "
                              "default, or name one of those")

    @property
    def delivery(self) -> str:
        return self.encoding.delivery

    @property
    def latent_map(self) -> LatentMap | None:
        return getattr(self.encoding, "latent_map", None)

    @property
    def translator(self) -> Translator | None:
        return getattr(self.encoding, "translator", None)

    def map_for(self, receiver: Agent) -> LatentMap:
        """The latent map on the receiver's device, loaded once."""
        return self.encoding.map_for(receiver)

    def reference_translator(self) -> Translator:
        """The translator as given (or loaded once, on the host): what pair checks read."""
        return self.encoding.reference()

    def translator_for(self, device: torch.device | str) -> Translator:
        """The translator on `device` (a sender's), placed there once."""
        return self.encoding.translator_for(device)

    def check_map(self, senders: Sequence, receiver: Agent) -> None:
        """LatentMapMismatchError (GeometryMismatchError for a translator) unless this protocol's map or translator
        (if any) was made for each sender and `receiver`. `senders`: Agents, or their Geometries where the
        senders live elsewhere (a transport)."""
        self.encoding.check_pair(senders, receiver)

    def check_translated_window(self, senders: Sequence[str], prompts: Sequence[int], receiver: Agent,
                                question: str) -> None:
        """MessageOverflowError, before any sender reads, unless the largest translated message the budgets allow
        fits the receiver. `senders`: their model names."""
        self.encoding.check_receiver_window(self, prompts, receiver, question, senders)

"""Cross-model CacheBack: senders of one model select as CacheBack does, a receiver of another model reads it.

Each sender (model A) reads its document query-blind (prefill + G latent steps), scores its finished
state against the receiver's question and selects rows within B = ceil(T / r) exactly as `CacheBack`
(same read, scores, spans and budget). Rows of A do not transfer to a receiver of model B (other
embeddings, other vocabulary), so the selection travels by `delivery`:

    "spans"         the selected document rows become the exact character spans of the sender's document
                    they cover (`message.Spans`): rows that follow each other in the sender's prompt form
                    one span (so whitespace some tokenizers leave out of their offsets stays in), spans
                    that overlap or touch are merged, in document order, `SEPARATOR` ("\\n…\\n") between
                    two spans that do not touch. The first row (template) and the latent rows are
                    dropped. No training; any pair of models.
    "spans+latent"  the same text, then the sender's G latent rows mapped into B's input-embedding space
                    by a `LatentMap` fitted for the pair (translate/latent_map.py, ridge in closed form),
                    each rescaled to B's mean token-embedding norm as `Agent.rows` does for a model's own
                    latent rows. A map of another pair, or of another latent mode, is refused.
    "translated"    the selected rows' K/V (first and latent rows included, as CacheBack sends them) go through
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

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from ..agent import MESSAGE_PROMPT, Agent
from ..clock import now
from ..errors import ConfigError, ContextOverflowError, UnknownNameError
from ..message import SEPARATOR, Rows, Spans
from ..select import fanin_budget
from ..state import KVState
from ..translate import load as load_translator
from ..translate.base import Translator, cast, read_header
from ..translate.latent_map import LatentMap
from .base import after_first, Outcome, register
from .cacheback import CacheBack, Sent
from .stages import RowsEncoding, flat_keywords
from .documents import sent_spans

DELIVERIES = ("spans", "spans+latent", "translated")
ROW_TRANSLATORS = ("dense",)  # translators that map rows on their own (needs_receiver=False)
SENDER_SEPARATOR = "\n\n"  # between two senders' texts in the receiver's slot
__all__ = ["DELIVERIES", "ROW_TRANSLATORS", "SENDER_SEPARATOR", "SEPARATOR", "CacheBackX", "MessageOverflowError",
           "receiver_rows", "receiver_state", "sent_spans"]


class MessageOverflowError(ContextOverflowError):
    """A message (spans text + latent rows, or translated rows) that would overflow the receiver's context window;
    names both sides' models."""

    def __init__(self, needed: int, window: int, breakdown: dict[str, int], senders: Sequence[str], receiver: str):
        super().__init__(needed, window, breakdown)
        self.senders, self.receiver = tuple(senders), receiver
        self.args = (f"message from sender {', '.join(self.senders)} to receiver {receiver}: {self.args[0]}",)

    def __reduce__(self):
        return type(self), (self.needed, self.window, self.breakdown, self.senders, self.receiver)


@register
@flat_keywords
@dataclass
class CacheBackX(CacheBack):
    """CacheBack to a receiver of another model: the selected rows travel as document text spans (plus mapped
    latent rows, or translated K/V). Key parameters: `delivery`, `latent_map` / `translator`, and CacheBack's
    `ratio` and `latent_steps`."""
    name = "cacheback_x"
    delivery: str = "spans"  # "spans", "spans+latent" or "translated"
    # "spans+latent": the LatentMap for (sender -> receiver), a folder written by `LatentMap.save` or the map
    latent_map: str | Path | LatentMap | None = None
    # "translated": a dense translator for (sender -> receiver), a checkpoint folder (`latentwire train`) or one
    translator: str | Path | Translator | None = None

    def __post_init__(self):
        super().__post_init__()
        if self.delivery not in DELIVERIES:
            raise UnknownNameError("delivery", self.delivery, DELIVERIES)
        if type(self.encoding) is not RowsEncoding:
            raise ConfigError("cacheback_x sends Spans (wire encoding 'spans' or 'spans_latent') or translated K/V "
                             "('kv'), by delivery: leave `encoding` at its default")
        if (self.delivery == "spans+latent") != (self.latent_map is not None):
            raise ConfigError("delivery 'spans+latent' needs latent_map= (a folder written by LatentMap.save, or a "
                             "LatentMap) and 'spans' takes none")
        if not isinstance(self.latent_map, (str, Path, LatentMap, type(None))):
            raise ConfigError(f"latent_map: want a folder or a LatentMap, got {type(self.latent_map).__name__}")
        if self.latent_map is not None:  # a missing folder, or a map of another latent mode: refused now
            given = isinstance(self.latent_map, LatentMap)
            mode = self.latent_map.latent_mode if given else LatentMap.read_header(self.latent_map).get("latent_mode")
            if mode != self.latent_mode:
                raise ConfigError(f"latent map {self.latent_map.pair if given else self.latent_map} was fitted on "
                                  f"{mode!r} latent rows; this protocol's senders think with "
                                  f"latent_mode={self.latent_mode!r}")
        if (self.delivery == "translated") != (self.translator is not None):
            raise ConfigError("delivery 'translated' needs translator= (a dense translator checkpoint folder, or the "
                             "translator) and the other deliveries take none")
        if self.translator is not None:
            if not isinstance(self.translator, (str, Path, Translator)):
                raise ConfigError(f"translator: want a checkpoint folder or a Translator, got "
                                 f"{type(self.translator).__name__}")
            method = self.translator.name if isinstance(self.translator, Translator) else \
                read_header(self.translator).get("method")
            if method not in ROW_TRANSLATORS:
                raise ConfigError(f"delivery 'translated' needs a translator that maps rows on their own "
                                  f"({', '.join(ROW_TRANSLATORS)}); {method!r} writes residuals into the receiver's "
                                  "own cache of the same text, which a cacheback_x receiver never reads")
        self._maps: dict[str, LatentMap] = {}  # receiver device -> the map there
        self._translators: dict[str, Translator] = {}  # "" -> as given; sender device -> the translator there

    def __getstate__(self):  # pickled to nodes without its loaded maps and translators (each node loads its own)
        state = super().__getstate__()
        state["_maps"], state["_translators"] = {}, {}
        return state

    def map_for(self, receiver: Agent) -> LatentMap:
        """The latent map on the receiver's device, loaded once (its latent mode was checked when this was built)."""
        key = str(receiver.device)
        if key not in self._maps:
            m = self.latent_map if isinstance(self.latent_map, LatentMap) else LatentMap.load(self.latent_map)
            self._maps[key] = m.to(receiver.device)
        return self._maps[key]

    def reference_translator(self) -> Translator:
        """The translator as given (or loaded from its folder once, on the host): what pair checks read. Never moved."""
        if "" not in self._translators:
            t = self.translator if isinstance(self.translator, Translator) else load_translator(self.translator)
            t.check_mode(False)  # ContextModeError if trained context-aware (see the module docstring)
            self._translators[""] = t
        return self._translators[""]

    def translator_for(self, device: torch.device | str) -> Translator:
        """The translator on `device` (a sender's): the given one where it already is, otherwise a copy placed
        there once (the caller's module is never moved). Dense alignment has no dropout or normalisation
        statistics, so its training flag changes nothing."""
        ref, key = self.reference_translator(), str(torch.device(device))
        if key not in self._translators:
            here = next(ref.parameters()).device == torch.device(device)
            self._translators[key] = ref if here else copy.deepcopy(ref).to(device)
        return self._translators[key]

    def send_one(self, sender: Agent, document: str, question: str, index: int) -> Sent:
        if self.delivery == "translated":
            self.translator_for(sender.device)  # loaded or placed before the read: not charged as selection
        return super().send_one(sender, document, question, index)

    def pack(self, sender: Agent, state: KVState, rows: torch.Tensor, per_row: list, document: str,
             index: int) -> Spans | KVState:
        """Sender `index`'s message: the document spans its selected rows cover (+ its latent rows), or ("translated")
        the selected rows' K/V translated into the receiver's geometry."""
        if self.delivery == "translated":
            with torch.inference_mode():
                return self.translator_for(sender.device)(state.select(rows))  # (B' rows) compact, receiver's
        latents = None
        if self.delivery == "spans+latent":
            lat = rows[state.is_latent[rows]]  # (G,) every latent row is always kept
            latents = (sender.rows(state.select(lat)).embeds if len(lat) else  # (G, d_A), as CacheBack sends them
                       torch.zeros(0, sender.geometry.hidden_size, dtype=sender.dtype, device=sender.device))
        return Spans.of(document, sent_spans(per_row, rows, document), index,
                        (sender.geometry.model, sender.geometry.tokenizer), latents)

    def receive(self, receiver: Agent, question: str, parts: Sequence[Spans] | Sequence[KVState]) -> Rows | KVState:
        """The receiver's message from the senders' parts: Rows for Spans (`receiver_rows`, with this protocol's map
        if it has one); for translated states their concatenation (`receiver_state`). A part of the other kind
        (a KV state for a spans delivery, or Spans for "translated") is refused (ConfigError)."""
        want = KVState if self.delivery == "translated" else Spans
        wrong = sorted({type(m).__name__ for m in parts if not isinstance(m, want)})
        if wrong:
            raise ConfigError(f"cacheback_x with delivery {self.delivery!r} receives {want.__name__} messages, got "
                              f"{', '.join(wrong)}: the senders ran another delivery")
        if self.delivery == "translated":
            return receiver_state(receiver, question, parts, self.max_new_tokens,
                                  [self.reference_translator().sharer.model])
        latent_map = self.map_for(receiver) if self.delivery == "spans+latent" else None
        return receiver_rows(receiver, question, parts, latent_map, self.max_new_tokens)

    def check_map(self, senders: Sequence, receiver: Agent) -> None:
        """LatentMapMismatchError (GeometryMismatchError for a translator) unless this protocol's map or translator
        (if any) was made for each sender and `receiver`. `senders`: Agents, or their Geometries where the
        senders live elsewhere (a transport)."""
        if self.delivery == "spans+latent":
            latent_map = self.map_for(receiver)
            for sender in senders:
                latent_map.check(sender, receiver)
        if self.delivery == "translated":
            translator = self.reference_translator()
            for sender in senders:
                translator.check_pair(getattr(sender, "geometry", sender), receiver.geometry)

    def check_translated_window(self, senders: Sequence[str], prompts: Sequence[int], receiver: Agent,
                                question: str) -> None:
        """MessageOverflowError, before any sender reads, unless the largest translated message the budgets allow
        fits the receiver with its continuation prompt and answer: per sender (prompt length P) min(B, P - 1)
        document rows + its first row + G latent rows, B = ceil((P + G) / ratio). `senders`: their model names."""
        rows = sum(min(fanin_budget(P + self.latent_steps, self.ratio), P - 1) + 1 + self.latent_steps
                   for P in prompts)
        check_translated_fit(receiver, question, rows, self.max_new_tokens, sorted(set(senders)))

    def run(self, senders: Sequence[Agent], documents: Sequence[str], receiver: Agent, question: str) -> Outcome:
        self.check_map(senders, receiver)  # refused before any sender reads
        prompts = self.check_senders(senders, documents, question)  # each sender's read fits its window
        if self.delivery == "translated":  # and the largest translated message fits the receiver's
            self.check_translated_window([s.model_name for s in senders], prompts, receiver, question)
        messages, seconds, kept, timing = self.send(senders, documents, question)
        t0 = now(receiver.device)
        message = self.receive(receiver, question, messages)
        build_s = now(receiver.device) - t0
        reply = receiver.answer(question, message=message, max_new_tokens=self.max_new_tokens)
        details = {"senders": timing, "delivery": self.delivery, "message_rows": len(message),
                   "receiver_build_s": build_s}
        if self.delivery == "translated":
            for t, m in zip(timing, messages):
                t.update(translated_rows=len(m))
            nbytes = sum(m.nbytes for m in messages)
            details |= {"translated_rows": len(message), "kv_bytes": nbytes}
            kept = tuple(kept)  # the selected rows' document spans, as CacheBack reports them
        else:
            for t, m in zip(timing, messages):
                t.update(spans=len(m.spans), text_chars=len(m.text),
                         latent_rows=0 if m.latents is None else len(m.latents))
            n_lat = int((message.token_ids == -1).sum())
            text_bytes = sum(len(m.text.encode("utf-8")) for m in messages)
            nbytes = sum(m.nbytes for m in messages)
            kept = tuple(m.spans for m in messages)
            details |= {"text_rows": len(message) - n_lat, "latent_rows": n_lat, "text_bytes": text_bytes,
                        "latent_bytes": nbytes - text_bytes}
        return Outcome(self.name, reply.text, nbytes, reply.context, tuple(seconds), reply.seconds + build_s, details,
                       kept_spans=kept, read_seconds=self.reads_of(timing), after_first=after_first(reply))


@torch.no_grad()
def receiver_rows(receiver: Agent, question: str, messages: Sequence[Spans], latent_map: LatentMap | None = None,
                  max_new_tokens: int = 48) -> Rows:
    """The receiver's input for these messages, as `Rows` in its own space: per message (sender order) its text
    as the receiver tokenizes it (SENDER_SEPARATOR before each but the first), then its latent rows mapped by
    `latent_map` and rescaled to the receiver's mean embedding norm.

    Before any compute: MessageOverflowError unless rows + prompt + `max_new_tokens` fit the receiver's window;
    a message with latent rows needs `latent_map`, fitted for its sender and this receiver
    (LatentMapMismatchError otherwise).
    """
    tok = receiver.tokenizer
    ids = [receiver.ids(tok((SENDER_SEPARATOR if i else "") + m.text, add_special_tokens=False)["input_ids"])
           for i, m in enumerate(messages)]  # per message (n_i,) int64
    n_lat = [0 if m.latents is None else m.latents.shape[0] for m in messages]
    pre, post = receiver.slot_ids(receiver.chat_text(MESSAGE_PROMPT.format(question=question)))
    parts = {"spans_text": sum(len(i) for i in ids), "latent_rows": sum(n_lat), "prompt": len(pre) + len(post),
             "max_new_tokens": max_new_tokens}
    if sum(parts.values()) > receiver.context_window:
        names = sorted({m.space[0] if m.space else f"#{m.document}" for m in messages})
        raise MessageOverflowError(sum(parts.values()), receiver.context_window, parts, names, receiver.model_name)
    embeds, token_ids = [], []
    for m, m_ids, g in zip(messages, ids, n_lat):
        embeds.append(receiver.embed(m_ids))  # (n_i, d_B)
        token_ids.append(m_ids)
        if m.latents is None:
            continue
        if latent_map is None:
            raise ConfigError(f"spans from {m.space[0] if m.space else 'a sender'} carry {g} latent rows: the "
                              "receiver needs a latent_map fitted for that sender and itself")
        if m.space is None:
            raise ConfigError("spans with latent rows must name their sender (space=(model, tokenizer)): the latent "
                              "map for the pair is checked against it")
        mapped = latent_map.apply(m.latents, sender=m.space, receiver=receiver)  # (G, d_B) float32
        mapped = mapped * (receiver.mean_embedding_norm / mapped.norm(dim=-1, keepdim=True).clamp_min(1e-12))
        embeds.append(mapped.to(receiver.device, receiver.dtype))
        token_ids.append(torch.full((g,), -1, dtype=torch.int64, device=receiver.device))
    d = receiver.geometry.hidden_size
    return Rows(torch.cat(embeds) if embeds else torch.zeros(0, d, dtype=receiver.dtype, device=receiver.device),
                torch.cat(token_ids) if token_ids else torch.zeros(0, dtype=torch.int64, device=receiver.device),
                (receiver.geometry.model, receiver.geometry.tokenizer))


def receiver_state(receiver: Agent, question: str, states: Sequence[KVState], max_new_tokens: int = 48,
                   senders: Sequence[str] = ("(translated)",)) -> KVState:
    """The receiver's full-KV prefix for translated messages: the states one after another (in sender order, keys
    re-rotated), in the receiver's dtype and on its device. Before any compute: GeometryMismatchError unless each
    state is in the receiver's geometry (a translator made for another receiver), MessageOverflowError unless the
    rows, the receiver's continuation prompt and `max_new_tokens` fit its window (`senders`: the models the
    states were translated from, for the error)."""
    for s in states:
        receiver.geometry.check_same(s.geometry)
    check_translated_fit(receiver, question, sum(len(s) for s in states), max_new_tokens, senders)
    return KVState.concat([cast(s, receiver.dtype, receiver.device) for s in states])


def check_translated_fit(receiver: Agent, question: str, rows: int, max_new_tokens: int,
                         senders: Sequence[str]) -> None:
    """MessageOverflowError naming the sender models and the receiver unless `rows` translated rows, the receiver's
    continuation prompt and `max_new_tokens` fit its window (before the reads: the budgets' bound; at receipt:
    the rows that came)."""
    parts = {"translated_rows": rows, "prompt": len(receiver.kv_prompt_ids(question)), "max_new_tokens": max_new_tokens}
    if sum(parts.values()) > receiver.context_window:
        raise MessageOverflowError(sum(parts.values()), receiver.context_window, parts, list(senders),
                                   receiver.model_name)

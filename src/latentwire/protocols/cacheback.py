"""CacheBack (docs/methods.md#cacheback): each sender scores its finished state against the receiver's query and sends
only the best positions, as rows the receiver re-prefills inside its chat template.

Senders are query-blind while they read and think; the query arrives afterwards, so one stored
state can answer many queries. The selector is pluggable, so receiver-agnostic baselines run through
the same spans, budgets and encodings.
"""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field, replace
from typing import Sequence

import torch

from ..agent import KV_PROMPT, LATENT_MODES, MESSAGE_PROMPT, Agent
from ..blend import check_blend, recompute_count
from ..clock import now
from ..errors import ConfigError, ContextOverflowError, UnknownNameError
from ..registry import construct
from ..message import Rows
from ..select import (SELECTORS, SPAN, TextSelector, always_kept, check_sentence_options, context_rows,
                      fanin_budget, mass_budget, fused_row_scores, get_selector, select_rows, span_units,
                      sentence_groups, unit_ranks, unit_row_scores)
from ..select.presses import rerun_seconds
from ..state import KVState
from .calibration import GENERIC_QUESTION, calibrate, masked_question
from .base import after_first, QUESTION_SUFFIX, SENDER_PROMPT, Outcome, Protocol, register, sender_prompt_lengths
from .documents import document_rows, kept_document_spans, token_document_spans  # noqa: F401  (re-exported)
from .reads import Read, held_value, read, text_key
from .variants import SCORING_PRESETS, variant_fields  # noqa: F401  (re-exported)

# "rows": hidden-size input rows the receiver re-prefills; "token_ids": their ids (+ latent rows); "kv": the selected
# rows' own K/V, keys re-rotated to consecutive positions, attached as the receiver's prefix (no re-prefill: a row
# keeps what the sender's context wrote into it, e.g. a pronoun's antecedent); "kv_reencoded": the K/V the selected
# rows get when the sender re-reads them alone in the receiver's message slot (`Agent.encode_rows`), attached there
# (`Agent.answer_attached`): what "rows" computes at the receiver, moved to the sender (and without the other
# senders' rows in view); "kv_blend": the read's K/V as "kv", attached in the message slot, where the receiver
# recomputes the share `recompute` of rows its own context changes most (CacheBlend's selective recompute, blend.py;
# "kv_reencoded" takes `recompute` too: what its senders' rows miss is each other).
# docs/methods.md#kv-delivery: why attached read K/V lose accuracy.
ENCODINGS = ("rows", "token_ids", "kv", "kv_reencoded", "kv_blend")
KV_ENCODINGS = ("kv", "kv_reencoded", "kv_blend")  # K/V states: attached by the receiver, not re-prefilled
READ_KV = ("kv", "kv_blend")  # the read's own K/V: the read keeps every row on sliding layers
SLOT_KV = ("kv_reencoded", "kv_blend")  # K/V attached in the receiver's message slot (`Agent.answer_attached`)
RECOMPUTE = 0.15  # kv_blend's default share, CacheBlend's operating point (not tuned on our tasks)
QUERY_FORMATS = ("turn", "raw")
SPAN_MODES = ("fixed", "sentence")
# Background calibration (calibration.py): the question's scores ÷ those of a content-free query.
CALIBRATIONS = ("none", "generic", "masked")
# How the answer probe's tokens join the question's: "join" = one query, the turn then the probe (every token's
# attention pooled); "and" = √(scores of the turn alone × scores of turn + probe), so a row must be read both for
# the question (whose day, which person) and while answering it (what was made of it).
PROBE_MIXES = ("join", "and")
# What a text selector (`selector` itself, or `fuse`) matches sentences against: the question alone, or the question
# followed by the sender's answer draft (the probe's decoded tokens): the draft names the entity a pronoun stands
# for and words the answer as the document does, so word overlap and embeddings find the sentence it came from.
TEXT_QUERIES = ("question", "draft")


@dataclass(frozen=True)
class Sent:
    """One CacheBack sender's contribution: its message (`CacheBack.pack`), its seconds (read + selection),
    the document spans of its selected rows, its timing record and the positions of the rows it selected."""
    part: object  # Rows for CacheBack; Spans, or a translated KVState, for CacheBackX
    seconds: float
    kept: tuple
    timing: dict
    positions: list[int]


@register
@dataclass
class CacheBack(Protocol):
    """Each sender sends B = ceil(T / ratio) of its best-scoring document rows (plus its first and latent rows)
    for the receiver to re-prefill; key parameters: `ratio`, `latent_steps`, `selector`, `span_mode`."""
    name = "cacheback"
    ratio: float = 8.0  # compression r: each sender sends B = ceil(T / r) rows beyond the always-kept ones
    # Adaptive budget: None = the fixed B = ceil(T / ratio); q in (0, 1] = the fewest best units holding q of the
    # score mass (`mass_budget`), at most ceil(T / ratio) rows (the cap) and at least ceil(T / max_ratio) (the floor).
    mass: float | None = None
    max_ratio: float = 64.0  # adaptive budgets only: the floor ceil(T / max_ratio)
    latent_steps: int = 8  # G; the measured studies all use 8 (docs/methods.md#latentmas, "Default G")
    latent_mode: str = "rescale"
    selector: str = "cacheback"
    selector_params: dict = field(default_factory=dict)
    encoding: str = "rows"  # ENCODINGS (described above them)
    # "kv_blend" (default RECOMPUTE) and "kv_reencoded" (default 0): the share of attached rows the receiver recomputes
    recompute: float | None = None
    span: int = SPAN
    # "sentence" (default): spans end at the document's sentence and line boundaries (at most 2·span rows),
    # so a fact is not split across two spans; "fixed": spans of `span` document rows (the paper). Measured
    # on 48 episodes per (task, model), 8× / 16× evidence recall: +8 / +13 points on Qwen `facts`, +0 / +11
    # on Qwen `code`, +8 / +13 on Gemma3 `facts` (paired CIs above 0 except Qwen `code` at 8×).
    span_mode: str = "sentence"
    # Sentence spans only: when the budget is below one span (documents of a few dozen tokens at 8×) and the
    # best sentence does not fit, send that sentence whole and alone, rather than a piece of it ("Biscuit" cut
    # to "B") or short lesser sentences that fit. Budgets of a span or more (every measured study) are unchanged.
    unit_floor: bool = True
    # Sentence spans only: rows a selected sentence takes along, spending budget (`context_rows`): "lead" = the
    # first sentence of its paragraph (which names the subject a "he" or an alias refers to), "previous" = the
    # sentence before it, "none" = the sentence alone.
    context: str = "none"
    # FILLS: "cut" fills the budget left after whole units with the best piece of the next one; "whole" leaves it
    # unspent, so no unit arrives cut ("Ana Weber leads t" next to another sentence reads as another fact).
    fill: str = "cut"
    # How q is appended after the finished state: "turn" = the receiver's own next chat turn asking the
    # question (what the receiver would prefill), "raw" = the question's tokens alone.
    query_format: str = "turn"
    # Answer probe: the sender decodes its own first `probe` greedy answer tokens to the question's turn on the
    # finished state (`query_for`; not kept, not sent) and their attention joins the question's: the rows a model
    # reads as it starts to answer (whose "she", what "hometown" means). 0: the question alone.
    probe: int = 0
    probe_mix: str = "join"  # PROBE_MIXES: "and" scores the question's turn alone too (one more pass per question,
    # two under "masked" calibration; "generic" mixes its background once per stored state)
    # "generic": the question's scores ÷ those of GENERIC_QUESTION (scored once per stored state and reused
    # by every follow-up question); "masked": ÷ those of the question with its content words replaced by
    # "thing" (same length and shape, one more scoring pass per question). See `calibrate`.
    calibration: str = "none"
    calibration_floor: float = 0.05  # κ: background scores below κ·mean(background) count as κ·mean
    # A text selector ("lexical", "bm25", "dense") whose unit ranks are fused with the selector's by reciprocal
    # rank fusion (`fused_row_scores`, constant `fuse_k`): attention breaks the ties word overlap cannot (whose
    # "she"), the retriever finds what a small model's attention misses (paraphrase). None: no fusion.
    fuse: str | None = None
    fuse_k: float = 60.0
    text_query: str = "question"  # TEXT_QUERIES; "draft" needs probe ≥ 1 and a text selector (or fuse)
    # The sender reads the question with its document (kvpress's query-aware setting). With a
    # receiver-agnostic selector (snapkv) this is the strongest baseline that sees the question without
    # a receiver query; the stored state then serves that one question only. SnapKV then observes the
    # question: its window is the rows read after the document (SnapKV's own setting), unless
    # `selector_params` fixes `window_size` (kvpress's default, 64, also covers the document's last
    # rows, which then score max + 1 and fill a small budget: 8x recall 0.0-0.9 vs 1.0 on 4 facts episodes).
    query_aware: bool = False

    def __post_init__(self):
        super().__post_init__()
        if not 1 <= self.ratio < math.inf:
            raise ConfigError(f"ratio must be a finite number ≥ 1, got {self.ratio}")
        if self.mass is not None and not 0 < self.mass <= 1:
            raise ConfigError(f"mass must be in (0, 1] (None: the fixed budget), got {self.mass!r}")
        if self.mass is not None and not self.ratio <= self.max_ratio < math.inf:  # only adaptive budgets use it
            raise ConfigError(f"max_ratio (the adaptive floor) must be ≥ ratio (the cap) and finite, got "
                              f"{self.max_ratio} with ratio {self.ratio}")
        if self.mass is not None and self.fuse is not None:  # rank-fused scores are near flat: mass would mean rows
            raise ConfigError("mass (the adaptive budget) reads the attention scores' mass; fused rank scores have "
                              "none to speak of: use one of mass or fuse")
        if self.mass is not None and self.context != "none":
            raise ConfigError("mass (the adaptive budget) does not count the context rows a sentence takes along; "
                              "use one of mass or context")
        if not isinstance(self.unit_floor, bool):
            raise ConfigError(f"unit_floor must be a bool, got {self.unit_floor!r}")
        if self.latent_steps < 0:
            raise ConfigError(f"latent_steps must be ≥ 0, got {self.latent_steps}")
        if self.latent_mode not in LATENT_MODES:
            raise UnknownNameError("latent mode", self.latent_mode, LATENT_MODES)
        if self.encoding not in ENCODINGS:
            raise UnknownNameError("encoding", self.encoding, ENCODINGS)
        if self.recompute is not None and self.encoding not in SLOT_KV:
            raise ConfigError(f"recompute is the receiver's share of attached rows to recompute, under encodings "
                              f"{', '.join(map(repr, SLOT_KV))}; encoding {self.encoding!r} has none")
        recompute_count(self.recompute_share, 1)
        if self.query_format not in QUERY_FORMATS:
            raise UnknownNameError("query format", self.query_format, QUERY_FORMATS)
        if self.selector not in SELECTORS:
            raise UnknownNameError("selector", self.selector, SELECTORS)
        if self.span_mode not in SPAN_MODES:
            raise UnknownNameError("span mode", self.span_mode, SPAN_MODES)
        if self.span < 1:
            raise ConfigError(f"span must be ≥ 1, got {self.span}")
        check_sentence_options(self.span_mode, self.context, self.fill)
        if self.calibration not in CALIBRATIONS:
            raise UnknownNameError("calibration", self.calibration, CALIBRATIONS)
        if self.calibration_floor <= 0:
            raise ConfigError(f"calibration_floor must be > 0, got {self.calibration_floor}")
        if isinstance(self.probe, bool) or not isinstance(self.probe, int) or self.probe < 0:
            raise ConfigError(f"probe must be an int ≥ 0 (answer tokens decoded to score with), got {self.probe!r}")
        if self.probe_mix not in PROBE_MIXES:
            raise UnknownNameError("probe mix", self.probe_mix, PROBE_MIXES)
        if self.probe_mix != "join" and not self.probe:
            raise ConfigError(f"probe_mix {self.probe_mix!r} combines the probe's scores with the question's: "
                             "it needs probe ≥ 1")
        if self.text_query not in TEXT_QUERIES:
            raise UnknownNameError("text query", self.text_query, TEXT_QUERIES)
        if self.text_query == "draft" and not self.probe:
            raise ConfigError("text_query 'draft' matches the sender's answer draft: it needs probe ≥ 1")
        if self.probe and self.query_format != "turn":
            raise ConfigError("probe decodes the sender's answer to the question's turn: it needs query_format 'turn'")
        self._selector = get_selector(self.selector, **self.selector_params)
        self._selector.check_installed()  # a kvpress selector without the extra: refused before any compute
        self._fuse = None
        if self.fuse is not None:
            if self.fuse not in SELECTORS or not issubclass(SELECTORS[self.fuse], TextSelector):
                raise UnknownNameError("text selector to fuse", self.fuse,
                                       [n for n in SELECTORS.names() if issubclass(SELECTORS[n], TextSelector)])
            if isinstance(self._selector, TextSelector):
                raise ConfigError(f"fuse= combines a state selector with a text one; {self.selector!r} is a text selector")
            if not self.fuse_k > 0:
                raise ConfigError(f"fuse_k must be > 0, got {self.fuse_k!r}")
            self._fuse = get_selector(self.fuse)
        text_only = isinstance(self._selector, TextSelector)
        if self.text_query == "draft" and not (text_only or self._fuse is not None):
            raise ConfigError("text_query 'draft' is what a text selector reads: set selector= to one "
                              "(lexical, bm25, dense) or fuse= one with the state selector")
        drafting = text_only and self.text_query == "draft"  # the probe only writes the draft: no attention
        for knob, on in (("calibration", self.calibration != "none"), ("probe", self.probe > 0 and not drafting),
                         ("probe_mix", self.probe_mix != "join")):
            if on and (not self._selector.query_conditioned or text_only):
                raise ConfigError(f"{knob} needs a query-conditioned state selector, not {self.selector!r}")
        # stored state -> its generic background scores and probe texts: follow-ups reuse them (states are values)
        self._memo: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # state -> background scores, probes
        self._windowed: dict = {}  # observation window -> query-aware SnapKV selector (`selector_for`)

    @classmethod
    def variant(cls, spec: str, **fields) -> "CacheBack":
        """A CacheBack from a short variant name (`variants.py`): "cacheback@deep+generic/sentence:probe=16"."""
        return construct("protocol", cls.name, cls, **variant_fields(spec, **fields))  # typed errors, as get_protocol

    def __getstate__(self):  # picklable (protocols travel to Ray actors): the background cache stays behind
        state = self.__dict__.copy()
        state["_memo"] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._memo = weakref.WeakKeyDictionary()

    def sender_prompt(self, document: str, question: str | None = None) -> str:
        if not self.query_aware:
            return SENDER_PROMPT.format(document=document)
        if question is None:
            raise ValueError("a query_aware sender reads the question with its document: pass question=")
        return SENDER_PROMPT.format(document=document) + QUESTION_SUFFIX.format(question=question)

    def read(self, sender: Agent, document: str, question: str | None = None) -> KVState:
        """The sender's finished state: prefill + latent steps (query-blind unless `query_aware`)."""
        return self.sender_read(sender, document, question).state

    def sender_read(self, sender: Agent, document: str, question: str | None = None) -> Read:
        """`read` with its measured seconds; inside `shared_reads()` one read serves every protocol."""
        return read(sender, self.sender_prompt(document, question), self.latent_steps, self.latent_mode,
                    full_history=self.encoding in READ_KV)  # K/V of any selected row, sliding layers included

    def query_text(self, sender: Agent, question: str) -> str:
        return sender.continuation_text(KV_PROMPT.format(question=question)) if self.query_format == "turn" \
            else question

    def query_for(self, sender: Agent, state: KVState, question: str) -> str:
        """The text whose attention scores `state` for `question`: `query_text`, then with `probe` the first
        `probe` tokens of the sender's own greedy answer to that turn, decoded on `state` (which is not changed)."""
        return self.query_text(sender, question) + (self.said(sender, state, question) or "")

    def said(self, sender: Agent, state: KVState, question: str) -> str | None:
        """With `probe`: the first `probe` tokens of the sender's greedy answer to the question's turn, decoded
        once per state and question (None without a probe)."""
        if not self.probe:
            return None
        cached = self._memo.setdefault(state, {})
        key = ("probe", sender.uid, question)
        if key not in cached:
            answer = sender.answer_after(state, KV_PROMPT.format(question=question), max_new_tokens=self.probe)
            cached[key] = sender.tokenizer.decode(list(answer.token_ids), skip_special_tokens=True)
        return cached[key]

    def selector_for(self, per_row: list | None = None):
        """The selector that scores a state whose prompt rows map to the document as `per_row`: query-aware
        SnapKV gets the question (the rows after the document) as its observation window."""
        if not (self.query_aware and per_row and hasattr(self._selector, "window_size")
                and "window_size" not in self.selector_params):
            return self._selector
        last = max((i for i, span in enumerate(per_row) if span is not None), default=len(per_row) - 1)
        window = max(1, len(per_row) - 1 - last)
        if window not in self._windowed:  # one instance per window: its timing fields stay readable
            self._windowed[window] = replace(self._selector, window_size=window)
        return self._windowed[window]

    def scores(self, sender: Agent, state: KVState, question: str, per_row: list | None = None) -> torch.Tensor:
        """(T,) row scores for this question, background-calibrated when `calibration` says so. `per_row`
        (`document_rows`): where the document sits in the sender's prompt (used by query-aware SnapKV)."""
        scores = self.question_scores(self.selector_for(per_row), sender, state, question)
        if self.calibration == "none":
            return scores
        if self.calibration == "masked":
            background = self.question_scores(self._selector, sender, state, masked_question(question))
        else:
            background = self.background(sender, state)
        return calibrate(scores, background, self.calibration_floor)

    def question_scores(self, selector, sender: Agent, state: KVState, question: str) -> torch.Tensor:
        """(T,) uncalibrated scores of one question: its query's (`query_for`), or with probe_mix "and" the
        geometric mean of those and the question turn's alone (read for the question and while answering it)."""
        scores = selector.score(sender, state, self.query_for(sender, state, question))
        if self.probe_mix == "and":
            scores = (scores * selector.score(sender, state, self.query_text(sender, question))).sqrt()
        return scores

    def background(self, sender: Agent, state: KVState) -> torch.Tensor | None:
        """(T,) generic background scores of a stored state (calibration "generic"; None otherwise). They do not
        depend on the question, so they are scored once per state, when it is read (`send_one` counts them in
        the read's seconds: an agent that holds its document has them before a question), and reused."""
        if self.calibration != "generic":
            return None
        key = (sender.uid, self.query_format, self.probe, self.probe_mix)
        cached = self._memo.setdefault(state, {})
        if key not in cached:
            cached[key] = self.question_scores(self._selector, sender, state, GENERIC_QUESTION)
        return cached[key]

    def choose(self, sender: Agent, state: KVState, question: str, eligible: torch.Tensor | None = None,
               groups: list[list[int]] | None = None, per_row: list | None = None,
               document: str | None = None) -> torch.Tensor:
        """Row indices to send for this question (re-scoring a stored state; the sender is not re-run).
        `groups`: the span units (`span_groups`); None = fixed spans of `span` rows. A text selector (lexical,
        bm25, dense) scores those units' text: it needs `per_row` and `document`."""
        keep = always_kept(state)
        text = self._fuse if self._fuse is not None else (
            self._selector if isinstance(self._selector, TextSelector) else None)
        if text is None:
            scores = self.scores(sender, state, question, per_row)
        else:
            if per_row is None or document is None:
                raise ValueError(f"selector {text.name!r} scores the document's text: pass per_row and document")
            units = span_units(keep, eligible, self.span, groups)
            query = question if self.text_query == "question" else f"{question} {self.said(sender, state, question)}"
            scores = unit_row_scores(text, query, per_row, document, len(state), units, state.device)
            if self._fuse is not None:
                attention = self.scores(sender, state, question, per_row)
                scores = fused_row_scores([unit_ranks(attention, units), unit_ranks(scores, units)], units,
                                          len(state), self.fuse_k, state.device)
        budget = fanin_budget(len(state), self.ratio)
        if self.mass is not None:
            budget = mass_budget(scores, keep, self.mass, min(budget, fanin_budget(len(state), self.max_ratio)),
                                 budget, self.span, eligible, groups)
        ctx = None
        if self.context != "none" and groups is not None:
            if per_row is None or document is None:
                raise ValueError(f"context {self.context!r} reads the document's paragraphs: pass per_row and document")
            ctx = context_rows(groups, per_row, document, self.context)
        return select_rows(scores, budget, keep, self.span, eligible, groups, self.unit_floor, ctx, self.fill)

    def layout(self, sender: Agent, document: str, n_rows: int, prompt: str) -> tuple:
        """(per_row, eligible, groups) of a state of `n_rows` read from `prompt`: `document_rows` and `span_groups`."""
        per_row, eligible = document_rows(sender, document, n_rows, prompt)
        return per_row, eligible, self.span_groups(per_row, document)

    def span_groups(self, per_row: list, document: str) -> list[list[int]] | None:
        """The span units `choose` ranks for this document: None (fixed spans) or its sentences and lines."""
        return sentence_groups(per_row, document, 2 * self.span) if self.span_mode == "sentence" else None

    def check_senders(self, senders: Sequence[Agent], documents: Sequence[str], question: str) -> list[int]:
        """Each sender's prompt length, checked against its window before any sender reads."""
        pairs = self._pair(senders, documents)
        return sender_prompt_lengths([s for s, _ in pairs], [self.sender_prompt(d, question) for _, d in pairs],
                                     self.latent_steps)

    def check_window(self, senders: Sequence[Agent], documents: Sequence[str], receiver: Agent, question: str) -> None:
        """ContextOverflowError, before any sender reads, unless every sender's state and the largest message
        the budgets allow fit: per sender min(B, T - 1) document rows (at least one whole sentence, ≤ 2·span rows,
        under the unit floor) + its first row + G latent rows, then the receiver's prompt and answer; for
        "kv_reencoded" each sender's re-read of those rows after its slot's template text, too."""
        prompts = self.check_senders(senders, documents, question)
        for i, (sender, prompt) in enumerate(zip(senders, prompts)):
            self.check_reread(sender, f"sender {i}", prompt, question)
        self.check_receiver_window(prompts, receiver, question)

    def _max_rows(self, prompt: int) -> int:
        """The most document rows a sender whose prompt has `prompt` rows may send: min(B, prompt - 1)."""
        B = fanin_budget(prompt + self.latent_steps, self.ratio)
        if self.unit_floor and self.span_mode == "sentence" and (B < self.span or self.fill == "whole"):
            B = max(B, 2 * self.span)  # the unit floor may send one whole sentence of up to 2·span rows
        return min(B, prompt - 1)

    def check_reread(self, sender: Agent, label: str, prompt: int, question: str) -> None:
        """"kv_reencoded": the sender's re-read of its largest message after its slot's template text fits its
        window (nothing to check for the other encodings)."""
        if self.encoding == "kv_reencoded":
            pre = sender.slot_ids(sender.chat_text(MESSAGE_PROMPT.format(question=question)))[0]
            sender.check_window(**{f"{label} slot prompt": len(pre),
                                   "sent_rows": self._max_rows(prompt) + 1 + self.latent_steps})

    def check_receiver_window(self, prompts: Sequence[int], receiver: Agent, question: str) -> None:
        """The receiver's half of `check_window`, from the senders' prompt lengths (`check_senders`): what a
        transport checks on the receiver's node before any sender's node reads."""
        budget = sum(self._max_rows(prompt) for prompt in prompts)
        first, latent = len(prompts), len(prompts) * self.latent_steps
        if self.recompute_share:  # the receiver's attention must take the recompute's prepared mask
            check_blend(receiver)
        if self.encoding == "kv":  # the prompt continues after the attached rows
            prompt = len(receiver.kv_prompt_ids(question))  # kv_reencoded: attached inside the slot, as rows
        else:
            pre, post = receiver.slot_ids(receiver.chat_text(MESSAGE_PROMPT.format(question=question)))
            prompt = len(pre) + len(post)
        parts = {"budget_rows": budget, "first_rows": first, "latent_rows": latent, "prompt": prompt,
                 "max_new_tokens": self.max_new_tokens}
        if sum(parts.values()) > receiver.context_window:
            raise ContextOverflowError(sum(parts.values()), receiver.context_window, parts)

    def run(self, senders: Sequence[Agent], documents: Sequence[str], receiver: Agent, question: str) -> Outcome:
        self.check_window(senders, documents, receiver, question)
        parts, seconds, kept, timing = self.send(senders, documents, question)
        where = {receiver.device, *(p.device for p in parts if isinstance(p, KVState))}  # K/V placed where they lie
        t0 = now(*where)
        message = self.receive(receiver, question, parts)
        place_s = now(*where) - t0 if self.encoding in KV_ENCODINGS else 0.0  # re-rotating K/V is real work
        if self.encoding in KV_ENCODINGS:
            nbytes = sum(len(p.to_bytes()) for p in parts)  # each sender ships its selected rows' state
            details = {"message_rows": len(message), "kv_bytes": nbytes, "place_s": place_s}
        else:
            nbytes = message.nbytes if self.encoding == "rows" else message.token_id_nbytes
            details = {"message_rows": len(message), "rows_bytes": message.nbytes,
                       "token_id_bytes": message.token_id_nbytes}
        reply = self.reply(receiver, question, message)
        return Outcome(self.name, reply.text, nbytes, reply.context, tuple(seconds), reply.seconds + place_s,
                       {"senders": timing} | details, kept_spans=tuple(kept), read_seconds=self.reads_of(timing),
                       after_first=after_first(reply))

    def reads_of(self, timing: list[dict]) -> tuple[float, ...] | None:
        """Each sender's read seconds (`Outcome.read_seconds`): None when it read the question too (query-aware)."""
        return None if self.query_aware else tuple(t["read_s"] for t in timing)

    def receive(self, receiver: Agent, question: str, parts: Sequence) -> Rows | KVState:
        """The receiver's input from the senders' messages (in sender order): their rows, concatenated; for "kv",
        their states placed one after another (keys re-rotated: the receiver's prefix, or for "kv_reencoded" what
        it attaches in its message slot)."""
        return KVState.concat(parts) if self.encoding in KV_ENCODINGS else Rows.cat(parts)

    @property
    def recompute_share(self) -> float:
        """The share of attached rows the receiver recomputes: `recompute`, by default RECOMPUTE for "kv_blend" and 0
        for the others."""
        if self.recompute is not None:
            return self.recompute
        return RECOMPUTE if self.encoding == "kv_blend" else 0.0

    def reply(self, receiver: Agent, question: str, message: Rows | KVState):
        """The receiver's answer over `receive`'s message: re-prefilled rows, the read's K/V as its prefix, or
        K/V attached in its message slot (re-encoded by the senders, or the read's with a share recomputed here)."""
        if self.encoding in SLOT_KV:
            return receiver.answer_attached(question, message, max_new_tokens=self.max_new_tokens,
                                            recompute=self.recompute_share)
        return receiver.answer(question, message=message, max_new_tokens=self.max_new_tokens)

    def pack(self, sender: Agent, state: KVState, rows: torch.Tensor, per_row: list, document: str, index: int):
        """What sender `index` sends for its selected `rows` (timed as its selection; n = len(rows): the budgeted
        document rows plus the first row and the G latent rows, `always_kept`): the rows themselves, or for "kv" and
        "kv_blend" their K/V with keys re-rotated to positions 0..n−1, for "kv_reencoded" the K/V the sender computes
        re-reading them alone in the message slot (`Agent.encode_rows`, positions 0..n−1)."""
        if self.encoding in READ_KV:
            return state.select(rows).compact()
        if self.encoding == "kv_reencoded":
            return sender.encode_rows(sender.rows(state.select(rows)))
        return sender.rows(state.select(rows))

    def send(self, senders: Sequence[Agent], documents: Sequence[str], question: str) -> tuple[list, list, list, list]:
        """Each sender reads, scores and selects: (what each sends (`pack`), its seconds, its kept document
        spans per row, its timing record)."""
        sent = [self.send_one(sender, doc, question, i) for i, (sender, doc) in enumerate(self._pair(senders, documents))]
        return [x.part for x in sent], [x.seconds for x in sent], [x.kept for x in sent], [x.timing for x in sent]

    def send_one(self, sender: Agent, document: str, question: str, index: int) -> Sent:
        """Sender `index` reads, scores and selects (`Sent`). The distributed runner calls this where the sender
        lives, so a sender does the same work in process and on a node."""
        for text in (self._fuse, self._selector):  # an encoder loads once, before any question's clock
            if isinstance(text, TextSelector):
                text.prepare()
        r = self.sender_read(sender, document, question)
        state, background_s = r.state, 0.0
        if self.calibration == "generic":  # query-blind: part of the read (~0 s once this state has it)
            tb = now(sender.device)
            self.background(sender, state)
            background_s = now(sender.device) - tb
        # Where the document sits in the state's rows and its sentence units depend on the prompt, not on the
        # question (unless it is in the prompt: query_aware): part of the read, held with it across questions.
        prompt = self.sender_prompt(document, question)
        (per_row, eligible, groups), layout_s, _ = held_value(
            ("index", "layout", sender.uid, len(state), self.span_mode, self.span, text_key(prompt),
             text_key(document)),  # the agent (uid) fixes its chat template: no render needed to key it
            lambda: self.layout(sender, document, len(state), prompt), sender.device)
        t1 = now(sender.device)
        t0 = t1 - r.seconds - background_s - layout_s  # charged the read it would pay alone, shared or not
        rows = self.choose(sender, state, question, eligible, groups, per_row, document)
        part = self.pack(sender, state, rows, per_row, document, index)
        # Press baselines re-run the prefill to record scores a deployed sender records while reading:
        # that re-run is not charged, the scoring inside it is.
        t2 = now(sender.device) - rerun_seconds(self.selector_for(per_row))
        doc_rows = sum(1 for x in rows.tolist() if x < len(per_row) and per_row[x] is not None)
        timing = {"read_s": r.seconds + background_s + layout_s, "background_s": background_s, "layout_s": layout_s,
                  "select_s": t2 - t1,
                  "rows": len(state), "sent": len(rows), "sent_document_rows": doc_rows,
                  "shared_read": r.shared}  # sent: + first, latent
        if self.probe:
            timing["probe"] = self.said(sender, state, question)  # what the sender began to answer
        return Sent(part, t2 - t0, kept_document_spans(per_row, rows), timing, state.positions[rows].tolist())

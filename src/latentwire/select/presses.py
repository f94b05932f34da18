"""Receiver-agnostic KV-compression baselines from kvpress 0.5.5, as latentwire selectors
(docs/methods.md#kvpress-selectors).

kvpress prunes a cache during prefill: a forward hook on every attention layer calls the press's
`compress()`, which for a `ScorerPress` computes `score(module, hidden_states, keys, values,
attentions, kwargs) -> (B, H_kv, T)` and keeps the top-k pairs per layer and KV head. Here the same
scorers *record* instead of prune: `recording_press` wraps a kvpress press, stores each layer's
scores and returns keys/values unchanged, so the cache is untouched. The scores then go through the
same `select_rows` span/budget rule as CacheBack, so comparisons differ only in the scores.

From kvpress (its own scoring code, unchanged):

    name      kvpress press                         score of row t in one layer / KV head
    snapkv    SnapKVPress(window_size, kernel_size)  attention of the last `window_size` prefill tokens
                                                     (the sender's own observation window) on t, mean
                                                     over those queries, avg-pooled (kernel_size), mean
                                                     over the query heads of the KV head; the window's
                                                     own rows get that layer's max + 1 (always kept)
    h2o       ObservedAttentionPress                 attention every prefill query pays to t, summed and
                                                     divided by the number of queries that see t (T - t),
                                                     mean over the query heads of the KV head. Needs the
                                                     attention weights: the recording prefill runs with
                                                     eager attention (switched, then restored)
    tova      TOVAPress                              attention of the last prefill token on t, mean over
                                                     all query heads; the last row gets max + 1
    knorm     KnormPress                             -‖k_t‖ (the key's L2 norm, negated)
    chunkkv   ChunkKVPress(SnapKVPress | KnormPress) the inner scorer's (1, H_kv, T) scores summed over
                                                     KV heads, then averaged inside chunks of
                                                     `chunk_length` rows counted from row 0 (a last
                                                     partial chunk is one chunk) -- exactly how
                                                     ChunkKVPress.compress forms the chunk scores it
                                                     ranks; every row carries its chunk's score
    kvzip     KVzipPress(chunk_size, plus)           max, over the reconstruction queries and the query
                                                     heads of the KV head, of the attention paid to t
                                                     while the model re-reads the context ("Repeat the
                                                     previous context exactly." + the context again);
                                                     rows of the chat-template prefix are not scored (0)

ChunkKVPress has no `score()` (it ranks chunks inside `compress()`), so `chunk_row_scores` repeats
its chunk formation; a unit test pins that the top chunks of those scores are the rows
ChunkKVPress.compress keeps. latentwire's span rule then ranks its own spans (of the candidate rows,
after the always-kept ones) by the mean of these piecewise-constant scores: chunks and spans are
not aligned, and need not be -- the chunk scores are the baseline, the spans the common protocol.

Aggregation into one score per row: kvpress prunes each (layer, KV head) independently (KVzip ranks
all layers' pairs together), so a per-row selector has to aggregate. Every selector here takes the
mean over KV heads, then the mean over the scored layers, in float64:

    score_t = mean_{l ∈ global layers} mean_{h < H_kv} s[l, h, t]

(for knorm: -mean_{l,h} ‖k_{l,h,t}‖; chunkkv: the mean over layers of the per-layer chunk score.)

Which rows are scored: the state's token rows (`token_ids >= 0`, in row order) -- the sender's
prefill. Latent rows have no prefill score; they get the maximum score of the token rows (finite,
so scores stay comparable; `always_kept` keeps them whatever their score anyway). A state with
fewer than two token rows has nothing to rank: its scores are all zero.

How the scores are obtained: the recording is a prefill of the state's token ids at positions
0..n-1 with the press's hooks active -- numerically the sender's own prefill (the test pins that
knorm's recorded keys are the state's keys). A deployed sender would record these scores during its
first prefill, at the cost of the scoring alone, so benchmark timings of these baselines must
exclude the re-run: every selector exposes `last_seconds` (wall time of the last recording pass,
prefill included: subtract it) and `last_press_seconds` (time inside kvpress's scoring: what a
deployed sender would add to its prefill). KVzip is different: it scores *after* prefill, by
re-reading the context over the finished cache, so it runs over the state's own cache of its token
rows (no re-run; `last_seconds` is 0.0) and its reconstruction passes are its real cost
(`last_press_seconds`).

The state need not be a plain prefill: after `select`/`concat` its token rows are re-prefilled as
one sequence at positions 0..n-1, which is then an approximation of what each sender saw.

Attention implementation: left as the model has it, except for h2o (eager for its pass, then
restored). Under eager attention kvpress's SnapKV/TOVA read the observed weights, under sdpa they
recompute the window's attention from the hidden states; a test pins that both give the same
scores. kvpress's hook also installs `self_attn.rotary_emb` on every attention module and never
removes it; latentwire removes it after each pass, so scoring leaves the model as it was.

Hybrid models (Gemma3): kvpress's hook skips sliding-window layers only for
`Gemma3ForConditionalGeneration`; on `Gemma3ForCausalLM` (our models) it hooks them too. On a sliding
layer the cache holds only the last `window - 1` rows after prefill (measured on the tiny Gemma3,
window 8: keys (1, 1, 7, D) against 112 prefill tokens), so knorm scores 7 rows, snapkv/tova
computed from the eager attention matrix return 112 scores that do not index the 7 cached rows,
and h2o fails with a shape error. Scores are therefore recorded and aggregated on global layers
only -- what kvpress itself does for Gemma3, and what CacheBack does (docs/methods.md#cacheback-scores).

Knorm on Gemma3 (and any model with a per-head key RMSNorm, like Qwen3) is nearly degenerate:
keys are RMS-normalised before RoPE (which keeps norms), so ‖k‖ varies only through the norm's
per-dimension weights (on the random-weight tiny Gemma3 all rows score -√D up to ~1e-5). That is
kvpress's scorer as published; it is kept, not patched.

kvpress is imported on first use (`_kv()`): importing it costs ~2.5 s, which every process that
imports `latentwire.select` (the CLI, every protocol) would otherwise pay. The first `score` call
pays it instead, outside `last_seconds`.

Native, not from kvpress:
  * streaming_llm (streaming_llm.py): needs no scores -- sinks plus recency is a function of
    position alone. kvpress's StreamingLLMPress is also position-only (ones, with the rows after the
    sinks zeroed), so it would be equivalent and would cost a model forward for nothing.
  * random (random_select.py): the floor; kvpress's RandomPress is the same idea.

Left out:
  * FastKVzipPress, KVzapPress, DuoAttentionPress, ExpectedAttentionPress with stats: they load
    trained gates / statistics from the Hugging Face hub at run time (this project runs offline).
  * kvzip on Gemma3: KVzipPress refuses every Gemma3 model ("KVzipPress is not supported for
    Gemma3ForCausalLM"); its reconstruction hook reads the context from every layer's cache, which
    sliding layers do not keep. The selector raises `PressUnsupportedError` for any state with
    sliding layers rather than inventing a variant kvpress does not have.

kvzip's driver: `KVzipPress.__call__` loads the tokenizer with
`AutoTokenizer.from_pretrained(model.config.name_or_path)` (absent for in-memory models) and scores
only when `compression_ratio > 0`, after which it marks pairs for masking on the model's attention
modules. `kvzip_scores` therefore sets up the press as `__call__` does, but with the agent's own
tokenizer, and calls kvpress's `_perform_kvzip_compression` at compression ratio 0: the
reconstruction passes and `score_kvzip` run unchanged, the final masking step is a no-op, and the
scores are read from `press.score_val`. The chat-template prefix is skipped only when the state's
token ids start with it (a state prefilled with a system turn is scored whole); a latentwire
prefill ends with the generation prompt, so those last template tokens are re-read as part of the
context. This uses a private kvpress method: kvpress is pinned to
0.5.5 in pyproject.toml.
"""
from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import torch

from ..agent import Agent
from ..errors import PressUnsupportedError  # noqa: F401  (re-exported: callers catch it from here)
from ..state import KVState
from .base import Selector, register
from .press_recording import (CHUNKKV_SCORERS, _kv, _refuse_sliding, _with_latents, chunk_row_scores,  # noqa: F401
                              kvpress_installed, kvzip_scores, require_kvpress, record_prefill_scores, recording_press, refuse_rope_kvpress_cannot_rotate)
from ..errors import ConfigError

if TYPE_CHECKING:
    from kvpress import BasePress


@dataclass
class PressSelector(Selector):
    """A selector whose scores are a kvpress scorer's, recorded during a prefill of the state's tokens."""

    extra: ClassVar[str | None] = "kvpress"
    check_installed = staticmethod(require_kvpress)
    attn_implementation: ClassVar[str | None] = None  # forced for the recording pass (None: the model's)
    rotates_queries: ClassVar[bool] = False  # kvpress rotates queries itself (SnapKV's window attention)
    # Timing of the last `score` call (see the module docstring): subtract `last_seconds` from a
    # benchmark's sender time; `last_press_seconds` is the scoring a deployed sender would still pay.
    last_seconds: float = field(default=0.0, init=False, repr=False, compare=False)
    last_press_seconds: float = field(default=0.0, init=False, repr=False, compare=False)

    @abstractmethod
    def make_press(self, n_tokens: int) -> "BasePress":
        """The kvpress press to record, for a prefill of n_tokens (≥ 2) tokens."""

    def score(self, agent: Agent, state: KVState, query: str) -> torch.Tensor:
        _kv()  # without the kvpress extra: MissingExtraError before any compute, whatever the state's size
        if self.rotates_queries:
            refuse_rope_kvpress_cannot_rotate(agent, self.name)
        n = int((~state.is_latent).sum())
        if n < 2:  # nothing to rank
            agent.geometry.check_same(state.geometry)
            self.last_seconds = self.last_press_seconds = 0.0
            return torch.zeros(len(state), dtype=torch.float64, device=state.device)
        scores, self.last_seconds, self.last_press_seconds = record_prefill_scores(
            agent, state, self.make_press(n), self.attn_implementation)
        return _with_latents(state, scores)


def _check_snapkv(window_size: int, kernel_size: int) -> None:
    if window_size < 1:
        raise ValueError(f"window_size must be ≥ 1, got {window_size}")
    if kernel_size < 1 or kernel_size % 2 == 0:
        raise ValueError(f"kernel_size must be a positive odd number (pooling keeps the length), got {kernel_size}")


def _snapkv_window(window_size: int, n_tokens: int) -> int:
    """kvpress asserts n > window_size; a shorter prefill observes its last half instead."""
    return window_size if n_tokens > window_size else max(1, n_tokens // 2)


@register
@dataclass
class SnapKVSelector(PressSelector):
    name = "snapkv"
    rotates_queries: ClassVar[bool] = True
    window_size: int = 64  # kvpress default: the last 64 prefill tokens are the observation queries
    kernel_size: int = 5  # kvpress default: avg-pool width along positions

    def __post_init__(self):
        _check_snapkv(self.window_size, self.kernel_size)

    def make_press(self, n_tokens: int) -> "BasePress":
        return _kv().SnapKVPress(window_size=_snapkv_window(self.window_size, n_tokens), kernel_size=self.kernel_size)


@register
@dataclass
class H2OSelector(PressSelector):
    name = "h2o"
    attn_implementation = "eager"  # ObservedAttentionPress reads the attention weights

    def make_press(self, n_tokens: int) -> "BasePress":
        return _kv().ObservedAttentionPress()


@register
@dataclass
class TOVASelector(PressSelector):
    name = "tova"
    # Under sdpa kvpress has no attention weights for TOVA and scores with SnapKV's one-row window attention,
    # rotating the query itself: refused where that rotation is wrong, as SnapKV is.
    rotates_queries: ClassVar[bool] = True

    def make_press(self, n_tokens: int) -> "BasePress":
        return _kv().TOVAPress()


@register
@dataclass
class KnormSelector(PressSelector):
    name = "knorm"

    def make_press(self, n_tokens: int) -> "BasePress":
        return _kv().KnormPress()


@register
@dataclass
class ChunkKVSelector(PressSelector):
    name = "chunkkv"
    scorer: str = "snapkv"  # the ScorerPress ChunkKVPress wraps: "snapkv" or "knorm"
    chunk_length: int = 20  # kvpress default
    window_size: int = 64  # snapkv only
    kernel_size: int = 5  # snapkv only

    @property
    def rotates_queries(self) -> bool:  # SnapKV inside rotates queries; knorm reads keys only
        return self.scorer == "snapkv"

    def __post_init__(self):
        if self.scorer not in CHUNKKV_SCORERS:
            raise ConfigError(f"scorer must be one of {CHUNKKV_SCORERS}, got {self.scorer!r}")
        if self.chunk_length < 1:
            raise ConfigError(f"chunk_length must be ≥ 1, got {self.chunk_length}")
        _check_snapkv(self.window_size, self.kernel_size)

    def make_press(self, n_tokens: int) -> "BasePress":
        kv = _kv()
        inner = (kv.SnapKVPress(window_size=_snapkv_window(self.window_size, n_tokens), kernel_size=self.kernel_size)
                 if self.scorer == "snapkv" else kv.KnormPress())
        return kv.ChunkKVPress(press=inner, chunk_length=self.chunk_length)


@register
@dataclass
class KVzipSelector(Selector):
    name = "kvzip"
    extra: ClassVar[str | None] = "kvpress"
    check_installed = staticmethod(require_kvpress)
    chunk_size: int = 2048  # kvpress default: context tokens reconstructed per replay pass
    plus: bool = False  # KVzip+ normalisation (divide by ‖h‖, multiply by ‖W_O v‖)
    last_seconds: float = field(default=0.0, init=False, repr=False, compare=False)  # always 0: no re-run
    last_press_seconds: float = field(default=0.0, init=False, repr=False, compare=False)

    def __post_init__(self):
        if self.chunk_size < 1:
            raise ConfigError(f"chunk_size must be ≥ 1, got {self.chunk_size}")
        if not isinstance(self.plus, bool):
            raise ConfigError(f"plus must be a bool, got {self.plus!r}")

    def score(self, agent: Agent, state: KVState, query: str) -> torch.Tensor:
        self.last_seconds = self.last_press_seconds = 0.0
        _kv()  # without the kvpress extra: MissingExtraError before any compute
        agent.geometry.check_same(state.geometry)
        _refuse_sliding(agent, state)
        refuse_rope_kvpress_cannot_rotate(agent, self.name)
        if int((~state.is_latent).sum()) < 2:  # nothing to rank
            return torch.zeros(len(state), dtype=torch.float64, device=state.device)
        scores, self.last_press_seconds = kvzip_scores(agent, state, self.chunk_size, self.plus)
        return _with_latents(state, scores)

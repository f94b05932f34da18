"""LCF's two-stage pooler over variable-length spans, for the LCF-X baseline (`lcfx.py`).

    stage 0  spans:   a layer's T rows -> n spans: runs of consecutive positions (a gap in the positions
                      is a segment boundary), each cut into windows of at most `width` rows
    stage 1  per span: one learned query per layer and KV head attends over the span's rows only
                      (padding masked) -> one summary row per span               (L, H, n, 2D)
    stage 2  slots:   k learned queries per layer and KV head attend over the n span summaries
                      -> k slots                                                 (L, H, k, 2D)

What is LCF's and what is ours. LCF (arXiv 2605.22863): only its abstract and the opening of its
introduction were reachable from here (keys and values are jointly translated and compressed into a
small adapter; the sharer transmits a *summary* of its cache). The two stages over variable-length
spans are the XKV paper's characterisation of LCF's pooler (arXiv 2608.20617: XKV pools N -> k "in one
vectorised step instead of two hard-to-batch stages over variable-length spans"). Our choices: spans
from position runs and a fixed maximum width (the translator sees no tokenizer, so no sentence
boundaries), one attention query per span and layer/head in stage 1, dot-product slot attention over
span summaries in stage 2, the same RMS normalisation and output layout as XKV's `SlotPool`
(so the rest of LCF-X is unchanged). Stage 1 is batched by padding spans to the longest one; the
span layout is data-dependent, so it costs a host sync per layer group and the padded rows' work.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..state import Geometry, KVState
from .layers import LayerGroup, rms
from ..errors import ConfigError, StateFormatError


@dataclass(frozen=True, eq=False)
class Spans:
    """n variable-length spans over T rows, padded to the longest (m rows)."""

    index: torch.Tensor  # (n, m) int64: the row behind each span slot (padding repeats the span's last row)
    mask: torch.Tensor  # (n, m) bool: True on real rows; every span has ≥ 1
    lengths: torch.Tensor  # (n,) int64: rows per span

    def __post_init__(self):
        if self.index.dim() != 2 or self.index.dtype != torch.int64:
            raise ConfigError(f"spans.index: want (n, m) int64, got {tuple(self.index.shape)} {self.index.dtype}")
        if self.mask.shape != self.index.shape or self.mask.dtype != torch.bool:
            raise ConfigError(f"spans.mask: want {tuple(self.index.shape)} bool, "
                             f"got {tuple(self.mask.shape)} {self.mask.dtype}")
        if self.lengths.shape != self.index.shape[:1] or self.lengths.dtype != torch.int64:
            raise ConfigError(f"spans.lengths: want ({self.index.shape[0]},) int64, got {tuple(self.lengths.shape)}")


def spans(positions: torch.Tensor, width: int) -> Spans:
    """Split rows at `positions` (T,) increasing into runs of consecutive positions, each cut into windows
    of ≤ `width` rows. One host sync (n, m: the padded shape depends on the data)."""
    if width < 1:
        raise ConfigError(f"spans: width must be ≥ 1, got {width}")
    T, device = positions.shape[0], positions.device
    if T == 0:
        raise StateFormatError("spans: no rows to pool (the state is empty)")
    t = torch.arange(T, dtype=torch.int64, device=device)  # (T,)
    new_seg = torch.ones(T, dtype=torch.bool, device=device)  # (T,) True where a run starts
    new_seg[1:] = positions[1:] != positions[:-1] + 1
    seg_start = torch.cummax(torch.where(new_seg, t, torch.zeros_like(t)), dim=0).values  # (T,) first row of its run
    new_span = new_seg | ((t - seg_start) % width == 0)  # (T,)
    starts = t[new_span]  # (n,) first row of each span
    lengths = torch.diff(starts, append=torch.tensor([T], dtype=torch.int64, device=device))  # (n,)
    m = int(lengths.max())  # the host sync
    j = torch.arange(m, dtype=torch.int64, device=device)  # (m,)
    mask = j < lengths[:, None]  # (n, m)
    index = starts[:, None] + torch.minimum(j, lengths[:, None] - 1)  # (n, m)
    return Spans(index, mask, lengths)


def pool_spans(x: torch.Tensor, query: torch.Tensor, sp: Spans) -> torch.Tensor:
    """Stage 1: each span's rows -> one row. x (L, H, T, 2D) [keys; values]; query (L, H, D) scores the keys.
    Returns (L, H, n, 2D): per span the attention-weighted mean of its own rows (padding gets weight 0)."""
    D = query.shape[-1]
    rows = x[:, :, sp.index]  # (L, H, n, m, 2D)
    scores = torch.einsum("lhd,lhnmd->lhnm", query, rows[..., :D]) / math.sqrt(D)
    scores = scores.masked_fill(~sp.mask, float("-inf"))  # every span has a real row: no all -inf row
    return torch.einsum("lhnm,lhnmc->lhnc", torch.softmax(scores, dim=-1), rows)  # (L, H, n, 2D)


def pool_slots(summaries: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    """Stage 2: k slot queries over the n span summaries. summaries (L, H, n, 2D); query (L, H, k, D).
    Returns (L, H, k, 2D)."""
    D = query.shape[-1]
    scores = torch.einsum("lhsd,lhnd->lhsn", query, summaries[..., :D]) / math.sqrt(D)  # (L, H, k, n)
    return torch.einsum("lhsn,lhnc->lhsc", torch.softmax(scores, dim=-1), summaries)


class SpanSlotPool(nn.Module):
    """LCF's pooler for one cache: per layer and KV head, T rows -> spans -> `slots` slots.

    Output (L, H * slots * 2D), RMS-normalised per layer, the layout of XKV's `SlotPool`.
    """

    def __init__(self, geometry: Geometry, slots: int, width: int):
        super().__init__()
        L, H, D = geometry.num_layers, geometry.num_kv_heads, geometry.head_dim
        self.width = width
        self.span_queries = nn.Parameter(torch.randn(L, H, D) / math.sqrt(D))  # (L, H, D) stage 1
        self.slot_queries = nn.Parameter(torch.randn(L, H, slots, D) / math.sqrt(D))  # (L, H, k, D) stage 2
        self.out_dim = H * slots * 2 * D

    def forward(self, state: KVState, groups: list[LayerGroup]) -> torch.Tensor:
        """(L, H * k * 2D) in layer order. groups: `layer_groups(state)` (keys without RoPE)."""
        parts = []
        for g in groups:
            D = g.kv.shape[-1] // 2
            x = rms(g.kv.unflatten(-1, (2, D))).flatten(-2)  # (L_g, H, T, 2D): keys and values each RMS-normalised
            sp = spans(_group_positions(state, g), self.width)
            summaries = pool_spans(x, self.span_queries[g.index], sp)  # (L_g, H, n, 2D)
            parts.append(pool_slots(summaries, self.slot_queries[g.index]).flatten(1))  # (L_g, H k 2D)
        order = torch.cat([g.index for g in groups])  # (L,) the layer behind each stacked row
        return rms(torch.cat(parts)[torch.argsort(order)])  # (L, H k 2D)


def _group_positions(state: KVState, g: LayerGroup) -> torch.Tensor:
    """(T,) the rows' positions, shared by the group's layers (sliding layers of one row count hold the same rows)."""
    first = state.layers[g.layers[0]].positions
    if state.geometry.layer_types[g.layers[0]] == "sliding":
        for i in g.layers[1:]:
            if not torch.equal(state.layers[i].positions, first):
                raise StateFormatError(f"lcfx: sliding layers {g.layers[0]} and {i} hold different rows")
    return first


def n_params(module: nn.Module) -> int:
    """Trainable parameters of `module` (e.g. to print LCF-X ÷ XKV)."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)

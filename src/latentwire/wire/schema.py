"""What a wire message holds, and the checks `encode` and `decode` share.

Constants (format name, versions, encodings, dtypes, header fields, limits), the typed error, the
`Selection` and `TokenRows` value types, the content digest, and the header / tensor checks that
both directions run, so `encode` refuses exactly what `decode` would reject. Schema: docs/wire.md.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Callable, Union

import torch

from ..errors import StateFormatError
from ..merge.fragments import FragmentSet
from ..message import Rows, Spans
from ..state import Geometry, KVState, canonical_json

FORMAT = "latentwire.message"
VERSION = 2  # the newest header version this build reads and writes (it reads every version from 1)
ENCODING_VERSIONS = {"rows": 1, "token_ids": 1, "kv": 1, "text": 1, "fragments": 1, "spans": 2, "spans_latent": 2}
ENCODINGS = tuple(ENCODING_VERSIONS)
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
FIELDS = ("format", "version", "protocol", "sender", "encoding", "dtype", "positions", "selection", "digest")
MAX_HEADER_BYTES = 8 << 20  # the safetensors JSON header (tensor table + our metadata)
MAX_LAYERS = 1024
DIGEST_LABEL = b"latentwire.message/1 digest\n"
_HEX = frozenset("0123456789abcdef")


class WireFormatError(StateFormatError):
    """A wire message is malformed; `field` names what was wrong (e.g. "header.positions", "tensors.embeds")."""

    def __init__(self, field: str, reason: str):
        self.field, self.reason = field, reason
        super().__init__(f"{field}: {reason}")

    def __reduce__(self):  # picklable across processes despite the two-argument constructor
        return type(self), (self.field, self.reason)


def _want(ok: bool, field: str, reason: str) -> None:
    if not ok:
        raise WireFormatError(field, reason)


@dataclass(frozen=True)
class Selection:
    """How the sender chose the rows: selector name, row budget B and compression ratio r (None: not a ratio)."""

    method: str
    budget: int
    ratio: float | None = None

    def __post_init__(self):
        _check_selection({"method": self.method, "budget": self.budget,
                          "ratio": None if self.ratio is None else _float(self.ratio)}, "selection")
        if self.ratio is not None:
            object.__setattr__(self, "ratio", float(self.ratio))

    def to_json(self) -> dict:
        return {"method": self.method, "budget": self.budget, "ratio": self.ratio}


@dataclass(frozen=True, eq=False)
class TokenRows:
    """Rows sent as token ids: the receiver looks token rows up in its own embedding table.

    Only latent rows travel as vectors. `to_rows(agent.embed)` rebuilds exactly the `Rows` that
    `agent.rows(state)` gave the sender when both run the same model (the premise of this encoding).
    """

    token_ids: torch.Tensor  # (n,) int64, -1 marks a latent row
    latents: torch.Tensor  # (n_latent, hidden): the latent rows' embeddings, in row order
    space: tuple[str, str] | None = None  # (model, tokenizer), as in Rows

    def __post_init__(self):
        ids, lat = self.token_ids, self.latents
        if ids.dtype != torch.int64 or ids.dim() != 1 or lat.dim() != 2:
            raise StateFormatError(f"token rows: want token_ids (n,) int64 and latents (n_latent, hidden), got "
                                   f"{tuple(ids.shape)} {ids.dtype} / {tuple(lat.shape)}")
        n_lat = int((ids == -1).sum())
        if lat.shape[0] != n_lat:
            raise StateFormatError(f"token rows: {n_lat} latent rows (id -1) but {lat.shape[0]} latent vectors")

    def __len__(self) -> int:
        return self.token_ids.shape[0]

    @classmethod
    def from_rows(cls, rows: Rows) -> "TokenRows":
        return cls(rows.token_ids, rows.embeds[rows.token_ids == -1], rows.space)

    def to_rows(self, embed: Callable[[torch.Tensor], torch.Tensor]) -> Rows:
        """Rows with token rows from `embed` (ids (k,) -> (k, hidden), e.g. `agent.embed`) and latent rows as sent."""
        rows = embed(self.token_ids.clamp_min(0)).clone()  # (n, hidden), on the embedding's device
        ids = self.token_ids.to(rows.device, copy=True)
        rows[ids == -1] = self.latents.to(rows.device, rows.dtype)
        return Rows(rows, ids, self.space)


Body = Union[Rows, TokenRows, KVState, str, FragmentSet, Spans]


def content_digest(header: dict, tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 over a label, the canonical header minus digest/signature, then each tensor in name order:
    canonical JSON [name, dtype, shape], a newline and its raw little-endian bytes (C order)."""
    h = hashlib.sha256(DIGEST_LABEL)
    h.update(canonical_json({k: v for k, v in header.items() if k not in ("digest", "signature")}).encode())
    for name in sorted(tensors):
        t = tensors[name]
        h.update(b"\n" + canonical_json([name, str(t.dtype).removeprefix("torch."), list(t.shape)]).encode() + b"\n")
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()



def _dtype_of(obj, kind: str) -> str | None:
    t = {"rows": lambda: obj.embeds, "token_ids": lambda: obj.latents, "kv": lambda: obj.latents,
         "spans_latent": lambda: obj.latents}.get(kind)
    return None if t is None else str(t().dtype).removeprefix("torch.")


def _header(protocol, sender: Geometry, kind, dtype, positions, selection) -> dict:
    return {"format": FORMAT, "version": ENCODING_VERSIONS[kind], "protocol": protocol,
            "sender": {"model": sender.model, "tokenizer": sender.tokenizer, "geometry": sender.to_json()},
            "encoding": kind, "dtype": dtype, "positions": None if positions is None else list(positions),
            "selection": None if selection is None else selection.to_json()}


def _short(v) -> str:
    """An untrusted header value for an error message: short, and never a deep repr."""
    return repr(v[:40]) if isinstance(v, str) else repr(v) if isinstance(v, (int, float, bool, type(None))) \
        else type(v).__name__



# -- checks shared by encode and decode ---------------------------------------------------------
def _check_fields(header: dict) -> Geometry:
    """Every header field but format, version, digest and signature (shared by encode and decode); the sender."""
    p = header["protocol"]
    _want(_name(p), "header.protocol", "want a non-empty Unicode string (≤ 200 chars)")
    s = header["sender"]
    _want(isinstance(s, dict) and sorted(s) == ["geometry", "model", "tokenizer"], "header.sender",
          "want an object with exactly model, tokenizer, geometry")
    g = _geometry(s)
    for k in ("model", "tokenizer"):
        _want(_name(s[k]), f"header.sender.{k}", "want a non-empty Unicode string (≤ 200 chars)")
        _want(s[k] == getattr(g, k), f"header.sender.{k}", "differs from header.sender.geometry")
    kind = header["encoding"]
    _want(kind in ENCODINGS, "header.encoding", f"want one of {list(ENCODINGS)}, got {_short(kind)}")
    dtype = header["dtype"]
    if kind in ("text", "fragments", "spans"):
        _want(dtype is None, "header.dtype", f"want null for {kind}")
    else:
        _want(isinstance(dtype, str) and dtype in DTYPES, "header.dtype",
              f"want one of {list(DTYPES)}, got {_short(dtype)}")
    pos = header["positions"]
    if kind in ("rows", "token_ids"):
        _want(isinstance(pos, list) and all(type(x) is int and x >= 0 for x in pos), "header.positions",
              "want a list of non-negative integers")
        _want(all(a < b for a, b in zip(pos, pos[1:])), "header.positions", "must be strictly increasing")
    else:
        _want(pos is None, "header.positions", f"want null for {kind} (only rows / token_ids carry positions)")
    if header["selection"] is not None:
        _check_selection(header["selection"], "header.selection")
    return g


def _name(s) -> bool:
    """A non-empty string of at most 200 characters that is valid Unicode (no lone surrogates)."""
    if not isinstance(s, str) or not 0 < len(s) <= 200:
        return False
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_selection(sel, where: str) -> None:
    _want(isinstance(sel, dict) and sorted(sel) == ["budget", "method", "ratio"], where,
          "want null or an object with exactly method, budget, ratio")
    _want(_name(sel["method"]), f"{where}.method", "want a non-empty Unicode string (≤ 200 chars)")
    _want(type(sel["budget"]) is int and sel["budget"] >= 0, f"{where}.budget", "want an integer ≥ 0")
    r = sel["ratio"]
    _want(r is None or (type(r) is float and math.isfinite(r) and r >= 1), f"{where}.ratio",
          "want null or a finite number ≥ 1 written with a fraction (e.g. 16.0)")


def _float(x):
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else x


def _geometry(sender: dict) -> Geometry:
    where = "header.sender.geometry"
    d = sender["geometry"]
    _want(isinstance(d, dict), where, "want an object")
    try:
        g = Geometry.from_json(d)
        same = canonical_json(g.to_json()) == canonical_json(d)
    except (StateFormatError, OverflowError, RecursionError, ValueError) as e:
        raise WireFormatError(where, f"malformed ({str(e)[:200]})") from None
    _want(same, where, "not in canonical form (a field has the wrong JSON type or extra keys)")
    _want(g.hidden_size > 0 and g.num_kv_heads > 0 and g.head_dim > 0, where, "sizes must be positive")
    _want(0 < g.num_layers <= MAX_LAYERS, where, f"want 1..{MAX_LAYERS} layers, got {g.num_layers}")
    _want(all(s.rotary_dim <= g.head_dim for _, s in g.rope), where, "rope rotates more dims than head_dim")
    return g


def _names(tensors: dict, want: set[str]) -> None:
    missing, extra = sorted(want - set(tensors)), sorted(set(tensors) - want)
    _want(not missing and not extra, "tensors", f"missing {missing[:5]}, unexpected {[e[:40] for e in extra[:5]]}")


def _tensor(t: torch.Tensor, name: str, dtype: torch.dtype, shape: tuple) -> None:
    """dtype and shape check; None in `shape` matches any size."""
    _want(t.dtype == dtype, f"tensors.{name}", f"want dtype {str(dtype)[6:]}, got {str(t.dtype)[6:]}")
    ok = t.dim() == len(shape) and all(w is None or w == h for w, h in zip(shape, t.shape))
    _want(ok, f"tensors.{name}", f"want shape {tuple('n' if w is None else w for w in shape)}, got {tuple(t.shape)}")


def _finite_values(t: torch.Tensor, name: str) -> None:
    bad = int((~torch.isfinite(t)).sum()) if t.numel() else 0
    _want(bad == 0, f"tensors.{name}", f"{bad} non-finite values (NaN/inf)")


def _ids(t: torch.Tensor, name: str) -> None:
    _want(t.numel() == 0 or int(t.min()) >= -1, f"tensors.{name}", "ids are ≥ 0, or -1 for a latent row")


def _check_tensors(kind: str, tensors: dict, g: Geometry, dtype_name: str | None, positions) -> None:
    """Names, dtypes, shapes, id ranges and finiteness (shared by encode and decode)."""
    dtype = DTYPES.get(dtype_name)
    if kind == "rows":
        _names(tensors, {"embeds", "token_ids"})
        _tensor(tensors["embeds"], "embeds", dtype, (None, g.hidden_size))
        n = tensors["embeds"].shape[0]
        _tensor(tensors["token_ids"], "token_ids", torch.int64, (n,))
        _ids(tensors["token_ids"], "token_ids")
        _finite_values(tensors["embeds"], "embeds")
    elif kind == "token_ids":
        _names(tensors, {"token_ids", "latents"})
        _tensor(tensors["token_ids"], "token_ids", torch.int32, (None,))
        n = tensors["token_ids"].shape[0]
        _ids(tensors["token_ids"], "token_ids")
        _tensor(tensors["latents"], "latents", dtype, (int((tensors["token_ids"] == -1).sum()), g.hidden_size))
        _finite_values(tensors["latents"], "latents")
    elif kind == "kv":
        _names(tensors, {"positions", "token_ids", "latents"} | {
            f"layers.{i}.{k}" for i in range(g.num_layers) for k in ("keys", "values", "positions")})
        _tensor(tensors["positions"], "positions", torch.int64, (None,))
        _tensor(tensors["token_ids"], "token_ids", torch.int64, (None,))
        _tensor(tensors["latents"], "latents", dtype, (None, g.hidden_size))
        _finite_values(tensors["latents"], "latents")
        for i in range(g.num_layers):
            _tensor(tensors[f"layers.{i}.positions"], f"layers.{i}.positions", torch.int64, (None,))
            for k in ("keys", "values"):
                _tensor(tensors[f"layers.{i}.{k}"], f"layers.{i}.{k}", dtype, (g.num_kv_heads, None, g.head_dim))
                _finite_values(tensors[f"layers.{i}.{k}"], f"layers.{i}.{k}")
        return
    elif kind in ("spans", "spans_latent"):
        _names(tensors, {"text", "spans", "document"} | ({"latents"} if kind == "spans_latent" else set()))
        _tensor(tensors["text"], "text", torch.uint8, (None,))
        _tensor(tensors["spans"], "spans", torch.int64, (None, 2))
        _tensor(tensors["document"], "document", torch.int64, (1,))
        _want(int(tensors["document"][0]) >= 0, "tensors.document", "want a document index ≥ 0")
        if kind == "spans_latent":
            _tensor(tensors["latents"], "latents", dtype, (None, g.hidden_size))
            _finite_values(tensors["latents"], "latents")
        return
    else:
        _names(tensors, {kind})
        _tensor(tensors[kind], kind, torch.uint8, (None,))
        return
    _want(len(positions) == n, "header.positions", f"{len(positions)} positions for {n} rows")

"""The wire format of a latent message: one safetensors payload whose metadata holds one JSON header.

    data = encode(rows, protocol="cacheback", sender_geometry=sender.geometry, positions=kept,
                  selection=Selection("cacheback", budget=94, ratio=16.0), signer=signer)
    msg = decode(data, expect=receiver.geometry, verify={signer.public_key})
    msg.body  # Rows | TokenRows | KVState | str | FragmentSet | Spans, by msg.encoding

Never pickle: tensors are safetensors, the header is canonical JSON (sorted keys, no whitespace).
`decode` is strict: anything malformed raises WireFormatError naming the field, a sender that does
not fit `expect` raises GeometryMismatchError, a missing/untrusted/bad signature SignatureError; no
other exception escapes and no partly checked object is returned. `encode` refuses what `decode`
would reject, and `encode(decode(data)) == data` for every `data` that `encode` produced.
Schema, digest and signature rules: docs/wire.md.

Versions: the header fields are the same in every version; a message carries the version of its
encoding (`ENCODING_VERSIONS`): version 1 for the original five, version 2 for the spans encodings
added with cross-model CacheBack. Version-1 messages are written byte for byte as before, so older
builds keep reading them, and an older build handed a spans message says "unsupported version".
"""
from __future__ import annotations

import hashlib
import json
import math
import operator
from dataclasses import dataclass, field
from typing import Callable, Union

import numpy
import safetensors.torch
import torch

from ..errors import ConfigError, GeometryMismatchError, LatentWireError, StateFormatError
from ..merge.fragments import Fragment, FragmentSet
from ..message import Rows, Spans
from ..state import Geometry, KVState, LayerKV, canonical_json
from .security import SIGNATURE_ALG, Signer, SignatureError, trusted_keys, verify_signature

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


@dataclass(frozen=True, eq=False)
class Message:
    """A decoded message: its body plus every header field, checked. Build one with `decode`."""

    body: Body
    protocol: str
    sender: Geometry
    encoding: str
    positions: tuple[int, ...] | None  # (n,) source row positions of rows / token_ids; None otherwise
    selection: Selection | None
    digest: str  # SHA-256 hex of the content (header without digest/signature + tensors)
    signature: dict | None = field(default=None, repr=False)  # the header's signature field, verified

    @property
    def signed_by(self) -> bytes | None:
        """The Ed25519 public key whose signature verified (32 bytes), None if unsigned."""
        return None if self.signature is None else bytes.fromhex(self.signature["public_key"])

    @property
    def dtype(self) -> str | None:
        return _dtype_of(self.body, self.encoding)

    @property
    def header(self) -> dict:
        head = _header(self.protocol, self.sender, self.encoding, self.dtype, self.positions, self.selection)
        return head | {"digest": self.digest} | ({"signature": self.signature} if self.signature else {})

    def to_bytes(self) -> bytes:
        """The same bytes again (the signature is kept, not re-made)."""
        return encode(self)


# -- encode -------------------------------------------------------------------------------------
def encode(obj, *, protocol: str | None = None, sender_geometry: Geometry | None = None, positions=None,
           selection: Selection | None = None, signer: Signer | None = None, encoding: str | None = None) -> bytes:
    """Serialise a message body (or re-serialise a decoded Message, keeping its signature unless `signer` is given).

    obj: Rows ("rows"; `encoding="token_ids"` sends ids + latent rows), TokenRows ("token_ids"), KVState
    ("kv"), str ("text"), Fragment / FragmentSet ("fragments"), Spans ("spans", or "spans_latent" when it
    carries latent rows). `positions`: the source row positions of rows / token_ids (default 0..n-1).
    `sender_geometry` defaults to the state's own for kv / fragments.
    """
    keep = None
    if isinstance(obj, Message):
        if any(x is not None for x in (protocol, sender_geometry, positions, selection, encoding)):
            raise ConfigError("encode(Message) takes its fields from the message; pass only `signer`")
        obj, protocol, sender_geometry, positions, selection, encoding, keep = (
            obj.body, obj.protocol, obj.sender, obj.positions, obj.selection, obj.encoding, obj.signature)
    if isinstance(obj, Fragment):
        obj = FragmentSet([obj])
    if isinstance(obj, Rows) and encoding == "token_ids":
        obj = TokenRows.from_rows(obj)
    kind = _encoding_of(obj)
    if encoding is not None and encoding != kind:
        raise ConfigError(f"encoding {encoding!r} cannot carry a {type(obj).__name__} (it is sent as {kind!r})")
    if sender_geometry is None and kind in ("kv", "fragments"):
        sender_geometry = obj.geometry
    if not isinstance(sender_geometry, Geometry):
        raise ConfigError(f"sender_geometry: want the sender's Geometry, got {type(sender_geometry).__name__}")
    if selection is not None and not isinstance(selection, Selection):
        raise ConfigError(f"selection: want a Selection, got {type(selection).__name__}")
    space = getattr(obj, "space", None)
    if space is not None and tuple(space) != (sender_geometry.model, sender_geometry.tokenizer):
        raise GeometryMismatchError(f"sender: rows were embedded by {space[0]} but sender_geometry is "
                                    f"{sender_geometry.model}")
    if kind in ("kv", "fragments") and getattr(obj, "geometry", None) is not None:
        obj.geometry.check_same(sender_geometry)
    if kind in ("rows", "token_ids"):
        positions = tuple(range(len(obj))) if positions is None else _as_positions(positions)
    elif positions is not None:
        raise ConfigError(f"positions: only rows / token_ids messages carry positions, not {kind}")
    header = _header(protocol, sender_geometry, kind, _dtype_of(obj, kind), positions, selection)
    _check_fields(header)
    tensors = _own(_tensors(obj, kind))
    _check_tensors(kind, tensors, sender_geometry, header["dtype"], positions)
    header["digest"] = content_digest(header, tensors)
    if signer is not None:
        if not isinstance(signer, Signer):
            raise ConfigError(f"signer: want a Signer, got {type(signer).__name__}")
        header["signature"] = signer.sign(header["digest"])
    elif keep is not None:
        header["signature"] = keep
    return safetensors.torch.save(tensors, metadata={"latentwire": canonical_json(header)})


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


def _encoding_of(obj) -> str:
    if isinstance(obj, Spans):
        return "spans" if obj.latents is None else "spans_latent"
    for kind, cls in (("rows", Rows), ("token_ids", TokenRows), ("kv", KVState), ("text", str),
                      ("fragments", FragmentSet)):
        if isinstance(obj, cls):
            return kind
    raise ConfigError(f"cannot encode a {type(obj).__name__}: want Rows, TokenRows, KVState, str, Fragment, "
                      "FragmentSet or Spans")


def _dtype_of(obj, kind: str) -> str | None:
    t = {"rows": lambda: obj.embeds, "token_ids": lambda: obj.latents, "kv": lambda: obj.latents,
         "spans_latent": lambda: obj.latents}.get(kind)
    return None if t is None else str(t().dtype).removeprefix("torch.")


def _header(protocol, sender: Geometry, kind, dtype, positions, selection) -> dict:
    return {"format": FORMAT, "version": ENCODING_VERSIONS[kind], "protocol": protocol,
            "sender": {"model": sender.model, "tokenizer": sender.tokenizer, "geometry": sender.to_json()},
            "encoding": kind, "dtype": dtype, "positions": None if positions is None else list(positions),
            "selection": None if selection is None else selection.to_json()}


def _tensors(obj, kind: str) -> dict[str, torch.Tensor]:
    if kind == "rows":
        return {"embeds": obj.embeds, "token_ids": obj.token_ids}
    if kind == "token_ids":
        ids = obj.token_ids
        _ids(ids, "token_ids")
        _want(len(ids) == 0 or int(ids.max()) < 2 ** 31, "tensors.token_ids", "ids ≥ 2**31 do not fit int32")
        return {"token_ids": ids.to(torch.int32), "latents": obj.latents}
    if kind == "kv":
        out = {"positions": obj.positions, "token_ids": obj.token_ids, "latents": obj.latents}
        for i, layer in enumerate(obj.layers):
            out |= {f"layers.{i}.keys": layer.keys, f"layers.{i}.values": layer.values,
                    f"layers.{i}.positions": layer.positions}
        return out
    if kind in ("spans", "spans_latent"):
        out = {"text": _utf8(obj.text), "spans": torch.tensor(obj.spans, dtype=torch.int64).reshape(-1, 2),
               "document": torch.tensor([obj.document], dtype=torch.int64)}  # host tensors, like the text
        return out | ({"latents": obj.latents} if kind == "spans_latent" else {})
    raw = obj.encode("utf-8") if kind == "text" else obj.to_bytes()
    return {kind: torch.from_numpy(numpy.frombuffer(raw, dtype=numpy.uint8).copy())}  # host bytes, empty or not


def _utf8(text: str) -> torch.Tensor:
    """(nbytes,) uint8 on the host: the UTF-8 bytes of `text`."""
    return torch.from_numpy(numpy.frombuffer(text.encode("utf-8"), dtype=numpy.uint8).copy())


def _own(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous CPU tensors, none sharing storage (safetensors refuses shared storage)."""
    out, seen = {}, set()
    for k, t in tensors.items():
        t = t.detach().cpu().contiguous()
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen and t.numel():
            t = t.clone()
        seen.add(t.untyped_storage().data_ptr())
        out[k] = t
    return out


def _as_positions(positions) -> tuple[int, ...]:
    if isinstance(positions, torch.Tensor):
        positions = positions.tolist()
    try:
        return tuple(operator.index(p) if not isinstance(p, bool) else p for p in positions)
    except TypeError as e:
        raise WireFormatError("header.positions", f"want integers ({e})") from None


def _short(v) -> str:
    """An untrusted header value for an error message: short, and never a deep repr."""
    return repr(v[:40]) if isinstance(v, str) else repr(v) if isinstance(v, (int, float, bool, type(None))) \
        else type(v).__name__


# -- decode -------------------------------------------------------------------------------------
def decode(data: bytes, *, expect: Geometry | tuple[str, str] | None = None, verify=None,
           require_signature: bool | None = None, device: torch.device | str | None = None) -> Message:
    """Strictly decode one message (see the module docstring for what raises what).

    expect: the receiver's Geometry (kv / fragments: every geometry field must match; rows / token_ids:
      model, tokenizer and hidden size) or its (model, tokenizer); text fits any receiver.
    verify: trusted Ed25519 public keys. A signature, when present, is always checked; with `verify` it
      must also come from a trusted key. require_signature (default: True iff `verify` is given)
      rejects unsigned messages.
    device: where the body's tensors go (the receiving model's device); None keeps them on the host,
      where they are decoded and checked.
    """
    trusted = None if verify is None else trusted_keys(verify)
    if require_signature is None:
        require_signature = trusted is not None
    if require_signature and not trusted:
        raise ConfigError("require_signature=True needs verify= (the trusted public keys)")
    header, tensors = _read(data)
    _check_version(header)
    digest = header["digest"]
    _want(isinstance(digest, str) and len(digest) == 64 and set(digest) <= _HEX, "header.digest",
          "want 64 lowercase hex characters (SHA-256)")
    _want(content_digest(header, tensors) == digest, "header.digest",
          "the content does not hash to it (corrupted or altered in transit)")
    _want("signature" not in header or isinstance(header["signature"], dict), "header.signature",
          "want an object when present (omit the field for an unsigned message)")
    _check_signature(header.get("signature"), digest, trusted, require_signature)
    sender = _check_fields(header)
    if expect is not None:
        _check_expect(sender, header["encoding"], expect)
    kind, positions = header["encoding"], header["positions"]
    positions = None if positions is None else tuple(positions)
    _check_tensors(kind, tensors, sender, header["dtype"], positions)
    body = _BODY[kind](tensors, sender)
    if device is not None:
        body = _to_device(body, torch.device(device))
    sel = header["selection"]
    msg = Message(body, header["protocol"], sender, kind, positions,
                  None if sel is None else Selection(sel["method"], sel["budget"], sel["ratio"]),
                  digest, header.get("signature"))
    again = msg.header
    for k in sorted(set(header) | set(again)):  # defence in depth: what decode accepts, encode writes back unchanged
        _want(k in header and k in again and canonical_json(again[k]) == canonical_json(header[k]), f"header.{k}",
              "not in canonical form")
    return msg


def _read(data) -> tuple[dict, dict[str, torch.Tensor]]:
    """Framing: safetensors' 8-byte length + JSON table, our one metadata entry, then the tensors."""
    _want(isinstance(data, (bytes, bytearray, memoryview)), "data", f"want bytes, got {type(data).__name__}")
    data = bytes(data)
    _want(len(data) >= 8, "payload", f"truncated: {len(data)} bytes, the header length alone takes 8")
    n = int.from_bytes(data[:8], "little")
    _want(n <= len(data) - 8, "payload", f"header length {n} exceeds the {len(data) - 8} bytes that follow "
          "(truncated, or not a safetensors payload)")
    _want(n <= MAX_HEADER_BYTES, "payload", f"header of {n} bytes exceeds the {MAX_HEADER_BYTES} byte limit")
    table = _json(data[8:8 + n], "payload.header")
    _want(isinstance(table, dict), "payload.header", f"want a JSON object, got {type(table).__name__}")
    try:  # as safetensors writes it: compact JSON, then spaces up to a multiple of 8 bytes
        compact = json.dumps(table, separators=(",", ":"), ensure_ascii=False).encode()
    except (ValueError, RecursionError):
        compact = b""
    pad = data[8 + len(compact):8 + n]
    _want(data[8:8 + len(compact)] == compact and n % 8 == 0 and len(pad) < 8 and pad == b" " * len(pad),
          "payload.header", "not in canonical form (compact JSON padded with spaces to 8 bytes)")
    end = 0
    for name, entry in table.items():  # data in table order, back to back (as written; no gaps, no aliasing)
        if name != "__metadata__":
            span = entry.get("data_offsets") if isinstance(entry, dict) else None
            ok = isinstance(span, list) and len(span) == 2 and all(type(x) is int for x in span) and span[0] == end
            _want(ok, "payload.header", f"tensor {name[:40]!r}: data_offsets must continue at byte {end}")
            end = span[1]
    meta = table.get("__metadata__")
    _want(isinstance(meta, dict) and list(meta) == ["latentwire"] and isinstance(meta["latentwire"], str),
          "metadata", "want exactly one entry, 'latentwire', holding the header as a JSON string")
    raw = meta["latentwire"]
    header = _json(raw, "metadata.latentwire")
    _want(isinstance(header, dict), "metadata.latentwire", f"want a JSON object, got {type(header).__name__}")
    try:
        canonical = canonical_json(header) == raw
    except (ValueError, RecursionError):
        canonical = False
    _want(canonical, "metadata.latentwire", "not canonical JSON (sorted keys, no whitespace)")
    try:
        tensors = safetensors.torch.load(data)
    except Exception as e:  # safetensors raises SafetensorError and others on garbled tables
        raise WireFormatError("payload", f"not a valid safetensors payload ({type(e).__name__}: {str(e)[:160]})") \
            from None
    return header, tensors


def _json(text, field: str):
    """json.loads, refusing duplicate keys, NaN/Infinity and non-finite numbers; any failure is typed."""
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant, parse_float=_finite)
    except (ValueError, RecursionError, TypeError) as e:  # JSONDecodeError, UnicodeDecodeError, digit limit
        raise WireFormatError(field, f"not valid JSON ({type(e).__name__}: {str(e)[:120]})") from None


def _no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"duplicate keys {sorted({k for k in keys if keys.count(k) > 1})[:3]}")
    return dict(pairs)


def _no_constant(name):
    raise ValueError(f"{name} is not allowed")


def _finite(text: str) -> float:
    x = float(text)
    if not math.isfinite(x):
        raise ValueError(f"non-finite number {text[:20]}")
    return x


def _check_version(header: dict) -> None:
    _want(header.get("format") == FORMAT, "header.format", f"want {FORMAT!r}, got {_short(header.get('format'))}")
    v = header.get("version")
    _want(type(v) is int and 1 <= v <= VERSION, "header.version",
          f"unsupported {_short(v)} (this build reads 1 to {VERSION})")
    kind = header.get("encoding")
    if isinstance(kind, str) and kind in ENCODING_VERSIONS:  # one version per encoding: one spelling per message
        _want(v == ENCODING_VERSIONS[kind], "header.version",
              f"{kind} messages are version {ENCODING_VERSIONS[kind]}, not {v}")
    missing, extra = sorted(set(FIELDS) - set(header)), sorted(set(header) - set(FIELDS) - {"signature"})
    _want(not missing, "header", f"missing fields {missing}")
    _want(not extra, "header", f"unexpected fields {[e[:40] for e in extra[:5]]}")


def _check_signature(sig, digest: str, trusted: frozenset[bytes] | None, required: bool) -> None:
    if sig is None:
        if required:
            raise SignatureError("header.signature", "missing; this receiver requires signed messages")
        return
    _want(isinstance(sig, dict) and sorted(sig) == ["alg", "public_key", "sig"], "header.signature",
          "want an object with exactly alg, public_key, sig")
    _want(sig["alg"] == SIGNATURE_ALG, "header.signature.alg", f"want {SIGNATURE_ALG!r}, got {_short(sig['alg'])}")
    for k, n in (("public_key", 64), ("sig", 128)):
        v = sig[k]
        _want(isinstance(v, str) and len(v) == n and set(v) <= _HEX, f"header.signature.{k}",
              f"want {n} lowercase hex characters")
    public_key = bytes.fromhex(sig["public_key"])
    verify_signature(public_key, bytes.fromhex(sig["sig"]), digest)
    if trusted is not None and public_key not in trusted:
        raise SignatureError("header.signature.public_key", f"{sig['public_key'][:16]}… is not a trusted sender key")


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


def _check_expect(sender: Geometry, kind: str, expect) -> None:
    # Text fits any receiver, and so do spans: their latent rows stay in the sender's space until the
    # receiver's LatentMap (fitted for this sender) maps them, and that map checks the pair.
    if kind in ("text", "spans", "spans_latent"):
        return
    if isinstance(expect, Geometry):
        if kind in ("kv", "fragments"):
            try:
                expect.check_same(sender)
            except GeometryMismatchError as e:
                raise GeometryMismatchError(f"header.sender.geometry: does not fit this receiver: {e}") from None
            return
        want = (expect.model, expect.tokenizer, expect.hidden_size)
    elif isinstance(expect, tuple) and len(expect) == 2 and all(isinstance(x, str) for x in expect):
        want = (*expect, None)
    else:
        raise ConfigError(f"expect: want the receiver's Geometry or (model, tokenizer), got {type(expect).__name__}")
    have = (sender.model, sender.tokenizer, sender.hidden_size)
    for name, w, h in zip(("model", "tokenizer", "hidden_size"), want, have):
        if w is not None and w != h:
            raise GeometryMismatchError(f"header.sender.{name}: message has {str(h)[:64]!r}, this receiver "
                                        f"{str(w)[:64]!r} (input embeddings and token ids do not transfer)")


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


def _rows(tensors, g: Geometry) -> Rows:
    return Rows(tensors["embeds"], tensors["token_ids"], (g.model, g.tokenizer))


def _token_rows(tensors, g: Geometry) -> TokenRows:
    return TokenRows(tensors["token_ids"].long(), tensors["latents"], (g.model, g.tokenizer))


def _kv(tensors, g: Geometry) -> KVState:
    layers = tuple(LayerKV(tensors[f"layers.{i}.keys"], tensors[f"layers.{i}.values"],
                           tensors[f"layers.{i}.positions"]) for i in range(g.num_layers))
    try:
        return KVState(g, layers, tensors["positions"], tensors["token_ids"], tensors["latents"])
    except StateFormatError as e:
        raise WireFormatError("tensors", f"not a valid KV state: {e}") from None


def _text(tensors, g: Geometry) -> str:
    try:
        return tensors["text"].numpy().tobytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise WireFormatError("tensors.text", f"not UTF-8 ({e.reason} at byte {e.start})") from None


def _fragments(tensors, g: Geometry) -> FragmentSet:
    raw = tensors["fragments"].numpy().tobytes()
    try:
        fs = FragmentSet.from_bytes(raw)  # re-hashes every fragment against its listed digest
    except LatentWireError as e:
        raise WireFormatError("tensors.fragments", str(e)[:300]) from None
    except Exception as e:  # nested decoder: anything it lets escape (e.g. json limits) is still a format error
        raise WireFormatError("tensors.fragments", f"malformed ({type(e).__name__}: {str(e)[:200]})") from None
    n = int.from_bytes(raw[:8], "little")
    _want(canonical_json(json.loads(raw[8:8 + n])).encode() == raw[8:8 + n], "tensors.fragments",
          "the set's header is not canonical JSON")
    if fs.geometry is not None:
        try:
            fs.geometry.check_same(g)
        except GeometryMismatchError as e:
            raise WireFormatError("tensors.fragments", f"geometry differs from header.sender.geometry: {e}") from None
    return fs


def _spans(tensors, g: Geometry) -> Spans:
    text = _text(tensors, g)
    latents = tensors.get("latents")
    try:
        return Spans(text, tuple(map(tuple, tensors["spans"].tolist())), int(tensors["document"][0]),
                     (g.model, g.tokenizer), latents)
    except StateFormatError as e:  # spans out of order, touching, or not what the text holds
        raise WireFormatError("tensors.spans", str(e).removeprefix("spans: ")[:300]) from None


_BODY = {"rows": _rows, "token_ids": _token_rows, "kv": _kv, "text": _text, "fragments": _fragments,
         "spans": _spans, "spans_latent": _spans}


def _to_device(body: Body, device: torch.device) -> Body:
    """A decoded (host) body with its tensors on `device`; text is returned as is."""
    if isinstance(body, Rows):
        return Rows(body.embeds.to(device), body.token_ids.to(device), body.space)
    if isinstance(body, TokenRows):
        return TokenRows(body.token_ids.to(device), body.latents.to(device), body.space)
    if isinstance(body, KVState):
        return body.to(device)
    if isinstance(body, FragmentSet):
        return FragmentSet(f.to(device) for f in body)
    if isinstance(body, Spans) and body.latents is not None:
        return Spans(body.text, body.spans, body.document, body.space, body.latents.to(device))
    return body

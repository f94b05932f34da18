"""Writing a message: `encode` turns a body (or a decoded `Message`) into the bytes of one wire message.

Tensors go into one safetensors payload whose metadata holds the canonical JSON header; every field
and tensor is checked as `decode` would check it, so nothing is written that would be refused.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field

import numpy
import safetensors.torch
import torch

from ..errors import ConfigError, GeometryMismatchError
from ..merge.fragments import Fragment, FragmentSet
from ..message import Rows, Spans
from ..state import Geometry, KVState, canonical_json
from .schema import (Body, Selection, TokenRows, WireFormatError, _check_fields, _check_tensors, _dtype_of, _header,
                     _ids, _want, content_digest)
from .security import Signer

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


def _encoding_of(obj) -> str:
    if isinstance(obj, Spans):
        return "spans" if obj.latents is None else "spans_latent"
    for kind, cls in (("rows", Rows), ("token_ids", TokenRows), ("kv", KVState), ("text", str),
                      ("fragments", FragmentSet)):
        if isinstance(obj, cls):
            return kind
    raise ConfigError(f"cannot encode a {type(obj).__name__}: want Rows, TokenRows, KVState, str, Fragment, "
                      "FragmentSet or Spans")


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
        out = {"text": _utf8(obj.text, "tensors.text"),
               "spans": torch.tensor(obj.spans, dtype=torch.int64).reshape(-1, 2),
               "document": torch.tensor([obj.document], dtype=torch.int64)}  # host tensors, like the text
        return out | ({"latents": obj.latents} if kind == "spans_latent" else {})
    if kind == "text":
        return {kind: _utf8(obj, "tensors.text")}
    return {kind: torch.from_numpy(numpy.frombuffer(obj.to_bytes(), dtype=numpy.uint8).copy())}  # host bytes


def _utf8(text: str, field: str) -> torch.Tensor:
    """(nbytes,) uint8 on the host: the UTF-8 bytes of `text`; text that is not valid Unicode (a lone surrogate, as
    JSON can carry) is a WireFormatError naming `field`, as decode would refuse those bytes."""
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise WireFormatError(field, f"not valid Unicode ({e.reason} at character {e.start})") from None
    return torch.from_numpy(numpy.frombuffer(raw, dtype=numpy.uint8).copy())


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

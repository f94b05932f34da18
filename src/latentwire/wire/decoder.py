"""Reading a message: `decode` checks one wire message strictly and returns a `Message`.

Framing (canonical safetensors table, one metadata entry), strict JSON, version, digest, signature,
every header field and tensor, and the receiver fit (`expect`) are all checked before a body is
built; anything malformed raises WireFormatError naming the field. Rules: docs/wire.md.
"""
from __future__ import annotations

import json
import math

import safetensors.torch
import torch

from ..errors import ConfigError, GeometryMismatchError, LatentWireError, StateFormatError
from ..merge.fragments import FragmentSet
from ..message import Rows, Spans
from ..placement import parse_device
from ..state import Geometry, KVState, LayerKV, canonical_json
from .encoder import Message
from .schema import (_HEX, ENCODING_VERSIONS, FIELDS, FORMAT, MAX_HEADER_BYTES, VERSION, Body, Selection, TokenRows,
                     WireFormatError, _check_fields, _check_tensors, _short, _want, content_digest)
from .security import SIGNATURE_ALG, SignatureError, trusted_keys, verify_signature

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
    device = None if device is None else parse_device(device)  # DeviceError before any byte is read
    if expect is not None and not isinstance(expect, Geometry) and not (
            isinstance(expect, tuple) and len(expect) == 2 and all(isinstance(x, str) for x in expect)):
        raise ConfigError(f"expect: want the receiver's Geometry or (model, tokenizer), got {type(expect).__name__}")
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
        body = _to_device(body, device)
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
    else:  # (model, tokenizer): its type was checked before the payload was read
        want = (*expect, None)
    have = (sender.model, sender.tokenizer, sender.hidden_size)
    for name, w, h in zip(("model", "tokenizer", "hidden_size"), want, have):
        if w is not None and w != h:
            raise GeometryMismatchError(f"header.sender.{name}: message has {str(h)[:64]!r}, this receiver "
                                        f"{str(w)[:64]!r} (input embeddings and token ids do not transfer)")


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

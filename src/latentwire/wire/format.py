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

The code sits in three modules, re-exported here: `schema` (constants, value types, the digest and the
checks both directions share), `encoder` (`Message`, `encode`) and `decoder` (`decode`).
"""
from .decoder import decode
from .encoder import Message, encode
from .schema import (DIGEST_LABEL, DTYPES, ENCODING_VERSIONS, ENCODINGS, FIELDS, FORMAT, MAX_HEADER_BYTES, MAX_LAYERS,
                     VERSION, Body, Selection, TokenRows, WireFormatError, content_digest)

__all__ = ["DIGEST_LABEL", "DTYPES", "ENCODING_VERSIONS", "ENCODINGS", "FIELDS", "FORMAT", "MAX_HEADER_BYTES",
           "MAX_LAYERS", "VERSION", "Body", "Message", "Selection", "TokenRows", "WireFormatError", "content_digest",
           "decode", "encode"]

"""Messages across process and machine boundaries: a versioned wire format, signatures and sealing.

    from latentwire import wire
    signer, key = wire.Signer.generate(), wire.generate_key()
    data = wire.seal(wire.encode(rows, protocol="cacheback", sender_geometry=g, signer=signer), key)
    msg = wire.decode(wire.open_sealed(data, key), expect=receiver.geometry, verify={signer.public_key})

Layout, header schema and error rules: docs/wire.md.
"""
from .format import (ENCODING_VERSIONS, ENCODINGS, FORMAT, VERSION, Message, Selection, TokenRows, WireFormatError,
                     content_digest, decode, encode)
from .security import SignatureError, Signer, generate_key, open_sealed, seal, trusted_keys

__all__ = ["ENCODING_VERSIONS", "ENCODINGS", "FORMAT", "VERSION", "Message", "Selection", "SignatureError", "Signer",
           "TokenRows", "WireFormatError", "content_digest", "decode", "encode", "generate_key", "open_sealed", "seal",
           "trusted_keys"]

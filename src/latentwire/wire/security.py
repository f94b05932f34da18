"""Who sent a message, and who can read it: Ed25519 sender signatures and ChaCha20-Poly1305 sealing.

Signing: a sender's `Signer` signs the message's content digest (docs/wire.md); the signature and the
public key travel in the header. A receiver names the public keys it trusts (`decode(verify=...)`)
and then rejects unsigned, untrusted or tampered messages with SignatureError.

Sealing: `seal(data, key)` encrypts any bytes (an encoded message, a FragmentSet's bytes) under a
32-byte key shared by the agents; `open_sealed` returns them or raises SignatureError when the key
is wrong or any byte changed. Sealed layout:

    b"LWS" + version byte (4) | nonce (12, random) | ciphertext (len(data)) | Poly1305 tag (16)

The associated data is b"latentwire.sealed/" + version byte, so a sealed blob cannot be replayed as
another format. Nonces are random 96-bit values: keep one key under 2**32 messages (rotate it).
Signing and sealing compose: seal(encode(..., signer=s), key) hides the message and its signer.
"""
from __future__ import annotations

import os

from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

from ..errors import ConfigError, LatentWireError

SEAL_VERSION = 1
SEAL_MAGIC = b"LWS" + bytes([SEAL_VERSION])
SEAL_AD = b"latentwire.sealed/" + bytes([SEAL_VERSION])
NONCE_BYTES, TAG_BYTES, KEY_BYTES = 12, 16, 32
SIGNATURE_ALG = "ed25519"
# What is signed: this label, then the 32 raw bytes of the message digest (never the bare digest, so a
# signature made for latentwire cannot be replayed as a signature over some other 32-byte value).
SIGN_LABEL = b"latentwire.message/1 signature\n"


class SignatureError(LatentWireError):
    """A message failed authentication: unsigned where a signature is required, signed by an untrusted
    key, a signature that does not verify, or sealed bytes that do not open (wrong key or tampered).
    `field` names where: "header.signature", "header.signature.public_key", "sealed", "sealed.magic"."""

    def __init__(self, field: str, reason: str):
        self.field, self.reason = field, reason
        super().__init__(f"{field}: {reason}")

    def __reduce__(self):  # picklable across processes despite the two-argument constructor
        return type(self), (self.field, self.reason)


class Signer:
    """An Ed25519 private key that signs message digests. `public_key` (32 raw bytes) is what receivers trust."""

    __slots__ = ("_key", "public_key")

    def __init__(self, private_key: Ed25519PrivateKey):
        if not isinstance(private_key, Ed25519PrivateKey):
            raise ConfigError(f"Signer wraps an Ed25519PrivateKey, not {type(private_key).__name__}")
        self._key = private_key
        self.public_key: bytes = private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    @classmethod
    def generate(cls) -> "Signer":
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_private_bytes(cls, raw: bytes) -> "Signer":
        """From the 32-byte private seed (`private_bytes()`): store it like a password."""
        if not isinstance(raw, (bytes, bytearray)) or len(raw) != KEY_BYTES:
            raise ConfigError(f"private key: want {KEY_BYTES} raw bytes")
        return cls(Ed25519PrivateKey.from_private_bytes(bytes(raw)))

    def private_bytes(self) -> bytes:
        return self._key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())

    def sign(self, digest: str) -> dict:
        """The header's `signature` field for a message whose content digest (hex) is `digest`."""
        sig = self._key.sign(SIGN_LABEL + bytes.fromhex(digest))
        return {"alg": SIGNATURE_ALG, "public_key": self.public_key.hex(), "sig": sig.hex()}

    def __repr__(self) -> str:  # never the private key
        return f"Signer(public_key={self.public_key.hex()[:16]}…)"


def trusted_keys(keys) -> frozenset[bytes]:
    """Normalise trusted public keys (32 raw bytes, 64 hex chars, Ed25519PublicKey or Signer) to raw bytes."""
    if isinstance(keys, (bytes, str, Ed25519PublicKey, Signer)):
        keys = [keys]
    out = set()
    for k in keys:
        if isinstance(k, Signer):
            k = k.public_key
        elif isinstance(k, Ed25519PublicKey):
            k = k.public_bytes(Encoding.Raw, PublicFormat.Raw)
        elif isinstance(k, str):
            try:
                k = bytes.fromhex(k)
            except ValueError:
                raise ConfigError(f"trusted key {k[:20]!r}: not hex") from None
        if not isinstance(k, (bytes, bytearray)) or len(k) != KEY_BYTES:
            raise ConfigError(f"trusted key: want a {KEY_BYTES}-byte Ed25519 public key, got {type(k).__name__}")
        out.add(bytes(k))
    return frozenset(out)


def verify_signature(public_key: bytes, sig: bytes, digest: str) -> None:
    """SignatureError unless `sig` is public_key's Ed25519 signature of the message digest."""
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(sig, SIGN_LABEL + bytes.fromhex(digest))
    except (InvalidSignature, ValueError):
        raise SignatureError("header.signature", f"does not verify under public key {public_key.hex()[:16]}… "
                             "(the message was altered, or signed by someone else)") from None


def generate_key() -> bytes:
    """A fresh random 32-byte key for `seal` / `open_sealed`."""
    return ChaCha20Poly1305.generate_key()


def _cipher(key: bytes) -> ChaCha20Poly1305:
    if not isinstance(key, (bytes, bytearray)) or len(key) != KEY_BYTES:
        raise ConfigError(f"seal key: want {KEY_BYTES} bytes (use wire.generate_key()), got "
                          f"{len(key) if isinstance(key, (bytes, bytearray)) else type(key).__name__}")
    return ChaCha20Poly1305(bytes(key))


def seal(data: bytes, key: bytes) -> bytes:
    """Encrypt and authenticate `data` under the shared key: magic | nonce | ciphertext | tag."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ConfigError(f"seal takes bytes, not {type(data).__name__}")
    nonce = os.urandom(NONCE_BYTES)
    return SEAL_MAGIC + nonce + _cipher(key).encrypt(nonce, bytes(data), SEAL_AD)


def open_sealed(data: bytes, key: bytes) -> bytes:
    """The bytes `seal` was given; SignatureError on a wrong key, a changed byte, truncation or a foreign blob."""
    cipher = _cipher(key)
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise SignatureError("sealed", f"want bytes, got {type(data).__name__}")
    data = bytes(data)
    head = len(SEAL_MAGIC) + NONCE_BYTES
    if len(data) < head + TAG_BYTES:
        raise SignatureError("sealed", f"{len(data)} bytes, shorter than magic + nonce + tag ({head + TAG_BYTES}): "
                             "truncated or not sealed")
    if data[:len(SEAL_MAGIC)] != SEAL_MAGIC:
        raise SignatureError("sealed.magic", f"want {SEAL_MAGIC!r}, got {data[:len(SEAL_MAGIC)]!r} "
                             "(not a sealed latentwire blob, or another seal version)")
    try:
        return cipher.decrypt(data[len(SEAL_MAGIC):head], data[head:], SEAL_AD)
    except InvalidTag:
        raise SignatureError("sealed", "authentication failed (wrong key, or the bytes were altered)") from None

"""Wire format: byte-identical round trips, signatures and sealing.

Also the fixtures and message-editing helpers that test_wire_decoder.py (the strict decoder) and
test_wire_spans.py (version 2 spans) import from here."""
import json
import pickle

import pytest
import safetensors.torch
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from latentwire import wire
from latentwire.agent import Agent
from latentwire.errors import ConfigError, LatentWireError
from latentwire.merge import Fragment, FragmentSet
from latentwire.message import Rows
from latentwire.state import KVState, canonical_json
from latentwire.wire import Selection, SignatureError, Signer, TokenRows, WireFormatError

SEL = Selection("cacheback", budget=3, ratio=16.0)


@pytest.fixture(scope="module")
def llama(models, tokenizer):
    return Agent(models["llama"], tokenizer, model_name="llama")


@pytest.fixture(scope="module")
def state(llama):
    """A llama state with two latent rows."""
    return llama.think(llama.prefill("The cat sat on the mat."), steps=2)


@pytest.fixture(scope="module")
def kept(state):
    return [1, 4, 7, len(state) - 1]  # the last row is latent


@pytest.fixture(scope="module")
def rows(llama, state, kept):
    return llama.rows(state.select(kept))


@pytest.fixture(scope="module")
def msg(llama, rows, kept):
    return wire.encode(rows, protocol="cacheback", sender_geometry=llama.geometry, positions=kept, selection=SEL)


@pytest.fixture(scope="module")
def signer():
    return Signer.from_private_bytes(bytes(range(32)))


# -- helpers: take a message apart, edit it, put it back ------------------------------------------
def split(data: bytes) -> tuple[dict, dict]:
    n = int.from_bytes(data[:8], "little")
    return json.loads(json.loads(data[8:8 + n])["__metadata__"]["latentwire"]), safetensors.torch.load(data)


def forge(data: bytes, header=None, tensors=None, redigest: bool = True, text: str | None = None) -> bytes:
    """Edit a message's header / tensors, recomputing the digest as an attacker (or a buggy sender) could."""
    h, t = split(data)
    if header:
        header(h)
    if tensors:
        tensors(t)
    if redigest:
        h.pop("digest", None)
        h["digest"] = wire.content_digest(h, t)
    meta = text if text is not None else canonical_json(h)
    return safetensors.torch.save({k: v.contiguous() for k, v in t.items()}, metadata={"latentwire": meta})


def field_of(e: Exception) -> str:
    return getattr(e, "field", None) or str(e).split(":", 1)[0]


def _poke(name, index, value):
    def edit(t):
        t[name].view(-1)[index] = value
    return edit


def _set(path, value):
    def edit(h):
        box = h
        for k in path[:-1]:
            box = box[k]
        box[path[-1]] = value
    return edit


# -- round trips ----------------------------------------------------------------------------------
def same_rows(a: Rows, b: Rows) -> bool:
    return (a.embeds.dtype == b.embeds.dtype and torch.equal(a.embeds, b.embeds)
            and torch.equal(a.token_ids, b.token_ids))


def test_rows_round_trip_is_byte_identical(llama, rows, kept, msg):
    m = wire.decode(msg, expect=llama.geometry)
    assert m.encoding == "rows" and m.protocol == "cacheback" and m.dtype == "float32"
    assert same_rows(m.body, rows) and m.body.space == (llama.geometry.model, llama.geometry.tokenizer)
    assert m.positions == tuple(kept) and m.selection == SEL and m.sender == llama.geometry and m.signed_by is None
    assert m.to_bytes() == msg and wire.encode(m) == msg
    again = wire.encode(m.body, protocol="cacheback", sender_geometry=m.sender, positions=m.positions, selection=SEL)
    assert again == msg  # deterministic: same content, same bytes
    assert wire.encode(rows, protocol="cacheback", sender_geometry=llama.geometry, positions=kept) != msg


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_round_trips(llama, rows, state, dtype):
    half = Rows(rows.embeds.to(dtype), rows.token_ids, rows.space)
    for body in (half, TokenRows.from_rows(half)):
        data = wire.encode(body, protocol="cb", sender_geometry=llama.geometry)
        m = wire.decode(data)
        assert m.dtype == str(dtype)[6:] and m.to_bytes() == data
    s = state.select(range(4))
    kv = KVState(s.geometry, tuple(type(l)(l.keys.to(dtype), l.values.to(dtype), l.positions) for l in s.layers),
                 s.positions, s.token_ids, s.latents.to(dtype))
    data = wire.encode(kv, protocol="fullkv")
    assert wire.decode(data).body.digest() == kv.digest()


def test_a_bad_device_or_expect_is_refused_before_the_payload_is_read(llama):
    from latentwire.errors import DeviceError

    text = wire.encode("notes", protocol="text", sender_geometry=llama.geometry)
    for device in ("bogus", "cuda:99" if torch.cuda.is_available() else "cuda"):
        with pytest.raises(DeviceError, match="device"):
            wire.decode(b"not a message", device=device)
    with pytest.raises(ConfigError, match="expect"):  # text fits any receiver, yet a wrong `expect` is still named
        wire.decode(text, expect="smollm2-135m")
    assert wire.decode(text, expect=("m", "t"), device="cpu").body == "notes"


def test_token_ids_round_trip_rebuilds_the_same_rows(llama, rows, kept):
    data = wire.encode(rows, protocol="cacheback", sender_geometry=llama.geometry, positions=kept,
                       encoding="token_ids")
    m = wire.decode(data, expect=(llama.geometry.model, llama.geometry.tokenizer))
    assert isinstance(m.body, TokenRows) and m.body.latents.shape == (1, llama.geometry.hidden_size)
    assert same_rows(m.body.to_rows(llama.embed), rows)  # exact: the receiver's embedding table is the sender's
    assert m.to_bytes() == data and wire.encode(m) == data
    _, tensors = split(data)
    assert tensors["token_ids"].dtype == torch.int32
    assert len(data) < len(wire.encode(rows, protocol="cacheback", sender_geometry=llama.geometry, positions=kept))


def test_kv_round_trip_every_arch(models, tokenizer, arch):
    agent = Agent(models[arch], tokenizer, model_name=arch)
    state = agent.think(agent.prefill("Paris is the capital of France."), steps=2)
    data = wire.encode(state, protocol="fullkv")
    m = wire.decode(data, expect=agent.geometry)
    assert isinstance(m.body, KVState) and m.body.digest() == state.digest() and m.positions is None
    assert m.to_bytes() == data and wire.encode(m) == data
    a = agent.answer("What is the capital?", message=state, max_new_tokens=4)
    b = agent.answer("What is the capital?", message=m.body, max_new_tokens=4)
    assert a.token_ids == b.token_ids  # the decoded cache is the sent cache


@pytest.mark.parametrize("text", ["", "plain", "le chat — 猫 🐈", "nul\x00byte\nnewline"])
def test_text_round_trip(llama, text):
    data = wire.encode(text, protocol="text", sender_geometry=llama.geometry)
    m = wire.decode(data, expect=llama.geometry)
    assert m.body == text and m.dtype is None and m.to_bytes() == data


def test_text_that_is_not_unicode_is_refused_typed(llama):
    """A lone surrogate (JSON can carry "\\ud800") has no UTF-8 bytes: encode refuses it as decode would, naming the
    field, for a text message and for spans."""
    from latentwire.message import Spans

    for body in ("ok \ud800", Spans("o\udfff", ((0, 2),))):
        with pytest.raises(WireFormatError, match=r"tensors.text: not valid Unicode \(surrogates not allowed at"):
            wire.encode(body, protocol="text", sender_geometry=llama.geometry)


def test_fragments_round_trip_and_digest_check(llama, state):
    fs = FragmentSet.of(state.select([0, 1]), state.select([2, 3, 4]))
    for body in (fs, FragmentSet(), Fragment.of(state.select([5]))):
        data = wire.encode(body, protocol="merge", sender_geometry=llama.geometry)
        m = wire.decode(data, expect=llama.geometry)
        want = body if isinstance(body, FragmentSet) else FragmentSet([body])
        assert m.body == want and m.to_bytes() == data


def test_sealed_and_signed_fragments(llama, state, signer):
    fs = FragmentSet.of(state.select([0, 1]), state.select([2]))
    key = wire.generate_key()
    sealed = wire.seal(fs.to_bytes(), key)  # a bare FragmentSet, sealed
    assert FragmentSet.from_bytes(wire.open_sealed(sealed, key)) == fs
    signed = wire.encode(fs, protocol="merge", sender_geometry=llama.geometry, signer=signer)
    both = wire.seal(signed, key)
    assert wire.decode(wire.open_sealed(both, key), verify=signer).body == fs
    for i in range(0, len(both), 97):
        bad = bytearray(both)
        bad[i] ^= 0x10
        with pytest.raises(SignatureError):
            wire.open_sealed(bytes(bad), key)
    # the envelope digest covers the fragment bytes; FragmentSet.from_bytes re-hashes each fragment too
    def poke(t):
        t["fragments"][-1] ^= 1

    with pytest.raises(SignatureError, match="^header.signature"):
        wire.decode(forge(signed, tensors=poke), verify=signer)
    unsigned = wire.encode(fs, protocol="merge", sender_geometry=llama.geometry)
    with pytest.raises(WireFormatError, match="^tensors.fragments: fragments.1.: bytes do not hash"):
        wire.decode(forge(unsigned, tensors=poke))


# -- signatures -----------------------------------------------------------------------------------
def test_signed_messages(llama, rows, kept, signer):
    g = llama.geometry
    kw = dict(protocol="cacheback", sender_geometry=g, positions=kept)
    signed = wire.encode(rows, signer=signer, **kw)
    unsigned = wire.encode(rows, **kw)
    m = wire.decode(signed, verify={signer.public_key})
    assert m.signed_by == signer.public_key and m.to_bytes() == signed and wire.encode(m) == signed
    assert wire.decode(signed).signed_by == signer.public_key  # a present signature is always checked
    assert wire.encode(rows, signer=signer, **kw) == signed  # Ed25519 is deterministic
    with pytest.raises(SignatureError, match="^header.signature: missing"):
        wire.decode(unsigned, verify=signer)
    assert wire.decode(unsigned, verify=signer, require_signature=False).signed_by is None
    stranger = Signer.generate()
    with pytest.raises(SignatureError, match="^header.signature.public_key: .* not a trusted"):
        wire.decode(wire.encode(rows, signer=stranger, **kw), verify=signer)
    # re-signing a decoded message with another key
    assert wire.decode(wire.encode(m, signer=stranger), verify=stranger).signed_by == stranger.public_key
    # content changed and re-digested, old signature kept: the signature no longer verifies
    tampered = forge(signed, tensors=_poke("embeds", 0, 0.25))
    with pytest.raises(SignatureError, match="^header.signature: does not verify"):
        wire.decode(tampered)
    # a signature lifted from another message
    other = wire.encode(rows, signer=signer, protocol="other", sender_geometry=g, positions=kept)
    lifted = forge(signed, header=lambda h: h.__setitem__("signature", split(other)[0]["signature"]))
    with pytest.raises(SignatureError):
        wire.decode(lifted, verify=signer)
    for edit, field in [(_set(["signature"], None), "header.signature"),
                        (lambda h: h["signature"].pop("sig"), "header.signature"),
                        (_set(["signature", "alg"], "rsa"), "header.signature.alg"),
                        (_set(["signature", "sig"], "zz" * 64), "header.signature.sig"),
                        (_set(["signature", "public_key"], "00" * 31), "header.signature.public_key")]:
        with pytest.raises(WireFormatError) as e:
            wire.decode(forge(signed, header=edit), verify=signer)
        assert e.value.field == field
    with pytest.raises(ConfigError, match="require_signature"):
        wire.decode(signed, require_signature=True)


def test_every_flipped_byte_of_a_signed_message_is_rejected(llama, rows, kept, signer):
    signed = wire.encode(rows, protocol="cacheback", sender_geometry=llama.geometry, positions=kept, signer=signer)
    for i in range(len(signed)):
        for mask in (0x01, 0x80):
            bad = bytearray(signed)
            bad[i] ^= mask
            with pytest.raises(LatentWireError):
                wire.decode(bytes(bad), verify=signer)


def test_keys_and_signers(signer):
    pk = signer.public_key
    assert len(pk) == 32 and Signer.from_private_bytes(signer.private_bytes()).public_key == pk
    assert signer.private_bytes().hex() not in repr(signer)
    priv = Ed25519PrivateKey.generate()
    assert wire.trusted_keys([pk, pk.hex(), signer, priv.public_key()]) == {pk, Signer(priv).public_key}
    for bad in (b"short", "nothex", 3):
        with pytest.raises(ConfigError):
            wire.trusted_keys([bad])
    with pytest.raises(ConfigError):
        Signer.from_private_bytes(b"x")


# -- sealing --------------------------------------------------------------------------------------
def test_seal_round_trip_and_tampering(msg):
    key = wire.generate_key()
    a, b = wire.seal(msg, key), wire.seal(msg, key)
    assert a != b and wire.open_sealed(a, key) == wire.open_sealed(b, key) == msg  # random nonces
    assert len(a) == len(msg) + 4 + 12 + 16
    for i in range(len(a)):
        bad = bytearray(a)
        bad[i] ^= 0x01
        with pytest.raises(SignatureError):
            wire.open_sealed(bytes(bad), key)
    with pytest.raises(SignatureError, match="^sealed: authentication failed"):
        wire.open_sealed(a, wire.generate_key())
    with pytest.raises(SignatureError, match="^sealed: "):
        wire.open_sealed(a[:20], key)
    with pytest.raises(SignatureError, match="^sealed.magic"):
        wire.open_sealed(msg, key)  # an unsealed message
    for bad_key in (b"short", "x" * 32, None):
        with pytest.raises(ConfigError, match="seal key"):
            wire.seal(msg, bad_key)
    assert wire.open_sealed(wire.seal(b"", key), key) == b""


def test_errors_pickle_with_their_field():
    for e in (WireFormatError("header.digest", "bad"), SignatureError("sealed", "bad")):
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is type(e) and back.field == e.field and str(back) == str(e)
    assert issubclass(WireFormatError, ValueError) and issubclass(SignatureError, LatentWireError)

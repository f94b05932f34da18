"""Wire format: byte-identical round trips, a strict decoder that names the field, signatures and sealing."""
import json
import pickle

import pytest
import safetensors.torch
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from latentwire import wire
from latentwire.agent import Agent
from latentwire.errors import ConfigError, GeometryMismatchError, LatentWireError
from latentwire.merge import Fragment, FragmentSet
from latentwire.message import SEPARATOR, Rows, Spans
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


# -- strict decoder: every rejection names its field -------------------------------------------------
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


def _delete(key):
    return lambda h: h.pop(key)


REJECT = {  # case -> (forge kwargs, error class, field)
    "format": (dict(header=_set(["format"], "latentwire.kvstate")), WireFormatError, "header.format"),
    "version_2": (dict(header=_set(["version"], 2)), WireFormatError, "header.version"),
    "version_str": (dict(header=_set(["version"], "1")), WireFormatError, "header.version"),
    "version_bool": (dict(header=_set(["version"], True)), WireFormatError, "header.version"),
    "missing_field": (dict(header=_delete("selection")), WireFormatError, "header"),
    "extra_field": (dict(header=_set(["note"], "hi")), WireFormatError, "header"),
    "bad_digest": (dict(tensors=_poke("embeds", 0, 0.5), redigest=False), WireFormatError, "header.digest"),
    "digest_not_hex": (dict(header=_set(["digest"], "Z" * 64), redigest=False), WireFormatError, "header.digest"),
    "protocol_empty": (dict(header=_set(["protocol"], "")), WireFormatError, "header.protocol"),
    "protocol_number": (dict(header=_set(["protocol"], 7)), WireFormatError, "header.protocol"),
    "sender_extra": (dict(header=_set(["sender", "x"], 1)), WireFormatError, "header.sender"),
    "sender_model": (dict(header=_set(["sender", "model"], "gemma3")), WireFormatError, "header.sender.model"),
    "geometry_type": (dict(header=_set(["sender", "geometry", "hidden_size"], "64")), WireFormatError,
                      "header.sender.geometry"),
    "geometry_missing": (dict(header=lambda h: h["sender"]["geometry"].pop("rope")), WireFormatError,
                         "header.sender.geometry"),
    "geometry_zero": (dict(header=_set(["sender", "geometry", "num_kv_heads"], 0)), WireFormatError,
                      "header.sender.geometry"),
    "geometry_layers": (dict(header=_set(["sender", "geometry", "layer_types"], ["global"] * 1025)), WireFormatError,
                        "header.sender.geometry"),
    "geometry_rope": (dict(header=_set(["sender", "geometry", "rope", "global", "rope_type"], "dynamic")),
                      WireFormatError, "header.sender.geometry"),
    "encoding": (dict(header=_set(["encoding"], "pickle")), WireFormatError, "header.encoding"),
    "dtype_unknown": (dict(header=_set(["dtype"], "float8")), WireFormatError, "header.dtype"),
    "dtype_list": (dict(header=_set(["dtype"], ["float32"])), WireFormatError, "header.dtype"),
    "dtype_vs_tensor": (dict(header=_set(["dtype"], "float16")), WireFormatError, "tensors.embeds"),
    "positions_order": (dict(header=_set(["positions"], [1, 7, 4, 9])), WireFormatError, "header.positions"),
    "positions_length": (dict(header=_set(["positions"], [1, 4, 7])), WireFormatError, "header.positions"),
    "positions_negative": (dict(header=_set(["positions"], [-1, 4, 7, 9])), WireFormatError, "header.positions"),
    "positions_bool": (dict(header=_set(["positions"], [False, True, 7, 9])), WireFormatError, "header.positions"),
    "positions_null": (dict(header=_set(["positions"], None)), WireFormatError, "header.positions"),
    "selection_budget": (dict(header=_set(["selection", "budget"], -1)), WireFormatError, "header.selection.budget"),
    "selection_ratio_int": (dict(header=_set(["selection", "ratio"], 16)), WireFormatError, "header.selection.ratio"),
    "selection_ratio_low": (dict(header=_set(["selection", "ratio"], 0.5)), WireFormatError, "header.selection.ratio"),
    "selection_keys": (dict(header=lambda h: h["selection"].pop("method")), WireFormatError, "header.selection"),
    "missing_tensor": (dict(tensors=lambda t: t.pop("token_ids")), WireFormatError, "tensors"),
    "extra_tensor": (dict(tensors=lambda t: t.__setitem__("pickle", torch.zeros(1))), WireFormatError, "tensors"),
    "embeds_width": (dict(tensors=lambda t: t.__setitem__("embeds", t["embeds"][:, :32])), WireFormatError,
                     "tensors.embeds"),
    "embeds_3d": (dict(tensors=lambda t: t.__setitem__("embeds", t["embeds"][None])), WireFormatError,
                  "tensors.embeds"),
    "token_ids_dtype": (dict(tensors=lambda t: t.__setitem__("token_ids", t["token_ids"].int())), WireFormatError,
                        "tensors.token_ids"),
    "token_ids_length": (dict(tensors=lambda t: t.__setitem__("token_ids", t["token_ids"][:3])), WireFormatError,
                         "tensors.token_ids"),
    "token_id_range": (dict(tensors=_poke("token_ids", 0, -2)), WireFormatError, "tensors.token_ids"),
    "embeds_nan": (dict(tensors=_poke("embeds", 5, float("nan"))), WireFormatError, "tensors.embeds"),
    "embeds_inf": (dict(tensors=_poke("embeds", 5, float("-inf"))), WireFormatError, "tensors.embeds"),
    "rows_as_text": (dict(header=_set(["encoding"], "text")), WireFormatError, "header.dtype"),
}


@pytest.mark.parametrize("case", list(REJECT))
def test_strict_decoder_names_the_field(msg, case):
    kw, cls, field = REJECT[case]
    with pytest.raises(cls) as e:
        wire.decode(forge(msg, **kw))
    assert field_of(e.value) == field, str(e.value)
    assert str(e.value).startswith(field + ":")


FRAMING = {  # raw bytes -> field
    "empty": (lambda b: b"", "payload"),
    "short": (lambda b: b[:5], "payload"),
    "truncated": (lambda b: b[:len(b) // 2], "payload"),
    "truncated_by_one": (lambda b: b[:-1], "payload"),
    "zip_file": (lambda b: b"PK\x03\x04" + bytes(60), "payload"),
    "table_not_json": (lambda b: (16).to_bytes(8, "little") + b"{not json}      " + b[24:], "payload.header"),
    "table_spaced": (lambda b: b[:8] + b[8:9] + b" " + b[9:-1], "payload.header"),
    "table_list": (lambda b: (8).to_bytes(8, "little") + b"[]      ", "payload.header"),
    "no_metadata": (lambda b: safetensors.torch.save({"a": torch.zeros(1)}), "metadata"),
    "two_metadata": (lambda b: safetensors.torch.save(split(b)[1], metadata={
        "latentwire": canonical_json(split(b)[0]), "other": "x"}), "metadata"),
    "header_spaces": (lambda b: forge(b, text=json.dumps(split(b)[0])), "metadata.latentwire"),
    "header_not_json": (lambda b: forge(b, text="{oops"), "metadata.latentwire"),
    "header_list": (lambda b: forge(b, text="[]"), "metadata.latentwire"),
    "header_duplicate": (lambda b: forge(b, text=canonical_json(split(b)[0])[:-1] + ',"version":1}'),
                         "metadata.latentwire"),
    "header_nan": (lambda b: forge(b, text=canonical_json(split(b)[0]).replace('"budget":3', '"budget":NaN')),
                   "metadata.latentwire"),
    "header_1e400": (lambda b: forge(b, text=canonical_json(split(b)[0]).replace('"budget":3', '"budget":1e400')),
                     "metadata.latentwire"),
    "header_huge_int": (lambda b: forge(b, text=canonical_json(split(b)[0]).replace('"budget":3', '"budget":' +
                                                                                   "9" * 5000)),
                        "metadata.latentwire"),
    "header_deep": (lambda b: forge(b, text='{"a":' + "[" * 100000 + "]" * 100000 + "}"), "metadata.latentwire"),
}


@pytest.mark.parametrize("case", list(FRAMING))
def test_framing_errors_name_the_field(msg, case):
    make, field = FRAMING[case]
    with pytest.raises(WireFormatError) as e:
        wire.decode(make(msg))
    assert e.value.field == field, str(e.value)


@pytest.mark.parametrize("obj", ["a string", None, 123, [1, 2]])
def test_decode_refuses_non_bytes(obj):
    with pytest.raises(WireFormatError, match="^data: want bytes"):
        wire.decode(obj)


def test_strict_decoder_other_encodings(llama, state, rows, kept):
    g = llama.geometry
    tok = wire.encode(rows, protocol="cb", sender_geometry=g, positions=kept, encoding="token_ids")
    kv = wire.encode(state.select(range(6)), protocol="fullkv")
    text = wire.encode("hi", protocol="text", sender_geometry=g)
    frag = wire.encode(FragmentSet.of(state.select([0])), protocol="merge")
    cases = [
        (tok, dict(tensors=lambda t: t.__setitem__("latents", t["latents"][:0])), "tensors.latents"),
        (tok, dict(tensors=lambda t: t.__setitem__("token_ids", t["token_ids"].long())), "tensors.token_ids"),
        (kv, dict(tensors=lambda t: t.__setitem__("layers.0.keys", t["layers.0.keys"][:1])), "tensors.layers.0.keys"),
        (kv, dict(tensors=lambda t: t.__setitem__("layers.1.values", t["layers.1.values"].half())),
         "tensors.layers.1.values"),
        (kv, dict(tensors=_poke("layers.2.keys", 3, float("nan"))), "tensors.layers.2.keys"),
        (kv, dict(tensors=lambda t: t.__setitem__("layers.0.positions", t["layers.0.positions"] + 100)), "tensors"),
        (kv, dict(tensors=lambda t: t.__setitem__("positions", t["positions"].flip(0))), "tensors"),
        (kv, dict(tensors=lambda t: t.pop("layers.2.keys")), "tensors"),
        (kv, dict(header=_set(["positions"], [0, 1])), "header.positions"),
        (text, dict(tensors=lambda t: t.__setitem__("text", torch.tensor([0xFF, 0xFE], dtype=torch.uint8))),
         "tensors.text"),
        (text, dict(tensors=lambda t: t.__setitem__("text", t["text"].float())), "tensors.text"),
        (text, dict(header=_set(["dtype"], "float32")), "header.dtype"),
        (frag, dict(tensors=lambda t: t.__setitem__("fragments", t["fragments"][:40])), "tensors.fragments"),
        (frag, dict(header=_set(["sender", "geometry", "model"], "other")), "header.sender.model"),
    ]
    for data, kw, field in cases:
        with pytest.raises(WireFormatError) as e:
            wire.decode(forge(data, **kw))
        assert e.value.field == field, str(e.value)
    # a fragments message whose set is of another geometry than its sender
    relabel = lambda h: h["sender"].update(model="x", geometry=dict(h["sender"]["geometry"], model="x"))  # noqa: E731
    other = forge(frag, header=relabel)
    with pytest.raises(WireFormatError, match="^tensors.fragments: geometry differs"):
        wire.decode(other)


def test_nested_fragment_decoder_escapes_become_typed_errors(state):
    """FragmentSet.from_bytes lets json's RecursionError / digit-limit ValueError escape; the wire catches them."""
    frag = wire.encode(FragmentSet.of(state.select([0])), protocol="merge")
    for token in ("[" * 50000 + "]" * 50000, "9" * 5000):
        head = ('{"digests":[],"format":"latentwire.fragmentset","sizes":[],"version":' + token + "}").encode()
        raw = len(head).to_bytes(8, "little") + head
        inner = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        bad = forge(frag, tensors=lambda t: t.__setitem__("fragments", inner))
        with pytest.raises(WireFormatError, match="^tensors.fragments"):
            wire.decode(bad)


def test_expect_checks_the_receiver(models, tokenizer, llama, state, msg, geometry_for):
    qwen = Agent(models["qwen2"], tokenizer, model_name="qwen2").geometry
    with pytest.raises(GeometryMismatchError, match="^header.sender.model"):
        wire.decode(msg, expect=qwen)
    with pytest.raises(GeometryMismatchError, match="^header.sender.tokenizer"):
        wire.decode(msg, expect=("llama", "another-tokenizer"))
    # same model name, other RoPE: rows still fit (re-prefilled), a KV cache does not
    yarn = geometry_for("llama-yarn", name="llama")
    assert yarn.model == llama.geometry.model and yarn != llama.geometry
    wire.decode(msg, expect=yarn)
    kv = wire.encode(state, protocol="fullkv")
    with pytest.raises(GeometryMismatchError, match="^header.sender.geometry"):
        wire.decode(kv, expect=yarn)
    wire.decode(wire.encode("hi", protocol="text", sender_geometry=llama.geometry), expect=qwen)  # text fits anyone
    with pytest.raises(ConfigError, match="expect"):
        wire.decode(msg, expect="llama")


# -- encoder refuses what the decoder would reject ---------------------------------------------------
def test_encoder_refusals(llama, rows, kept, state):
    g = llama.geometry
    kw = dict(protocol="cb", sender_geometry=g)
    nan = Rows(rows.embeds.clone(), rows.token_ids, rows.space)
    nan.embeds[0, 0] = float("nan")
    for obj, extra, cls, field in [
        (nan, {}, WireFormatError, "tensors.embeds"),
        (Rows(rows.embeds[:, :32], rows.token_ids), {}, WireFormatError, "tensors.embeds"),
        (Rows(rows.embeds.double(), rows.token_ids), {}, WireFormatError, "header.dtype"),
        (rows, dict(positions=[4, 1, 7, 9]), WireFormatError, "header.positions"),
        (rows, dict(positions=[1, 4, 7]), WireFormatError, "header.positions"),
        (rows, dict(positions=[1.5, 4, 7, 9]), WireFormatError, "header.positions"),
        (Rows(rows.embeds, rows.token_ids, ("qwen2", "x")), {}, GeometryMismatchError, "sender"),
        (Rows(rows.embeds, torch.full((4,), 2 ** 40)), dict(encoding="token_ids"), WireFormatError,
         "tensors.token_ids"),
    ]:
        with pytest.raises(cls) as e:
            wire.encode(obj, **kw | extra)
        assert field_of(e.value) == field, str(e.value)
    with pytest.raises(WireFormatError, match="^header.protocol"):
        wire.encode(rows, protocol="", sender_geometry=g)
    for bad in [dict(obj=b"bytes"), dict(obj=rows, encoding="kv"), dict(obj="hi", positions=[0]),
                dict(obj=rows, sender_geometry=None), dict(obj=rows, signer="key"), dict(obj=rows, selection=(1, 2))]:
        obj = bad.pop("obj")
        with pytest.raises(ConfigError):
            wire.encode(obj, **kw | bad)
    with pytest.raises(ConfigError, match="encode\\(Message\\)"):
        wire.encode(wire.decode(wire.encode(rows, **kw)), protocol="x")
    assert Selection("x", 1, 16).ratio == 16.0 and isinstance(Selection("x", 1, 16).ratio, float)
    for args in [("", 1), ("x", -1), ("x", 1, 0.5), ("x", True), ("x", 1, float("inf"))]:
        with pytest.raises(WireFormatError, match="^selection"):
            Selection(*args)


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



# -- spans (cross-model CacheBack): version 2 ----------------------------------------------------------
DOC = "Ana Silva leads the Heron project. Le café — 猫 — was closed."


def test_spans_round_trip_is_byte_identical(llama, rows, state, models, tokenizer):
    g = llama.geometry
    bodies = [Spans.of(DOC, [(0, 9), (35, 47)], index=2), Spans.of(DOC, []),
              Spans.of(DOC, [(20, 25)], 1, latents=rows.embeds[-1:]),
              Spans.of(DOC, [(0, 3)], latents=rows.embeds[-1:].half()),
              Spans.of(DOC, [(0, 3)], latents=rows.embeds[:0])]
    other = Agent(models["gemma3"], tokenizer, model_name="gemma3").geometry
    for body in bodies:
        data = wire.encode(body, protocol="cacheback_x", sender_geometry=g, selection=SEL)
        m = wire.decode(data, expect=other)  # spans fit any receiver (the latent map checks the pair)
        kind = "spans" if body.latents is None else "spans_latent"
        assert m.encoding == kind and m.header["version"] == 2 and split(data)[0]["version"] == 2
        assert m.positions is None and m.dtype == (None if body.latents is None else str(body.latents.dtype)[6:])
        got = m.body
        assert (got.text, got.spans, got.document, got.space) == (body.text, body.spans, body.document,
                                                                  (g.model, g.tokenizer))
        assert (got.latents is None) == (body.latents is None)
        assert body.latents is None or (torch.equal(got.latents, body.latents)
                                        and got.latents.dtype == body.latents.dtype)
        assert m.to_bytes() == data and wire.encode(m) == data
    assert wire.decode(data, device="cpu").body.latents.shape == (0, g.hidden_size)
    with pytest.raises(GeometryMismatchError, match="^sender"):  # rows of another model cannot claim this sender
        wire.encode(Spans.of(DOC, [(0, 3)], space=("gemma3", g.tokenizer)), protocol="x", sender_geometry=g)


def test_older_encodings_are_still_version_1(llama, state, rows, msg):
    g = llama.geometry
    for data in (msg, wire.encode(rows, protocol="cb", sender_geometry=g, encoding="token_ids"),
                 wire.encode(state.select(range(3)), protocol="fullkv"),
                 wire.encode("hi", protocol="t", sender_geometry=g),
                 wire.encode(FragmentSet.of(state.select([0])), protocol="merge")):
        assert split(data)[0]["version"] == 1 and wire.decode(data).to_bytes() == data
    assert wire.VERSION == 2 and wire.ENCODING_VERSIONS["spans"] == wire.ENCODING_VERSIONS["spans_latent"] == 2


def test_spans_decoder_names_the_field(llama, rows):
    g = llama.geometry
    text = wire.encode(Spans.of(DOC, [(0, 9), (35, 46)]), protocol="cacheback_x", sender_geometry=g)  # ends in 猫
    lat = wire.encode(Spans.of(DOC, [(0, 9)], latents=rows.embeds[-2:]), protocol="cacheback_x", sender_geometry=g)
    spans = lambda v: lambda t: t.__setitem__("spans", torch.tensor(v, dtype=torch.int64))  # noqa: E731
    cases = [
        (text, dict(header=_set(["version"], 1)), "header.version"),  # spans are version 2 only
        (text, dict(header=_set(["version"], 3)), "header.version"),
        (text, dict(header=_set(["encoding"], "rows")), "header.version"),
        (text, dict(header=_set(["dtype"], "float32")), "header.dtype"),
        (text, dict(header=_set(["positions"], [0, 1])), "header.positions"),
        (text, dict(tensors=spans([[0, 9], [9, 19]])), "tensors.spans"),  # touching spans are one span
        (text, dict(tensors=spans([[35, 46], [0, 9]])), "tensors.spans"),  # out of order
        (text, dict(tensors=spans([[0, 10], [35, 46]])), "tensors.spans"),  # the text has 9 characters there
        (text, dict(tensors=spans([[0, 9, 1]])), "tensors.spans"),
        (text, dict(tensors=lambda t: t.__setitem__("spans", t["spans"].int())), "tensors.spans"),
        (text, dict(tensors=lambda t: t.__setitem__("text", t["text"][:-1])), "tensors.text"),  # cut inside 猫
        (text, dict(tensors=lambda t: t.__setitem__("text", t["text"][:5])), "tensors.spans"),
        (text, dict(tensors=_poke("text", 9, ord("|"))), "tensors.spans"),  # the separator overwritten
        (text, dict(tensors=_poke("document", 0, -1)), "tensors.document"),
        (text, dict(tensors=lambda t: t.__setitem__("document", torch.zeros(2, dtype=torch.int64))),
         "tensors.document"),
        (text, dict(tensors=lambda t: t.__setitem__("latents", rows.embeds[-1:])), "tensors"),
        (lat, dict(tensors=lambda t: t.pop("latents")), "tensors"),
        (lat, dict(tensors=lambda t: t.__setitem__("latents", t["latents"][:, :32])), "tensors.latents"),
        (lat, dict(tensors=_poke("latents", 3, float("nan"))), "tensors.latents"),
        (lat, dict(header=_set(["dtype"], None)), "header.dtype"),
    ]
    assert split(text)[1]["text"][9:9 + len(SEPARATOR.encode())].numpy().tobytes() == SEPARATOR.encode()
    for data, kw, field in cases:
        with pytest.raises(WireFormatError) as e:
            wire.decode(forge(data, **kw))
        assert e.value.field == field, str(e.value)

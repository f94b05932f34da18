"""Wire format: the strict decoder names the field of every rejection; the encoder refuses the same inputs."""
import json

import pytest
import safetensors.torch
import torch

from latentwire import wire
from latentwire.agent import Agent
from latentwire.errors import ConfigError, GeometryMismatchError
from latentwire.merge import FragmentSet
from latentwire.message import Rows
from latentwire.state import canonical_json
from latentwire.wire import Selection, WireFormatError

import test_wire
from test_wire import _poke, _set, field_of, forge, split

# test_wire.py's module-scoped fixtures, shared by name (each module builds its own instances)
llama, state, kept, rows, msg = test_wire.llama, test_wire.state, test_wire.kept, test_wire.rows, test_wire.msg


# -- strict decoder: every rejection names its field -------------------------------------------------
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

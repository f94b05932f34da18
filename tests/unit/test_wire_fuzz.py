"""Fuzz the strict wire decoder: any input decodes to a canonical message or raises a LatentWireError naming a
field; nothing else escapes. Plus the corpus of found inputs (tests/fixtures/wire_corpus), replayed by name.

The larger run (≥ 10,000 inputs, 14 operators) is benchmarks/wire_fuzz.py, which also refreshes the corpus.
"""
import json
from functools import lru_cache
from pathlib import Path

import pytest
import safetensors.torch
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from latentwire import wire
from latentwire.agent import Agent
from latentwire.errors import LatentWireError
from latentwire.merge import FragmentSet
from latentwire.message import Spans
from latentwire.models import tiny_model, tiny_tokenizer
from latentwire.state import Geometry, canonical_json

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "wire_corpus"
EXPECTED = json.loads((CORPUS / "expected.json").read_text()) if (CORPUS / "expected.json").exists() else {}
SIGNER = wire.Signer.from_private_bytes(bytes(range(32)))
KEY = bytes(range(100, 132))
FUZZ = settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck), print_blob=True)


@lru_cache(maxsize=1)
def seeds() -> tuple[tuple[str, bytes, dict], ...]:
    """Small valid messages of every encoding (tiny random-weight llama)."""
    torch.set_num_threads(1)
    agent = Agent(tiny_model("llama"), tiny_tokenizer(), model_name="llama")
    state = agent.think(agent.prefill("The cat sat."), 2)
    g, kept = agent.geometry, [1, 4, len(state) - 1]
    rows = agent.rows(state.select(kept))
    kw = dict(protocol="cacheback", sender_geometry=g, positions=kept)
    return (("rows", wire.encode(rows, selection=wire.Selection("cacheback", 2, 8.0), **kw), {}),
            ("token_ids", wire.encode(rows, encoding="token_ids", **kw), {}),
            ("kv", wire.encode(state.select(range(5)), protocol="fullkv"), {"expect": g}),
            ("text", wire.encode("chat — 猫", protocol="text", sender_geometry=g), {}),
            ("fragments", wire.encode(FragmentSet.of(state.select([0]), state.select([1, 2])), protocol="merge"), {}),
            ("signed", wire.encode(rows, signer=SIGNER, **kw), {"verify": SIGNER}),
            ("spans", wire.encode(Spans.of("The cat sat — 猫.", [(0, 3), (8, 12)]), protocol="cacheback_x",
                                  sender_geometry=g), {}),
            ("spans_latent", wire.encode(Spans.of("The cat sat.", [(4, 7)], 1, latents=rows.embeds[-1:]),
                                         protocol="cacheback_x", sender_geometry=g), {}))


def split(data: bytes) -> tuple[dict, dict]:
    n = int.from_bytes(data[:8], "little")
    return json.loads(json.loads(data[8:8 + n])["__metadata__"]["latentwire"]), safetensors.torch.load(data)


def assemble(header: dict, tensors: dict, redigest: bool) -> bytes:
    if redigest:
        header = {k: v for k, v in header.items() if k != "digest"}
        header["digest"] = wire.content_digest(header, tensors)
    return safetensors.torch.save({k: v.contiguous() for k, v in tensors.items()},
                                  metadata={"latentwire": canonical_json(header)})


def check(data: bytes, **kw):
    """The oracle: a typed error naming a field, or a message that re-encodes to exactly these bytes."""
    try:
        msg = wire.decode(data, **kw)
    except LatentWireError as e:
        field = getattr(e, "field", None) or str(e).split(":", 1)[0]
        assert field and " " not in field, f"error does not name a field: {e}"
        return e
    assert msg.to_bytes() == data, "accepted bytes that do not re-encode identically"
    return msg


JSON = st.recursive(st.none() | st.booleans() | st.integers(-2 ** 64, 2 ** 64) |
                    st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
                    max_leaves=6)


def paths(obj, prefix=()):
    """Every (container path, key) inside a JSON value."""
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        yield prefix, k
        yield from paths(v, prefix + (k,))


@st.composite
def mutated(draw):
    """(bytes, decode kwargs, must_reject) from one of six mutation families."""
    name, data, kw = draw(st.sampled_from(seeds()))
    family = draw(st.sampled_from(["random", "truncate", "flip", "header", "tensors", "table"]))
    if family == "random":
        return draw(st.binary(max_size=400)), {}, True
    if family == "truncate":
        return data[:draw(st.integers(0, len(data) - 1))], kw, True
    if family == "flip":
        b = bytearray(data)
        for i, m in draw(st.lists(st.tuples(st.integers(0, len(data) - 1), st.integers(1, 255)), min_size=1,
                                  max_size=4, unique_by=lambda x: x[0])):
            b[i] ^= m
        return bytes(b), kw, True
    header, tensors = split(data)
    if family == "header":
        box_path, key = draw(st.sampled_from(list(paths(header))))
        box = header
        for k in box_path:
            box = box[k]
        op = draw(st.sampled_from(["set", "delete", "add"]))
        if op == "delete" and isinstance(box, dict):
            del box[key]
        elif op == "add" and isinstance(box, dict):
            box[draw(st.text(max_size=6))] = draw(JSON)
        else:
            box[key] = draw(JSON)
        redigest = draw(st.booleans())
        return assemble(header, tensors, redigest), kw, False
    if family == "tensors":
        name = draw(st.sampled_from(sorted(tensors)))
        t = tensors[name].clone()
        op = draw(st.sampled_from(["drop", "extra", "dtype", "rows", "poke"]))
        if op == "drop":
            del tensors[name]
        elif op == "extra":
            tensors[draw(st.sampled_from(["x", "embeds", "latents", "text"]))] = torch.zeros(draw(st.integers(0, 3)))
        elif op == "dtype":
            tensors[name] = t.to(draw(st.sampled_from([torch.float16, torch.bfloat16, torch.int32, torch.int64,
                                                       torch.uint8, torch.float64])))
        elif op == "rows" and t.dim():
            tensors[name] = t[:draw(st.integers(0, max(0, t.shape[0] - 1)))]
        elif t.numel():
            value = draw(st.floats(width=32) if t.is_floating_point() else st.integers(-3, 2 ** 31 - 1))
            t.view(-1)[draw(st.integers(0, t.numel() - 1))] = value % 256 if t.dtype == torch.uint8 else value
            tensors[name] = t
        return assemble(header, tensors, redigest=True), kw, False
    # table: a plausible length prefix in front of arbitrary JSON text
    text = json.dumps(draw(JSON)).encode()
    return len(text).to_bytes(8, "little") + text + draw(st.binary(max_size=64)), {}, True


@FUZZ
@given(mutated())
def test_decoder_never_crashes(case):
    data, kw, must_reject = case
    out = check(data, **kw)
    event(f"{type(out).__name__} {getattr(out, 'field', '')}")  # --hypothesis-show-statistics: what was reached
    if must_reject:  # random bytes, truncations, flips and bare tables are never a valid message
        assert isinstance(out, LatentWireError), "a corrupted message was accepted"


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_sealed_tampering_never_opens(data):
    name, msg, _ = data.draw(st.sampled_from(seeds()))
    sealed = bytearray(wire.seal(msg, KEY))
    i = data.draw(st.integers(0, len(sealed) - 1))
    if data.draw(st.booleans()):
        sealed[i] ^= data.draw(st.integers(1, 255))
    else:
        del sealed[i:]
    with pytest.raises(wire.SignatureError):
        wire.open_sealed(bytes(sealed), KEY)


# -- corpus ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_corpus_regression(name):
    """Each stored input gives exactly the recorded outcome (error class and field); crashes stay fixed."""
    want = EXPECTED[name]
    data = (CORPUS / name).read_bytes()
    if want["decoder"] == "open_sealed":
        with pytest.raises(LatentWireError) as info:
            wire.open_sealed(data, KEY)
        err = info.value
    else:
        kw = {"verify": want["verify"]} if want.get("verify") else {}
        if want.get("expect"):
            kw["expect"] = Geometry.from_json(want["expect"])
        err = check(data, **kw)
    assert isinstance(err, LatentWireError), f"{name}: accepted"
    if want["error"] is not None:  # None: an input that once crashed; any typed error will do
        assert type(err).__name__ == want["error"], str(err)
        assert (getattr(err, "field", None) or str(err).split(":", 1)[0]) == want["field"], str(err)


def test_corpus_is_present_and_small():
    assert len(EXPECTED) >= 20, "run: python benchmarks/wire_fuzz.py --corpus tests/fixtures/wire_corpus"
    for name in EXPECTED:
        assert (CORPUS / name).stat().st_size <= 8192, name

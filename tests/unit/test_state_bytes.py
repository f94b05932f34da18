"""Canonical bytes: bit-exact round trips, stable digests, and a strict decoder."""
import hashlib
import json
import subprocess
import sys
import textwrap

import pytest
import safetensors.torch
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from latentwire.errors import StateFormatError
from latentwire.state import KVState


def same_content(a: KVState, b: KVState) -> bool:
    tensors = lambda s: [s.positions, s.token_ids, s.latents] + [  # noqa: E731
        t for layer in s.layers for t in (layer.keys, layer.values, layer.positions)]
    return a.geometry == b.geometry and all(
        x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(tensors(a), tensors(b), strict=True))


@pytest.fixture(scope="module")
def thought(models, tokenizer):
    """A gemma3 state with sliding + global layers and two latent rows."""
    from latentwire.agent import Agent

    agent = Agent(models["gemma3"], tokenizer, model_name="gemma3")
    return agent.think(agent.prefill("hi"), steps=2)


def split(data: bytes) -> tuple[dict, dict]:
    """(tensors, safetensors metadata) of a payload."""
    n = int.from_bytes(data[:8], "little")
    return safetensors.torch.load(data), json.loads(data[8:8 + n])["__metadata__"]


def with_header(data: bytes, edit) -> bytes:
    tensors, meta = split(data)
    header = json.loads(meta["latentwire"])
    edit(header)
    return safetensors.torch.save(tensors, metadata={"latentwire": json.dumps(header)})


def with_tensors(data: bytes, edit) -> bytes:
    tensors, meta = split(data)
    edit(tensors)
    return safetensors.torch.save(tensors, metadata=meta)


# -- round trips ----------------------------------------------------------------------------------
def test_round_trip_is_bit_exact(prefill_state, arch, random_ids):
    state = prefill_state(arch, random_ids(20))
    data = state.to_bytes()
    back = KVState.from_bytes(data)
    assert back.to_bytes() == data and back.digest() == state.digest() == hashlib.sha256(data).hexdigest()
    assert same_content(back, state)


def test_round_trip_with_latents_and_selection(thought):
    T = len(thought)
    for state in (thought, thought.select([0, 3, T - 7, T - 2, T - 1]), thought.shift(40)):
        data = state.to_bytes()
        back = KVState.from_bytes(data)
        assert back.to_bytes() == data and same_content(back, state)
    assert KVState.from_bytes(thought.to_bytes()).latents.shape == (2, 64)


def test_header_is_canonical_json(thought):
    tensors, meta = split(thought.to_bytes())
    assert set(meta) == {"latentwire"}
    text = meta["latentwire"]
    header = json.loads(text)
    assert text == json.dumps(header, sort_keys=True, separators=(",", ":"))
    assert header["format"] == "latentwire.kvstate" and header["version"] == 1
    assert header["geometry"] == thought.geometry.to_json()


def test_non_canonical_payload_decodes_to_canonical_bytes(thought):
    """A payload whose header JSON is re-ordered and indented decodes to the same state and bytes."""
    data = thought.to_bytes()
    tensors, meta = split(data)
    header = json.loads(meta["latentwire"])
    messy = json.dumps(dict(reversed(list(header.items()))), indent=2)
    back = KVState.from_bytes(safetensors.torch.save(tensors, metadata={"latentwire": messy}))
    assert back.to_bytes() == data


def test_memoryview_and_bytearray_accepted(thought):
    data = thought.to_bytes()
    assert KVState.from_bytes(bytearray(data)).digest() == KVState.from_bytes(memoryview(data)).digest() \
        == thought.digest()


def test_digest_tracks_content(thought):
    assert thought.digest() != thought.shift(1).digest()
    assert thought.digest() != thought.select(range(1, len(thought))).digest()
    moved = thought.shift(3)
    assert KVState.from_bytes(moved.to_bytes()).digest() == moved.digest() != thought.digest()  # content only


def test_digest_stable_across_processes(thought):
    code = textwrap.dedent("""
        import torch
        torch.set_num_threads(1)
        from latentwire.agent import Agent
        from latentwire.models import tiny_model, tiny_tokenizer
        agent = Agent(tiny_model("gemma3"), tiny_tokenizer(), model_name="gemma3")
        print(agent.think(agent.prefill("hi"), steps=2).digest())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip().splitlines()[-1] == thought.digest()


# -- strict decoder -------------------------------------------------------------------------------
def flip_last_header_byte(data: bytes) -> bytes:
    n = int.from_bytes(data[:8], "little")
    return data[:8 + n - 1] + bytes([data[8 + n - 1] ^ 0xFF]) + data[8 + n:]


def flip_closing_brace(data: bytes) -> bytes:
    n = int.from_bytes(data[:8], "little")
    i = data.rindex(b"}", 8, 8 + n)
    return data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:]


def retensor(name: str, fn):
    """A payload with tensor `name` replaced by fn(tensor)."""
    return lambda d: with_tensors(d, lambda t: t.update({name: fn(t[name])}))


MALFORMED = {
    "truncated-half": lambda d: d[: len(d) // 2],
    "truncated-last-byte": lambda d: d[:-1],
    "truncated-in-header": lambda d: d[:20],
    "empty": lambda d: b"",
    "garbage": lambda d: bytes(range(256)) * 8,
    "garbage-with-valid-length": lambda d: (40).to_bytes(8, "little") + b"\xff" * 40,
    "last-header-byte-flipped": flip_last_header_byte,
    "header-closing-brace-flipped": flip_closing_brace,
    "no-metadata": lambda d: safetensors.torch.save(split(d)[0]),
    "metadata-not-json": lambda d: safetensors.torch.save(split(d)[0], metadata={"latentwire": "{nope"}),
    "header-not-an-object": lambda d: safetensors.torch.save(split(d)[0], metadata={"latentwire": "[]"}),
    "wrong-format": lambda d: with_header(d, lambda h: h.update(format="other.kvstate")),
    "unsupported-version": lambda d: with_header(d, lambda h: h.update(version=2)),
    "no-geometry": lambda d: with_header(d, lambda h: h.pop("geometry")),
    "geometry-missing-field": lambda d: with_header(d, lambda h: h["geometry"].pop("head_dim")),
    "geometry-bad-layer-type": lambda d: with_header(d, lambda h: h["geometry"]["layer_types"].__setitem__(0, "x")),
    "geometry-empty-inv-freq": lambda d: with_header(d, lambda h: h["geometry"]["rope"]["global"].update(inv_freq=[])),
    "missing-tensor": lambda d: with_tensors(d, lambda t: t.pop("layers.2.values")),
    "unexpected-tensor": lambda d: with_tensors(d, lambda t: t.update(extra=torch.zeros(1))),
    "keys-wrong-shape": retensor("layers.0.keys", lambda k: k[:, :-1]),
    "latents-wrong-shape": retensor("latents", lambda x: x[:1]),
    "values-wrong-dtype": retensor("layers.5.values", lambda v: v.double()),
    "positions-not-increasing": retensor("positions", lambda p: p.flip(0)),
    "positions-0-dim": retensor("positions", lambda p: torch.tensor(0)),
    "token-ids-wrong-dtype": retensor("token_ids", lambda x: x.int()),
    "global-layer-rows-differ": retensor("layers.5.positions", lambda p: p + 1),  # layer 5 is gemma3's global layer
    "sliding-layer-positions-float": retensor("layers.0.positions", lambda p: p.float()),
    "keys-nan": retensor("layers.3.keys", lambda k: k.index_fill(1, torch.tensor([0]), float("nan"))),
    "latents-infinite": retensor("latents", lambda x: x.index_fill(0, torch.tensor([1]), float("inf"))),
    "rope-nan-frequency": lambda d: with_header(d, lambda h: h["geometry"]["rope"]["global"]["inv_freq"].__setitem__(
        0, float("nan"))),  # json.dumps writes NaN, json.loads reads it back
    "rope-infinite-scaling": lambda d: with_header(d, lambda h: h["geometry"]["rope"]["sliding"].update(
        attention_scaling=float("inf"))),
}


# The message must name the offending field for these.
NAMES_FIELD = {"wrong-format": "header.format", "unsupported-version": "header.version",
               "no-metadata": "metadata.latentwire", "geometry-missing-field": "header.geometry",
               "missing-tensor": r"missing \['layers.2.values'\]", "unexpected-tensor": "unexpected",
               "keys-wrong-shape": "layers.0", "latents-wrong-shape": "latents", "values-wrong-dtype": "layers.5",
               "positions-not-increasing": "positions", "token-ids-wrong-dtype": "token_ids",
               "keys-nan": r"tensors.layers.3.keys: not finite", "latents-infinite": r"tensors.latents: not finite",
               "rope-nan-frequency": "header.geometry.*inv_freq must hold finite",
               "rope-infinite-scaling": "header.geometry.*attention_scaling must be finite"}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_strict_decoder_refuses(thought, case):
    data = MALFORMED[case](thought.to_bytes())
    with pytest.raises(StateFormatError, match=NAMES_FIELD.get(case)):
        KVState.from_bytes(data)


@pytest.mark.parametrize("obj", ["a string", None, 123, [1, 2]])
def test_from_bytes_refuses_non_bytes(obj):
    with pytest.raises(StateFormatError, match="bytes"):
        KVState.from_bytes(obj)


# -- property: canonical bytes under select / shift --------------------------------------------------
@settings(max_examples=50, deadline=None)
@given(rows=st.lists(st.integers(0, 22), max_size=23), shift=st.integers(-10, 500))
def test_bytes_canonical_under_select_and_shift(thought, rows, shift):
    rows = [r % len(thought) for r in rows]
    state = thought.select(rows).shift(shift)
    data = state.to_bytes()
    back = KVState.from_bytes(data)
    assert back.to_bytes() == data and same_content(back, state)
    assert state.digest() == hashlib.sha256(data).hexdigest()
    # the digest is a function of content alone: same rows in another order / recomputed -> same digest
    assert thought.select(list(reversed(rows))).shift(shift).digest() == state.digest()
    if len(state):
        assert state.shift(1).digest() != state.digest()


@pytest.mark.parametrize("meta", ["[" * 100_000 + "]" * 100_000, "1" * 5_000], ids=["deep-nesting", "huge-int"])
def test_hostile_headers_are_typed_errors_not_crashes(meta):
    """Found by the wire fuzzer: RecursionError / ValueError (int digit limit) used to escape."""
    from latentwire.merge.fragments import FragmentSet

    with pytest.raises(StateFormatError, match="metadata.latentwire"):
        KVState.from_bytes(safetensors.torch.save({"x": torch.zeros(1)}, metadata={"latentwire": meta}))
    with pytest.raises(StateFormatError, match="header: not JSON"):
        FragmentSet.from_bytes(len(meta).to_bytes(8, "little") + meta.encode())


def test_out_of_range_rope_frequency_is_a_format_error():
    from latentwire.state import Geometry

    bad = {"model": "a", "tokenizer": "b", "hidden_size": 2, "num_kv_heads": 1, "head_dim": 2,
           "layer_types": ["global"], "sliding_window": None,
           "rope": {"global": {"rope_type": "default", "inv_freq": [10 ** 400], "attention_scaling": 1.0}}}
    with pytest.raises(StateFormatError, match="header.geometry"):
        Geometry.from_json(bad)


def test_concat_refuses_states_of_another_dtype_or_device(thought):
    """torch.cat would silently widen bf16 + fp32 to fp32 (two digests for one content) or fail untyped."""
    with pytest.raises(StateFormatError, match="concat: states in torch.float32 on cpu and torch.bfloat16"):
        KVState.concat([thought, thought.to(dtype=torch.bfloat16)])
    assert len(KVState.concat([thought, thought])) == 2 * len(thought)

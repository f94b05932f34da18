"""Inputs for benchmarks/wire_fuzz.py: valid seed messages, the 14 mutation operators and hand-made edge cases.

`make_input(rng, op, seeds(), sealed)` builds one input for operator `op` (one of `OPS`); `handmade(seeds())`
names the edge cases kept in the regression corpus. The signer and seal key are fixed, so corpus files stay
verifiable.
"""
from __future__ import annotations

import json
import random

import safetensors.torch
import torch

from latentwire import wire
from latentwire.agent import Agent
from latentwire.merge import FragmentSet
from latentwire.models import tiny_model, tiny_tokenizer
from latentwire.state import canonical_json

SIGNER = wire.Signer.from_private_bytes(bytes(range(32)))  # fixed: corpus files stay verifiable
KEY = bytes(range(100, 132))
NASTY = [None, True, False, 0, -1, 1, 2 ** 31, 2 ** 63, -2 ** 63, 1.5, -0.0, 1e308, "", "x" * 300, "\u00e9",
         [], {}, [1, 2], {"a": 1}, [[[[[]]]]], "ed25519", "rows", "float32", "latentwire.message"]
RAW = ["NaN", "Infinity", "-Infinity", "1e400", "9" * 5000, "[" * 5000 + "]" * 5000, '"\\ud800"', "01", "1.",
       '"\\u0000"', "true", "[]"]


# -- seeds ----------------------------------------------------------------------------------------
def seeds() -> list[tuple[str, bytes, dict]]:
    """(name, valid bytes, decode kwargs): small messages of every encoding on tiny random-weight models."""
    tok = tiny_tokenizer()
    llama, gemma = (Agent(tiny_model(a), tok, model_name=a) for a in ("llama", "gemma3"))
    st = llama.think(llama.prefill("The cat sat on the mat."), 2)
    kept = [1, 4, 7, len(st) - 1]
    rows = llama.rows(st.select(kept))
    g = llama.geometry
    sel = wire.Selection("cacheback", 3, 16.0)
    out = [("rows", wire.encode(rows, protocol="cacheback", sender_geometry=g, positions=kept, selection=sel), {}),
           ("token_ids", wire.encode(rows, protocol="cacheback", sender_geometry=g, positions=kept,
                                     encoding="token_ids"), {}),
           ("kv", wire.encode(st.select(range(6)), protocol="fullkv"), {"expect": g}),
           ("kv_sliding", wire.encode(gemma.prefill("Hello there, agent."), protocol="fullkv"), {}),
           ("text", wire.encode("le chat — 猫", protocol="text", sender_geometry=g), {}),
           ("fragments", wire.encode(FragmentSet.of(st.select([0, 1]), st.select([2])), protocol="merge"), {}),
           ("signed_rows", wire.encode(rows, protocol="cacheback", sender_geometry=g, positions=kept, signer=SIGNER),
            {"verify": [SIGNER.public_key.hex()]})]
    return out


def sealed_seed(data: bytes) -> bytes:
    return wire.seal(data, KEY)


# -- mutators -------------------------------------------------------------------------------------
def split(data: bytes) -> tuple[dict, dict]:
    n = int.from_bytes(data[:8], "little")
    return json.loads(json.loads(data[8:8 + n])["__metadata__"]["latentwire"]), safetensors.torch.load(data)


def assemble(header, tensors: dict, redigest: bool) -> bytes:
    if isinstance(header, dict) and redigest:
        header = {k: v for k, v in header.items() if k != "digest"}
        header["digest"] = wire.content_digest(header, tensors)
    text = header if isinstance(header, str) else canonical_json(header)
    return safetensors.torch.save({k: v.contiguous() for k, v in tensors.items()}, metadata={"latentwire": text})


def walk(rng: random.Random, obj, depth: int = 0):
    """A random (container, key) inside a JSON value, or None."""
    spots = []
    if isinstance(obj, dict):
        spots = [(obj, k) for k in obj]
    elif isinstance(obj, list):
        spots = [(obj, i) for i in range(len(obj))]
    if not spots:
        return None
    box, key = rng.choice(spots)
    if rng.random() < 0.55 and isinstance(box[key], (dict, list)) and box[key]:
        return walk(rng, box[key], depth + 1) or (box, key)
    return box, key


def mutate_json(rng: random.Random, header: dict) -> dict:
    header = json.loads(json.dumps(header))
    spot = walk(rng, header)
    if spot is None:
        return header
    box, key = spot
    op = rng.random()
    if op < 0.2 and isinstance(box, dict):
        del box[key]
    elif op < 0.3 and isinstance(box, dict):
        box[rng.choice(["extra", "x", key + "_", "signature"])] = rng.choice(NASTY)
    elif op < 0.4 and isinstance(box[key], list) and box[key]:
        box[key] = box[key][::-1] if rng.random() < 0.5 else box[key][:-1]
    elif op < 0.5 and isinstance(box[key], (int, float)) and not isinstance(box[key], bool):
        box[key] = box[key] + rng.choice([-1, 1, 0.5, -box[key] - 1])
    else:
        box[key] = rng.choice(NASTY)
    return header


def mutate_tensors(rng: random.Random, tensors: dict) -> dict:
    tensors = {k: v.clone() for k, v in tensors.items()}
    name = rng.choice(sorted(tensors))
    t, op = tensors[name], rng.randrange(9)
    if op == 0:
        del tensors[name]
    elif op == 1:
        tensors[rng.choice(["extra", name + "x", "embeds", "latents"])] = torch.zeros(2, 3)
    elif op == 2:
        tensors[name] = t.to(rng.choice([torch.float16, torch.int32, torch.uint8, torch.float64, torch.bfloat16]))
    elif op == 3 and t.dim() and t.shape[0]:
        tensors[name] = t[:-1] if rng.random() < 0.5 else torch.cat([t, t[:1]])
    elif op == 4:
        tensors[name] = t.reshape(-1) if t.dim() > 1 else t.reshape(1, -1)
    elif op == 5 and t.is_floating_point() and t.numel():
        t.view(-1)[rng.randrange(t.numel())] = rng.choice([float("nan"), float("inf"), -float("inf")])
    elif op == 6 and not t.is_floating_point() and t.numel():
        v = rng.choice([-2, -1, 0, 2 ** 31 - 1, 255, 7])
        t.view(-1)[rng.randrange(t.numel())] = v % 256 if t.dtype == torch.uint8 else v
    elif op == 7 and t.numel() > 1:
        tensors[name] = t.flip(0)
    else:
        tensors[name] = torch.zeros((0,) + tuple(t.shape[1:]), dtype=t.dtype)
    return tensors


def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(b) + 1)
        op = rng.randrange(4)
        if op == 0:
            b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif op == 1:
            del b[i:i + rng.randint(1, 16)]
        elif op == 2 and i < len(b):
            b[i] = rng.choice([0, 0x20, 0x22, 0x7b, 0x7d, 0xff, rng.randrange(256)])
        else:
            j = rng.randrange(len(b) + 1)
            b[i:i] = b[j:j + rng.randint(1, 32)]
    return bytes(b)


def table_mutation(rng: random.Random, data: bytes) -> bytes:
    """Mutate safetensors' own JSON table (dtype, shape, offsets), keeping our header and the data."""
    n = int.from_bytes(data[:8], "little")
    table = json.loads(data[8:8 + n])
    name = rng.choice([k for k in table if k != "__metadata__"])
    entry, what = table[name], rng.choice(["dtype", "shape", "data_offsets", "name", "drop"])
    if what == "dtype":
        entry["dtype"] = rng.choice(["F16", "I32", "U8", "BF16", "F64", "BOOL", "F8_E4M3", "X9", "I64", "F32"])
    elif what == "shape":
        entry["shape"] = rng.choice([[], [0], [1] + entry["shape"], entry["shape"][::-1], [-1], [2 ** 40]])
    elif what == "data_offsets":
        a, b = entry["data_offsets"]
        entry["data_offsets"] = rng.choice([[b, a], [a, b + 8], [a + 1, b], [0, 0], [a, 2 ** 62]])
    elif what == "name":
        table[name + "_"] = table.pop(name)
    else:
        del table[name]
    head = json.dumps(table, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    return len(head).to_bytes(8, "little") + head + data[8 + n:]


def raw_json(rng: random.Random, data: bytes) -> bytes:
    """Splice a nasty JSON token (NaN, huge ints, deep nesting, lone surrogates…) into our header text."""
    header, tensors = split(data)
    text = canonical_json(header)
    spots = [i for i, c in enumerate(text) if c in ":,["]
    i = rng.choice(spots) + 1
    j = i
    while j < len(text) and text[j] not in ",]}":
        j += 1 if text[j] != '"' else max(1, text.find('"', j + 1) - j + 1)
    if rng.random() < 0.25:  # a duplicated key
        key = rng.choice(sorted(header))
        text = text[:-1] + f',"{key}":' + json.dumps(header[key]) + "}"
    else:
        text = text[:i] + rng.choice(RAW) + text[j:]
    return assemble(text, tensors, redigest=False)


def nested(rng: random.Random, data: bytes) -> bytes:
    """Mutate the FragmentSet bytes inside a fragments message, then re-digest the envelope."""
    header, tensors = split(data)
    raw = tensors["fragments"].numpy().tobytes()
    raw = mutate_bytes(rng, raw) if rng.random() < 0.6 else raw_fragments(rng, raw)
    tensors["fragments"] = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else \
        torch.zeros(0, dtype=torch.uint8)
    return assemble(header, tensors, redigest=True)


def raw_fragments(rng: random.Random, raw: bytes) -> bytes:
    """A FragmentSet header rewritten with a nasty token but consistent lengths."""
    n = int.from_bytes(raw[:8], "little")
    head = raw[8:8 + n].decode()
    head = head.replace('"version":1', '"version":' + rng.choice(RAW), 1)
    return len(head.encode()).to_bytes(8, "little") + head.encode() + raw[8 + n:]


def random_table(rng: random.Random) -> bytes:
    """A syntactically plausible safetensors payload with random tensors and a random header."""
    tensors = {rng.choice(["embeds", "token_ids", "text", "latents", "positions", "a"]):
               torch.zeros(rng.randint(0, 4), dtype=rng.choice([torch.float32, torch.int64, torch.uint8]))
               for _ in range(rng.randint(0, 3))}
    header = {"format": "latentwire.message", "version": 1}
    for k in rng.sample(list(wire.format.FIELDS), rng.randint(0, len(wire.format.FIELDS))):
        header[k] = rng.choice(NASTY)
    return assemble(header, tensors, redigest=rng.random() < 0.5)


def make_input(rng: random.Random, op: str, seedlist, sealed) -> tuple[bytes, dict, str]:
    """(bytes, decode kwargs, decoder) for one operator."""
    name, data, kw = rng.choice(seedlist)
    if op == "random":
        return bytes(rng.randrange(256) for _ in range(rng.randint(0, 1024))), {}, "decode"
    if op == "random_table":
        return random_table(rng), {}, "decode"
    if op == "truncate":
        return data[:rng.randrange(len(data))], kw, "decode"
    if op == "bitflip":
        b = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        return bytes(b), kw, "decode"
    if op == "bytes":
        return mutate_bytes(rng, data), kw, "decode"
    if op == "splice":
        other = rng.choice(seedlist)[1]
        return data[:rng.randrange(len(data))] + other[rng.randrange(len(other)):], kw, "decode"
    if op in ("header", "header+digest"):
        header, tensors = split(data)
        return assemble(mutate_json(rng, header), tensors, redigest=op.endswith("digest")), kw, "decode"
    if op == "tensors+digest":
        header, tensors = split(data)
        return assemble(header, mutate_tensors(rng, tensors), redigest=True), kw, "decode"
    if op == "table":
        return table_mutation(rng, data), kw, "decode"
    if op == "raw_json":
        return raw_json(rng, data), kw, "decode"
    if op == "nested+digest":
        frag = next(d for n, d, _ in seedlist if n == "fragments")
        return nested(rng, frag), {}, "decode"
    if op == "signature":
        n, d, k = next(s for s in seedlist if s[0] == "signed_rows")
        header, tensors = split(d)
        choice = rng.randrange(4)
        if choice == 0:
            del header["signature"]
        elif choice == 1:
            header["signature"] = wire.Signer.generate().sign(header["digest"])  # valid but untrusted
        elif choice == 2:
            header = mutate_json(rng, header)
        else:
            return assemble(header, mutate_tensors(rng, tensors), redigest=True), k, "decode"  # old signature
        return assemble(header, tensors, redigest=False), k, "decode"
    if op == "sealed":
        blob = rng.choice(sealed)
        return (mutate_bytes(rng, blob) if rng.random() < 0.5 else blob[:rng.randrange(len(blob))]), {}, "open_sealed"
    raise ValueError(op)


OPS = ("random", "random_table", "truncate", "bitflip", "bytes", "splice", "header", "header+digest",
       "tensors+digest", "table", "raw_json", "nested+digest", "signature", "sealed")


# -- hand-made corpus cases -----------------------------------------------------------------------
def handmade(seedlist) -> dict[str, tuple[bytes, dict, str]]:
    """Named edge cases that once escaped (or could escape) a less careful decoder."""
    by = {n: (d, kw) for n, d, kw in seedlist}
    rows, signed, frag = by["rows"][0], by["signed_rows"][0], by["fragments"][0]
    h, t = split(rows)
    text = canonical_json(h)
    swap = lambda old, new: assemble(text.replace(old, new, 1), t, redigest=False)  # noqa: E731

    def geometry(**kw):
        g = json.loads(json.dumps(h))
        g["sender"]["geometry"].update(kw)
        return assemble(g, t, redigest=True)

    def inner(head: str) -> bytes:  # a fragments message whose FragmentSet header is `head`
        fh, ft = split(frag)
        raw = len(head.encode()).to_bytes(8, "little") + head.encode()
        return assemble(fh, ft | {"fragments": torch.frombuffer(bytearray(raw), dtype=torch.uint8)}, redigest=True)

    set_head = '{"digests":[],"format":"latentwire.fragmentset","sizes":[],"version":%s}'
    cases = {
        "header_deep_nesting": swap('"version":1', '"version":' + "[" * 1500 + "]" * 1500),
        "header_int_5000_digits": swap('"version":1', '"version":' + "9" * 5000),
        "header_nan": swap('"version":1', '"version":NaN'),
        "header_1e400": swap('"version":1', '"version":1e400'),
        "header_duplicate_key": assemble(text[:-1] + ',"version":1}', t, redigest=False),
        "header_lone_surrogate": assemble(dict(h, protocol="\ud800"), t, redigest=True),
        "header_signature_null": assemble(dict(h, signature=None), t, redigest=True),
        "geometry_no_layers": geometry(layer_types=[]),
        "geometry_negative_head_dim": geometry(head_dim=-16),
        "geometry_float_size": geometry(hidden_size=64.0),
        "geometry_huge_inv_freq": geometry(rope={"global": {"rope_type": "default", "attention_scaling": 1.0,
                                                            "inv_freq": [10 ** 400]}}),
        "length_2_63": (2 ** 63).to_bytes(8, "little") + rows[8:],
        "fragments_inner_deep_nesting": inner(set_head % ("[" * 1500 + "]" * 1500)),
        "fragments_inner_int_5000_digits": inner(set_head % ("9" * 5000)),
        "fragments_inner_not_canonical": inner(set_head.replace(":", ": ") % "1"),
    }
    cases = {k: (v, {}, "decode") for k, v in cases.items()}
    cases["unsigned_to_verifier"] = (rows, {"verify": [SIGNER.public_key.hex()]}, "decode")
    cases["signed_by_stranger"] = (assemble(dict(split(signed)[0], signature=wire.Signer.from_private_bytes(
        bytes(32)).sign(split(signed)[0]["digest"])), split(signed)[1], redigest=False),
        {"verify": [SIGNER.public_key.hex()]}, "decode")
    cases["sealed_plain_message"] = (rows, {}, "open_sealed")
    return {f"handmade_{k}.bin": v for k, v in cases.items()}

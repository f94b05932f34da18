"""Wire format: fuzz the strict decoder, and time encode + decode of a CacheBack-16×-sized message.

    python benchmarks/wire_fuzz.py [--inputs 12000] [--seed 0] [--rows 94] [--repeats 20]
                                   [--corpus tests/fixtures/wire_corpus] [--atheris RUNS]

Fuzz: valid seed messages of every encoding (rows, token_ids, kv on a tiny llama and a tiny gemma3
with sliding layers, text, fragments; signed ones decoded with `verify`; sealed ones opened with
`open_sealed`) are mutated by 14 operators, plus pure random bytes. A mutator named `+digest`
recomputes the content digest after mutating, as an attacker could, so the input reaches the field
checks behind the digest. Every input must either decode or raise a LatentWireError subclass;
anything else is a crash. An accepted input must re-encode to exactly its own bytes.

Overhead: a CacheBack 16× message of a 1,500-row SmolLM2-135M sender (`--rows` rows × 576, float32,
as `agent.rows` makes them), encoded and decoded (unsigned, signed + verified, sealed + opened),
against the receiver re-prefilling the same rows inside its template (`Agent.answer` with one new
token: its prefill time). SmolLM2-135M is used when its cache is built; otherwise a random-weight
model of the same shape (identical FLOPs). One torch thread throughout.

`--corpus DIR` keeps the smallest input per (error class, field), hand-made edge cases and every crash, as
regression files for tests/unit/test_wire_fuzz.py (with DIR/expected.json). `--atheris RUNS` runs
coverage-guided atheris (if installed) on `decode` from the seeds instead, and exits.
Writes docs/results/wire_fuzz.{md,json}.
"""
from __future__ import annotations

import argparse
import collections
import json
import random
import sys
import time
from pathlib import Path

import safetensors.torch
import torch

from latentwire import wire
from latentwire.agent import Agent
from latentwire.bench.runner import environment
from latentwire.errors import LatentWireError
from latentwire.merge import FragmentSet
from latentwire.message import Rows
from latentwire.models import get_zoo_model, tiny_model, tiny_tokenizer
from latentwire.state import canonical_json

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "results"
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


def field_of(e: Exception) -> str:
    return getattr(e, "field", None) or str(e).split(":", 1)[0][:60]


def run_one(data: bytes, kw: dict, decoder: str):
    """('ok' | 'typed' | 'crash', detail)."""
    try:
        if decoder == "open_sealed":
            wire.open_sealed(data, KEY)
            return "ok", "opened"
        msg = wire.decode(data, **kw)
        again = msg.to_bytes()
        return ("ok", "canonical") if again == data else ("ok", "NOT canonical")  # canonical: re-encodes exactly
    except LatentWireError as e:
        return "typed", (type(e).__name__, field_of(e))
    except Exception as e:  # noqa: BLE001 - counting what escapes is the point
        return "crash", (type(e).__name__, str(e)[:120])


def fuzz(n_inputs: int, seed: int, corpus: Path | None) -> dict:
    rng = random.Random(seed)
    seedlist = seeds()
    sealed = [sealed_seed(d) for _, d, _ in seedlist[:3]]
    for name, data, kw in seedlist:  # every seed must itself decode and re-encode exactly
        assert wire.decode(data, **kw).to_bytes() == data, name
    originals = {d for _, d, _ in seedlist} | set(sealed)
    by_op = {op: collections.Counter() for op in OPS}
    errors, keep, crashes = collections.Counter(), {}, []
    t0 = time.perf_counter()
    for i in range(n_inputs):
        op = OPS[i % len(OPS)] if i < len(OPS) * 10 else rng.choice(OPS)
        data, kw, decoder = make_input(rng, op, seedlist, sealed)
        outcome, detail = run_one(data, kw, decoder)
        by_op[op][outcome] += 1
        if outcome == "ok" and (data in originals):
            by_op[op]["unchanged"] += 1  # the mutation happened to be a no-op
        if outcome == "typed":
            errors[detail] += 1
            if detail not in keep or len(data) < len(keep[detail][1]):
                keep[detail] = (op, data, kw, decoder)
        elif outcome == "crash":
            crashes.append((op, detail, data, kw, decoder))
        elif detail == "NOT canonical":
            by_op[op]["not canonical"] += 1
    seconds = time.perf_counter() - t0
    if corpus is not None:
        save_corpus(corpus, keep, crashes, handmade(seedlist))
    return {"inputs": n_inputs, "seconds": seconds, "seeds": [(n, len(d)) for n, d, _ in seedlist],
            "by_op": {op: dict(c) for op, c in by_op.items()},
            "errors": sorted(([*k, v] for k, v in errors.items()), key=lambda r: -r[2]),
            "crashes": [(op, list(d)) for op, d, *_ in crashes]}


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


def _kw(kw: dict) -> dict:
    """decode kwargs as JSON: trusted keys (hex) and the receiver geometry."""
    return {"verify": kw.get("verify"), "expect": kw["expect"].to_json() if "expect" in kw else None}


def save_corpus(folder: Path, keep: dict, crashes: list, made: dict) -> None:
    """Smallest input per (error class, field), ≤ 8 KiB, the hand-made cases and every crash, replacing the
    previous corpus; expected outcomes in expected.json."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "expected.json"
    for old in json.loads(path.read_text()) if path.exists() else {}:
        (folder / old).unlink(missing_ok=True)
    expected = {}
    for (cls, fld), (op, data, kw, decoder) in sorted(keep.items()):
        if len(data) > 8192:
            continue
        name = f"{fld}__{cls}__{op}".replace("+", "_").replace(".", "_").replace(" ", "_")[:90] + ".bin"
        (folder / name).write_bytes(data)
        expected[name] = {"decoder": decoder, **_kw(kw), "error": cls, "field": fld}
    for name, (data, kw, decoder) in made.items():
        outcome, detail = run_one(data, kw, decoder)
        (folder / name).write_bytes(data)
        expected[name] = {"decoder": decoder, **_kw(kw),
                          "error": detail[0] if outcome == "typed" else None,
                          "field": detail[1] if outcome == "typed" else None}
        if outcome != "typed":
            crashes.append(("handmade", detail, data, kw, decoder))
    for i, (op, detail, data, kw, decoder) in enumerate(crashes):
        name = f"crash_{op}_{i}.bin".replace("+", "_")
        (folder / name).write_bytes(data)
        expected[name] = {"decoder": decoder, **_kw(kw), "error": None, "field": None,
                          "found": list(detail)}
    path.write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")


# -- overhead -------------------------------------------------------------------------------------
def receiver_agent() -> tuple[Agent, str]:
    if get_zoo_model("smollm2-135m").cached:
        return Agent.from_pretrained("smollm2-135m"), "SmolLM2-135M (cached weights)"
    from latentwire.models import tiny_tokenizer as tok
    model = tiny_model("llama", hidden_size=576, intermediate_size=1536, num_attention_heads=9,
                       num_key_value_heads=3, head_dim=64, num_hidden_layers=30,
                       rope_parameters={"rope_type": "default", "rope_theta": 100000.0})
    model.set_attn_implementation("sdpa")
    return Agent(model, tok(), model_name="smollm2-135m-shape"), "random-weight model of SmolLM2-135M's shape"


def best_time(fn, repeats: int) -> float:
    """Fastest of `repeats` calls: the machine is shared, and a slow call measures the neighbours."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def overhead(n_rows: int, repeats: int) -> dict:
    agent, which = receiver_agent()
    g = agent.geometry
    gen = torch.Generator().manual_seed(0)
    sender_rows = 1500
    positions = sorted(torch.randperm(sender_rows, generator=gen)[:n_rows].tolist())
    ids = torch.randint(5, agent.model.get_input_embeddings().num_embeddings, (n_rows,), generator=gen)
    ids[-4:] = -1  # a few latent rows, as after latent steps
    embeds = agent.embed(ids.clamp_min(0)).clone()
    embeds[-4:] = torch.randn(4, g.hidden_size, generator=gen) * agent.mean_embedding_norm / g.hidden_size ** 0.5
    rows = Rows(embeds, ids, (g.model, g.tokenizer))
    sel = wire.Selection("cacheback", n_rows, 16.0)
    kw = dict(protocol="cacheback", sender_geometry=g, positions=positions, selection=sel)
    plain = wire.encode(rows, **kw)
    signed = wire.encode(rows, signer=SIGNER, **kw)
    sealed = wire.seal(signed, KEY)
    tok_ids = wire.encode(rows, encoding="token_ids", **kw)
    trusted = {SIGNER.public_key}
    res = {"receiver": which, "rows": n_rows, "hidden": g.hidden_size, "sender_rows": sender_rows,
           "embeds_bytes": rows.nbytes, "message_bytes": len(plain), "signed_bytes": len(signed),
           "sealed_bytes": len(sealed), "token_ids_bytes": len(tok_ids)}
    res["encode_s"] = best_time(lambda: wire.encode(rows, **kw), repeats)
    res["decode_s"] = best_time(lambda: wire.decode(plain, expect=g), repeats)
    res["encode_signed_s"] = best_time(lambda: wire.encode(rows, signer=SIGNER, **kw), repeats)
    res["decode_verified_s"] = best_time(lambda: wire.decode(signed, expect=g, verify=trusted), repeats)
    res["seal_s"] = best_time(lambda: wire.seal(signed, KEY), repeats)
    res["open_s"] = best_time(lambda: wire.open_sealed(sealed, KEY), repeats)
    res["token_ids_encode_s"] = best_time(lambda: wire.encode(rows, encoding="token_ids", **kw), repeats)
    res["token_ids_decode_s"] = best_time(lambda: wire.decode(tok_ids, expect=g).body.to_rows(agent.embed), repeats)
    question = "Which city is the capital of the country described in the notes?"
    agent.answer(question, message=rows, max_new_tokens=1)  # warm-up
    prefill = [agent.answer(question, message=rows, max_new_tokens=1).prefill_seconds
               for _ in range(max(3, repeats // 4))]
    res["reprefill_s"] = min(prefill)
    res["reprefill_rows"] = agent.calls[-1].rows_in
    return res


# -- report ---------------------------------------------------------------------------------------
def report(args, fz: dict, ov: dict) -> str:
    cmd = "python benchmarks/wire_fuzz.py " + " ".join(sys.argv[1:])
    total = collections.Counter()
    for c in fz["by_op"].values():
        total.update(c)
    lines = [f"# Wire format: decoder fuzz ({fz['inputs']:,} inputs) and CacheBack-16× message overhead", "",
             f"Command: `{cmd.strip()}`  ", f"torch {torch.__version__}, {torch.get_num_threads()} thread.", "",
             "## Fuzz", "",
             "Seeds (valid messages, tiny random-weight models): " +
             ", ".join(f"{n} ({b:,} B)" for n, b in fz["seeds"]) + "; sealed copies of the first three.", "",
             "| operator | inputs | typed errors | accepted | of which no-op | accepted, not canonical | crashes |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for op, c in list(fz["by_op"].items()) + [("**all**", total)]:
        n = c.get("ok", 0) + c.get("typed", 0) + c.get("crash", 0)
        lines.append(f"| {op} | {n:,} | {c.get('typed', 0):,} | {c.get('ok', 0)} | {c.get('unchanged', 0)} | "
                     f"{c.get('not canonical', 0)} | {c.get('crash', 0)} |")
    per_class = collections.Counter()
    for cls, fld, n in fz["errors"]:
        per_class[cls] += n
    lines += ["", f"{fz['inputs']:,} inputs in {fz['seconds']:.1f} s ({1e3 * fz['seconds'] / fz['inputs']:.2f} ms "
              f"each). Crashes (an exception other than a LatentWireError): **{len(fz['crashes'])}**.", "",
              "Typed errors by class: " + ", ".join(f"{k} {v:,}" for k, v in per_class.most_common()) + ".", "",
              "| error | field | inputs |", "|---|---|---:|"]
    lines += [f"| {cls} | `{fld}` | {n:,} |" for cls, fld, n in fz["errors"]]
    if fz["crashes"]:
        lines += ["", "Crashes:", ""] + [f"- {op}: {d}" for op, d in fz["crashes"]]
    wire_s = ov["encode_s"] + ov["decode_s"]
    signed_s = ov["encode_signed_s"] + ov["decode_verified_s"] + ov["seal_s"] + ov["open_s"]
    ms = lambda s: f"{1e3 * s:.2f}"  # noqa: E731
    lines += ["", "## Overhead of a CacheBack 16× message", "",
              f"{ov['rows']} rows × {ov['hidden']} float32 (16× of a {ov['sender_rows']:,}-row sender, "
              "4 latent rows), "
              f"receiver {ov['receiver']}; best of {args.repeats} "
              f"(re-prefill: best of {max(3, args.repeats // 4)}).", "",
              "| step | ms | bytes |", "|---|---:|---:|",
              f"| embeds alone | | {ov['embeds_bytes']:,} |",
              f"| encode | {ms(ov['encode_s'])} | {ov['message_bytes']:,} |",
              f"| decode (strict, expect=receiver geometry) | {ms(ov['decode_s'])} | |",
              f"| encode + sign | {ms(ov['encode_signed_s'])} | {ov['signed_bytes']:,} |",
              f"| decode + verify | {ms(ov['decode_verified_s'])} | |",
              f"| seal (ChaCha20-Poly1305) | {ms(ov['seal_s'])} | {ov['sealed_bytes']:,} |",
              f"| open | {ms(ov['open_s'])} | |",
              f"| token_ids encoding: encode | {ms(ov['token_ids_encode_s'])} | {ov['token_ids_bytes']:,} |",
              f"| token_ids encoding: decode + re-embed | {ms(ov['token_ids_decode_s'])} | |",
              f"| **receiver re-prefill** ({ov['reprefill_rows']} rows: message + template) | "
              f"**{ms(ov['reprefill_s'])}** | |", "",
              f"Encode + decode = {ms(wire_s)} ms = **{100 * wire_s / ov['reprefill_s']:.2f}%** of the re-prefill "
              f"(target ≤ 5%); signed + sealed end to end (encode, sign, seal, open, decode, verify) = "
              f"{ms(signed_s)} ms "
              f"= {100 * signed_s / ov['reprefill_s']:.2f}%. Header overhead: "
              f"{ov['message_bytes'] - ov['embeds_bytes'] - 8 * ov['rows']:,} bytes beyond the tensors "
              f"(geometry, positions, table)."]
    return "\n".join(lines) + "\n"


def run_atheris(runs: int) -> None:
    import atheris

    import inspect

    from latentwire import state
    from latentwire.merge import fragments
    from latentwire.wire import decoder, encoder, schema, security

    for module in (schema, encoder, decoder, security, state, fragments):  # the decoding code only (not torch)
        for obj in list(vars(module).values()):
            funcs = [obj] if inspect.isfunction(obj) else [f for f in vars(obj).values() if inspect.isfunction(f)] \
                if inspect.isclass(obj) and obj.__module__ == module.__name__ else []
            for f in funcs:
                if f.__module__ == module.__name__:
                    atheris.instrument_func(f)
    seedlist = seeds()
    folder = Path("/tmp/wire_atheris_corpus")
    folder.mkdir(exist_ok=True)
    for name, data, _kw in seedlist:
        (folder / name).write_bytes(data)

    def one(data: bytes) -> None:
        try:
            wire.decode(data)
        except LatentWireError:
            pass

    atheris.Setup([sys.argv[0], f"-runs={runs}", "-max_len=65536", str(folder)], one)
    atheris.Fuzz()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inputs", type=int, default=12000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rows", type=int, default=94, help="message rows (94 = 1,500 sender rows at 16×)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--corpus", type=Path, default=None)
    ap.add_argument("--atheris", type=int, default=0, help="run atheris for this many inputs instead, then exit")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.atheris:
        return run_atheris(args.atheris)
    fz = fuzz(args.inputs, args.seed, args.corpus)
    ov = overhead(args.rows, args.repeats)
    md = report(args, fz, ov)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "wire_fuzz.md").write_text(md)
    (OUT / "wire_fuzz.json").write_text(json.dumps({"env": environment(), "fuzz": fz, "overhead": ov}, indent=1) + "\n")
    print(md)


if __name__ == "__main__":
    main()

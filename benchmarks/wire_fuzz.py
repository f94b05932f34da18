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
Writes docs/results/wire_fuzz.{md,json}. The seeds, mutators and hand-made cases are in wire_fuzz_inputs.py.
"""
from __future__ import annotations

import argparse
import collections
import json
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from wire_fuzz_inputs import KEY, OPS, SIGNER, handmade, make_input, sealed_seed, seeds  # noqa: E402

from latentwire import wire  # noqa: E402
from latentwire.agent import Agent  # noqa: E402
from latentwire.bench.folder import environment  # noqa: E402
from latentwire.errors import LatentWireError  # noqa: E402
from latentwire.message import Rows  # noqa: E402
from latentwire.models import get_zoo_model, tiny_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "results"


# -- fuzz -----------------------------------------------------------------------------------------
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

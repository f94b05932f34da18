"""CRDT sync: merge of two large FragmentSets and one full anti-entropy round between two replicas.

    python benchmarks/crdt_sync.py [--fragments 1000] [--overlap 0.8] [--rows 8] [--model smollm2-135m]
                                   [--seed 0] [--repeats 5] [--render -1]

Two replicas each hold `--fragments` fragments: round(fragments × overlap) shared, the rest their own
(1,000 at 0.8: 800 shared + 200 own each, 1,200 distinct in all). Fragments are synthetic KVStates of
`--rows` rows with the real geometry of a bundled model (random keys/values/token ids, fixed seed). The
geometry is the loaded model's own. Measures:

- build: generating the tensors, hashing each state into a Fragment (canonical bytes + SHA-256) and
  building each replica's FragmentSet (replica B receives its fragments in another order);
- merge: `A.merge(B)` (median of `--repeats`);
- one anti-entropy round done the proper way: the replicas swap digest lists (32 raw bytes per digest),
  each ships `missing_from(peer digests).to_bytes()`, the receiver decodes it with the strict
  `FragmentSet.from_bytes` (every fragment re-hashed) and merges. Bytes exchanged (digests + deltas)
  vs the naive round where each side ships its whole set (`to_bytes()`, decoded and merged too);
- convergence: both replicas end with the same digests (= A ∪ B), and a CanonicalMerge render of the
  first `--render` fragments in digest order (default -1: all; 0: skip) gives the same digest on both
  replicas, replica B rendering from a reversed input.

Writes docs/results/crdt_sync.{md,json}.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch

from latentwire.bench.folder import environment
from latentwire.merge import CanonicalMerge, Fragment, FragmentSet
from latentwire.agent import Agent
from latentwire.state import Geometry, KVState, LayerKV

OUT = Path(__file__).resolve().parents[1] / "docs" / "results"
DIGEST_BYTES = 32


def model_geometry(name: str) -> tuple[Geometry, int]:
    """(geometry, vocabulary size) of a bundled model, as an Agent of it would report them."""
    agent = Agent.from_pretrained(name)
    return agent.geometry, len(agent.tokenizer)


def synthetic_state(g: Geometry, rows: int, vocab: int, gen: torch.Generator) -> KVState:
    """A state of `rows` token rows at positions 0..rows-1: random keys, values and token ids (float32)."""
    positions, layers = torch.arange(rows), []
    for kind in g.layer_types:
        n = rows if kind == "global" else min(rows, g.sliding_window - 1)  # a sliding layer holds its window
        shape = (g.num_kv_heads, n, g.head_dim)
        layers.append(LayerKV(torch.randn(shape, generator=gen), torch.randn(shape, generator=gen),
                              positions[rows - n:]))
    return KVState(g, tuple(layers), positions, torch.randint(0, vocab, (rows,), generator=gen),
                   torch.empty(0, g.hidden_size))


def encode_digests(digests) -> bytes:
    return b"".join(bytes.fromhex(d) for d in digests)


def decode_digests(data: bytes) -> list[str]:
    return [data[i:i + DIGEST_BYTES].hex() for i in range(0, len(data), DIGEST_BYTES)]


def clock(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


def parse_args() -> argparse.Namespace:
    """The command line, checked: --fragments, --rows, --repeats ≥ 1 and 0 ≤ --overlap ≤ 1."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fragments", type=int, default=1000, help="fragments per replica")
    ap.add_argument("--overlap", type=float, default=0.8, help="share of each replica's fragments the other holds too")
    ap.add_argument("--rows", type=int, default=8, help="rows per fragment")
    ap.add_argument("--model", default="smollm2-135m", help="bundled model whose geometry the fragments have")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=5, help="timings of merge: median of this many")
    ap.add_argument("--render", type=int, default=-1,
                    help="CanonicalMerge-render the first K fragments in digest order on both replicas (0: skip, -1: all)")
    args = ap.parse_args()
    if not 0 <= args.overlap <= 1 or min(args.fragments, args.rows, args.repeats) < 1:
        ap.error("want --fragments, --rows, --repeats ≥ 1 and 0 ≤ --overlap ≤ 1")
    return args


def command(args: argparse.Namespace) -> str:
    """The command line that reproduces this run, every option spelled out."""
    return (f"python benchmarks/crdt_sync.py --fragments {args.fragments} --overlap {args.overlap} --rows {args.rows} "
            f"--model {args.model} --seed {args.seed} --repeats {args.repeats} --render {args.render}")


def build(args: argparse.Namespace, g: Geometry, vocab: int, shared: int,
          own: int) -> tuple[FragmentSet, FragmentSet, dict]:
    """Replicas A and B of synthetic states (B receives its fragments in another order), and the build's
    numbers: states generated, median canonical bytes of a fragment, seconds per step."""
    gen = torch.Generator().manual_seed(args.seed)
    states, gen_s = clock(lambda: [synthetic_state(g, args.rows, vocab, gen) for _ in range(shared + 2 * own)])
    in_a = states[:shared] + states[shared:shared + own]
    in_b = states[:shared] + states[shared + own:]
    random.Random(args.seed).shuffle(in_b)  # B received its fragments in another order

    # Each replica hashes its own copy of every state it holds (shared ones are hashed on both sides).
    frags_a, hash_a = clock(lambda: [Fragment.of(s) for s in in_a])
    frags_b, hash_b = clock(lambda: [Fragment.of(s) for s in in_b])
    a, set_a = clock(FragmentSet, frags_a)
    b, set_b = clock(FragmentSet, frags_b)
    if len(a) != args.fragments or len(b) != args.fragments:
        raise SystemExit(f"synthetic states collided: |A| = {len(a)}, |B| = {len(b)}")
    frag_bytes = statistics.median(len(f.state.to_bytes()) for f in frags_a[:16])
    print(f"built: tensors {gen_s:.2f} s, hashing {hash_a + hash_b:.2f} s, sets {set_a + set_b:.3f} s", flush=True)
    return a, b, {"states": len(states), "fragment_bytes": frag_bytes,
                  "seconds": {"generate": gen_s, "hash": [hash_a, hash_b], "build_set": [set_a, set_b]}}


def timed_merges(a: FragmentSet, b: FragmentSet, repeats: int, distinct: int) -> tuple[FragmentSet, list[float]]:
    """A ∪ B and the seconds of each of `repeats` merges; exits unless it is the union, either way round."""
    merge_times = []
    for _ in range(repeats):
        union, dt = clock(a.merge, b)
        merge_times.append(dt)
    if union != b.merge(a) or len(union) != distinct:
        raise SystemExit("merge is not the union")
    return union, merge_times


def anti_entropy(a: FragmentSet, b: FragmentSet) -> tuple[FragmentSet, FragmentSet, dict, dict]:
    """One round, digests first, then only the difference: (A after, B after, seconds and bytes per phase,
    the round's bytes, seconds and fragments shipped)."""
    (dig_a, t_enc_a), (dig_b, t_enc_b) = clock(encode_digests, a.digests), clock(encode_digests, b.digests)
    (seen_by_a, t_dec_a), (seen_by_b, t_dec_b) = clock(decode_digests, dig_b), clock(decode_digests, dig_a)
    (delta_ab, t_delta_a), (delta_ba, t_delta_b) = (clock(lambda: a.missing_from(seen_by_a).to_bytes()),
                                                    clock(lambda: b.missing_from(seen_by_b).to_bytes()))
    (got_b, t_from_b), (got_a, t_from_a) = clock(FragmentSet.from_bytes, delta_ab), clock(FragmentSet.from_bytes, delta_ba)
    (b2, t_merge_b), (a2, t_merge_a) = clock(b.merge, got_b), clock(a.merge, got_a)
    phases = {
        "digest lists": {"seconds": t_enc_a + t_enc_b + t_dec_a + t_dec_b, "bytes": len(dig_a) + len(dig_b)},
        "deltas (missing_from + to_bytes)": {"seconds": t_delta_a + t_delta_b, "bytes": len(delta_ab) + len(delta_ba)},
        "receive (from_bytes, re-hashed)": {"seconds": t_from_a + t_from_b, "bytes": 0},
        "merge received": {"seconds": t_merge_a + t_merge_b, "bytes": 0},
    }
    sync = {"bytes": sum(p["bytes"] for p in phases.values()), "seconds": sum(p["seconds"] for p in phases.values()),
            "fragments_shipped": len(got_a) + len(got_b)}
    return a2, b2, phases, sync


def naive_round(a: FragmentSet, b: FragmentSet, union: FragmentSet) -> tuple[dict, bool]:
    """Each side ships its whole set; the receiver decodes and merges it all: (bytes and seconds, converged)."""
    (full_a, t_full_a), (full_b, t_full_b) = clock(a.to_bytes), clock(b.to_bytes)
    (naive_b, t_nfrom_b), (naive_a, t_nfrom_a) = clock(FragmentSet.from_bytes, full_a), clock(FragmentSet.from_bytes, full_b)
    (naive_b2, t_nmerge_b), (naive_a2, t_nmerge_a) = clock(b.merge, naive_b), clock(a.merge, naive_a)
    naive_ok = naive_a2.digests == naive_b2.digests == union.digests
    naive = {"bytes": len(full_a) + len(full_b), "seconds": t_full_a + t_full_b + t_nfrom_a + t_nfrom_b + t_nmerge_a + t_nmerge_b}
    return naive, naive_ok


def render_both(a2: FragmentSet, b2: FragmentSet, k: int) -> dict:
    """CanonicalMerge renders of the first k fragments in digest order on A and on B (B from a reversed
    input): rows, seconds, both digests and whether they are equal; {"fragments": 0} when k is 0."""
    if not k:
        return {"fragments": 0}
    sub_a, sub_b = a2.subset(a2.digests[:k]), b2.subset(b2.digests[:k])
    state_a, t_render_a = clock(CanonicalMerge().render, sub_a)
    state_b, t_render_b = clock(CanonicalMerge().render, list(reversed(sub_b.fragments)))
    render = {"fragments": k, "rows": len(state_a), "seconds": [t_render_a, t_render_b],
              "digest_a": state_a.digest(), "digest_b": state_b.digest()}
    render["equal"] = render["digest_a"] == render["digest_b"]
    return render


def page(r: dict, args: argparse.Namespace, g: Geometry, states: int, held: int) -> str:
    """The markdown page of a run's results `r` (crdt_sync.json's fields); `held`: digests on A after the round."""
    mb = 1 / 2**20
    secs, sync, naive, render = r["seconds"], r["anti_entropy"], r["naive"], r["render"]
    phases, k = sync["phases"], render["fragments"]
    lines = [f"# CRDT sync: two replicas of {args.fragments:,} fragments ({args.model} geometry, {args.rows} rows each)",
             "", f"Command: `{r['command']}`", "",
             f"Replica A and B: {r['shared']:,} shared + {r['own']:,} own fragments each, {r['distinct']:,} distinct; "
             f"one fragment = {r['fragment_bytes'] / 1024:.1f} KiB of canonical bytes (synthetic float32 state: "
             f"{g.num_layers} layers × {g.num_kv_heads} KV heads × head_dim {g.head_dim}, "
             "the loaded model's geometry).",
             "", "| step | time (s) | bytes |", "|---|---:|---:|",
             f"| generate tensors ({states:,} states) | {secs['generate']:.3f} | |",
             f"| hash into fragments (A + B, {2 * args.fragments:,}) | {secs['hash'][0] + secs['hash'][1]:.3f} | |",
             f"| build FragmentSets (A + B) | {secs['build_set'][0] + secs['build_set'][1]:.4f} | |",
             f"| `A.merge(B)` (median of {args.repeats}) | {statistics.median(secs['merge']):.5f} | |",
             "| **anti-entropy round** | | |"]
    lines += [f"| &nbsp; {name} | {p['seconds']:.4f} | {p['bytes']:,} |" for name, p in phases.items()]
    lines += [f"| **round total (digests first)** | **{sync['seconds']:.3f}** | **{sync['bytes']:,}** "
              f"({sync['bytes'] * mb:.1f} MiB) |",
              f"| naive round (each side ships its whole set, decoded and merged) | {naive['seconds']:.3f} | "
              f"{naive['bytes']:,} ({naive['bytes'] * mb:.1f} MiB) |", "",
              f"Digests first ship {sync['fragments_shipped']:,} fragments instead of {2 * args.fragments:,}: "
              f"{sync['bytes'] / naive['bytes']:.3f}× the naive bytes "
              f"(digest lists: {phases['digest lists']['bytes']:,} bytes, {DIGEST_BYTES} raw bytes per digest), "
              f"{sync['seconds'] / naive['seconds']:.3f}× its time.", "",
              f"Converged: {'yes' if sync['converged'] else 'NO'} — both replicas hold the same {held:,} digests, "
              f"equal to A ∪ B (naive round too: {'yes' if naive['converged'] else 'NO'})."]
    if k:
        lines += ["", f"CanonicalMerge render of the first {k:,} fragments in digest order ({render['rows']:,} rows; "
                  f"{'the whole set' if k == r['distinct'] else 'a subset, to keep the render small'}): "
                  f"{render['seconds'][0]:.3f} s on A, {render['seconds'][1]:.3f} s on B (reversed input); "
                  f"digests {'equal' if render['equal'] else 'DIFFER'} ({render['digest_a'][:16]}…)."]
    else:
        lines += ["", "CanonicalMerge render: skipped (`--render 0`)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    """Build both replicas, merge them, sync them once digests first and once naively, render, write the page."""
    args = parse_args()
    shared = round(args.fragments * args.overlap)
    own = args.fragments - shared

    g, vocab = model_geometry(args.model)
    print(f"{args.model}: {g.num_layers} layers × {g.num_kv_heads} KV heads × head_dim {g.head_dim}", flush=True)
    a, b, built = build(args, g, vocab, shared, own)
    union, merge_times = timed_merges(a, b, args.repeats, shared + 2 * own)
    a2, b2, phases, sync = anti_entropy(a, b)
    converged = a2.digests == b2.digests == union.digests
    naive, naive_ok = naive_round(a, b, union)
    render = render_both(a2, b2, len(union) if args.render < 0 else min(args.render, len(union)))
    result = {"command": command(args), "model": args.model, "fragments": args.fragments, "shared": shared,
              "own": own, "distinct": len(union), "rows": args.rows, "fragment_bytes": built["fragment_bytes"],
              "seconds": built["seconds"] | {"merge": merge_times},
              "anti_entropy": {"phases": phases, **sync, "converged": converged},
              "naive": {**naive, "converged": naive_ok}, "render": render}
    text = page(result, args, g, built["states"], len(a2))
    print(text)
    OUT.mkdir(parents=True, exist_ok=True)
    stem = OUT / "crdt_sync"
    stem.with_name(stem.name + ".md").write_text(text)
    record = result | {"environment": environment()}
    stem.with_name(stem.name + ".json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {stem}.md")
    if not (converged and naive_ok and render.get("equal", True)):
        raise SystemExit("replicas did not converge")


if __name__ == "__main__":
    main()

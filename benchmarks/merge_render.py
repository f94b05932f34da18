"""Merge renders on real thinker states: byte-identity under every input order, and render cost.

    python benchmarks/merge_render.py [--models smollm2-135m,qwen2.5-coder-0.5b,gemma3-270m] [--seed 0]
                                      [--tokens 120] [--think-steps 4] [--max-n 5]

For each bundled model, `--max-n` thinkers each read one document of a generated `facts` episode (~`--tokens`
tokens each, query-blind: `Read this document.` + the document) and think `--think-steps` latent steps;
each finished state is a Fragment. For N = 2 … max-n (the first N thinkers), CanonicalMerge and BagMerge
render the N fragments given in every one of the N! input orders. Reports the number of distinct render
digests (CanonicalMerge must give 1; BagMerge gives up to N!), the median render time of each over the
N! orders (render only: ordering, re-rotation and concatenation; hashing the result is not timed), and
the time of CanonicalMerge's sort key (mean K-norm at the middle layer) per fragment. Target: at N = 5,
CanonicalMerge ≤ 1.1× BagMerge. Writes docs/results/merge_render.{md,json}.
"""
from __future__ import annotations

import argparse
import gc
import itertools
import json
import math
import statistics
import time
from pathlib import Path

from latentwire.agent import Agent
from latentwire.bench.folder import environment
from latentwire.bench.tasks.facts import episodes as facts_episodes
from latentwire.merge import BagMerge, CanonicalMerge, Fragment
from latentwire.protocols.base import SENDER_PROMPT, timed

OUT = Path(__file__).resolve().parents[1] / "docs" / "results"
TARGET = 1.1  # CanonicalMerge render time ÷ BagMerge render time, at N = 5


def thinkers(agent: Agent, documents: list[str], steps: int) -> tuple[list[Fragment], list[float]]:
    """One fragment per document: prefill (query-blind) + `steps` latent steps; and the seconds each took."""
    fragments, seconds = [], []
    for doc in documents:
        t0 = time.perf_counter()
        fragments.append(Fragment.of(agent.think(agent.prefill(SENDER_PROMPT.format(document=doc)), steps)))
        seconds.append(time.perf_counter() - t0)
    return fragments, seconds


def orders(fragments: list[Fragment]) -> dict:
    """Render the fragments under every input order with both renders; digests and render times."""
    n = len(fragments)
    canonical, bag = CanonicalMerge(), BagMerge()
    digests = {"canonical": set(), "bag": set()}
    seconds = {"canonical": [], "bag": []}
    for k, perm in enumerate(itertools.permutations(range(n))):
        given = [fragments[i] for i in perm]  # arrival order
        jobs = [("canonical", canonical), ("bag", bag)]
        for name, render in (jobs if k % 2 == 0 else jobs[::-1]):  # alternate which runs first
            state, dt = timed(None, render.render, given)  # on the CPU here
            seconds[name].append(dt)
            digests[name].add(state.digest())
    key_s = []
    for f in fragments:  # the sort key alone: one layer's K-norms, float64, fsum
        key_s.append(min(timed(None, canonical.key, f)[1] for _ in range(5)))
    slots = [fragments.index(f) for f in canonical.order(fragments)]
    return {"n": n, "orders": math.factorial(n),
            "distinct": {name: len(d) for name, d in digests.items()},
            "canonical_is_a_bag_order": digests["canonical"] <= digests["bag"],
            "render_s_median": {name: statistics.median(s) for name, s in seconds.items()},
            "render_s": seconds, "key_s_per_fragment_median": statistics.median(key_s),
            "key_s_all": sum(key_s), "canonical_slots": slots, "rows": sum(len(f) for f in fragments),
            "canonical_digest": next(iter(digests["canonical"])) if len(digests["canonical"]) == 1 else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2-135m,qwen2.5-coder-0.5b,gemma3-270m")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokens", type=int, default=120, help="approximate tokens per thinker document")
    ap.add_argument("--think-steps", type=int, default=4, help="latent steps each thinker runs")
    ap.add_argument("--max-n", type=int, default=5, help="largest number of thinkers (N = 2 … max-n)")
    args = ap.parse_args()
    if not 2 <= args.max_n <= 7:
        ap.error("--max-n: want 2 … 7 (N! orders are rendered twice each)")
    documents = list(facts_episodes(args.seed, n=1, tokens=args.tokens, senders=args.max_n)[0].contexts)

    results = {}
    for model in args.models.split(","):
        agent = Agent.from_pretrained(model)
        fragments, think_s = thinkers(agent, documents, args.think_steps)
        per_n = []
        for n in range(2, args.max_n + 1):
            per_n.append(orders(fragments[:n]))
            r = per_n[-1]
            print(f"{model} N={n}: canonical {r['distinct']['canonical']} / bag {r['distinct']['bag']} distinct over "
                  f"{r['orders']} orders; render {1e3 * r['render_s_median']['canonical']:.1f} vs "
                  f"{1e3 * r['render_s_median']['bag']:.1f} ms", flush=True)
        results[agent.model_name] = {"thinker_rows": [len(f) for f in fragments], "think_s": think_s,
                                     "per_n": per_n}
        del agent, fragments
        gc.collect()

    cmd = (f"python benchmarks/merge_render.py --models {args.models} --seed {args.seed} --tokens {args.tokens} "
           f"--think-steps {args.think_steps} --max-n {args.max_n}")
    lines = [f"# Merge renders on real thinker states (N = 2 … {args.max_n}, all N! input orders)", "",
             f"Command: `{cmd}`", "",
             f"Thinkers: one generated `facts` document each (~{args.tokens} tokens, query-blind prompt) + "
             f"{args.think_steps} latent steps. Render times: median over the N! orders, render only (the "
             f"digest of the result is not timed); key: CanonicalMerge's sort key (mean K-norm at the middle "
             f"layer), median per fragment.", "",
             "| model | N | orders | rows | CanonicalMerge distinct | BagMerge distinct | canonical ms | bag ms "
             "| canonical ÷ bag | key ms / fragment |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    verdicts = []
    for model, res in results.items():
        for r in res["per_n"]:
            c, b = r["render_s_median"]["canonical"], r["render_s_median"]["bag"]
            lines.append(f"| {model} | {r['n']} | {r['orders']} | {r['rows']} | {r['distinct']['canonical']} | "
                         f"{r['distinct']['bag']} | {1e3 * c:.2f} | {1e3 * b:.2f} | {c / b:.3f} | "
                         f"{1e3 * r['key_s_per_fragment_median']:.3f} |")
        last = res["per_n"][-1]
        ratio = last["render_s_median"]["canonical"] / last["render_s_median"]["bag"]
        res["ratio_at_max_n"] = ratio
        res["byte_identical"] = all(r["distinct"]["canonical"] == 1 for r in res["per_n"])
        verdicts.append(f"- {model}: CanonicalMerge byte-identical under every order for every N: "
                        f"{'yes' if res['byte_identical'] else 'NO'}; BagMerge distinct digests "
                        f"{', '.join(str(r['distinct']['bag']) + '/' + str(r['orders']) for r in res['per_n'])}; "
                        f"render time at N = {last['n']}: canonical ÷ bag = {ratio:.3f} "
                        + (f"(target ≤ {TARGET}: {'met' if ratio <= TARGET else 'MISSED'})" if last["n"] == 5
                           else f"(the ≤ {TARGET} target is stated at N = 5)"))
    lines += ["", *verdicts]
    text = "\n".join(lines) + "\n"
    print(text)
    OUT.mkdir(parents=True, exist_ok=True)
    stem = OUT / "merge_render"
    stem.with_name(stem.name + ".md").write_text(text)
    stem.with_name(stem.name + ".json").write_text(json.dumps(
        {"command": cmd, "documents": documents, "target": TARGET, "models": results, "environment": environment()},
        indent=2) + "\n")
    print(f"wrote {stem}.md")


if __name__ == "__main__":
    main()

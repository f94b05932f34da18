"""What CacheBack's scoring + selection costs the sender, against its read, as the document grows.

    python benchmarks/scoring_cost.py [--models smollm2-135m,qwen2.5-coder-0.5b] [--dtypes float32,bfloat16]
                                      [--tokens 500,1000,2000,4000] [--latent-steps 8] [--reps 3]

For one generated `facts` document per size: the sender's read (prefill of SENDER_PROMPT + G latent
steps), then the receiver's question scored against the finished state (`Agent.attend`: the m query
tokens through the model with its own attention implementation, queries captured by hooks, weights
computed over the cached keys; then reductions, Pool7, correction) and spans selected at 8×. Also the
same m tokens through the model with nothing captured: the floor any query-attention scorer pays.
Medians over `--reps`. Run it alone: the machine has 2 cores, and a second job skews every number. Writes
docs/results/scoring_cost.{md,json}.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from latentwire.agent import Agent
from latentwire.bench.folder import environment
from latentwire.bench.tasks.facts import episodes as facts_episodes
from latentwire.protocols.base import SENDER_PROMPT
from latentwire.protocols.cacheback import CacheBack, document_rows
from latentwire.select import always_kept, fanin_budget, get_selector, select_rows

OUT = Path(__file__).resolve().parents[1] / "docs" / "results"


def measure(agent: Agent, tokens: int, reps: int, latent_steps: int) -> dict:
    ep = facts_episodes(seed=tokens, n=1, tokens=tokens, senders=1, hops=1)[0]
    doc, selector, cb = ep.contexts[0], get_selector("cacheback"), CacheBack(latent_steps=0)
    query = cb.attention.query_text(agent, ep.question)
    ids = agent.ids(agent.tokenizer(query, add_special_tokens=False)["input_ids"])
    prefill, score, floor = [], [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        state = agent.think(agent.prefill(SENDER_PROMPT.format(document=doc)), latent_steps)
        t1 = time.perf_counter()
        _, eligible = document_rows(agent, doc, len(state))
        select_rows(selector.score(agent, state, query), fanin_budget(len(state), 8), always_kept(state), eligible=eligible)
        t2 = time.perf_counter()
        with torch.inference_mode():
            agent._forward(state.to_cache(), len(state), ids=ids)
        t3 = time.perf_counter()
        prefill.append(t1 - t0), score.append(t2 - t1), floor.append(t3 - t2)
    p, s, f = map(statistics.median, (prefill, score, floor))
    return {"tokens": tokens, "T": len(state), "m": len(ids), "prefill_s": p, "score_select_s": s,
            "query_forward_s": f, "share": s / p, "floor_share": f / p}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2-135m,qwen2.5-coder-0.5b")
    ap.add_argument("--tokens", default="500,1000,2000,4000")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--latent-steps", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    rows = {}
    for model in args.models.split(","):
        for dtype in args.dtypes.split(","):
            agent = Agent.from_pretrained(model, device="cpu", dtype=dtype)
            measure(agent, 200, 1, args.latent_steps)  # warm-up
            key = f"{model} {dtype}"
            rows[key] = [measure(agent, t, args.reps, args.latent_steps) for t in map(int, args.tokens.split(","))]
            for r in rows[key]:
                print(key, json.dumps(r), flush=True)
            del agent
    cmd = (f"python benchmarks/scoring_cost.py --models {args.models} --dtypes {args.dtypes} --tokens {args.tokens} "
           f"--latent-steps {args.latent_steps} --reps {args.reps}")
    env = environment()
    lines = ["# CacheBack scoring + selection vs the sender's read", "", f"Command: `{cmd}`", "",
             f"latentwire @ {str(env['git'])[:10]}, torch {env['torch']}, {env['torch_threads']} threads, CPU; medians "
             f"of {args.reps}. The read is the prefill plus G = {args.latent_steps} latent steps. Target: scoring + "
             "selection ≤ 5% of the read from ~1,000 tokens up on Qwen.", "",
             "| model, dtype | T rows | m query tokens | read s | score + select s | share | query forward alone s | its share |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for model, rs in rows.items():
        lines += [f"| {model} | {r['T']} | {r['m']} | {r['prefill_s']:.2f} | {r['score_select_s']:.3f} | "
                  f"{100 * r['share']:.1f}% {'✓' if r['share'] <= 0.05 else '✗'} | {r['query_forward_s']:.3f} | "
                  f"{100 * r['floor_share']:.1f}% |" for r in rs]
    text = "\n".join(lines) + "\n"
    print(text)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "scoring_cost.md").write_text(text)
    (OUT / "scoring_cost.json").write_text(json.dumps({"command": cmd, "rows": rows, "environment": env}, indent=2) + "\n")


if __name__ == "__main__":
    main()

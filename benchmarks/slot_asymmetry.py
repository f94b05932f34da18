"""Slot asymmetry (docs/methods.md#slot-asymmetry): how much of the judger's attention a fragment
gets in the prefix vs the tail slot.

    python benchmarks/slot_asymmetry.py [--model smollm2-135m] [--n 20] [--latent-steps 10]

For each 2-thinker `reasoning` problem: both thinkers read their premises query-blind and think G
steps; the pair is rendered by BagMerge in both orders; the judger's prompt (the question, as the
turn it would append) attends over each render (`Agent.attend`: mean over layers, heads and prompt
tokens). Per-token mass of a fragment = its block's attention mass ÷ its rows. Ratio = per-token
mass in the prefix slot ÷ in the tail slot, per fragment. The first row of the merged cache is an
attention sink that only the prefix fragment holds, so the ratio is also reported without each
block's first row. The paper: 8.5% less in the prefix, ratio 0.915. Writes
docs/results/slot_asymmetry_<model>.{md,json,png}.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from latentwire.agent import KV_PROMPT, Agent
from latentwire.bench.runner import load_task_episodes, select_episodes
from latentwire.merge import BagMerge, Fragment
from latentwire.protocols.base import SENDER_PROMPT
from latentwire.attention import attend

OUT = Path(__file__).resolve().parents[1] / "docs" / "results"


def row_mass(agent: Agent, state, query: str) -> torch.Tensor:
    """(T,) attention of the query on each row: mean over global layers, heads and query tokens."""
    return attend(agent, state, query).double().mean(dim=(0, 1, 2))


def per_token(row: torch.Tensor, start: int, length: int) -> tuple[float, float]:
    """Per-token mass on rows [start, start + length): with and without the block's first row."""
    block = row[start:start + length]
    return float(block.sum() / length), float(block[1:].sum() / (length - 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--latent-steps", type=int, default=10)
    args = ap.parse_args()
    agent = Agent.from_pretrained(args.model)
    episodes = select_episodes(load_task_episodes("reasoning"), args.n, args.seed, {"thinkers": 2})
    ratios, ratios_nosink = [], []
    for ep in episodes:
        frags = [Fragment.of(agent.think(agent.prefill(SENDER_PROMPT.format(document=doc)), args.latent_steps))
                 for doc in ep.contexts]
        query = agent.continuation_text(KV_PROMPT.format(question=ep.question))
        ab, ba = BagMerge((0, 1)).render(frags), BagMerge((1, 0)).render(frags)
        row_ab, row_ba = row_mass(agent, ab, query), row_mass(agent, ba, query)
        a, b = len(frags[0]), len(frags[1])
        # fragment A: prefix in ab (rows 0..a), tail in ba (rows b..b+a); fragment B the other way round
        for (p_row, p_start), (t_row, t_start), n in (((row_ab, 0), (row_ba, b), a), ((row_ba, 0), (row_ab, a), b)):
            p, t = per_token(p_row, p_start, n), per_token(t_row, t_start, n)
            ratios.append(p[0] / t[0])
            ratios_nosink.append(p[1] / t[1])
        print(f"{ep.id}: ratios {ratios[-2]:.3f} {ratios[-1]:.3f}; without block sinks "
              f"{ratios_nosink[-2]:.3f} {ratios_nosink[-1]:.3f}", flush=True)

    def summary(xs: list[float]) -> dict:
        gm = float(torch.tensor(xs, dtype=torch.float64).log().mean().exp())
        return {"mean": statistics.mean(xs), "median": statistics.median(xs), "geomean": gm,
                "prefix_lower_share": sum(x < 1 for x in xs) / len(xs)}

    s, s2 = summary(ratios), summary(ratios_nosink)
    cmd = f"python benchmarks/slot_asymmetry.py --model {args.model} --n {args.n} --seed {args.seed} --latent-steps {args.latent_steps}"
    lines = [f"# Slot asymmetry: per-token attention on a fragment, prefix ÷ tail slot ({args.model})", "",
             f"Command: `{cmd}`", "",
             f"{len(ratios)} fragments ({len(episodes)} two-thinker `reasoning` problems, G = {args.latent_steps}, "
             "query-blind thinkers). Paper: ratio 0.915 (8.5% less attention per token in the prefix slot).", "",
             "| | mean ratio | median | geometric mean | fragments with less in the prefix |", "|---|---:|---:|---:|---:|",
             f"| all rows | {s['mean']:.3f} | {s['median']:.3f} | {s['geomean']:.3f} | {100 * s['prefix_lower_share']:.0f}% |",
             f"| without each block's first row | {s2['mean']:.3f} | {s2['median']:.3f} | {s2['geomean']:.3f} | "
             f"{100 * s2['prefix_lower_share']:.0f}% |", "", f"![ratios](slot_asymmetry_{args.model}.png)"]
    text = "\n".join(lines) + "\n"
    print(text)
    OUT.mkdir(parents=True, exist_ok=True)
    stem = OUT / f"slot_asymmetry_{args.model}"
    stem.with_name(stem.name + ".md").write_text(text)
    stem.with_name(stem.name + ".json").write_text(json.dumps(
        {"command": cmd, "all_rows": s, "without_block_sinks": s2, "ratios": ratios, "ratios_without_block_sinks":
         ratios_nosink, "episodes": [e.id for e in episodes]}, indent=2) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    bins = torch.logspace(-1.5, 1.5, 31).tolist()
    ax.hist(ratios, bins=bins, alpha=0.6, label="all rows")
    ax.hist(ratios_nosink, bins=bins, alpha=0.6, label="without each block's first row")
    ax.axvline(1.0, color="k", lw=1)
    ax.axvline(0.915, color="r", ls="--", lw=1, label="paper: 0.915")
    ax.set(xscale="log", xlabel="per-token attention, prefix slot ÷ tail slot (log)", ylabel="fragments",
           title=f"{args.model}: slot asymmetry")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(stem.with_name(stem.name + ".png"), dpi=120)


if __name__ == "__main__":
    main()

"""Partitioned reasoning (docs/methods.md#merge-protocol): does CanonicalMerge track the best BagMerge
order without knowing it?

    python benchmarks/partitioned_reasoning.py [--model smollm2-135m] [--n 20] [--steps 0,10,40]

Two thinkers each hold half the premises of a shipped `reasoning` problem (`thinkers=2`). Cells: regime
(query-blind / query-aware thinkers) × latent steps G. In each cell: BagMerge in both orders,
CanonicalMerge (ascending mean K-norm, the default) and its descending ablation, and (once, outside
the grid) text passing, PackLLM, a single agent reading every premise (fullcontext) and the judger
alone. Runs through the bench runner (records under
runs/partitioned_<model>/, resumable). The claim tested: CanonicalMerge within a few points of the
*best* BagMerge order in every cell; the sort direction is the ablation (with two thinkers, descending
is, per problem, the order ascending did not choose).
Writes docs/results/partitioned_reasoning_<model>.{md,json,png}.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from latentwire.agent import Agent
from latentwire.bench.report import read_run
from latentwire.bench.runner import RunConfig, parse_protocols, run

ROOT = Path(__file__).resolve().parents[1]
RENDERS = {"bag (0,1)": "render='bag', order=(0, 1)", "bag (1,0)": "render='bag', order=(1, 0)",
           "canonical": "render='canonical'",
           "canonical desc": "render='canonical', direction='descending'"}
BASELINES = ("text(report='notes')", "packllm", "fullcontext", "alone")


def spec(render: str, steps: int, aware: bool) -> str:
    return f"merge({RENDERS[render]}, latent_steps={steps}, query_aware={aware})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", default="0,10,40")
    args = ap.parse_args()
    steps = [int(s) for s in args.steps.split(",")]
    cells = [(aware, g) for aware in (False, True) for g in steps]
    protocols = [spec(r, g, aware) for aware, g in cells for r in RENDERS] + list(BASELINES)
    labels = dict(zip(protocols, parse_protocols(",".join(protocols))))
    runs = ROOT / "runs" / f"partitioned_{args.model}"
    agent = Agent.from_pretrained(args.model)
    run(RunConfig("reasoning", ",".join(protocols), agent.model_name, args.n, args.seed, {"thinkers": 2}), runs,
        agent=agent)
    _, records = read_run(runs)

    def acc(p: str) -> float:
        rs = [r["accuracy"] for r in records if r["protocol"] == labels[p]]
        return statistics.mean(rs) if rs else float("nan")

    cmd = f"python benchmarks/partitioned_reasoning.py --model {args.model} --n {args.n} --seed {args.seed} --steps {args.steps}"
    lines = [f"# Partitioned reasoning, 2 thinkers ({args.model}, {args.n} `reasoning` problems)", "",
             f"Command: `{cmd}`", "",
             "Accuracy (contains the gold answer). Gap = CanonicalMerge (ascending, the default) − best "
             "BagMerge order; canonical desc = the descending sort (the direction ablation).", "",
             "| regime | G | bag (0,1) | bag (1,0) | canonical | canonical desc | gap to best bag "
             "| canonical order = best? |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    table = {}
    for aware, g in cells:
        a = {r: acc(spec(r, g, aware)) for r in RENDERS}
        best = max(a["bag (0,1)"], a["bag (1,0)"])
        table[f"{'aware' if aware else 'blind'}/G={g}"] = a
        lines.append(f"| {'query-aware' if aware else 'query-blind'} | {g} | {a['bag (0,1)']:.2f} | "
                     f"{a['bag (1,0)']:.2f} | {a['canonical']:.2f} | {a['canonical desc']:.2f} | "
                     f"{100 * (a['canonical'] - best):+.0f} pp | "
                     f"{'yes' if a['canonical'] >= best else 'no'} |")
    lines += ["", "| baseline | accuracy |", "|---|---:|"] + [f"| {b} | {acc(b):.2f} |" for b in BASELINES]
    lines += ["", f"![accuracy per cell](partitioned_reasoning_{args.model}.png)"]
    text = "\n".join(lines) + "\n"
    print(text)
    out = ROOT / "docs" / "results"
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"partitioned_reasoning_{args.model}"
    stem.with_name(stem.name + ".md").write_text(text)
    stem.with_name(stem.name + ".json").write_text(json.dumps(
        {"command": cmd, "cells": table, "baselines": {b: acc(b) for b in BASELINES}}, indent=2) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    names = list(table)
    for k, r in enumerate(RENDERS):
        ax.bar([i + 0.2 * (k - 1.5) for i in range(len(names))], [table[c][r] for c in names], width=0.2, label=r)
    ax.set_xticks(range(len(names)), names, fontsize=8)
    ax.set(ylabel="accuracy", ylim=(0, 1.05), title=f"{args.model}: BagMerge orders vs CanonicalMerge")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(stem.with_name(stem.name + ".png"), dpi=120)


if __name__ == "__main__":
    main()

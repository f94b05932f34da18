"""Train every translator of the translator grid (resumable; finished runs are skipped).

    python benchmarks/train_translators.py [--pairs gemma3-270m:smollm2-135m,...] [--methods xkv,lcfx,dense,c2c]
                                           [--steps 100] [--steps-for dense=60,c2c=60]
                                           [--batch 2] [--threads 1]

Pairs (sharer:receiver) default to the grid of docs/results/translators.md: three ordered pairs covering
the three families plus one same-model pair. Each run trains on both split-evidence tasks (facts two-hop,
reasoning premise split) into runs/translators/<method>_<sharer>_<receiver>/ (checkpoint, optimizer,
trainer.json) and draws its loss curves to loss.png there. Evaluate with benchmarks/translators.py.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from latentwire.agent import Agent
from latentwire.training.states import StateCache
from latentwire.training.trainer import TrainConfig, train

ROOT = Path(__file__).resolve().parents[1]
PAIRS = "gemma3-270m:smollm2-135m,qwen2.5-coder-0.5b:gemma3-270m,smollm2-135m:gemma3-270m,smollm2-135m:smollm2-135m"
METHODS = "xkv,lcfx,dense,dense_aware,c2c"  # dense_aware: dense trained for (and marked) context-aware
LR = {"xkv": 1e-3, "lcfx": 1e-3, "dense": 3e-3, "dense_aware": 3e-3, "c2c": 1e-3}


def run_dir(method: str, sharer: str, receiver: str) -> Path:
    return ROOT / "runs" / "translators" / f"{method}_{sharer}_{receiver}"


def config(method: str, sharer: str, receiver: str, steps: int, batch: int) -> TrainConfig:
    dense = method.startswith("dense")
    stage1 = steps // 3 if dense else 0  # dense: cache reconstruction first, then the answer loss
    return TrainConfig("dense" if dense else method, sharer, receiver, train_n=160, val_n=6, steps=steps + stage1,
                       batch=batch, lr=LR[method], stage1_steps=stage1, eval_every=max(1, (steps + stage1) // 4),
                       context_aware=method == "dense_aware")


def plot(folder: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    log = json.loads((folder / "trainer.json").read_text())
    fig, ax = plt.subplots(figsize=(5, 3.2))
    for stage, label in ((1, "train: stage I reconstruction"), (2, "train: answer loss")):
        pts = [(s, l) for s, st, l in log["train"] if st == stage]
        if pts:
            k = 10  # running mean over 10 steps
            ys = [sum(l for _, l in pts[max(0, i - k + 1):i + 1]) / len(pts[max(0, i - k + 1):i + 1])
                  for i in range(len(pts))]
            ax.plot([s for s, _ in pts], ys, label=label)
    ax.plot([s for s, _ in log["val"]], [v for _, v in log["val"]], "o-", label="validation answer loss")
    c = log["config"]
    ax.set(xlabel="step", ylabel="loss", title=f"{c['method']}: {c['sharer']} -> {c['receiver']}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / "loss.png", dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", default=PAIRS)
    ap.add_argument("--methods", default=METHODS)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--steps-for", default="dense=60,dense_aware=60,c2c=60", help="per-method answer-loss steps, e.g. c2c=60")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    agents: dict[str, Agent] = {}
    cache = StateCache()
    steps = {m: args.steps for m in args.methods.split(",")}
    steps |= {k: int(v) for k, v in (kv.split("=") for kv in args.steps_for.split(",") if kv)}
    pairs = [spec.split(":") for spec in args.pairs.split(",")]
    for name in {n for pair in pairs for n in pair}:
        agents[name] = Agent.from_pretrained(name)
    for method in args.methods.split(","):  # method-major: every pair gets XKV before anything gets C2C
        for sharer, receiver in pairs:
            folder = run_dir(method, sharer, receiver)
            cfg = config(method, sharer, receiver, steps[method], args.batch)
            train(cfg, folder, agents[sharer], agents[receiver], cache)
            plot(folder)
            log = json.loads((folder / "trainer.json").read_text())
            print(f"{method:6} {sharer:>14} -> {receiver:14} params {log['parameters']:>10,d}  "
                  f"val {log['val'][0][1]:.3f} -> {log['val'][-1][1]:.3f}  {log.get('seconds', 0):.0f} s", flush=True)


if __name__ == "__main__":
    main()

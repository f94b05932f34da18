"""Train the translators of the translator grid (resumable; finished runs are skipped).

    python benchmarks/train_translators.py [--pairs gemma3-270m:smollm2-135m,...]
                                           [--methods xkv,lcfx,dense,dense_aware,c2c,c2c_input]
                                           [--steps 500] [--steps-for c2c=300] [--batch 2] [--threads 2]

Pairs (sharer:receiver) default to the grid of docs/results/translators/: three ordered pairs covering
the three families plus one same-model pair; the grid is meant to be filled one pair per sitting
(`--pairs A:B`, then `python benchmarks/translators.py --pairs A:B`). Methods: XKV, LCF-X, dense alignment
context-unaware and context-aware (`dense_aware`), C2C with its static gate and with its input-conditioned
gate (`c2c_input`). Each run trains on both split-evidence tasks (facts two-hop, reasoning premise split)
for `--steps` answer-loss steps (dense first adds steps // 3 of stage-I cache reconstruction) into
runs/translators/<method>_<sharer>_<receiver>/ (checkpoint, optimizer, trainer.json with the wall time)
and draws its loss curves to loss.png there.
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
# dense_aware: dense trained for (and marked) context-aware; c2c_input: C2C with its input-conditioned gate
METHODS = "xkv,lcfx,dense,dense_aware,c2c,c2c_input"
LR = {"xkv": 1e-3, "lcfx": 1e-3, "dense": 3e-3, "dense_aware": 3e-3, "c2c": 1e-3, "c2c_input": 1e-3}


def run_dir(method: str, sharer: str, receiver: str) -> Path:
    return ROOT / "runs" / "translators" / f"{method}_{sharer}_{receiver}"


def config(method: str, sharer: str, receiver: str, steps: int, batch: int) -> TrainConfig:
    dense = method.startswith("dense")
    stage1 = steps // 3 if dense else 0  # dense: cache reconstruction first, then the answer loss
    base = "dense" if dense else method.removesuffix("_input")
    return TrainConfig(base, sharer, receiver, train_n=160, val_n=6, steps=steps + stage1,
                       batch=batch, lr=LR[method], stage1_steps=stage1, eval_every=max(1, (steps + stage1) // 5),
                       context_aware=method == "dense_aware",
                       params={"gate": "input"} if method == "c2c_input" else {})


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
    ap.add_argument("--steps", type=int, default=500, help="answer-loss steps (dense adds steps // 3 of stage I)")
    ap.add_argument("--steps-for", default="", help="per-method answer-loss steps, e.g. c2c=300")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = ap.parse_args()
    unknown = sorted(set(args.methods.split(",")) - set(LR))
    if unknown:
        ap.error(f"unknown methods {unknown}; valid: {', '.join(LR)}")
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

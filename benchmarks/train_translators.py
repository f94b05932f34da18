"""Train the translators of the translator grid (resumable; finished runs are skipped).

    python benchmarks/train_translators.py [--pairs gemma3-270m:smollm2-135m,...]
                                           [--methods xkv,lcfx,dense,dense_aware,c2c,c2c_input]
                                           [--steps 500] [--steps-for c2c=300] [--batch 2] [--threads 2]
                                           [--sharer-docs own|shuffled|blank]

Pairs (sharer:receiver) default to the grid of docs/results/translators/: three ordered pairs covering
the three families plus one same-model pair; the grid is meant to be filled one pair per sitting
(`--pairs A:B`, then `python benchmarks/translators.py --pairs A:B`). Methods: XKV, LCF-X, dense alignment
context-unaware and context-aware (`dense_aware`), C2C with its static gate and with its input-conditioned
gate (`c2c_input`). Each run trains on both split-evidence tasks (facts two-hop, reasoning premise split)
for `--steps` answer-loss steps (dense first adds steps // 3 of stage-I cache reconstruction) into
runs/translators/<method>_<sharer>_<receiver>/ (checkpoint, optimizer, trainer.json with the wall time)
and draws its loss curves to loss.png there. `--sharer-docs shuffled|blank` trains the no-sharer control
instead (docs/methods.md#translators) into runs/translators/<method>_<control>_<sharer>_<receiver>/;
benchmarks/translator_controls.py trains and evaluates a pair's methods beside their controls.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from latentwire.agent import Agent
from latentwire.errors import ConfigError
from latentwire.training.states import StateCache
from latentwire.training.trainer import SHARER_DOCS, TrainConfig, resumable, train

ROOT = Path(__file__).resolve().parents[1]
PAIRS = "gemma3-270m:smollm2-135m,qwen2.5-coder-0.5b:gemma3-270m,smollm2-135m:gemma3-270m,smollm2-135m:smollm2-135m"
# dense_aware: dense trained for (and marked) context-aware; c2c_input: C2C with its input-conditioned gate
METHODS = "xkv,lcfx,dense,dense_aware,c2c,c2c_input"
# The evaluated grid (benchmarks/translators.py writes it, translators_report.py reads it): one folder per
# (pair, task), committed; the trained rows as (label, method, context-aware), and every row in page order.
GRID = ROOT / "docs" / "results" / "translators"
TRAINED = (("xkv", "xkv", False), ("lcfx", "lcfx", False), ("dense", "dense", False),
           ("dense (aware)", "dense_aware", True), ("c2c", "c2c", False), ("c2c (input gate)", "c2c_input", False))
ROWS = ("alone", "t2t") + tuple(label for label, _, _ in TRAINED) + ("fullcontext",)


def median(xs):
    """Median of the values that are not None (nan when none is)."""
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")


LR = {"xkv": 1e-3, "lcfx": 1e-3, "dense": 3e-3, "dense_aware": 3e-3, "c2c": 1e-3, "c2c_input": 1e-3}


def run_dir(method: str, sharer: str, receiver: str, control: str = "own") -> Path:
    """A run's folder; a no-sharer control (`control` "shuffled" or "blank") names itself after the method."""
    name = method if control == "own" else f"{method}_{control}"
    return ROOT / "runs" / "translators" / f"{name}_{sharer}_{receiver}"


def config(method: str, sharer: str, receiver: str, steps: int, batch: int, control: str = "own",
           dtype: str | None = None) -> TrainConfig:
    dense = method.startswith("dense")
    stage1 = steps // 3 if dense else 0  # dense: cache reconstruction first, then the answer loss
    base = "dense" if dense else method.removesuffix("_input")
    return TrainConfig(base, sharer, receiver, train_n=160, val_n=6, steps=steps + stage1, batch=batch,
                       lr=LR[method], lr_schedule="cosine", stage1_steps=stage1, eval_every=max(1, (steps + stage1) // 5),
                       context_aware=method == "dense_aware",
                       params={"gate": "input"} if method == "c2c_input" else {}, sharer_docs=control, dtype=dtype)


def method_steps(methods: list[str], steps: int, steps_for: str) -> dict[str, int]:
    """Answer-loss steps per method: `steps`, or `steps_for` ("c2c=300,dense=200"); a family name (c2c, dense)
    also sets its variant (c2c_input, dense_aware) unless that is given too, so a comparison stays equal."""
    out = {m: steps for m in methods}
    given = dict(kv.split("=") for kv in steps_for.split(",") if kv)
    unknown = sorted(set(given) - set(LR))
    if unknown:
        raise ConfigError(f"--steps-for: unknown methods {unknown}; valid: {', '.join(LR)}")
    for family, variant in (("c2c", "c2c_input"), ("dense", "dense_aware")):
        if family in given and variant not in given:
            given[variant] = given[family]
    return out | {m: int(v) for m, v in given.items() if m in out}


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
    method = folder.name.removesuffix(f"_{c['sharer']}_{c['receiver']}")  # c2c_input, dense_aware: the grid's name
    ax.set(xlabel="step", ylabel="loss", title=f"{method}: {c['sharer']} -> {c['receiver']}")
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
    ap.add_argument("--sharer-docs", default="own", choices=SHARER_DOCS,
                    help="own, or a no-sharer control: shuffled / blank sharer documents")
    args = ap.parse_args()
    unknown = sorted(set(args.methods.split(",")) - set(LR))
    if unknown:
        ap.error(f"unknown methods {unknown}; valid: {', '.join(LR)}")
    torch.set_num_threads(args.threads)
    methods = args.methods.split(",")
    try:
        steps = method_steps(methods, args.steps, args.steps_for)
    except ConfigError as e:
        ap.error(str(e))
    pairs = [spec.split(":") for spec in args.pairs.split(",")]
    control = args.sharer_docs
    runs = [(run_dir(m, s, r, control), config(m, s, r, steps[m], args.batch, control)) for m in methods for s, r in pairs]
    check_runs(runs)
    agents = {name: Agent.from_pretrained(name) for name in dict.fromkeys(n for pair in pairs for n in pair)}
    train_runs(runs, agents)  # method-major: every pair gets XKV before anything gets C2C


def check_runs(runs: list[tuple[Path, TrainConfig]]) -> None:
    """Exit naming the folder when one holds a run of another configuration, before any training starts."""
    for folder, cfg in runs:
        try:
            resumable(cfg, folder)
        except ConfigError as e:
            sys.exit(f"{folder}: {e}")


def train_runs(runs: list[tuple[Path, TrainConfig]], agents: dict[str, Agent]) -> None:
    """Train (or resume) each (folder, config) in order over one state cache; draw its loss curves; report it."""
    cache = StateCache()
    for folder, cfg in runs:
        hits, misses = cache.hits, cache.misses
        train(cfg, folder, agents[cfg.sharer], agents[cfg.receiver], cache)
        plot(folder)
        log = json.loads((folder / "trainer.json").read_text())
        print(f"{folder.name}: params {log['parameters']:,d}  val {log['val'][0][1]:.3f} -> {log['val'][-1][1]:.3f}  "
              f"{log.get('seconds', 0):.0f} s  state cache {cache.hits - hits} hits / {cache.misses - misses} misses "
              f"({cache.used / 2**30:.1f} GiB of {cache.limit / 2**30:.0f})", flush=True)

if __name__ == "__main__":
    main()

"""Heterogeneous translators vs text, per ordered model pair and task (docs/methods.md#translators).

    python benchmarks/train_translators.py --pairs A:B     # first: train the pair's translators (resumable)
    python benchmarks/translators.py --pairs A:B [--n 64] [--tasks facts,reasoning]
    python benchmarks/translators.py --report-only         # rebuild the grid page from the committed cells
    python benchmarks/translators.py --timing-only [--pairs ...] [--calls 50]   # seconds: XKV vs LCF-X only

For each ordered pair (sharer:receiver) and split-evidence task, on `--n` held-out test pairs: the
receiver alone (its own half), T2T (the sharer's notes as text), XKV, LCF-X, dense alignment
context-unaware and context-aware, C2C with its static and its input-conditioned gate (both models read
both documents: a shared-context method, compared with full context) and one agent reading both
documents. Every trained method needs its checkpoint (runs/translators/, from train_translators.py).

The grid fills pair by pair, in as many sittings as it takes: each (pair, task) is a resumable cell
folder under `--grid` (docs/results/translators/<sharer>_<receiver>_<task>/: config, records) and each
training log is copied to `--grid`/training/, so the page (`translators_report.py`: macro accuracy per
method with 95% stratified bootstrap CIs, paired verdicts with exact McNemar p, per-pair tables, loss
curves) is rebuilt from whatever cells exist, whichever machine ran them. The checkpoints themselves
stay under runs/ (tens of MB each).

Translator speed, per pair (`latentwire.translate.timing`): XKV and the LCF-X fuser run on the same
states (the sharer's and the receiver's prefill of the first held-out pair of the first task),
interleaved, `--calls` timed calls (≥ 50) after `--warmup`; the table gives the median forward time of
each, LCF-X ÷ XKV, and parameters XKV ÷ LCF-X. The translators are the trained checkpoints where they
exist, else freshly initialised ones (same architecture and parameter count; the forward time does not
depend on the weights). `--timing-only` runs just this and writes translators_timing.{md,json} to
`--out`; pair names `tiny-llama`, `tiny-gemma3`, `tiny-qwen2` use the tiny random-weight models.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import shutil
import sys
from pathlib import Path

import torch

from latentwire.agent import Agent
from latentwire.bench.pair_runner import run_pairs
from latentwire.bench.runner import parse_protocols
from latentwire.bench.tasks.pairs import pairs
from latentwire.protocols.pair import own_prompt
from latentwire.translate import build, load
from latentwire.translate.base import cast
from latentwire.translate.compose import PairStates
from latentwire.translate.timing import MIN_CALLS, compare

from train_translators import GRID, PAIRS, TRAINED, run_dir

ROOT = Path(__file__).resolve().parents[1]


def protocols(sharer: str, receiver: str, methods: list[str] | None = None) -> dict[str, str]:
    """Row label -> pair-protocol spec; every trained method of `methods` (default: all) must have its
    checkpoint (a missing one is an error naming the command that trains it, never a silently shorter table).
    Checkpoint paths are relative to the repository root, so records and configs do not name a machine."""
    out = {"alone": "alone", "t2t": "t2t", "fullcontext": "fullcontext"}
    missing = []
    for label, method, aware in TRAINED:
        if methods is not None and method not in methods:
            continue
        folder = run_dir(method, sharer, receiver)
        training = (json.loads((folder / "config.json").read_text()).get("training", {})
                    if (folder / "translator.safetensors").exists() else {})
        if not training or training["step"] != training["config"]["steps"]:  # absent, or saved mid-run
            missing.append(method)
        out[label] = f"translated(checkpoint={folder.relative_to(ROOT).as_posix()!r}, context_aware={aware})"
    if missing:
        sys.exit(f"{sharer} -> {receiver}: no finished training for {', '.join(missing)}; first run (it resumes) "
                 f"python benchmarks/train_translators.py --pairs {sharer}:{receiver} --methods {','.join(missing)}")
    return out


def checkpoint_identity(spec: str) -> dict:
    """A translated spec's checkpoint: SHA-256 of its weights and the training it finished."""
    name, params = next(iter(parse_protocols(spec).values()))
    folder = ROOT / params["checkpoint"]
    training = json.loads((folder / "config.json").read_text())["training"]
    return {"sha256": hashlib.sha256((folder / "translator.safetensors").read_bytes()).hexdigest(),
            "step": training["step"], "config": training["config"]}


def pin_checkpoints(cell: Path, specs: dict[str, str]) -> None:
    """Record the checkpoints a cell's records are made with (`checkpoints.json`); exit when a resumed cell's
    checkpoint has changed since (retrained): its old records would silently stand for the new weights."""
    now = {label: checkpoint_identity(spec) for label, spec in specs.items() if spec.startswith("translated")}
    path = cell / "checkpoints.json"
    before = json.loads(path.read_text()) if path.exists() else {}
    changed = sorted(k for k in now if k in before and before[k]["sha256"] != now[k]["sha256"])
    if changed:
        sys.exit(f"{cell} holds records made with other weights for {changed}; move the cell away to re-evaluate")
    cell.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(before | now, indent=1) + "\n")


def agent(name: str) -> Agent:
    """A bundled / local / hub model, or `tiny-<arch>`: a tiny random-weight model (no files)."""
    if name.startswith("tiny-"):
        from latentwire.models import tiny_model, tiny_tokenizer

        return Agent(tiny_model(name.removeprefix("tiny-")), tiny_tokenizer(), model_name=name)
    return Agent.from_pretrained(name)


def timing(sharer: Agent, receiver: Agent, task: str = "facts", calls: int = MIN_CALLS, warmup: int = 5) -> dict:
    """XKV vs LCF-X forward time and parameters for one ordered pair (module docstring), as JSON."""
    pair, device = pairs(task, "test", 1)[0], receiver.device  # translators run on the receiver's device
    states = PairStates(
        sharer=cast(sharer.prefill(own_prompt(pair.sharer_doc, pair.question)), torch.float32, device),
        receiver=cast(receiver.prefill(own_prompt(pair.receiver_doc, pair.question)), torch.float32, device))
    translators, sources = {}, {}
    for method in ("xkv", "lcfx"):
        folder = run_dir(method, sharer.model_name, receiver.model_name)
        if (folder / "translator.safetensors").exists():
            translators[method], sources[method] = load(folder, device), "checkpoint"
        else:
            t = build(method, states.sharer.geometry, states.receiver.geometry).to(device).eval()
            translators[method], sources[method] = t, "fresh"
    out = compare(translators["xkv"], translators["lcfx"], states, calls, warmup)
    return {"xkv_ms": out["xkv"].median_ms, "lcfx_ms": out["lcfx"].median_ms, "time_ratio": out["time_ratio"],
            "xkv_parameters": out["xkv"].parameters, "lcfx_parameters": out["lcfx"].parameters,
            "param_ratio": out["param_ratio"], "calls": calls, "warmup": warmup, "task": task,
            "sharer_rows": len(states.sharer), "receiver_rows": len(states.receiver), "weights": sources,
            "device": str(device), "times_ms": {"xkv": out["xkv"].times_ms, "lcfx": out["lcfx"].times_ms}}


def timing_table(timings: dict) -> list[str]:
    """Markdown: one row per pair, XKV and LCF-X median ms, LCF-X ÷ XKV, parameters and XKV ÷ LCF-X."""
    lines = ["| sharer → receiver | rows S / R | XKV ms | LCF-X ms | LCF-X ÷ XKV (paper 10.3×) | XKV params | "
             "LCF-X params | XKV ÷ LCF-X (paper ≤ 24%) | weights |", "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for pair, t in timings.items():
        weights = "/".join(sorted(set(t["weights"].values())))
        lines.append(f"| {pair.replace(':', ' → ')} | {t['sharer_rows']} / {t['receiver_rows']} | {t['xkv_ms']:.2f} | "
                     f"{t['lcfx_ms']:.2f} | {t['time_ratio']:.2f}× | {t['xkv_parameters']:,d} | "
                     f"{t['lcfx_parameters']:,d} | {100 * t['param_ratio']:.1f}% | {weights} |")
    return lines


def timed_pairs(args, agents: dict, timings: dict):
    """Yield (spec, sharer, receiver) per --pairs entry, its agents loaded (once) and its XKV/LCF-X timing done."""
    for spec in args.pairs.split(","):
        sharer, receiver = spec.split(":")
        for name in (sharer, receiver):
            if name not in agents:
                agents[name] = agent(name)
        timings[spec] = timing(agents[sharer], agents[receiver], args.tasks.split(",")[0], args.calls, args.warmup)
        yield spec, sharer, receiver


def timing_only(args) -> dict:
    agents: dict[str, Agent] = {}
    timings = {}
    for spec, sharer, receiver in timed_pairs(args, agents, timings):
        t = timings[spec]
        print(f"{spec}: XKV {t['xkv_ms']:.2f} ms, LCF-X {t['lcfx_ms']:.2f} ms, LCF-X ÷ XKV {t['time_ratio']:.2f}×; "
              f"params XKV ÷ LCF-X {100 * t['param_ratio']:.1f}%", flush=True)
    cmd = (f"python benchmarks/translators.py --timing-only --pairs {args.pairs} --tasks {args.tasks} "
           f"--calls {args.calls} --warmup {args.warmup} --threads {args.threads}")
    first = next(iter(timings.values()))
    lines = ["# Translator forward time: XKV vs the LCF-X fuser", "", f"Command: `{cmd}`", "",
             f"Median of {args.calls} interleaved timed calls per translator after {args.warmup} warm-up rounds, on "
             f"the same states (the first held-out `{first['task']}` pair, each party's own prompt), "
             f"{args.threads} CPU thread(s) or the receiver's device ({first['device']}). `weights`: trained "
             "checkpoint or freshly initialised.", ""] + timing_table(timings)
    text = "\n".join(lines) + "\n"
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "translators_timing.md").write_text(text)
    (out / "translators_timing.json").write_text(json.dumps({"command": cmd, "timing": timings}, indent=1) + "\n")
    return timings


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", default=PAIRS)
    ap.add_argument("--tasks", default="facts,reasoning")
    ap.add_argument("--n", type=int, default=64, help="held-out pairs per (model pair, task)")
    ap.add_argument("--methods", default=None, help="trained methods to evaluate (default: all; each needs its "
                    "checkpoint)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timing-only", action="store_true",
                    help="only the XKV vs LCF-X forward time and parameters per pair (seconds)")
    ap.add_argument("--report-only", action="store_true",
                    help="only rebuild the grid page from the cells already in --grid (no model loads)")
    ap.add_argument("--calls", type=int, default=MIN_CALLS, help=f"timed calls per translator (≥ {MIN_CALLS})")
    ap.add_argument("--warmup", type=int, default=5, help="untimed rounds first")
    ap.add_argument("--out", default=str(ROOT / "docs" / "results"), help="folder of the timing result files")
    ap.add_argument("--grid", type=Path, default=GRID, help="folder of the evaluated cells and the grid page")
    args = ap.parse_args(argv)
    if args.calls < MIN_CALLS:
        ap.error(f"--calls must be ≥ {MIN_CALLS}")
    args.grid = args.grid.resolve()
    torch.set_num_threads(args.threads)
    if args.timing_only:
        timing_only(args)
        return
    if not args.report_only:
        evaluate(args)
    from translators_report import write_page

    write_page(args.grid)


def evaluate(args) -> None:
    """Each pair × task into `args.grid/<sharer>_<receiver>_<task>/` (resumable), its training logs beside."""
    methods = args.methods.split(",") if args.methods else None
    specs = {}
    for spec in args.pairs.split(","):  # every checkpoint is checked before any model loads
        sharer, receiver = spec.split(":")
        specs[spec] = protocols(sharer, receiver, methods)
    agents: dict[str, Agent] = {}
    for spec in args.pairs.split(","):
        sharer, receiver = spec.split(":")
        for name in (sharer, receiver):
            if name not in agents:
                agents[name] = agent(name)
        for task in args.tasks.split(","):
            cell = args.grid / f"{sharer}_{receiver}_{task}"
            pin_checkpoints(cell, specs[spec])
            with contextlib.chdir(ROOT):  # the specs name checkpoints relative to the repository root
                run_pairs(sharer, receiver, task, ",".join(specs[spec].values()), args.n, cell,
                          sharer=agents[sharer], receiver=agents[receiver])
        (args.grid / "training").mkdir(parents=True, exist_ok=True)
        for _, method, _ in TRAINED:  # the checkpoints stay under runs/ (tens of MB); their logs travel with the cells
            log = run_dir(method, sharer, receiver) / "trainer.json"
            if log.exists() and (methods is None or method in methods):
                shutil.copyfile(log, args.grid / "training" / f"{method}_{sharer}_{receiver}.json")


if __name__ == "__main__":
    main()

"""Do trained translators transfer the sharer's content, or learn the answer's format? Each method beside its
no-sharer control (docs/methods.md#translators).

    python benchmarks/translator_controls.py [--pair smollm2-135m:smollm2-135m] [--methods xkv,lcfx]
        [--control shuffled] [--tasks facts,reasoning] [--n 64] [--steps 500] [--out docs/results/translator_controls]

For one ordered pair (sharer:receiver), in one sitting and one dtype, each method is trained twice with the
translator grid's recipe (benchmarks/train_translators.py; both runs resumable): on the sharer's own documents,
and as its **no-sharer control** (`--control shuffled`: every training and validation pair's sharer document
replaced by another pair's of the same task; `blank`: by an empty one). Then the receiver alone, T2T, every
method and every control answer the same `--n` held-out pairs per task, all with the real sharer document.

Reading the verdicts (pooled over the tasks: a − b with a stratified bootstrap CI, exact McNemar p, Holm over
the page's verdicts):
- method − control: what training on the real sharer documents adds, i.e. transfer. Only this one shows that
  content crossed from one model to the other.
- control − alone: what the same training teaches without any transfer (a short answer format that scores and
  answers sooner, a prior over the task's answers).
- method − alone and method − T2T: the grid's comparisons, for reference.
Time: median TTEOA rewards short answers (trained receivers answer in a word, the untrained ones in sentences);
median time to first token (ttft: TTEOA less the receiver's decode after its first answer token) does not.

Writes `--out`/<sharer>_<receiver>_<task>/ (the pair runner's resumable cells), training/*.json (the logs; the
checkpoints stay under runs/translators/), README.md, results.json and command.txt.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_translators import LR, check_runs, config, method_steps, run_dir, train_runs  # noqa: E402
from translators import ROOT, agent, pin_checkpoints  # noqa: E402
from translators_report import METHOD_ROW, cell_runs, collect, decide, macro, median, paired  # noqa: E402

from latentwire.bench.metrics import holm  # noqa: E402
from latentwire.bench.pair_runner import run_pairs  # noqa: E402
from latentwire.bench.report import holm_note  # noqa: E402
from latentwire.training.trainer import SHARER_DOCS  # noqa: E402

OUT = ROOT / "docs" / "results" / "translator_controls"
CONTEXT_AWARE = {"dense_aware": True}  # the grid's dense (aware) row; every other method reads its own half


def rows(methods: list[str], control: str) -> list[tuple[str, str | None, str]]:
    """(row label, trained method or None, control) in page order: alone, T2T, then each method and its control.
    Labels are the rows translators_report.collect names from the checkpoint folders (dense_aware: "dense (aware)")."""
    out = [("alone", None, "own"), ("t2t", None, "own")]
    for m in methods:
        out += [(METHOD_ROW.get(m, m), m, "own"), (f"{m}_{control}", m, control)]
    return out


def specs(rows_: list, sharer: str, receiver: str) -> dict[str, str]:
    """Row label -> pair-protocol spec (checkpoints named relative to the repository root)."""
    out = {}
    for label, method, control in rows_:
        if method is None:
            out[label] = label
        else:
            folder = run_dir(method, sharer, receiver, control).relative_to(ROOT).as_posix()
            out[label] = f"translated(checkpoint={folder!r}, context_aware={CONTEXT_AWARE.get(method, False)})"
    return out


def train_all(rows_: list, sharer: str, receiver: str, steps: dict, batch: int, agents: dict, out: Path) -> None:
    """Train every (method, control) not finished yet (train_translators' runs); copy the logs to `out`/training."""
    runs = [(run_dir(m, sharer, receiver, c), config(m, sharer, receiver, steps[m], batch, c)) for _, m, c in rows_ if m]
    check_runs(runs)
    train_runs(runs, agents)
    (out / "training").mkdir(parents=True, exist_ok=True)
    for folder, _ in runs:
        shutil.copyfile(folder / "trainer.json", out / "training" / f"{folder.name}.json")


def verdicts(methods: list[str], control: str) -> list[tuple[str, str, str]]:
    out = []
    for method in methods:
        m, c = METHOD_ROW.get(method, method), f"{method}_{control}"
        out += [(m, c, f"{m} transfers (method − its control)"), (c, "alone", f"{m}'s training teaches without transfer"),
                (m, "alone", f"{m} beats the receiver alone"), (m, "t2t", f"{m} beats text (T2T)")]
    return out


def page(out: Path, methods: list[str], control: str, command: str) -> dict:
    cells = collect(out)
    order = [label for label, _, _ in rows(methods, control)]
    tasks = sorted({task for _, task in cells})
    table = []
    for row in order:
        if not any(row in r for r in cells.values()):
            continue
        acc, lo, hi, _, n = macro(cells, row)
        em = macro(cells, row, "em")[0]
        per_task = {t: macro({k: v for k, v in cells.items() if k[1] == t}, row)[0] for t in tasks}
        got = [r[row] for r in cells.values() if row in r]
        table.append({"row": row, "acc": acc, "low": lo, "high": hi, "em": em, "n": n, "per_task": per_task,
                      "tteoa": median([x for g in got for x in g["tteoa"]]),
                      "ttft": median([x for g in got for x in g["ttft"]]), "errors": sum(g["errors"] for g in got)})
    found = [(a, b, claim, v) for a, b, claim in verdicts(methods, control) if (v := paired(cells, a, b))]
    for (_, _, _, v), p in zip(found, holm([v["p"] for *_, v in found])):
        v["holm"] = p
    pair = next(iter(cells))[0] if cells else "?"
    lines = [f"# Translators against their no-sharer controls: {pair.replace(':', ' → ')}", "",
             f"Command: `{command}`", "",
             f"Control: `{control}` sharer documents in training (every training and validation pair's sharer document "
             "replaced; see docs/methods.md#translators). Every row is evaluated on the same held-out pairs with the "
             f"real sharer document. Tasks: {', '.join(tasks)}; accuracy = a gold alias occurs in the reply; macro over "
             "the tasks with a 95% stratified bootstrap CI. ttft = time to first answer token.", "",
             "| row | macro accuracy [95% CI] | " + " | ".join(tasks) + " | macro EM | episodes | median TTEOA s | "
             "median ttft s | errors |", "|---|---|" + "---:|" * len(tasks) + "---:|---:|---:|---:|---:|"]
    for t in table:
        lines.append(f"| {t['row']} | {t['acc']:.3f} [{t['low']:.3f}, {t['high']:.3f}] | "
                     + " | ".join(f"{t['per_task'][k]:.3f}" for k in tasks)
                     + f" | {t['em']:.3f} | {t['n']} | {t['tteoa']:.2f} | {t['ttft']:.2f} | {t['errors']} |")
    lines += ["", "## Verdicts", "", "Paired on the same pairs; bold where the Holm-adjusted p ≤ 0.05.", "",
              "| claim | a − b | difference [95% CI] | McNemar p | Holm p | reads |", "|---|---|---|---:|---:|---|"]
    for a, b, claim, v in found:
        diff = f"{100 * v['diff']:+.1f} pp [{100 * v['low']:+.1f}, {100 * v['high']:+.1f}]"
        if v["holm"] <= 0.05:
            diff = f"**{diff}**"
        reads = decide(v | {"p_holm": v["holm"]})
        lines.append(f"| {claim} | {a} − {b} | {diff} | {v['p']:.3g} | {v['holm']:.3g} | {reads} |")
    lines += ["", holm_note(len(found)), "", "## How it ran", ""]
    lines += [f"- {task}: {how}" for (_, task), (_, how) in sorted(cell_runs(out).items())]
    lines += ["", "Training runs (validation answer loss on each run's own validation pairs: a control's are "
              "its shuffled or blank ones, so the losses compare runs, not transfer):", "",
              "| run | steps | parameters | minutes | validation loss first → last |", "|---|---:|---:|---:|---|"]
    for path in sorted((out / "training").glob("*.json")):
        log = json.loads(path.read_text())
        lines.append(f"| {path.stem} | {log['step']} | {log['parameters']:,d} | {log.get('seconds', 0) / 60:.1f} | "
                     f"{log['val'][0][1]:.3f} → {log['val'][-1][1]:.3f} |")
    (out / "README.md").write_text("\n".join(lines) + "\n")
    result = {"command": command, "control": control, "rows": table,
              "verdicts": [{"a": a, "b": b, "claim": c} | v for a, b, c, v in found]}
    (out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    print("\n".join(lines))
    return result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="smollm2-135m:smollm2-135m", help="sharer:receiver")
    ap.add_argument("--methods", default="xkv,lcfx", help=f"of {', '.join(LR)}")
    ap.add_argument("--control", default="shuffled", choices=[c for c in SHARER_DOCS if c != "own"])
    ap.add_argument("--tasks", default="facts,reasoning")
    ap.add_argument("--n", type=int, default=64, help="held-out pairs per task")
    ap.add_argument("--steps", type=int, default=500, help="answer-loss steps per run (the grid's)")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--report-only", action="store_true", help="only rebuild the page from the cells in --out")
    args = ap.parse_args(argv)
    methods = args.methods.split(",")
    unknown = sorted(set(methods) - set(LR))
    if unknown:
        ap.error(f"unknown methods {unknown}; valid: {', '.join(LR)}")
    if args.n < 1:
        ap.error("--n must be ≥ 1")
    sharer, receiver = args.pair.split(":")
    out = args.out.resolve()
    command = (f"python benchmarks/translator_controls.py --pair {args.pair} --methods {args.methods} --control "
               f"{args.control} --tasks {args.tasks} --n {args.n} --steps {args.steps} --batch {args.batch}")
    if not args.report_only:
        torch.set_num_threads(args.threads)
        rows_ = rows(methods, args.control)
        agents = {name: agent(name) for name in dict.fromkeys((sharer, receiver))}
        train_all(rows_, sharer, receiver, method_steps(methods, args.steps, ""), args.batch, agents, out)
        spec = specs(rows_, sharer, receiver)
        for task in args.tasks.split(","):
            cell = out / f"{sharer}_{receiver}_{task}"
            pin_checkpoints(cell, spec)  # a resumed cell whose checkpoints were retrained since is refused
            with contextlib.chdir(ROOT):  # the specs name checkpoints relative to the repository root
                run_pairs(sharer, receiver, task, ",".join(spec.values()), args.n, cell,
                          sharer=agents[sharer], receiver=agents[receiver])
        (out / "command.txt").write_text(command + "\n")
    page(out, methods, args.control, command)


if __name__ == "__main__":
    main()

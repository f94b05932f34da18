"""Heterogeneous translators vs text, per ordered model pair and task (docs/methods.md#translators).

    python benchmarks/train_translators.py            # first: train the grid (resumable)
    python benchmarks/translators.py [--n 16] [--pairs ...] [--tasks facts,reasoning]
    python benchmarks/translators.py --timing-only [--pairs ...] [--calls 50]   # seconds: XKV vs LCF-X only

For each ordered pair (sharer:receiver) and split-evidence task, on held-out test pairs: the receiver
alone (its own half), T2T (the sharer's notes as text), XKV, LCF-X, dense alignment context-unaware
and context-aware, C2C (both read both documents) and one agent reading both documents (the ceiling).
Records under runs/translators_eval/<sharer>_<receiver>_<task>/ (resumable). Writes
docs/results/translators.{md,json} and PNGs (accuracy per pair; every run's loss curves), then
checks the paper's claims at this scale: XKV > LCF-X > T2T on macro score; the XKV translator
≥ 10x faster than the LCF-X fuser with ≤ 24% of its parameters; end to end faster than T2T.

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
import json
import statistics
from pathlib import Path

import torch

from latentwire.agent import Agent
from latentwire.bench.pair_runner import read_records, run_pairs
from latentwire.bench.runner import parse_protocols
from latentwire.bench.tasks.pairs import pairs
from latentwire.protocols.pair import own_prompt
from latentwire.translate import build, load
from latentwire.translate.base import cast
from latentwire.translate.compose import PairStates
from latentwire.translate.timing import MIN_CALLS, compare

from train_translators import PAIRS, run_dir

ROOT = Path(__file__).resolve().parents[1]
TRAINED = (("xkv", "xkv", False), ("lcfx", "lcfx", False), ("dense", "dense", False),
           ("dense (aware)", "dense_aware", True), ("c2c", "c2c", False))
ROWS = ("alone", "t2t") + tuple(label for label, _, _ in TRAINED) + ("fullcontext",)


def protocols(sharer: str, receiver: str) -> dict[str, str]:
    """Row label -> pair-protocol spec (translated rows only where a trained checkpoint exists)."""
    out = {"alone": "alone", "t2t": "t2t", "fullcontext": "fullcontext"}
    for label, method, aware in TRAINED:
        folder = run_dir(method, sharer, receiver)
        if (folder / "translator.safetensors").exists():
            out[label] = f"translated(checkpoint={str(folder)!r}, context_aware={aware})"
    return out


def mean(xs):
    xs = [x for x in xs if x is not None]
    return statistics.mean(xs) if xs else float("nan")


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")


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
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timing-only", action="store_true",
                    help="only the XKV vs LCF-X forward time and parameters per pair (seconds)")
    ap.add_argument("--calls", type=int, default=MIN_CALLS, help=f"timed calls per translator (≥ {MIN_CALLS})")
    ap.add_argument("--warmup", type=int, default=5, help="untimed rounds first")
    ap.add_argument("--out", default=str(ROOT / "docs" / "results"), help="folder of the result files")
    args = ap.parse_args(argv)
    if args.calls < MIN_CALLS:
        ap.error(f"--calls must be ≥ {MIN_CALLS}")
    torch.set_num_threads(args.threads)
    if args.timing_only:
        timing_only(args)
        return
    agents: dict[str, Agent] = {}
    results = {}  # pair -> task -> row -> metrics
    timings = {}  # pair -> XKV vs LCF-X forward time and parameters
    for spec, sharer, receiver in timed_pairs(args, agents, timings):
        specs = protocols(sharer, receiver)
        for task in args.tasks.split(","):
            out = ROOT / "runs" / "translators_eval" / f"{sharer}_{receiver}_{task}"
            run_pairs(sharer, receiver, task, ",".join(specs.values()), args.n, out,
                      sharer=agents[sharer], receiver=agents[receiver])
            records = read_records(out)
            by_label = {}
            for label, s in specs.items():
                key = next(iter(parse_protocols(s)))  # the runner's normalised label of this spec
                rs = [r for r in records if r["protocol"] == key]
                by_label[label] = {
                    "n": len(rs), "accuracy": mean(r["accuracy"] for r in rs), "em": mean(r["em"] for r in rs),
                    "f1": mean(r["f1"] for r in rs), "tteoa_s": median(r["tteoa"] for r in rs),
                    "translator_ms": median(r.get("details", {}).get("translator_ms") for r in rs),
                    "parameters": next((r["details"]["parameters"] for r in rs
                                        if r.get("details", {}).get("parameters")), None),
                    "errors": sum(bool(r.get("error")) for r in rs)}
            results.setdefault(spec, {})[task] = by_label
    write(results, args, timings)


def write(results: dict, args, timings: dict | None = None) -> None:
    tasks = args.tasks.split(",")
    cmd = f"python benchmarks/translators.py --n {args.n} --pairs {args.pairs} --tasks {args.tasks}"
    lines = ["# Heterogeneous translators vs text", "", f"Command: `{cmd}` (after "
             "`python benchmarks/train_translators.py`)", "",
             f"{args.n} held-out split-evidence pairs per task (documents never seen in training). Accuracy = the "
             "gold answer occurs in the reply; EM / F1 as SQuAD. Macro = mean accuracy over tasks. TTEOA: slowest of "
             "(sharer's work, receiver's own prefill) + translator + answer, median seconds. Translator: forward "
             "time (median ms) and trainable parameters.", ""]
    macro = {}
    for pair, per_task in results.items():
        lines += [f"## {pair.replace(':', ' → ')}", "",
                  "| method | " + " | ".join(f"{t} acc" for t in tasks) + " | macro | EM | F1 | TTEOA s | "
                  "translator ms | params |", "|---|" + "---:|" * (len(tasks) + 6)]
        for row in ROWS:
            cells = [per_task[t].get(row) for t in tasks]
            if not all(cells):
                continue
            m = mean(c["accuracy"] for c in cells)
            macro.setdefault(row, []).append(m)
            lines.append(f"| {row} | " + " | ".join(f"{c['accuracy']:.2f}" for c in cells) + f" | {m:.2f} | "
                         f"{mean(c['em'] for c in cells):.2f} | {mean(c['f1'] for c in cells):.2f} | "
                         f"{mean(c['tteoa_s'] for c in cells):.2f} | "
                         + (f"{mean(c['translator_ms'] for c in cells):.1f}" if cells[0]["translator_ms"] ==
                            cells[0]["translator_ms"] else "–")
                         + f" | {cells[0]['parameters'] or 0:,d} |")
        lines.append("")
    lines += ["## Macro accuracy over all pairs and tasks", "", "| method | macro |", "|---|---:|"]
    lines += [f"| {row} | {mean(v):.3f} |" for row, v in macro.items()]
    if timings:
        lines += ["", f"## Translator forward time: XKV vs LCF-X ({args.calls} interleaved calls, same inputs)", ""]
        lines += timing_table(timings)
    lines += ["", "## The paper's claims at this scale", ""] + claims(results, tasks, macro, timings)
    lines += ["", "## Training runs (`benchmarks/train_translators.py`)", "",
              "| method | sharer → receiver | steps (stage I + answer) | batch | params | val loss first → last eval |",
              "|---|---|---:|---:|---:|---|"]
    for path in sorted((ROOT / "runs" / "translators").glob("*/trainer.json")):
        log = json.loads(path.read_text())
        c = log["config"]
        lines.append(f"| {c['method']} | {c['sharer']} → {c['receiver']} | {c['stage1_steps']} + "
                     f"{c['steps'] - c['stage1_steps']} | {c['batch']} | {log.get('parameters', 0):,d} | "
                     f"{log['val'][0][1]:.2f} (step {log['val'][0][0]}) → {log['val'][-1][1]:.2f} |")
    lines += ["", "![accuracy](translators.png)", "", "![loss curves](translators_loss.png)"]
    text = "\n".join(lines) + "\n"
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "translators.md").write_text(text)
    (out / "translators.json").write_text(json.dumps({"command": cmd, "results": results,
                                                      "macro": {k: mean(v) for k, v in macro.items()},
                                                      "timing": timings or {}}, indent=1) + "\n")
    plots(results, tasks, out)


def claims(results: dict, tasks: list[str], macro: dict, timings: dict | None = None) -> list[str]:
    m = {k: mean(v) for k, v in macro.items()}
    out = []
    if {"xkv", "lcfx", "t2t"} <= set(m):
        ok = m["xkv"] > m["lcfx"] > m["t2t"]
        out.append(f"- XKV > LCF-X > T2T on macro accuracy: {m['xkv']:.3f} / {m['lcfx']:.3f} / {m['t2t']:.3f} → "
                   f"{'holds' if ok else 'does NOT hold'} here.")
    speed, share, e2e = [], [], []
    for pair, per_task in results.items():
        cells = [per_task[t] for t in tasks]
        if all("xkv" in c and "lcfx" in c for c in cells):
            x, lc = mean(c["xkv"]["translator_ms"] for c in cells), mean(c["lcfx"]["translator_ms"] for c in cells)
            speed.append((pair, lc / x))
            share.append((pair, cells[0]["xkv"]["parameters"] / cells[0]["lcfx"]["parameters"]))
        if all("xkv" in c and "t2t" in c for c in cells):
            e2e.append((pair, mean(c["t2t"]["tteoa_s"] for c in cells) / mean(c["xkv"]["tteoa_s"] for c in cells)))
    if timings:  # the dedicated measurement (same inputs, ≥ 50 calls) replaces the per-episode medians
        speed = [(p, t["time_ratio"]) for p, t in timings.items()]
        share = [(p, t["param_ratio"]) for p, t in timings.items()]
    if speed:
        out.append("- XKV translator vs the LCF-X fuser, forward time (LCF-X ÷ XKV; target ≥ 10×): "
                   + ", ".join(f"{p} {v:.1f}×" for p, v in speed))
        out.append("- XKV parameters as a share of LCF-X's (target ≤ 24%): "
                   + ", ".join(f"{p} {100 * v:.0f}%" for p, v in share))
    if e2e:
        out.append("- End to end, T2T TTEOA ÷ XKV TTEOA (the paper: 6.8×): " + ", ".join(f"{p} {v:.1f}×" for p, v in e2e))
    if {"dense", "dense (aware)"} <= set(m):
        out.append(f"- Dense alignment, context-unaware {m['dense']:.3f} vs context-aware {m['dense (aware)']:.3f} "
                   f"(receiver alone {m.get('alone', float('nan')):.3f}, one agent reading both "
                   f"{m.get('fullcontext', float('nan')):.3f}).")
    return out


def plots(results: dict, tasks: list[str], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pairs = list(results)
    fig, axes = plt.subplots(1, len(pairs), figsize=(4.2 * len(pairs), 3.6), sharey=True, squeeze=False)
    for ax, pair in zip(axes[0], pairs):
        rows = [r for r in ROWS if all(r in results[pair][t] for t in tasks)]
        for k, t in enumerate(tasks):
            ax.bar([i + 0.4 * (k - 0.5) for i in range(len(rows))], [results[pair][t][r]["accuracy"] for r in rows],
                   width=0.4, label=t)
        ax.set_xticks(range(len(rows)), rows, rotation=60, fontsize=7)
        ax.set(title=pair.replace(":", " → "), ylim=(0, 1))
    axes[0][0].set_ylabel("accuracy")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "translators.png", dpi=110)
    plt.close(fig)
    logs = sorted((ROOT / "runs" / "translators").glob("*/trainer.json"))
    if logs:
        fig, axes = plt.subplots(1, 4, figsize=(16, 3.4), squeeze=False)
        for log_path in logs:
            log = json.loads(log_path.read_text())
            c = log["config"]
            ax = axes[0][["xkv", "lcfx", "dense", "c2c"].index(c["method"])]
            ax.plot([s for s, _ in log["val"]], [v for _, v in log["val"]], "o-", label=f"{c['sharer']}→{c['receiver']}")
            ax.set(title=f"{c['method']}: validation answer loss", xlabel="step")
        for ax in axes[0]:
            ax.legend(fontsize=6)
        fig.tight_layout()
        fig.savefig(out / "translators_loss.png", dpi=110)
        plt.close(fig)


if __name__ == "__main__":
    main()

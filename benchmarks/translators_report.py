"""The translator grid's page, rebuilt from the evaluated cells (benchmarks/translators.py writes them).

    python benchmarks/translators_report.py [--grid docs/results/translators]

Reads every `<sharer>_<receiver>_<task>/` cell (config.json, records.jsonl) and `training/*.json` under the
grid folder and writes README.md, grid.json, accuracy.png and loss.png there:
- macro accuracy per method (mean over the (pair, task) cells it ran in) with a 95% stratified bootstrap
  CI (episodes redrawn within each cell, 2,000 resamples, seed 0);
- paired verdicts (a − b over the cells both ran in, episodes matched by pair id): macro difference with
  its stratified bootstrap CI and an exact McNemar p over all matched episodes;
- one table per model pair (accuracy per task with its CI, TTEOA, translator time, parameters);
- the training runs (steps, wall time, validation loss) and their loss curves.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_translators import GRID, PAIRS, ROWS, TRAINED, median  # noqa: E402  (the grid, shared with translators.py)

from latentwire.bench.metrics import bootstrap_ci, holm, sign_flip_exact, stratified_bootstrap_ci  # noqa: E402
from latentwire.bench.report import holm_note  # noqa: E402
from latentwire.bench.folder import hardware  # noqa: E402

METHOD_ROW = {method: label for label, method, _ in TRAINED}
SHARED_CONTEXT = ("c2c", "c2c (input gate)")  # both models read both documents
VERDICTS = (  # (a, b, what the row decides)
    ("xkv", "lcfx", "XKV > LCF-X"), ("lcfx", "t2t", "LCF-X > T2T"), ("xkv", "t2t", "XKV > T2T"),
    ("dense", "alone", "dense alignment works context-unaware"),
    ("dense (aware)", "dense", "context-aware dense vs context-unaware"),
    ("c2c (input gate)", "c2c", "C2C: input-conditioned gate vs static gate"),
    ("c2c", "fullcontext", "C2C vs one model reading both documents (both shared-context)"),
    ("c2c (input gate)", "fullcontext", "C2C, input gate, vs one model reading both documents"),
    ("dense (aware)", "fullcontext", "context-aware dense vs one model reading both documents"),
)


def row_of(name: str, params: dict, sharer: str, receiver: str) -> str:
    """The table row of a pair-protocol spec: its name, or the trained method its checkpoint folder names."""
    if name != "translated":
        return name
    method = Path(params["checkpoint"]).name.removesuffix(f"_{sharer}_{receiver}")
    return METHOD_ROW.get(method, method)


def collect(grid: Path) -> dict:
    """{(pair, task): {row: {"acc": {pair_id: 0/1}, "tteoa": [...], "ttft": [...], "ms": [...], "params": int|None,
    "errors": int}}} over every cell folder in `grid`, and the cells' n."""
    cells = {}
    for cfg_path in sorted(grid.glob("*/config.json")):
        cfg = json.loads(cfg_path.read_text())["config"]  # the pair runner's resolved configuration
        sharer, receiver, task = cfg["sharer"], cfg["receiver"], cfg["task"]
        label_row = {label: row_of(p["name"], p["params"], sharer, receiver) for label, p in cfg["protocols"].items()}
        rows: dict[str, dict] = {}
        for line in (cfg_path.parent / "records.jsonl").read_text(encoding="utf-8").splitlines():
            r = json.loads(line)
            row = rows.setdefault(label_row[r["protocol"]], {"acc": {}, "em": {}, "tteoa": [], "ttft": [], "ms": [],
                                                              "params": None, "errors": 0})
            row["acc"][r["pair"]] = float(r["accuracy"])
            row["em"][r["pair"]] = float(r["em"])
            row["errors"] += bool(r.get("error"))
            for key in ("tteoa", "ttft"):  # ttft: absent from records made before the field
                if r.get(key) is not None:
                    row[key].append(r[key])
            details = r.get("details") or {}
            if details.get("translator_ms") is not None:
                row["ms"].append(details["translator_ms"])
            row["params"] = row["params"] or details.get("parameters")
        cells[(f"{sharer}:{receiver}", task)] = rows
    return cells


def cell_runs(grid: Path) -> dict:
    """{(pair, task): (dtype, how the cell ran)}: its dtype, and the dtype, device and CPU (with its native-bf16
    flags) in words, from its config.json (a cell resumed elsewhere lists every environment)."""
    runs = {}
    for cfg_path in sorted(grid.glob("*/config.json")):
        raw = json.loads(cfg_path.read_text())
        cfg, envs = raw["config"], [e for e in (raw.get("environment"), *raw.get("resumed", [])) if e]
        where = sorted({hardware(e) for e in envs}) or ["environment not recorded"]
        dtype = cfg.get("dtype", "?")
        runs[(f"{cfg['sharer']}:{cfg['receiver']}", cfg["task"])] = (
            dtype, f"{dtype} on {cfg.get('device', '?')}: " + "; ".join(where))
    return runs


def macro(cells: dict, row: str, metric: str = "acc") -> tuple[float, float, float, int, int]:
    """(macro accuracy (or `metric` "em"), CI low, CI high, cells, episodes) of one row over its cells."""
    strata = [list(rows[row][metric].values()) for rows in cells.values() if row in rows]
    return (*stratified_bootstrap_ci(strata), len(strata), sum(map(len, strata)))


def paired(cells: dict, a: str, b: str) -> dict | None:
    """a − b over the cells both ran in, episodes matched by pair id."""
    diffs, xa, xb = [], [], []
    for rows in cells.values():
        if a in rows and b in rows:
            ids = sorted(set(rows[a]["acc"]) & set(rows[b]["acc"]))
            diffs.append([rows[a]["acc"][i] - rows[b]["acc"][i] for i in ids])
            xa += [rows[a]["acc"][i] for i in ids]
            xb += [rows[b]["acc"][i] for i in ids]
    if not xa:
        return None
    d, lo, hi = stratified_bootstrap_ci(diffs)
    return {"diff": d, "low": lo, "high": hi, "p": sign_flip_exact(xa, xb), "cells": len(diffs), "n": len(xa)}


def verdicts_by_receiver(cells: dict) -> dict:
    """{receiver: {claim: paired difference}} over each receiver model's cells; empty when the grid has one."""
    receivers = sorted({pair.split(":")[1] for pair, _ in cells})
    if len(receivers) < 2:
        return {}
    out = {}
    for r in receivers:
        sub = {key: rows for key, rows in cells.items() if key[0].split(":")[1] == r}
        out[r] = {claim: v for a, b, claim in VERDICTS if (v := paired(sub, a, b)) is not None}
    return out


def decide(v: dict) -> str:
    """A claim holds (or is reversed) only where its Holm-adjusted p is ≤ 0.05 and its CI agrees in sign: the
    percentile-bootstrap CI alone can exclude 0 where the exact test does not reject."""
    if v["p_holm"] <= 0.05 and v["low"] > 0:
        return "holds"
    if v["p_holm"] <= 0.05 and v["high"] < 0:
        return "reversed"
    return "not established (CI includes 0)" if v["low"] <= 0 <= v["high"] else "not established (Holm p > 0.05)"


def training_logs(grid: Path) -> list[tuple[str, dict]]:
    out = []
    for path in sorted((grid / "training").glob("*.json")):
        log = json.loads(path.read_text())
        c = log["config"]
        out.append((path.stem.removesuffix(f"_{c['sharer']}_{c['receiver']}"), log))
    return out


def intro(cells: dict, pairs_done: list[str], pending: list[str], tasks: list[str], dtypes: list[str]) -> list[str]:
    """The page's title, commands, and which pairs, tasks and dtypes the grid covers."""
    ns = sorted({len(rows[r]["acc"]) for rows in cells.values() for r in rows})

    def partial(pair: str) -> str:  # a pair evaluated on only some of the grid's tasks says which
        got = [t for t in tasks if (pair, t) in cells]
        return f" ({', '.join(got)} only)" if len(got) < len(tasks) else ""

    return ["# Translators between different frozen models: the grid", "",
            "Commands, per ordered pair A:B (sharer:receiver): `python benchmarks/train_translators.py --pairs A:B`, "
            "then `python benchmarks/translators.py --pairs A:B --n 64`; this page: "
            "`python benchmarks/translators.py --report-only`.", "",
            f"Pairs evaluated: {', '.join(p.replace(':', ' → ') + partial(p) for p in pairs_done) or 'none'}"
            + (f"; not yet: {', '.join(p.replace(':', ' → ') for p in pending)}." if pending else "."),
            f"Tasks: {', '.join(tasks)}; held-out pairs per cell: {', '.join(map(str, ns))} (documents never seen in "
            "training). Accuracy = a gold alias occurs in the reply. C2C (both gates) is a shared-context method: "
            "the receiver reads both documents too, so its reference is full context (one model reading both), "
            "not the single-document translators."
            + (f" Cells ran in different dtypes ({', '.join(dtypes)}; each pair's section says which): accuracy "
               "compares across cells, times only within a pair." if len(dtypes) > 1 else ""), ""]


def summary_section(cells: dict) -> tuple[list[str], dict]:
    """The macro-accuracy table (one line per method that ran) and its rows as grid.json's "summary"."""
    lines = ["## Macro accuracy per method", "",
             "Mean over the (pair, task) cells; 95% CI from a stratified bootstrap (episodes redrawn within each "
             "cell). EM (the reply is exactly a gold alias, SQuAD-normalised) beside it: accuracy credits a reply "
             "that names the answer anywhere, which favours long replies.", "",
             "| method | macro accuracy [95% CI] | macro EM | cells | episodes | median TTEOA s | translator ms |",
             "|---|---|---:|---:|---:|---:|---:|"]
    summary = {}
    for row in ROWS:
        m, lo, hi, k, n = macro(cells, row)
        if not k:
            continue
        tteoa = median([x for rows in cells.values() if row in rows for x in rows[row]["tteoa"]])
        ms = median([x for rows in cells.values() if row in rows for x in rows[row]["ms"]])
        summary[row] = {"macro": m, "low": lo, "high": hi, "cells": k, "episodes": n, "tteoa_s": tteoa,
                        "translator_ms": ms}
        tag = " (shared context)" if row in SHARED_CONTEXT else ""
        em = macro(cells, row, "em")[0]
        summary[row]["em"] = em
        lines.append(f"| {row}{tag} | {m:.3f} [{lo:.3f}, {hi:.3f}] | {em:.3f} | {k} | {n} | {tteoa:.2f} | "
                     + (f"{ms:.1f} |" if ms == ms else "– |"))
    return lines, summary


def verdict_section(cells: dict) -> tuple[list[str], list[dict]]:
    """The pooled verdicts table (McNemar p, Holm-adjusted) and its rows as grid.json's "verdicts"."""
    lines = ["", "## Verdicts", "", "| claim | a − b | macro difference [95% CI] | McNemar p | Holm p | episodes | "
             "verdict |", "|---|---|---|---:|---:|---:|---|"]
    verdicts = [{"a": a, "b": b, "claim": claim, **v} for a, b, claim in VERDICTS if (v := paired(cells, a, b))]
    for v, q in zip(verdicts, holm([v["p"] for v in verdicts])):
        v["p_holm"] = q
        v["verdict"] = decide(v)
        lines.append(f"| {v['claim']} | {v['a']} − {v['b']} | {100 * v['diff']:+.1f} pp [{100 * v['low']:+.1f}, "
                     f"{100 * v['high']:+.1f}] | {v['p']:.3g} | {q:.3g} | {v['n']} | {v['verdict']} |")
    if verdicts:
        lines += ["", holm_note(len(verdicts))]
    return lines, verdicts


def receiver_section(by_receiver: dict) -> list[str]:
    """The verdicts per receiver model, one column each; nothing when the grid has one receiver."""
    if not by_receiver:
        return []
    receivers = list(by_receiver)
    lines = ["", "### The verdicts per receiver model", "",
             "The same paired differences over the cells of one receiver each (McNemar p unadjusted): a "
             "pooled verdict that one receiver alone carries shows here.", "",
             "| claim | " + " | ".join(f"receiver {r}" for r in receivers) + " |", "|---|" + "---|" * len(receivers)]
    for _, _, claim in VERDICTS:
        got = [by_receiver[r].get(claim) for r in receivers]
        if any(got):
            lines.append(f"| {claim} | " + " | ".join(
                f"{100 * v['diff']:+.1f} pp [{100 * v['low']:+.1f}, {100 * v['high']:+.1f}], p = {v['p']:.2g}, "
                f"n = {v['n']}" if v else "–" for v in got) + " |")
    return lines


def pair_row(row: str, present: list[dict | None]) -> str:
    """One method's line of a pair's table, from its cell per task (None where it did not run that task)."""
    accs = []
    for c in present:
        if c is None:
            accs.append("–")
            continue
        m, lo, hi = bootstrap_ci(list(c["acc"].values()))
        accs.append(f"{m:.2f} [{lo:.2f}, {hi:.2f}]")
    got = [c for c in present if c]
    ms = median([x for c in got for x in c["ms"]])
    return (f"| {row} | " + " | ".join(accs) + f" | {median([x for c in got for x in c['tteoa']]):.2f} | "
            + (f"{ms:.1f}" if ms == ms else "–") + f" | {got[0]['params'] or 0:,d} | "
            f"{sum(c['errors'] for c in got)} |")


def pair_section(pair: str, cells: dict, runs: dict, tasks: list[str]) -> list[str]:
    """One model pair's section: how its cells ran, and accuracy per task of every method it ran."""
    lines = ["", f"## {pair.replace(':', ' → ')}", "",
             "Ran in " + "; ".join(f"{t}: {runs[(pair, t)][1]}" for t in tasks if (pair, t) in runs) + ".", "",
             "| method | " + " | ".join(f"{t} accuracy [95% CI]" for t in tasks) + " | median TTEOA s | "
             "translator ms | params | errors |", "|---|" + "---|" * len(tasks) + "---:|---:|---:|---:|"]
    for row in ROWS:
        present = [cells.get((pair, t), {}).get(row) for t in tasks]
        if any(present):
            lines.append(pair_row(row, present))
    return lines


def training_section(logs: list[tuple[str, dict]]) -> list[str]:
    """The training runs table (steps, batch, schedule, wall time, validation loss); nothing without logs."""
    if not logs:
        return []
    lines = ["", "## Training runs (`benchmarks/train_translators.py`)", "",
             "| method | sharer → receiver | steps reached (stage I + answer) | batch | lr schedule | params | "
             "wall time | val loss first → last eval |", "|---|---|---:|---:|---|---:|---:|---|"]
    for method, log in logs:
        c = log["config"]
        stage1 = min(log["step"], c["stage1_steps"])
        lines.append(f"| {METHOD_ROW.get(method, method)} | {c['sharer']} → {c['receiver']} | {log['step']} of "
                     f"{c['steps']} ({stage1} + {log['step'] - stage1}) | {c['batch']} | "
                     f"{c.get('lr_schedule', 'constant')} | {log.get('parameters', 0):,d} | "
                     f"{log.get('seconds', 0) / 60:.1f} min | {log['val'][0][1]:.2f} (step {log['val'][0][0]}) "
                     f"→ {log['val'][-1][1]:.2f} |")
    return lines


def page(grid: Path, cells: dict) -> tuple[str, dict]:
    """README.md's text and grid.json's data, from the cells and the training logs in `grid`."""
    pairs_done = sorted({p for p, _ in cells})
    pending = [p for p in PAIRS.split(",") if p not in pairs_done]
    tasks = sorted({t for _, t in cells})
    runs = cell_runs(grid)
    dtypes = sorted({dtype for dtype, _ in runs.values()})
    summary_lines, summary = summary_section(cells)
    verdict_lines, verdicts = verdict_section(cells)
    by_receiver = verdicts_by_receiver(cells)
    logs = training_logs(grid)
    lines = intro(cells, pairs_done, pending, tasks, dtypes) + summary_lines + verdict_lines
    lines += receiver_section(by_receiver)
    for pair in pairs_done:
        lines += pair_section(pair, cells, runs, tasks)
    lines += training_section(logs)
    lines += ["", "Translator forward time and parameters, XKV vs LCF-X: [translators_timing](../translators_timing.md).",
              "", "![accuracy per pair](accuracy.png)"] + (["", "![validation loss](loss.png)"] if logs else [])
    return "\n".join(lines) + "\n", {"summary": summary, "verdicts": verdicts, "by_receiver": by_receiver,
                                     "pairs": pairs_done,
                                     "pending": pending, "tasks": tasks}


def plots(grid: Path, cells: dict, pairs_done: list[str], tasks: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if pairs_done:
        fig, axes = plt.subplots(1, len(pairs_done), figsize=(4.6 * len(pairs_done), 3.8), sharey=True,
                                 squeeze=False)
        for ax, pair in zip(axes[0], pairs_done):
            rows = [r for r in ROWS if any(r in cells.get((pair, t), {}) for t in tasks)]
            width = 0.8 / max(1, len(tasks))
            for k, t in enumerate(tasks):
                cis = [bootstrap_ci(list(cells.get((pair, t), {}).get(r, {"acc": {}})["acc"].values())) for r in rows]
                xs = [i + width * (k - (len(tasks) - 1) / 2) for i in range(len(rows))]
                ax.bar(xs, [m for m, _, _ in cis], width=width, label=t,
                       yerr=[[m - lo for m, lo, _ in cis], [hi - m for m, _, hi in cis]], capsize=2)
            ax.set_xticks(range(len(rows)), rows, rotation=60, fontsize=7, ha="right")
            ax.set(title=pair.replace(":", " → "), ylim=(0, 1))
        axes[0][0].set_ylabel("accuracy (95% CI)")
        axes[0][0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(grid / "accuracy.png", dpi=110)
        plt.close(fig)
    logs = training_logs(grid)
    if logs:
        methods = list(dict.fromkeys(m for m, _ in logs))
        fig, axes = plt.subplots(1, len(methods), figsize=(3.6 * len(methods), 3.2), squeeze=False)
        for method, log in logs:
            c = log["config"]
            ax = axes[0][methods.index(method)]
            ax.plot([s for s, _ in log["val"]], [v for _, v in log["val"]], "o-", ms=3,
                    label=f"{c['sharer']} → {c['receiver']}")
            ax.set(title=f"{METHOD_ROW.get(method, method)}: validation loss", xlabel="step")
        for ax in axes[0]:
            ax.legend(fontsize=6)
        fig.tight_layout()
        fig.savefig(grid / "loss.png", dpi=110)
        plt.close(fig)


def write_page(grid: Path) -> str:
    grid.mkdir(parents=True, exist_ok=True)
    cells = collect(grid)
    text, data = page(grid, cells)
    (grid / "README.md").write_text(text, encoding="utf-8")
    (grid / "grid.json").write_text(json.dumps(data, indent=1) + "\n")
    plots(grid, cells, data["pairs"], data["tasks"])
    print(text)
    return text


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", type=Path, default=GRID)
    write_page(ap.parse_args().grid.resolve())

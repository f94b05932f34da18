"""The rival's `code` cell again, after retrieval's text became spans, and retrieval at twice the budget.

    python benchmarks/rival_spans.py [--cell code1] [--dtype float32] [--report-only]

Why. The rival study (benchmarks/rival.py) sent retrieval's sentences stripped and joined by newlines: code lost its
indentation, and its text differed from CacheBack's spans (`cacheback_x`) in form as well as in selection. Since
then retrieval sends exactly what `cacheback_x` would send for the same rows (`Spans.of` over the rows' character
spans: indentation kept, "\\n…\\n" between pieces), and sentence units leave whitespace-only runs out (on code that
changed CacheBack's units in 27 of the cell's 100 episodes, on the prose cells in none: a one-off count before
the change). This reruns, on the cell's
committed episodes, CacheBack 8× and retrieval (BM25, dense) under the current code, plus BM25 at ratio 4:
twice the budget, which still costs less time than CacheBack's read when no sender holds its document.

Pre-specified verdicts (Holm over the five): each retrieval now vs as the rival ran it (what the format changed),
and CacheBack 8× (rerun here) against BM25 and dense at 8× and BM25 at 4×. The run's model, dtype and device, and
the parameters of the protocols it shares with the rival, must be the rival's (else the format is not all that
changed): refused otherwise. Accuracy pairs are per episode; TTEOA ratios
against the rival's records come from another run (marked †). Writes `<rival>/<cell>_spans/`: records, the
standard report and README.md with the verdicts and this command.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from latentwire.agent import Agent
from latentwire.bench.episode import jsonl_lines
from latentwire.bench.report import complete_episodes, compare, read_run, summarize, verdict_table, write_report
from latentwire.bench.runner import RunConfig, run

RIVAL = Path(__file__).resolve().parents[1] / "docs" / "results" / "rival"
CB8, BM25, DENSE = "cacheback(ratio=8)", "retrieval(selector='bm25')", "retrieval(selector='dense')"
BM25_4 = "retrieval(selector='bm25', ratio=4)"
PROTOCOLS = [CB8, BM25, DENSE, BM25_4]
OLD = " [rival]"  # suffix of a label as the rival study ran it (committed records, before the span format)
FAMILY = [(BM25, BM25 + OLD), (DENSE, DENSE + OLD), (CB8, BM25), (CB8, DENSE), (CB8, BM25_4)]


def rival_records(cell: str, labels: set[str]) -> list[dict]:
    """The rival cell's committed records of `labels`, relabelled with `OLD`."""
    path = RIVAL / cell / "records.jsonl"
    out = []
    for line in jsonl_lines(path.read_text(encoding="utf-8")):
        r = json.loads(line)
        if r["protocol"] in labels:
            out.append(r | {"protocol": r["protocol"] + OLD})
    return out


def rival_config(cell: str) -> dict:
    """The rival cell's run configuration (config.json's "config": model, dtype, device, protocols)."""
    return json.loads((RIVAL / cell / "config.json").read_text(encoding="utf-8"))["config"]


def check_matches_rival(rival: dict, resolved: dict) -> None:
    """SystemExit unless `resolved` (RunConfig.resolved) runs on the rival cell's (`rival_config`) model, dtype and
    device, and every protocol label it shares with the rival with the same parameters."""
    for key in ("model", "dtype", "device"):
        if rival.get(key) != resolved.get(key):
            raise SystemExit(f"{key}: the rival ran {rival.get(key)!r}, this run would use {resolved.get(key)!r}")
    for label, spec in resolved["protocols"].items():
        if label in rival["protocols"] and rival["protocols"][label].get("parameters") != spec.get("parameters"):
            raise SystemExit(f"{label}: its parameters changed since the rival ran it; pairing would compare two "
                             "protocols under one label")


def write_readme(folder: Path, cell: str, cmd: str) -> Path:
    config, records = read_run(folder)
    records = complete_episodes(records, PROTOCOLS)  # episodes every rerun protocol finished
    done = {r["episode"] for r in records}
    old = [r for r in rival_records(cell, {BM25, DENSE, CB8}) if r["episode"] in done]
    both = records + old
    labels = PROTOCOLS + [BM25 + OLD, DENSE + OLD, CB8 + OLD]
    lines = [f"# `{cell}` again: retrieval sent as spans, and at twice the budget", "",
             f"{len(done)} of the rival cell's {len(config['episodes'])} committed episodes "
             f"([rival {cell}](../{cell}/report.md)), Qwen2.5-Coder-0.5B, {config['config']['dtype']}, fan-in of 3. "
             "Why and what changed: the docstring of `benchmarks/rival_spans.py`. \"[rival]\": the committed "
             "record of the rival study (retrieval's text stripped and joined by newlines; CacheBack's sentence units "
             "before whitespace-only runs were left out).", "",
             "| protocol | n | accuracy [95% CI] | evidence recall | median TTEOA s | median receiver context |",
             "|---|---:|---|---:|---:|---:|"]
    summary = summarize(both, labels)
    for label in labels:
        s = summary.get(label)
        if s is None:
            continue
        acc, rec, ctx = s["accuracy"], s.get("evidence_recall"), s.get("receiver_context")
        lines.append(f"| `{label}` | {s['n']} | {acc[0]:.2f} [{acc[1]:.2f}, {acc[2]:.2f}] | "
                     f"{'—' if rec is None else f'{rec[0]:.2f}'} | "
                     f"{'—' if s['tteoa_median'] is None else format(s['tteoa_median'], '.2f')} | "
                     f"{'—' if ctx is None else f'{ctx[0]:.0f}'} |")
    comparisons = [c for a, b in FAMILY if (c := compare(both, a, b)) is not None]
    if done and len(comparisons) != len(FAMILY):
        raise SystemExit(f"{len(comparisons)} of the {len(FAMILY)} pre-specified verdicts could be drawn")
    lines += ["", f"Pre-specified verdicts (Holm over these {len(FAMILY)}; report.md's verdicts are the same "
              "pairs without the rival's records, Holm over fewer: this table decides):", ""]
    lines += verdict_table(comparisons)
    lines += ["", f"Command: `{cmd}`", ""]
    path = folder / "README.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cell", default="code1")
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--dtype", default=None, help="default: the rival cell's")
    ap.add_argument("--report-only", action="store_true", help="rewrite the reports from the records")
    args = ap.parse_args()
    folder = RIVAL / f"{args.cell}_spans"
    if not args.report_only:
        task = RIVAL / args.cell / "episodes.jsonl"
        if not task.exists():
            sys.exit(f"{task} does not exist: run benchmarks/rival.py --cells {args.cell} first")
        rival = rival_config(args.cell)
        dtype = args.dtype or rival["dtype"]  # the rival's, so that the format is all that changed
        agent = Agent.from_pretrained(args.model, device=rival["device"], dtype=dtype)
        config = RunConfig(os.path.relpath(task), ",".join(PROTOCOLS), args.model, device=rival["device"], dtype=dtype)
        check_matches_rival(rival, config.resolved(agent))
        run(config, folder, agent=agent)
    write_report(folder, [p for p in FAMILY if OLD not in p[1]], complete=True)  # the README's table decides
    cmd = " ".join(["python benchmarks/rival_spans.py"] + [a for a in sys.argv[1:] if a != "--report-only"])  # the run
    print(write_readme(folder, args.cell, cmd).read_text())


if __name__ == "__main__":
    main()

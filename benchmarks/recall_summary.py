"""One table over evidence-recall runs: each CacheBack variant against today's CacheBack and against the
question-aware SnapKV baseline, paired per episode.

    python benchmarks/recall_summary.py docs/results/evidence_recall_facts_qwen2.5-0.5b.json [...]

Reads the per-episode recalls `benchmarks/evidence_recall.py` stores, and prints (and writes to
docs/results/evidence_recall_summary.md) for each run and ratio 8× and 16×: the mean recall of every
CacheBack variant, and its paired difference (95% paired bootstrap CI, episodes resampled together)
against plain `cacheback` and against `snapkv[question in sender]`.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from latentwire.bench.metrics import paired_bootstrap_diff

OUT = Path(__file__).resolve().parents[1] / "docs" / "results" / "evidence_recall_summary.md"
QA = "snapkv[question in sender]"
VARIANTS = ("cacheback", "cacheback+generic", "cacheback+masked", "cacheback/sentence",
            "cacheback+generic/sentence", "cacheback+masked/sentence")


def diff(a: list[float], b: list[float]) -> str:
    d, lo, hi = (100 * x for x in paired_bootstrap_diff(a, b))
    return f"{d:+.0f} [{lo:+.0f}, {hi:+.0f}]"


def main() -> None:
    paths = [Path(p) for p in sys.argv[1:]]
    if not paths:
        sys.exit(__doc__)
    lines = ["# Evidence recall: CacheBack variants, paired", "",
             f"Command: `python benchmarks/recall_summary.py {' '.join(str(p) for p in sys.argv[1:])}`", "",
             "Mean recall; differences in points with 95% paired bootstrap CIs (episodes resampled together).", ""]
    for path in paths:
        run = json.loads(path.read_text())
        per = run["per_episode"]
        n = len(run["episodes"])
        lines += [f"## {path.stem.removeprefix('evidence_recall_')} ({n} episodes)", "",
                  "| variant | 8× | − cacheback | − question-aware SnapKV | 16× | − cacheback | − question-aware SnapKV |",
                  "|---|---:|---|---|---:|---|---|"]
        for v in VARIANTS:
            if f"{v}@8" not in per:
                continue
            cells = []
            for r in (8, 16):
                x = per[f"{v}@{r}"]
                cells += [f"{sum(x) / len(x):.2f}", "—" if v == "cacheback" else diff(x, per[f"cacheback@{r}"]),
                          diff(x, per[f"{QA}@{r}"]) if f"{QA}@{r}" in per else "—"]
            lines.append(f"| {v} | " + " | ".join(cells) + " |")
        if f"{QA}@8" in per:
            qa = [sum(per[f"{QA}@{r}"]) / n for r in (8, 16)]
            lines.append(f"| *{QA}* | {qa[0]:.2f} | | | {qa[1]:.2f} | | |")
        lines.append("")
    OUT.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()

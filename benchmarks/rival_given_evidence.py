"""Accuracy once the evidence has arrived: each message against dense text, on the episodes where both carried it all.

    python benchmarks/rival_given_evidence.py [--rival docs/results/rival] [--against dense]

Evidence recall says whether a message found the gold sentences; this says what the receiver made of them. Per
rival cell it keeps the episodes where both messages have evidence recall 1.0 and prints the paired accuracy
difference with its 95% bootstrap CI (unadjusted: a diagnosis, not a verdict of the study's family). What is left
is everything but retrieval: the other sentences that fill the budget, and the delivery (re-prefilled rows,
attached K/V or text). Reads the committed records only (benchmarks/rival.py writes them; no model loads).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rival import BM25, CELLS, CONTENDERS, DENSE  # noqa: E402

from latentwire.bench.metrics import paired_bootstrap_diff  # noqa: E402

BASELINES = {"dense": DENSE, "bm25": BM25}


def given_evidence(records: list[dict], message: str, baseline: str) -> tuple[int, float, float, tuple]:
    """(n, accuracy of `message`, of `baseline`, (diff, low, high)) on the episodes where both recalled 1.0."""
    by: dict[str, dict[str, dict]] = {}
    for r in records:
        by.setdefault(r["protocol"], {})[r["episode"]] = r
    a, b = by.get(message, {}), by.get(baseline, {})
    ids = sorted(e for e in set(a) & set(b) if a[e].get("evidence_recall") == 1.0 == b[e].get("evidence_recall"))
    if not ids:
        return 0, float("nan"), float("nan"), (float("nan"),) * 3
    x, y = [a[e]["accuracy"] for e in ids], [b[e]["accuracy"] for e in ids]
    return len(ids), sum(x) / len(x), sum(y) / len(y), paired_bootstrap_diff(x, y)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rival", type=Path, default=Path(__file__).resolve().parents[1] / "docs" / "results" / "rival")
    ap.add_argument("--against", choices=sorted(BASELINES), default="dense")
    args = ap.parse_args()
    baseline = BASELINES[args.against]
    print(f"| cell | message | n (both recall 1.0) | accuracy | {args.against} text | difference [95% CI] |")
    print("|---|---|---:|---:|---:|---|")
    for cell in CELLS:
        path = args.rival / cell / "records.jsonl"
        if not path.exists():
            continue
        records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        for label, message in CONTENDERS.items():
            if message == baseline:
                continue
            n, acc, base, (d, lo, hi) = given_evidence(records, message, baseline)
            if n:
                print(f"| {cell} | {label} | {n} | {acc:.2f} | {base:.2f} | "
                      f"{100 * d:+.0f} pp [{100 * lo:+.0f}, {100 * hi:+.0f}] |")


if __name__ == "__main__":
    main()

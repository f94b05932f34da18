"""Evidence recall of CacheBack's scoring variants against its default, paired per episode, on every rival cell.

    python benchmarks/rival_recall_pairs.py [--rival docs/results/rival]

Reads each cell's committed records (benchmarks/rival.py writes them; no model loads) and prints, per cell, the
mean paired difference in evidence recall of contrastive scoring, of contrastive ⊕ dense and of the answer probe
(`probe=16`) against
`cacheback(ratio=8)`, with its 95% paired bootstrap CI (the figures of docs/results.md's default decision).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rival import CB8, CBD8, CBDF8, CBP8, CELLS  # noqa: E402

from latentwire.bench.episode import jsonl_lines  # noqa: E402
from latentwire.bench.metrics import paired_bootstrap_diff  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rival", type=Path, default=Path(__file__).resolve().parents[1] / "docs" / "results" / "rival")
    args = ap.parse_args()
    for cell in CELLS:
        path = args.rival / cell / "records.jsonl"
        if not path.exists():
            continue
        recall: dict[str, dict[str, float]] = {}
        for line in jsonl_lines(path.read_text(encoding="utf-8")):
            r = json.loads(line)
            if r.get("evidence_recall") is not None:
                recall.setdefault(r["protocol"], {})[r["episode"]] = r["evidence_recall"]
        for name, label in (("contrastive", CBD8), ("contrastive ⊕ dense", CBDF8), ("probe", CBP8)):
            ids = sorted(set(recall.get(label, {})) & set(recall.get(CB8, {})))
            if ids:
                d, lo, hi = paired_bootstrap_diff([recall[label][i] for i in ids], [recall[CB8][i] for i in ids])
                print(f"{cell:11} {name:20} n={len(ids):3}  recall − default {100 * d:+.0f} pp [{100 * lo:+.0f}, {100 * hi:+.0f}]")


if __name__ == "__main__":
    main()

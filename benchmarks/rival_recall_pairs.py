"""Evidence recall of CacheBack's scoring variants against its default, paired per episode, on every rival cell.

    python benchmarks/rival_recall_pairs.py [--rival docs/results/rival]

Reads each cell's committed records (benchmarks/rival.py writes them; no model loads) and prints, per cell, the
mean paired difference in evidence recall of contrastive scoring, of contrastive ⊕ dense and of the answer probe
(`probe=16`) against
`cacheback(ratio=8)`, with its 95% paired bootstrap CI, and the probe's median TTEOA ratio to the default over
the episodes one run timed both (the figures of docs/results.md's default decision).
"""
from __future__ import annotations

import argparse
import json
import statistics
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
        timed: dict[str, dict[str, tuple]] = {}  # protocol -> episode -> (run, TTEOA)
        for line in jsonl_lines(path.read_text(encoding="utf-8")):
            r = json.loads(line)
            if r.get("evidence_recall") is not None:
                recall.setdefault(r["protocol"], {})[r["episode"]] = r["evidence_recall"]
            if r.get("tteoa"):
                timed.setdefault(r["protocol"], {})[r["episode"]] = (r.get("run"), r["tteoa"])
        for name, label in (("contrastive", CBD8), ("contrastive ⊕ dense", CBDF8), ("probe", CBP8)):
            ids = sorted(set(recall.get(label, {})) & set(recall.get(CB8, {})))
            if ids:
                d, lo, hi = paired_bootstrap_diff([recall[label][i] for i in ids], [recall[CB8][i] for i in ids])
                print(f"{cell:11} {name:20} n={len(ids):3}  recall − default {100 * d:+.0f} pp [{100 * lo:+.0f}, {100 * hi:+.0f}]")
        # the probe's cost: its TTEOA over the default's, on episodes where one run timed both (side by side)
        probe, base = timed.get(CBP8, {}), timed.get(CB8, {})
        same = [probe[e][1] / base[e][1] for e in probe.keys() & base.keys()
                if probe[e][0] and probe[e][0] == base[e][0]]
        if same:
            print(f"{cell:11} {'probe':20} n={len(same):3}  TTEOA ÷ default ×{statistics.median(same):.2f} "
                  "(median, episodes both ran in one run)")


if __name__ == "__main__":
    main()

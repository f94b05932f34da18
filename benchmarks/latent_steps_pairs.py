"""Latent steps against none: every committed run that ran a protocol both with G = 8 and with G = 0, paired.

    python benchmarks/latent_steps_pairs.py [--results docs/results] [--out docs/results/latent_steps_pairs.md]

Reads the committed records only (no model loads). In each run folder (a `records.jsonl` beside a `config.json`)
it pairs every protocol label with the label that differs from it only in `latent_steps` (8 against 0, defaults
resolved, so `cacheback(ratio=8)` pairs with `cacheback(ratio=8, latent_steps=0)`), and prints the paired accuracy
difference (95% bootstrap CI, exact sign-flip p, Holm over every row of the table) with the median ratio of cold
TTEOA (G = 8 ÷ G = 0; † where the pair's records came from different invocations, so were not timed side by side).
One table, so the question "do latent steps help?" is answered over all the evidence at once.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from latentwire.bench.episode import jsonl_lines
from latentwire.bench.report import VERDICT_HEADER, compare, verdict, with_holm
from latentwire.bench.runner import parse_protocols
from latentwire.errors import LatentWireError
from latentwire.protocols import get_protocol

ROOT = Path(__file__).resolve().parents[1]


def resolved(label: str) -> tuple[str, tuple, int] | None:
    """(name, every parameter but latent_steps, latent_steps) with defaults filled in; None for a label that is not
    a protocol spec this library builds, or a protocol without latent steps."""
    try:
        (name, params), = parse_protocols(label).values()
        protocol = get_protocol(name, **params)
    except (LatentWireError, ValueError):
        return None
    steps = getattr(protocol, "latent_steps", None)
    if steps is None:
        return None
    rest = tuple(sorted((k, repr(v)) for k, v in vars(protocol).items() if not k.startswith("_") and k != "latent_steps"))
    return name, rest, steps


def pairs_in(folder: Path) -> list[dict]:
    records = [json.loads(line) for line in jsonl_lines((folder / "records.jsonl").read_text(encoding="utf-8"))]
    labels = sorted({r["protocol"] for r in records})
    keyed = {label: k for label in labels if (k := resolved(label)) is not None}
    out = []
    for a, (name, rest, steps) in keyed.items():
        if steps != 8:
            continue
        for b, (name_b, rest_b, steps_b) in keyed.items():
            if steps_b == 0 and (name_b, rest_b) == (name, rest) and (c := compare(records, a, b)) is not None:
                out.append(c | {"folder": folder.relative_to(ROOT).as_posix()})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=ROOT / "docs" / "results")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "latent_steps_pairs.md")
    args = ap.parse_args()
    rows = [c for rec in sorted(args.results.glob("**/records.jsonl")) if (rec.parent / "config.json").exists()
            for c in pairs_in(rec.parent)]
    if not rows:
        sys.exit(f"no run under {args.results} holds a protocol with both G = 8 and G = 0")
    with_holm(rows)
    lines = ["# Latent steps (G = 8) against none (G = 0), paired", "",
             f"`python benchmarks/latent_steps_pairs.py` (reads the committed records; {len(rows)} pairs in "
             f"{len({c['folder'] for c in rows})} runs). Accuracy of G = 8 vs G = 0 on the episodes both ran, the "
             "difference with its 95% paired bootstrap CI, the exact sign-flip p and Holm's adjustment over every "
             "row of this table; the TTEOA ratio is G = 8's cold time ÷ G = 0's († not timed side by side).", ""]
    for folder in dict.fromkeys(c["folder"] for c in rows):
        config = json.loads((ROOT / folder / "config.json").read_text())["config"]
        lines += [f"## [{folder}]({Path(folder).relative_to('docs/results').as_posix()}/report.md)", "",
                  f"model `{config.get('model')}`, dtype `{config.get('dtype')}`, task `{config.get('task')}`", "",
                  *VERDICT_HEADER]
        lines += [verdict(c) for c in rows if c["folder"] == folder] + [""]
    better = [c for c in rows if c["p_holm"] < 0.05]
    lines += [f"Rows whose difference survives Holm: {len(better)} of {len(rows)}"
              + ("." if not better else ": " + "; ".join(f"`{c['a']}` in {c['folder']}" for c in better) + "."), ""]
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()

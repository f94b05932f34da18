"""The decomposition table of held-document messages (issue #65, dev episodes only: explorations, not verdicts).

    python benchmarks/decomposition.py            # reads docs/results/decomposition/*/records.jsonl, writes README.md

One factor changed at a time against a reference protocol of the same cell (whole reads concatenated): accuracy with
its paired difference (discordant episodes, exact p, no correction: these are dev runs that choose what a study
pre-specifies), median question-time TTEOA in one process and with the message moved at 0.1 / 1 / 10 Gbit/s
(`Outcome.moved_tteoa`), and median message bytes. The runs themselves are `latentwire bench run` commands, in each
folder's `command.txt`.
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from latentwire.bench.metrics import sign_flip_exact  # noqa: E402
from latentwire.protocols.base import LINKS_GBIT_S, transfer_seconds  # noqa: E402

OUT = ROOT / "docs" / "results" / "decomposition"
REFERENCE = "fullkv(latent_steps=0)"  # the whole reads, concatenated (today's full KV at G = 0)


def load(folder: Path) -> dict[str, dict[str, dict]]:
    """protocol label -> episode -> record, over a cell's folders (`<cell>_dev7_<dtype>*`)."""
    out: dict[str, dict[str, dict]] = {}
    for path in sorted(folder.parent.glob(folder.name + "*/records.jsonl")):
        for line in path.read_text().splitlines():
            r = json.loads(line)
            out.setdefault(r["protocol"], {})[r["episode"]] = r
    return out


def row(label: str, recs: dict, ref: dict | None) -> str:
    acc = statistics.mean(r["accuracy"] for r in recs.values())
    if ref is None or label == REFERENCE:
        diff = "—"
    else:
        both = sorted(recs.keys() & ref.keys())
        a, b = [recs[e]["accuracy"] for e in both], [ref[e]["accuracy"] for e in both]
        up, down = sum(x > y for x, y in zip(a, b)), sum(x < y for x, y in zip(a, b))
        diff = f"{100 * (statistics.mean(a) - statistics.mean(b)):+.0f} pp ({up}↑ {down}↓, p {sign_flip_exact(a, b):.2g})"
    q = [r["tteoa_question"] for r in recs.values() if r.get("tteoa_question") is not None]
    times = " / ".join(f"{statistics.median(x + transfer_seconds(r['message_bytes'], g) for x, r in zip(q, recs.values())):.2f}"
                       for g in LINKS_GBIT_S) if q else "—"
    nbytes = statistics.median(r["message_bytes"] for r in recs.values())
    size = f"{nbytes / 1e6:,.2f} MB" if nbytes >= 1e5 else f"{nbytes:,.0f} B"
    return f"| `{label}` | {len(recs)} | {acc:.2f} | {diff} | {times} | {size} |"


def main() -> None:
    lines = ["# Decomposition of held-document messages (dev episodes, not verdicts)", "",
             "Dev episodes of the rival tasks (seed 7, `docs/results/rival/dev7/`), 24 per cell, Qwen2.5-Coder-0.5B, "
             "bfloat16 (this CPU's native dtype), 3 senders. Each row changes one factor against the whole reads "
             f"concatenated (`{REFERENCE}`); Δ is paired on the same episodes (discordant episodes, exact sign-flip p, "
             "no correction). Question-time TTEOA (median, s): one process / 0.1 / 1 / 10 Gbit/s, the message moved "
             "over one link. Commands: each folder's `command.txt`; table: `python benchmarks/decomposition.py`.", ""]
    for folder in sorted(p for p in OUT.iterdir() if p.is_dir() and not p.name.endswith("_recompute")):
        data = load(folder)
        lines += [f"## {folder.name.split('_dev7')[0]}", "",
                  "| protocol | n | accuracy | Δ vs whole reads | question-time TTEOA s | message |",
                  "|---|---:|---:|---|---|---:|"]
        lines += [row(label, recs, data.get(REFERENCE)) for label, recs in data.items()]
        lines.append("")
    (OUT / "README.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()

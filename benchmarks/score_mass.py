"""How concentrated are CacheBack's row scores? Per sender of a few dev episodes: whether it holds evidence, the
share of the score mass the 8x budget holds, the rows the adaptive rule (`mass_budget`) would send at several
targets, and how many rows it takes to reach the evidence. Used to choose the stored-states study's adaptive budget.

    python benchmarks/score_mass.py [--seed 7] [--dtype bfloat16] [--out docs/results/stored_states/score_mass]

Writes `records.jsonl` (one object per sender × calibration), `summary.md` and `command.txt`. Dev seed: not the
study's (2027), so the choice is not fitted to the episodes it is measured on.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import stored_states as ss  # noqa: E402

from latentwire.agent import Agent  # noqa: E402
from latentwire.protocols import get_protocol  # noqa: E402
from latentwire.protocols.documents import document_rows  # noqa: E402
from latentwire.select import always_kept, fanin_budget  # noqa: E402
from latentwire.select.base import ranked_units  # noqa: E402

TARGETS = (0.3, 0.5, 0.7, 0.9)


def sender_record(agent: Agent, cb, doc: str, question: str, evidence: list[tuple[int, int]]) -> dict:
    state = cb.sender_read(agent, doc, question).state
    per_row, eligible = document_rows(agent, doc, len(state), cb.sender_prompt(doc, question))
    scores = cb.scores(agent, state, question, per_row).double()  # (T,)
    spans, order = ranked_units(scores, always_kept(state), cb.span, eligible, cb.span_groups(per_row, doc))
    mass = torch.tensor([float(scores[u].clamp_min(0).sum()) for u in spans], dtype=torch.float64)
    rows = torch.tensor([len(spans[j]) for j in order]).cumsum(0)  # rows sent after each unit, best first
    share = mass[order].cumsum(0) / mass.sum()  # score mass held after each unit
    cap = fanin_budget(len(state), 8)
    hits = [k for k, j in enumerate(order) if any(per_row[x] and per_row[x][0] < b and per_row[x][1] > a
                                                  for x in spans[j].tolist() for a, b in evidence)]
    return {"T": len(state), "cap8": cap, "evidence": bool(evidence),
            "mass_at_cap8": round(float(share[(rows <= cap).sum() - 1]), 3) if rows[0] <= cap else 0.0,
            "rows_for_mass": {str(q): int(rows[min(int((share < q).sum()), len(rows) - 1)]) for q in TARGETS},
            "rows_to_evidence": [int(rows[k]) for k in hits]}


def summary(recs: list[dict]) -> list[str]:
    lines = ["| cell | calibration | senders (with evidence) | 8x budget's mass share, median | target | rows ÷ 8x "
             "budget, median (holders / others) | holders whose evidence is all inside |", "|---|---|---|---:|---:|---|---|"]
    for key in sorted({(r["cell"], r["calibration"]) for r in recs}):
        sub = [r for r in recs if (r["cell"], r["calibration"]) == key]
        held = [r for r in sub if r["evidence"]]
        other = [r for r in sub if not r["evidence"]]
        med = lambda xs: f"{statistics.median(xs):.2f}" if xs else "—"  # noqa: E731
        for q in TARGETS:
            inside = sum(all(x <= r["rows_for_mass"][str(q)] for x in r["rows_to_evidence"]) for r in held)
            lines.append(f"| {key[0]} | {key[1]} | {len(sub)} ({len(held)}) | {med([r['mass_at_cap8'] for r in sub])} | "
                         f"{q} | {med([r['rows_for_mass'][str(q)] / r['cap8'] for r in held])} / "
                         f"{med([r['rows_for_mass'][str(q)] / r['cap8'] for r in other])} | {inside} of {len(held)} |")
    lines += ["", "Rows to reach all the evidence ÷ 8x budget, per holder: " + "; ".join(
        f"{r['cell']} {r['calibration']} {[round(x / r['cap8'], 2) for x in r['rows_to_evidence']]}" for r in recs
        if r["evidence"])]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--out", type=Path, default=ss.OUT / "score_mass")
    args = ap.parse_args()
    agent = Agent.from_pretrained(args.model, dtype=args.dtype)
    recs = []
    for cell, n in (("facts1_2000", 3), ("aggregate_2000", 2)):
        for group in ss.groups_for(cell, n, args.seed):
            ep = group[0]
            for calibration in ("none", "generic"):
                cb = get_protocol("cacheback", ratio=8, calibration=calibration)
                for i, doc in enumerate(ep.contexts):
                    ev = [(e.start, e.end) for e in ep.evidence if e.agent == i]
                    recs.append({"cell": cell, "episode": ep.id, "calibration": calibration, "sender": i}
                                | sender_record(agent, cb, doc, ep.question, ev))
                    print(json.dumps(recs[-1]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (args.out / "command.txt").write_text(" ".join(["python benchmarks/score_mass.py"] + sys.argv[1:]) + "\n")
    text = [f"# CacheBack score mass on dev episodes (seed {args.seed}, {args.model}, "
            f"{str(agent.dtype).removeprefix('torch.')})", ""] + summary(recs)
    (args.out / "summary.md").write_text("\n".join(text) + "\n")
    print("\n".join(text))


if __name__ == "__main__":
    main()

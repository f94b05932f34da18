"""Two CacheBack design choices, measured: which rows compete for the budget, and how q is appended.

    python benchmarks/cacheback_design.py [--model smollm2-135m] [--n 10] [--ratio 8]

Short `facts` episodes (≤ 1,000 tokens per sender). For CacheBack and mean-query attention: all rows
vs document rows only as candidates; q as raw question tokens vs the receiver's own chat turn.
Writes docs/results/cacheback_design_<model>.{md,json}.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from latentwire.agent import Agent
from latentwire.bench.episode import span_token_positions
from latentwire.bench.runner import load_task_episodes, select_episodes
from latentwire.protocols.cacheback import CacheBack, document_rows, kept_document_spans
from latentwire.select import always_kept, fanin_budget, get_selector, select_rows

OUT = Path(__file__).resolve().parents[1] / "docs" / "results"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--ratio", type=float, default=8)
    ap.add_argument("--latent-steps", type=int, default=8)
    args = ap.parse_args()
    agent = Agent.from_pretrained(args.model)
    tok = agent.tokenizer
    short = [e for e in select_episodes(load_task_episodes("facts"), None, 0, {}) if e.meta["length_bucket"] <= 1000]
    episodes = select_episodes(short, args.n, 0, {})
    readers = {f: CacheBack(latent_steps=args.latent_steps, query_format=f) for f in ("raw", "turn")}
    recall: dict[tuple, list[float]] = {}
    for ep in episodes:
        for a in sorted({s.agent for s in ep.evidence}):
            doc = ep.contexts[a]
            state = readers["raw"].read(agent, doc)
            per_row, eligible = document_rows(agent, doc, len(state))
            gold = set(span_token_positions(doc, [(s.start, s.end) for s in ep.evidence if s.agent == a], tok))
            for fmt, reader in readers.items():
                for sel in ("cacheback", "mean_query"):
                    scores = get_selector(sel).score(agent, state, reader.query_text(agent, ep.question))
                    for rows_kind, elig in (("all rows", None), ("document rows", eligible)):
                        rows = select_rows(scores, fanin_budget(len(state), args.ratio), always_kept(state),
                                           eligible=elig)
                        kept = set(span_token_positions(doc, kept_document_spans(per_row, rows), tok))
                        recall.setdefault((sel, fmt, rows_kind), []).append(len(gold & kept) / len(gold))
    cmd = f"python benchmarks/cacheback_design.py --model {args.model} --n {args.n} --ratio {args.ratio:g}"
    lines = [f"# CacheBack design choices ({args.model}, {len(episodes)} short facts episodes, {args.ratio:g}×, "
             f"G = {args.latent_steps})", "", f"Command: `{cmd}`", "", "Evidence recall (mean over evidence-holding "
             "senders):", "", "| selector | q appended as | candidates | recall |", "|---|---|---|---:|"]
    lines += [f"| {s} | {f} | {r} | {statistics.mean(v):.2f} |" for (s, f, r), v in sorted(recall.items())]
    print("\n".join(lines))
    OUT.mkdir(parents=True, exist_ok=True)
    stem = OUT / f"cacheback_design_{args.model}"
    stem.with_name(stem.name + ".md").write_text("\n".join(lines) + "\n")
    stem.with_name(stem.name + ".json").write_text(json.dumps({"command": cmd, "recall": {" | ".join(k): statistics.mean(v)
                                                                               for k, v in recall.items()}},
                                                    indent=2) + "\n")


if __name__ == "__main__":
    main()

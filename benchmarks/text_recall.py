"""Text selectors beside CacheBack on evidence recall, like with like: the same episodes, units and budgets.

    python benchmarks/text_recall.py --task facts [--model qwen2.5-coder-0.5b] [--n 48] [--seed 0] [--latent-steps 8]

Reads the committed `docs/results/evidence_recall_{task}_{model}.json` (CacheBack's per-episode recall on the
same seeded episodes) and scores, on exactly those episodes, the lexical, BM25 and dense selectors under
sentence spans and fixed 16-row spans, with CacheBack's budget ceil((T + G) / r) over a sender state of T
prompt rows and G latent rows (the first and latent rows kept beside it, as CacheBack keeps them). No LLM
forward pass is needed: text selectors read the document and the model's tokenizer only. Writes
`docs/results/text_recall_{task}_{model}.md` with matched pairs (paired bootstrap CIs).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from latentwire.agent import Agent
from latentwire.bench.episode import span_token_positions
from latentwire.bench.metrics import bootstrap_ci, paired_bootstrap_diff
from latentwire.bench.runner import load_task_episodes, select_episodes
from latentwire.protocols.base import SENDER_PROMPT
from latentwire.protocols.cacheback import document_rows, kept_document_spans
from latentwire.select import (SPAN, fanin_budget, get_selector, select_rows, span_units,
                               sentence_groups, unit_row_scores)

OUT = Path(__file__).resolve().parents[1] / "docs" / "results"
SELECTORS = ("lexical", "bm25", "dense")
RATIOS = (8, 16)
MODES = ("sentence", "fixed")
OLD_NAMES = {"qwen2.5-coder-0.5b": "qwen2.5-0.5b"}  # the committed recall pages use the model's old name


def episode_recall(agent: Agent, ep, latent_steps: int) -> dict[str, float]:
    """{selector/mode/ratio: recall} over the senders holding gold evidence (as evidence_recall.py counts it)."""
    gold_total, kept = 0, {}
    for a in sorted({s.agent for s in ep.evidence}):
        doc = ep.contexts[a]
        gold = set(span_token_positions(doc, [(s.start, s.end) for s in ep.evidence if s.agent == a], agent.tokenizer))
        gold_total += len(gold)
        T = len(agent.chat_ids(SENDER_PROMPT.format(document=doc)))
        per_row, eligible = document_rows(agent, doc, T + latent_steps)
        keep = torch.zeros(T + latent_steps, dtype=torch.bool, device=eligible.device)
        keep[0], keep[T:] = True, True  # the first row and every latent row, as `always_kept` on a state
        for mode in MODES:
            groups = sentence_groups(per_row, doc) if mode == "sentence" else None
            units = span_units(keep, eligible, SPAN, groups)
            for name in SELECTORS:
                scores = unit_row_scores(get_selector(name), ep.question, per_row, doc, T + latent_steps, units,
                                         eligible.device)
                for r in RATIOS:
                    rows = select_rows(scores, fanin_budget(T + latent_steps, r), keep, SPAN, eligible, groups)
                    hit = gold & set(span_token_positions(doc, kept_document_spans(per_row, rows), agent.tokenizer))
                    key = f"{name}/{mode}/{r}"
                    kept[key] = kept.get(key, 0) + len(hit)
    return {k: v / gold_total for k, v in kept.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--task", default="facts")
    ap.add_argument("--n", type=int, default=48)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--latent-steps", type=int, default=8)
    args = ap.parse_args()
    ref_path = OUT / f"evidence_recall_{args.task}_{OLD_NAMES.get(args.model, args.model)}.json"
    ref = json.loads(ref_path.read_text())
    episodes = select_episodes(load_task_episodes(args.task), args.n, args.seed, {})
    episodes = [e for e in episodes if e.evidence]
    if [e.id for e in episodes] != ref["episodes"]:
        sys.exit(f"{ref_path.name} covers other episodes than --task {args.task} --n {args.n} --seed {args.seed}")
    agent = Agent.from_pretrained(args.model)
    rows = [episode_recall(agent, ep, args.latent_steps) for ep in episodes]
    cacheback = {f"cacheback/{m}/{r}": ref["per_episode"][f"cacheback{'/sentence' if m == 'sentence' else ''}@{r}"]
                 for m in MODES for r in RATIOS}
    table = {k: [row[k] for row in rows] for k in rows[0]} | cacheback
    cmd = " ".join(["python benchmarks/text_recall.py"] + sys.argv[1:])
    lines = [f"# Evidence recall: text selectors beside CacheBack, `{args.task}`, {args.model}", "",
             f"Command: `{cmd}`. CacheBack's per-episode recall from [{ref_path.name}]({ref_path.name}) "
             f"(`{ref['command']}`), on the same {len(episodes)} episodes, units and budgets. Mean [95% bootstrap CI].",
             "", "| selector | " + " | ".join(f"{m} {r}×" for r in RATIOS for m in MODES) + " |",
             "|---|" + "---:|" * (len(RATIOS) * len(MODES))]
    for name in ("cacheback", *SELECTORS):
        cells = ["{:.2f} [{:.2f}, {:.2f}]".format(*bootstrap_ci(table[f"{name}/{m}/{r}"])) for r in RATIOS for m in MODES]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Matched pairs, CacheBack − selector (paired bootstrap, same units):", ""]
    for name in SELECTORS:
        for m in MODES:
            d, lo, hi = paired_bootstrap_diff(table[f"cacheback/{m}/8"], table[f"{name}/{m}/8"])
            lines.append(f"- {name}, {m} spans, 8×: {100 * d:+.0f} pp [{100 * lo:+.0f}, {100 * hi:+.0f}]")
    text = "\n".join(lines) + "\n"
    print(text)
    stem = f"text_recall_{args.task}_{args.model}"
    (OUT / f"{stem}.md").write_text(text)
    (OUT / f"{stem}.json").write_text(json.dumps({"command": cmd, "episodes": [e.id for e in episodes],
                                                  "per_episode": table}, indent=2) + "\n")


if __name__ == "__main__":
    main()

"""Two checks of the rival study's verdicts on the person-attribute tasks, from the committed records alone.

    python benchmarks/rival_robustness.py [--rival docs/results/rival]   # writes robustness.md there

1. **Hedging.** Accuracy asks whether a gold value occurs in the answer, so an answer that lists several values
   of the asked relation ("the cello, the oboe or the viola") would score wherever the gold is among them. The
   hedge-proof score counts a single answer only if it names the gold value and no other value of that
   relation's vocabulary, and scores an aggregate answer by set F1 over the vocabulary values it names. The
   page gives both per protocol, how many answers hedge, and the headline verdicts under each.
2. **The decoy.** A `paraphrase` episode states another person's value of the asked relation in about half the
   episodes (the generator's `decoy`); in the other half the gold is the only value of its kind in the notes, so
   "the only instrument mentioned" answers it without linking fact to person. The page splits the headline
   verdicts by whether the episode holds another value of the asked relation.

No model loads; the numbers are paired bootstrap CIs (`metrics.paired_bootstrap_diff`) over the episodes.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rival import BM25, CB8, CBXDD8, CBXP8, CONTENDERS, DENSE, FULLCTX  # noqa: E402

from latentwire.bench.episode import jsonl_lines, load_episodes  # noqa: E402
from latentwire.bench.metrics import bootstrap_ci, contains, paired_bootstrap_diff  # noqa: E402
from latentwire.bench.tasks.people import RELATIONS  # noqa: E402

VOCAB = {r.name: r.values for r in RELATIONS}
CELLS = ("paraphrase", "coref", "aggregate")
HEADLINE = ((DENSE, CB8), (DENSE, BM25), (CB8, BM25), (CBXP8, BM25), (CBXP8, DENSE), (CBXDD8, DENSE))


def named(answer: str, relation: str) -> set[str]:
    """The values of `relation`'s vocabulary that the answer names (whole words, normalised)."""
    return {v for v in VOCAB[relation] if contains(answer, [v])}


def hedge_proof(rec: dict, ep) -> float:
    """1 / 0 for a single answer that names the gold and nothing else of its relation; set F1 for aggregates."""
    said = named(rec["answer"], ep.meta["qtype"])
    if isinstance(ep.answers, dict):  # aggregate: gold values, one per part
        gold = {next(v for v in VOCAB[ep.meta["qtype"]] if contains(aliases[0], [v]))
                for aliases in ep.answers.values()}
        hits = len(said & gold)
        return 0.0 if not hits else 2 * hits / (len(said) + len(gold))
    return float(rec["accuracy"] == 1.0 and len(said) <= 1)


def has_decoy(ep) -> bool:
    """Whether the notes state a value of the asked relation besides the gold's."""
    gold = {v for v in VOCAB[ep.meta["qtype"]] if any(contains(a, [v]) for a in ep.answers)}
    return bool(named(" ".join(ep.contexts), ep.meta["qtype"]) - gold)


def pp(d: tuple[float, float, float]) -> str:
    return f"{100 * d[0]:+.0f} pp [{100 * d[1]:+.0f}, {100 * d[2]:+.0f}]"


def verdict(scores: dict[str, dict[str, float]], a: str, b: str, ids: list[str]) -> str:
    both = [i for i in ids if i in scores.get(a, {}) and i in scores.get(b, {})]
    if not both:
        return "—"
    return pp(paired_bootstrap_diff([scores[a][i] for i in both], [scores[b][i] for i in both])) + f" (n = {len(both)})"


def cell_lines(folder: Path) -> list[str]:
    episodes = {e.id: e for e in load_episodes(folder / "episodes.jsonl")}
    acc, proof, hedged = defaultdict(dict), defaultdict(dict), defaultdict(int)
    for line in jsonl_lines((folder / "records.jsonl").read_text(encoding="utf-8")):
        r = json.loads(line)
        ep = episodes.get(r["episode"])
        if ep is None or r.get("accuracy") is None:
            continue
        acc[r["protocol"]][ep.id] = r["accuracy"]
        proof[r["protocol"]][ep.id] = hedge_proof(r, ep)
        parts = len(ep.answers) if isinstance(ep.answers, dict) else 1
        hedged[r["protocol"]] += len(named(r["answer"], ep.meta["qtype"])) > parts
    name = {v: k for k, v in CONTENDERS.items()}
    lines = [f"## {folder.name}", "", "| protocol | n | accuracy [95% CI] | hedge-proof [95% CI] | answers naming more "
             "values than asked |", "|---|---:|---|---|---:|"]
    for p in sorted(acc, key=lambda p: -sum(acc[p].values()) / len(acc[p])):
        a, h = bootstrap_ci(list(acc[p].values())), bootstrap_ci(list(proof[p].values()))
        lines.append(f"| {name.get(p, f'`{p}`')} | {len(acc[p])} | {a[0]:.2f} [{a[1]:.2f}, {a[2]:.2f}] | "
                     f"{h[0]:.2f} [{h[1]:.2f}, {h[2]:.2f}] | {hedged[p]} |")
    ids = sorted(episodes)
    lines += ["", "| a − b | accuracy | hedge-proof |" + (" no decoy (accuracy) | with a decoy (accuracy) |"
                                                          if folder.name == "paraphrase" else ""),
              "|---|---|---|" + ("---|---|" if folder.name == "paraphrase" else "")]
    decoy = {i for i in ids if has_decoy(episodes[i])}
    for a, b in HEADLINE:
        row = f"| {name.get(a, a)} − {name.get(b, b)} | {verdict(acc, a, b, ids)} | {verdict(proof, a, b, ids)} |"
        if folder.name == "paraphrase":
            row += (f" {verdict(acc, a, b, [i for i in ids if i not in decoy])} |"
                    f" {verdict(acc, a, b, [i for i in ids if i in decoy])} |")
        lines.append(row)
    if folder.name == "paraphrase":
        lines += ["", f"Episodes with another value of the asked relation in the notes: {len(decoy)} of {len(ids)}.",
                  "", "| protocol | no decoy | with a decoy |", "|---|---|---|"]
        for p in (DENSE, CBXDD8, CBXP8, CB8, BM25, FULLCTX):
            split = [bootstrap_ci([acc[p][i] for i in ids if (i in decoy) == d and i in acc[p]]) for d in (False, True)]
            lines.append(f"| {name.get(p, p)} | " + " | ".join(f"{m:.2f} [{lo:.2f}, {hi:.2f}]" for m, lo, hi in split)
                         + " |")
        recall: dict[str, dict[str, float]] = {}  # selector -> episode -> evidence recall (a later line wins)
        for line in jsonl_lines((folder / "recall.jsonl").read_text(encoding="utf-8")):
            r = json.loads(line)
            for key, v in r["recall"].items():
                recall.setdefault(key, {})[r["episode"]] = v
        lines += ["", "Evidence recall at 8× (sentence spans), by whether the notes hold a decoy (another person's "
                  "value of the asked relation): attention, which finds the relation, keeps less of the evidence "
                  "there; BM25, which matches the person's name, does not.", "",
                  "| selector | no decoy | with a decoy |", "|---|---|---|"]
        for sel in ("cacheback", "cacheback@deep+generic", "bm25", "dense"):
            got = recall.get(f"{sel}/sentence/8", {})
            split = [bootstrap_ci([v for i, v in got.items() if (i in decoy) == d]) for d in (False, True)]
            lines.append(f"| {sel} | " + " | ".join(f"{m:.2f} [{lo:.2f}, {hi:.2f}]" for m, lo, hi in split) + " |")
    return lines + [""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rival", type=Path, default=Path(__file__).resolve().parents[1] / "docs" / "results" / "rival")
    args = ap.parse_args()
    lines = ["# Rival study: hedging and the paraphrase decoy", "",
             "Checks of the person-attribute cells' verdicts from their records (no model): the hedge-proof score "
             "counts a single answer only if it names the gold value and no other value of the asked relation, and "
             "scores an aggregate answer by set F1 over the values it names; the `paraphrase` verdicts split by "
             "whether the notes hold another value of the asked relation. Paired differences with 95% bootstrap "
             "CIs, unadjusted (the study's Holm-adjusted verdicts are in [README.md](README.md)).", "",
             "Command: `python benchmarks/rival_robustness.py`", ""]
    for cell in CELLS:
        if (args.rival / cell / "records.jsonl").exists():
            lines += cell_lines(args.rival / cell)
    text = "\n".join(lines)
    (args.rival / "robustness.md").write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()

"""A 4-hop CacheBack chain: each hop re-prefills the previous hop's rows, reads its own document, sends on.

    python benchmarks/chain.py [--model smollm2-135m] [--n 12] [--hops 4] [--tokens 500]

Generated `facts` episodes with `--hops` contexts in chain order (one- and two-hop questions, evidence at
any hop). Protocols: the chain with relative budgets (B_i = T_old + ceil(T_new / 8)) and with a fixed
budget (B_max = 256 rows), against fan-in CacheBack 8× and full KV on the same documents. Besides the
run report: rows sent per hop and evidence recall by the hop that read the (earliest) evidence, i.e.
whether early evidence survives later hops. Writes docs/results/chain<hops>_<model>/.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
from pathlib import Path

from latentwire.agent import Agent
from latentwire.bench.episode import write_episodes
from latentwire.bench.report import read_run, write_report
from latentwire.bench.runner import RunConfig, run
from latentwire.bench.tasks.facts import episodes as facts_episodes

ROOT = Path(__file__).resolve().parents[1]
PROTOCOLS = ("cacheback_chain(ratio=8, latent_steps=8)",
             "cacheback_chain(ratio=8, latent_steps=8, budget='fixed', max_rows=256)",
             "cacheback(ratio=8, latent_steps=8)", "fullkv(latent_steps=8)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--n", type=int, default=12)
    ap.add_argument("--hops", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=500, help="~tokens of each hop's document")
    args = ap.parse_args()
    name = f"chain{args.hops}_{args.model}"
    runs = ROOT / "runs" / name
    runs.mkdir(parents=True, exist_ok=True)
    path = runs / "episodes.jsonl"
    episodes = facts_episodes(seed=4, n=args.n, tokens=args.tokens, senders=args.hops, topology="chain")
    write_episodes(path, episodes)
    agent = Agent.from_pretrained(args.model)
    run(RunConfig(str(path), ",".join(PROTOCOLS), agent.model_name), runs, agent=agent)
    report = write_report(runs)
    config, records = read_run(runs)
    eps = {ep.id: ep for ep in episodes}
    labels = list(config["config"]["protocols"])
    cmd = f"python benchmarks/chain.py --model {args.model} --n {args.n} --hops {args.hops} --tokens {args.tokens}"
    lines = [f"# {args.hops}-hop chain ({args.model}, {args.n} generated facts episodes, ~{args.tokens} tokens per hop)",
             "", f"Command: `{cmd}`", "", "## Rows sent per hop (mean) and budget",
             "", "Sent rows include the always-kept ones (first row, every hop's latent rows) beyond the budget B.", "",
             "| protocol | " + " | ".join(f"hop {h + 1} sent / budget" for h in range(args.hops)) + " |",
             "|---|" + "---:|" * args.hops]
    for label in labels:
        hops = [r["details"]["hops"] for r in records if r["protocol"] == label and r.get("details", {}).get("hops")]
        if hops:
            lines.append(f"| `{label}` | " + " | ".join(
                f"{statistics.mean(h[i]['sent'] for h in hops):.0f} / {statistics.mean(h[i]['budget'] for h in hops):.0f}"
                for i in range(args.hops)) + " |")
    lines += ["", "## Evidence recall by the hop that read the earliest evidence", "",
              "| protocol | " + " | ".join(f"hop {h + 1}" for h in range(args.hops)) + " |", "|---|" + "---:|" * args.hops]
    for label in labels:
        by_hop = {h: [] for h in range(args.hops)}
        for r in records:
            if r["protocol"] == label and r["evidence_recall"] is not None:
                by_hop[min(s.agent for s in eps[r["episode"]].evidence)].append(r["evidence_recall"])
        lines.append(f"| `{label}` | " + " | ".join(f"{statistics.mean(v):.2f} (n={len(v)})" if v else "—"
                                                    for v in by_hop.values()) + " |")
    out = ROOT / "docs" / "results" / name
    out.mkdir(parents=True, exist_ok=True)
    for f in ("report.md", "accuracy_vs_tteoa.png", "recall_vs_ratio.png", "config.json"):
        shutil.copy(runs / f, out / f)
    text = "\n".join(lines) + "\n\n" + report.read_text().replace("# Run report", "## Run report", 1)
    (out / "README.md").write_text(text)
    print(text)
    print(f"wrote {out}/README.md")


if __name__ == "__main__":
    main()

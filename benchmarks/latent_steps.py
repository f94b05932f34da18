"""Full-KV accuracy on the demo episodes as the number of latent steps G grows, per latent mode.

    python benchmarks/latent_steps.py [--model smollm2-135m] [--steps 0,4,8,16,40]

Prints a table and writes docs/results/latent_steps_<model>.{md,json}.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from latentwire.agent import Agent
from latentwire.demo import DOCUMENTS, EPISODES
from latentwire.protocols import get_protocol

OUT = Path(__file__).resolve().parents[1] / "docs" / "results"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--steps", default="0,4,8,16,40")
    args = ap.parse_args()
    agent = Agent.from_pretrained(args.model)
    rows = []
    for mode in ("rescale", "realign"):
        for g in map(int, args.steps.split(",")):
            protocol = get_protocol("fullkv", latent_steps=g, latent_mode=mode)
            outs = [(ep, protocol.run([agent] * 3, DOCUMENTS, agent, ep.question)) for ep in EPISODES]
            acc = sum(ep.gold.lower() in o.answer.lower() for ep, o in outs) / len(outs)
            row = {"mode": mode, "G": g, "accuracy": round(acc, 3),
                   "tteoa_s": round(statistics.median(o.tteoa for _, o in outs), 2),
                   "message_MB": round(statistics.median(o.message_bytes for _, o in outs) / 1e6, 2),
                   "answers": [o.answer for _, o in outs]}
            rows.append(row)
            print(f"{mode:8} G={g:3d} acc {acc:.2f}  TTEOA {row['tteoa_s']:5.2f} s  {row['message_MB']:6.2f} MB  "
                  f"{[a[:40] for a in row['answers']]}", flush=True)
    cmd = f"python benchmarks/latent_steps.py --model {args.model} --steps {args.steps}"
    OUT.mkdir(parents=True, exist_ok=True)
    stem = OUT / f"latent_steps_{args.model}"
    stem.with_name(stem.name + ".json").write_text(json.dumps({"command": cmd, "rows": rows}, indent=2) + "\n")
    lines = [f"# Full-KV accuracy vs latent steps ({args.model}, 3 senders, {len(EPISODES)} demo episodes)", "",
             f"Command: `{cmd}`", "", "| mode | G | accuracy | median TTEOA s | message MB |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {r['mode']} | {r['G']} | {r['accuracy']:.2f} | {r['tteoa_s']} | {r['message_MB']} |" for r in rows]
    lines += ["", "Answers per cell are in the JSON file next to this one. Three episodes: a smoke-scale",
              "measurement, not a benchmark result (see benchmarks/evidence_recall.py and latent_vs_text.py)."]
    stem.with_name(stem.name + ".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {stem}.md")


if __name__ == "__main__":
    main()

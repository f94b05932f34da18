"""End-to-end fan-in (3 senders): text at CacheBack 8×'s message size vs full KV vs CacheBack 4–32×.

    python benchmarks/fanin.py [--model qwen2.5-coder-0.5b] [--task facts] [--n 12] [--filter length_bucket=500]

Runs the protocols through the bench runner (records under runs/fanin_<task>_<model>/, re-running
resumes), writes the run report and adds: bytes on the wire (full KV vs CacheBack rows vs CacheBack
token ids, the same messages), and the issue's end-to-end target (CacheBack 8× at least as accurate as
text of the same size, with a median TTEOA ≥ 5× lower). Writes docs/results/fanin_<task>_<model>/.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
from pathlib import Path

from latentwire.agent import Agent
from latentwire.bench.report import read_run, summarize, write_report
from latentwire.bench.runner import RunConfig, parse_filters, run

ROOT = Path(__file__).resolve().parents[1]
RATIOS = (4, 8, 16, 32)
TEXT, FULL = "text(ratio=8)", "fullkv(latent_steps=8)"


def cacheback(r: int) -> str:
    return f"cacheback(ratio={r}, latent_steps=8)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--task", default="facts")
    ap.add_argument("--n", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--filter", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()
    tag = "".join(f"_{f.replace('=', '')}" for f in args.filter)
    name = f"fanin_{args.task}{tag}_{args.model}"
    runs = ROOT / "runs" / name
    protocols = [TEXT, FULL, *map(cacheback, RATIOS), "alone"]
    agent = Agent.from_pretrained(args.model)
    run(RunConfig(args.task, ",".join(protocols), agent.model_name, args.n, args.seed, parse_filters(args.filter)),
        runs, agent=agent)
    report = write_report(runs)
    config, records = read_run(runs)
    summary = summarize(records, list(config["config"]["protocols"]))
    by = {p: [r for r in records if r["protocol"] == p and r["error"] is None] for p in protocols}

    def median(p: str, key) -> float:
        return statistics.median(key(r) for r in by[p]) if by[p] else float("nan")

    full = median(FULL, lambda r: r["message_bytes"])
    cmd = (f"python benchmarks/fanin.py --model {args.model} --task {args.task} --n {args.n} --seed {args.seed}"
           + "".join(f" --filter {f}" for f in args.filter))
    lines = [f"# End-to-end fan-in ({args.task}, {args.model}, {len(config['episodes'])} episodes, 3 senders)", "",
             f"Command: `{cmd}`", "", "## Bytes on the wire (median per episode, all senders)", "",
             "| message | bytes | full KV ÷ this | rows sent | receiver ctx |", "|---|---:|---:|---:|---:|",
             f"| full KV (G = 8) | {full:,.0f} | 1 | {median(FULL, lambda r: r['details']['message_rows']):.0f} | "
             f"{median(FULL, lambda r: r['receiver_context']):.0f} |"]
    for r in RATIOS:
        p = cacheback(r)
        rows_b = median(p, lambda x: x["details"]["rows_bytes"])
        ids_b = median(p, lambda x: x["details"]["token_id_bytes"])
        sent, ctx = median(p, lambda x: x["details"]["message_rows"]), median(p, lambda x: x["receiver_context"])
        lines += [f"| CacheBack {r}×, rows | {rows_b:,.0f} | {full / rows_b:,.0f}× | {sent:.0f} | {ctx:.0f} |",
                  f"| CacheBack {r}×, token ids | {ids_b:,.0f} | {full / ids_b:,.0f}× | {sent:.0f} | {ctx:.0f} |"]
    lines.append(f"| text at 8×'s size | {median(TEXT, lambda r: r['message_bytes']):,.0f} | "
                 f"{full / median(TEXT, lambda r: r['message_bytes']):,.0f}× | "
                 f"{median(TEXT, lambda r: sum(r['details']['report_tokens'])):.0f} tokens | "
                 f"{median(TEXT, lambda r: r['receiver_context']):.0f} |")
    cb8, text = summary[cacheback(8)], summary[TEXT]
    speedup = text["tteoa_median"] / cb8["tteoa_median"]
    lines += ["", "## Target: CacheBack 8× vs text of the same size", "",
              f"- accuracy: CacheBack 8× {cb8['accuracy'][0]:.2f} vs text {text['accuracy'][0]:.2f} → "
              f"{'met' if cb8['accuracy'][0] >= text['accuracy'][0] else 'MISSED'}",
              f"- median TTEOA: CacheBack 8× {cb8['tteoa_median']:.2f} s vs text {text['tteoa_median']:.2f} s = "
              f"{speedup:.1f}× lower (target ≥ 5×) → {'met' if speedup >= 5 else 'MISSED'}",
              f"- bytes: full KV ÷ rows at 8× = {full / median(cacheback(8), lambda x: x['details']['rows_bytes']):.0f}× "
              f"(target ≥ 18×), ÷ token ids = "
              f"{full / median(cacheback(8), lambda x: x['details']['token_id_bytes']):.0f}× (target ≥ 75×)", ""]
    out = ROOT / "docs" / "results" / name
    out.mkdir(parents=True, exist_ok=True)
    for f in ("accuracy_vs_tteoa.png", "recall_vs_ratio.png", "config.json"):
        shutil.copy(runs / f, out / f)
    text_md = "\n".join(lines) + "\n" + report.read_text().replace("# Run report", "## Run report", 1)
    (out / "README.md").write_text(text_md)
    (out / "summary.json").write_text(json.dumps({"command": cmd, "summary": summary}, indent=2, default=str) + "\n")
    print(text_md)
    print(f"wrote {out}/README.md")


if __name__ == "__main__":
    main()

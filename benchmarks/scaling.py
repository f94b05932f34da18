"""Scaling: what the receiver pays as senders multiply and as their contexts grow.

    python benchmarks/scaling.py [--model smollm2-135m] [--n 2] [--senders 1,2,4,8] [--tokens 500,1000,2000,4000,7000]

Two sweeps of generated `facts` episodes (one-hop questions): M senders × ~500 tokens, and one sender
× ~500 → ~7,000 tokens (SmolLM2's window is 8,192, so full KV of one longer sender would not fit). For
each point, full KV vs text vs CacheBack 16× through the bench runner (records are kept under
runs/scaling_<model>/, re-running resumes): receiver context, receiver time and TTEOA (median over
episodes). The receiver side of CacheBack should grow with 1/r of full KV's slope. Writes
docs/results/scaling_<model>.{md,json,png}.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np

from latentwire.agent import Agent
from latentwire.bench.episode import write_episodes
from latentwire.bench.report import read_run
from latentwire.bench.runner import RunConfig, parse_protocols, run
from latentwire.bench.tasks.facts import episodes as facts_episodes

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "results"
PROTOCOLS = {"full KV": "fullkv(latent_steps=8)", "text": "text", "CacheBack 16×": "cacheback(ratio=16, latent_steps=8)"}
LABELS = dict(zip(PROTOCOLS, parse_protocols(",".join(PROTOCOLS.values()))))  # our label -> the runner's
METRICS = {"receiver_context": "receiver context (rows)", "receiver_seconds": "receiver time (s)", "tteoa": "TTEOA (s)"}


def sweep_point(agent: Agent, runs: Path, name: str, senders: int, tokens: int, n: int) -> dict:
    """Run every protocol on n episodes of `senders` × ~`tokens`; median of each metric per protocol."""
    folder = runs / name
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "episodes.jsonl"
    episodes = facts_episodes(seed=senders * 100_000 + tokens, n=n, tokens=tokens, senders=senders, hops=1)
    write_episodes(path, episodes)
    run(RunConfig(str(path), ",".join(PROTOCOLS.values()), agent.model_name), folder, progress=False, agent=agent)
    _, records = read_run(folder)
    sender_tokens = statistics.median(sum(len(agent.tokenizer(c)["input_ids"]) for c in ep.contexts)
                                      for ep in episodes)
    out = {"senders": senders, "tokens": tokens, "sender_tokens": sender_tokens, "protocols": {}}
    for label in PROTOCOLS:
        mine = [r for r in records if r["protocol"] == LABELS[label]]
        ok = [r for r in mine if r["error"] is None]
        out["protocols"][label] = {m: statistics.median(r[m] for r in ok) if ok else None for m in METRICS}
        out["protocols"][label]["errors"] = [r["error"] for r in mine if r["error"]]
        out["protocols"][label]["accuracy"] = statistics.mean(r["accuracy"] for r in mine) if mine else None
    return out


def slope(points: list[dict], label: str, metric: str, log: bool) -> float | None:
    xy = [(p["sender_tokens"], p["protocols"][label][metric]) for p in points if p["protocols"][label][metric]]
    if len(xy) < 2:
        return None
    x, y = np.array(xy, dtype=float).T
    return float(np.polyfit(np.log(x), np.log(y), 1)[0] if log else np.polyfit(x, y, 1)[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--n", type=int, default=2, help="episodes per point")
    ap.add_argument("--senders", default="1,2,4,8")
    ap.add_argument("--tokens", default="500,1000,2000,4000,7000")
    args = ap.parse_args()
    agent = Agent.from_pretrained(args.model)
    runs = ROOT / "runs" / f"scaling_{args.model}"
    sweeps = {"senders": [], "context": []}
    for m in map(int, args.senders.split(",")):
        sweeps["senders"].append(sweep_point(agent, runs, f"senders{m}_500", m, 500, args.n))
        print(json.dumps(sweeps["senders"][-1]), flush=True)
    for t in map(int, args.tokens.split(",")):
        sweeps["context"].append(sweep_point(agent, runs, f"senders1_{t}", 1, t, args.n))
        print(json.dumps(sweeps["context"][-1]), flush=True)

    cmd = f"python benchmarks/scaling.py --model {args.model} --n {args.n} --senders {args.senders} --tokens {args.tokens}"
    lines = [f"# Scaling: receiver cost vs senders and context ({args.model}, {args.n} episodes per point, medians)",
             "", f"Command: `{cmd}`", ""]
    fits = {}
    for sweep, points in sweeps.items():
        what = "M senders × ~500 tokens" if sweep == "senders" else "1 sender × ~T tokens"
        lines += [f"## {what}", "", "| M | T/sender | sender tokens | " + " | ".join(
            f"{label}: {short}" for label in PROTOCOLS for short in ("ctx", "recv s", "TTEOA s", "acc")) + " |",
            "|---:|---:|---:|" + "---:|" * (4 * len(PROTOCOLS))]
        for p in points:
            cells = []
            for label in PROTOCOLS:
                d = p["protocols"][label]
                cells += [f"{d['receiver_context']:.0f}" if d["receiver_context"] else f"error ×{len(d['errors'])}",
                          f"{d['receiver_seconds']:.2f}" if d["receiver_seconds"] else "—",
                          f"{d['tteoa']:.2f}" if d["tteoa"] else "—", f"{d['accuracy']:.2f}"]
            lines.append(f"| {p['senders']} | {p['tokens']} | {p['sender_tokens']:.0f} | " + " | ".join(cells) + " |")
        fits[sweep] = {label: {m: {"linear": slope(points, label, m, False), "loglog": slope(points, label, m, True)}
                               for m in METRICS} for label in PROTOCOLS}
        full = fits[sweep]["full KV"]["receiver_context"]["linear"]
        lines += ["", "Fitted slopes against total sender tokens (linear: rows or s per sender token; log-log "
                  "exponent in brackets):", "", "| protocol | " + " | ".join(METRICS.values()) + " |",
                  "|---|" + "---:|" * len(METRICS)]
        for label in PROTOCOLS:
            f = fits[sweep][label]
            lines.append(f"| {label} | " + " | ".join(
                "—" if f[m]["linear"] is None else f"{f[m]['linear']:.3g} ({f[m]['loglog']:.2f})" for m in METRICS) + " |")
        cb = fits[sweep]["CacheBack 16×"]["receiver_context"]["linear"]
        if full and cb:
            lines += ["", f"Receiver-context slope, CacheBack 16× ÷ full KV = {cb / full:.3f} (1/r = {1 / 16:.3f})."]
        lines.append("")
    lines.append(f"![scaling](scaling_{args.model}.png)")
    text = "\n".join(lines) + "\n"
    print(text)
    OUT.mkdir(parents=True, exist_ok=True)
    stem = OUT / f"scaling_{args.model}"
    stem.with_name(stem.name + ".md").write_text(text)
    stem.with_name(stem.name + ".json").write_text(json.dumps({"command": cmd, "sweeps": sweeps, "fits": fits}, indent=2) + "\n")
    plot(sweeps, stem.with_name(stem.name + ".png"), args.model)
    print(f"wrote {stem}.md")


def plot(sweeps: dict, path: Path, model: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(METRICS), figsize=(4.2 * len(METRICS), 7.5))
    for row, (sweep, points) in enumerate(sweeps.items()):
        for col, (metric, title) in enumerate(METRICS.items()):
            ax = axes[row, col]
            for label in PROTOCOLS:
                xy = [(p["sender_tokens"], p["protocols"][label][metric]) for p in points
                      if p["protocols"][label][metric]]
                if xy:
                    ax.plot(*zip(*xy), "o-", label=label)
            ax.set(xscale="log", yscale="log", xlabel="total sender tokens (log)", ylabel=title,
                   title=f"{'M senders × 500' if sweep == 'senders' else '1 sender × T'}: {title}")
            ax.grid(alpha=0.3, which="both")
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(f"{model}: receiver cost scaling")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()

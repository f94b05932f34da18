"""Ray fan-in of 3 senders vs in-process: time to end of answer (TTEOA), and identical results.

    python benchmarks/ray_fanin.py [--model smollm2-135m] [--repeats 2] [--ratio 8] [--latent-steps 8]
    python benchmarks/ray_fanin.py --dry-run        # tiny random-weight gemma3, a few seconds, no docs written

In-process: the protocol's own `run`, one agent object in this process (one torch thread); its TTEOA
is the slowest sender plus the receiver, i.e. senders assumed perfectly parallel. Ray: three sender
actors and one receiver actor (a local `ray.init(num_cpus=2, include_dashboard=False)`, one torch
thread per actor, each actor loads its own copy of the model); the senders really run in parallel,
the rows travel through the object store as signed wire messages, and the receiver verifies and
decodes them. The Ray TTEOA is the driver's wall clock from dispatching the senders to holding the
answer, so it includes dispatch, object-store transfers, encoding, signing, verifying and decoding,
and any contention of 3 parallel senders for the 2 cores. Target: Ray / in-process ≤ 1.5×.

Each episode (the demo's three documents and questions, `--repeats` times) runs on both transports;
answers and the selected positions of every sender must be identical. One warm-up episode per
transport is not timed. Writes docs/results/ray_fanin.{md,json} (with --dry-run: runs/ray_fanin_dryrun.*).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from latentwire.agent import Agent
from latentwire.bench.folder import environment
from latentwire.demo import DOCUMENTS, EPISODES
from latentwire.protocols import get_protocol
from latentwire.transport import AgentSpec, InProcessTransport, run_protocol

ROOT = Path(__file__).resolve().parents[1]
SENDERS, RECEIVER = ["sender-0", "sender-1", "sender-2"], "receiver"
TARGET = 1.5


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="bundled model or local HF directory")
    ap.add_argument("--dry-run", action="store_true", help="tiny random-weight gemma3 agents, 1 repeat, no docs")
    ap.add_argument("--repeats", type=int, default=2, help="passes over the 3 demo episodes")
    ap.add_argument("--ratio", type=float, default=8.0)
    ap.add_argument("--latent-steps", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--num-cpus", type=int, default=2, help="CPUs of the local Ray")
    ap.add_argument("--address", default=None, help="an existing Ray cluster instead of a local one")
    ap.add_argument("--out", default=None, help="output stem; default docs/results/ray_fanin")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)

    if args.dry_run:
        spec = AgentSpec.tiny("gemma3")
        args.repeats, args.latent_steps, args.max_new_tokens = 1, 2, 4
        stem = Path(args.out) if args.out else ROOT / "runs" / "ray_fanin_dryrun"
    else:
        spec = AgentSpec.pretrained(args.model)
        stem = Path(args.out) if args.out else ROOT / "docs" / "results" / "ray_fanin"
    protocol = get_protocol("cacheback", ratio=args.ratio, latent_steps=args.latent_steps,
                            max_new_tokens=args.max_new_tokens)
    episodes = [e for _ in range(args.repeats) for e in EPISODES]
    docs = list(DOCUMENTS)

    print(f"loading {spec.name} in process ...", flush=True)
    agent = spec.build()
    local = InProcessTransport()  # zero copy, every node the same agent object: the positions reference
    for name in SENDERS + [RECEIVER]:
        local.add(name, agent)

    from latentwire.transport.ray_transport import RayTransport

    t0 = time.perf_counter()
    remote = RayTransport(address=args.address, num_cpus=args.num_cpus, torch_threads=1)
    for name in SENDERS + [RECEIVER]:
        remote.add(name, spec)
    remote.ready()
    startup = time.perf_counter() - t0
    print(f"Ray: {len(remote.nodes)} actors up in {startup:.1f} s (pids {[remote.pid(n) for n in remote.nodes]})",
          flush=True)

    rows = []
    try:
        warm = EPISODES[0].question
        _inprocess(protocol, agent, docs, warm)
        run_protocol(remote, protocol, SENDERS, docs, RECEIVER, warm)
        for i, ep in enumerate(episodes):
            ref, ref_wall = _inprocess(protocol, agent, docs, ep.question)
            pos = run_protocol(local, protocol, SENDERS, docs, RECEIVER, ep.question).details["positions"]
            out = run_protocol(remote, protocol, SENDERS, docs, RECEIVER, ep.question)
            row = {"episode": i, "question": ep.question, "gold": ep.gold,
                   "inprocess_tteoa": ref.tteoa, "inprocess_wall": ref_wall,
                   "inprocess_sender_s": list(ref.sender_seconds), "inprocess_receiver_s": ref.receiver_seconds,
                   "ray_wall": out.details["wall_s"], "ray_actor_tteoa": out.tteoa,
                   "ray_sender_s": list(out.sender_seconds), "ray_receiver_s": out.receiver_seconds,
                   "wire_bytes": out.details["wire_bytes"], "signed": None not in out.details["signed_by"],
                   "same_answer": out.answer == ref.answer, "same_positions": out.details["positions"] == pos,
                   "correct": ep.gold.lower() in out.answer.lower(), "answer": out.answer}
            rows.append(row)
            print(f"  {i}: in-process TTEOA {row['inprocess_tteoa']:.3f} s, Ray {row['ray_wall']:.3f} s "
                  f"({row['ray_wall'] / row['inprocess_tteoa']:.2f}×), same answer {row['same_answer']}, "
                  f"same positions {row['same_positions']}", flush=True)
    finally:
        remote.close()

    summary = _summary(rows, startup)
    env = environment()
    cmd = "python benchmarks/ray_fanin.py " + " ".join(sys.argv[1:] if argv is None else argv)
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps({"command": cmd, "model": spec.name, "environment": env,
                                                     "summary": summary, "episodes": rows}, indent=1))
    stem.with_suffix(".md").write_text(_markdown(cmd, spec.name, args, summary, rows, env))
    print(stem.with_suffix(".md").read_text())
    return 0 if summary["identical"] else 1


def _inprocess(protocol, agent: Agent, docs, question):
    t0 = time.perf_counter()
    out = protocol.run([agent] * len(docs), docs, agent, question)
    return out, time.perf_counter() - t0


def _summary(rows, startup) -> dict:
    med = lambda k: statistics.median(r[k] for r in rows)  # noqa: E731
    ratio = med("ray_wall") / med("inprocess_tteoa")
    return {"episodes": len(rows), "startup_s": startup,
            "inprocess_tteoa_median": med("inprocess_tteoa"),
            "inprocess_sequential_wall_median": med("inprocess_wall"),
            "ray_wall_median": med("ray_wall"), "ray_actor_tteoa_median": med("ray_actor_tteoa"),
            "ratio": ratio, "ratio_vs_sequential": med("ray_wall") / med("inprocess_wall"),
            "per_episode_ratio_median": statistics.median(r["ray_wall"] / r["inprocess_tteoa"] for r in rows),
            "target": TARGET, "met": ratio <= TARGET,
            "identical": all(r["same_answer"] and r["same_positions"] for r in rows),
            "signed": all(r["signed"] for r in rows), "correct": sum(r["correct"] for r in rows),
            "wire_bytes_median": statistics.median(sum(r["wire_bytes"]) for r in rows)}


def _markdown(cmd, model, args, s, rows, env) -> str:
    lines = [f"# Ray fan-in of 3 senders vs in-process ({model})", "",
             f"Command: `{cmd}`", "",
             f"CacheBack {args.ratio:g}× with {args.latent_steps} latent steps, {args.max_new_tokens} answer tokens, "
             f"3 senders + 1 receiver; {s['episodes']} episodes (the demo's questions × {args.repeats}) after one "
             f"untimed warm-up. Machine: {env['cpus']} CPUs ({env['processor'] or env['machine']}), one torch "
             f"thread per agent; local Ray with num_cpus={args.num_cpus}, {len(SENDERS) + 1} actors (startup "
             f"{s['startup_s']:.1f} s, not counted).", "",
             "| | median (s) |", "|---|---:|",
             "| in-process TTEOA (slowest sender + receiver; senders assumed parallel) | "
             f"{s['inprocess_tteoa_median']:.3f} |",
             f"| in-process, senders one after another (wall) | {s['inprocess_sequential_wall_median']:.3f} |",
             f"| **Ray TTEOA** (driver wall clock: dispatch → answer, senders in parallel actors) | "
             f"**{s['ray_wall_median']:.3f}** |",
             f"| Ray, actor compute only (slowest sender + receiver, as measured in the actors) | "
             f"{s['ray_actor_tteoa_median']:.3f} |", "",
             f"**Ratio Ray / in-process TTEOA: {s['ratio']:.2f}×** (target ≤ {TARGET}×: "
             f"{'met' if s['met'] else 'NOT met'}); per-episode median {s['per_episode_ratio_median']:.2f}×; "
             f"against the sequential in-process wall clock {s['ratio_vs_sequential']:.2f}×.", "",
             f"Identical answers and selected positions on both transports: "
             f"{'yes' if s['identical'] else 'NO'} ({s['episodes']} episodes). Every message signed and verified: "
             f"{'yes' if s['signed'] else 'no'}. Wire bytes per episode (3 messages, median): "
             f"{s['wire_bytes_median']:,.0f}. Correct answers: {s['correct']}/{s['episodes']}.", "",
             "| # | question | in-process TTEOA | Ray wall | ratio | same | answer |",
             "|---:|---|---:|---:|---:|---|---|"]
    for r in rows:
        ans = r["answer"].replace("|", "\\|").replace("\n", " ")[:40]
        same = "✓" if r["same_answer"] and r["same_positions"] else "✗"
        lines.append(f"| {r['episode']} | {r['question'][:40]} | {r['inprocess_tteoa']:.3f} | {r['ray_wall']:.3f} | "
                     f"{r['ray_wall'] / r['inprocess_tteoa']:.2f} | {same} | {ans} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())

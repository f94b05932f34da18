"""fp32 vs bf16, per bundled model: raw prefill / decode speed, then fan-in end to end on the same episodes.

    python benchmarks/dtype_speed.py [--models qwen2.5-coder-0.5b,smollm2-135m,gemma3-270m] [--n 48]
                                     [--filter length_bucket=500] [--device cpu]

Part 1: prefill tok/s on a 512-token prompt and greedy decode tok/s (32 forced steps after it), medians
of `--reps`. Part 2: alone / text / full KV (G = 8) / CacheBack 8× (G = 8) through the bench runner on
`--n` fan-in `facts` episodes (3 senders), once per dtype (records under runs/dtype_speed/, re-running
resumes; the run folders are copied to docs/results/dtype_speed/). Per protocol: accuracy with its 95%
bootstrap CI in each dtype, the paired accuracy difference, median TTEOA in each dtype and the ratio
bf16 ÷ fp32 of the medians with a paired bootstrap CI (episodes resampled). Goal: bf16 TTEOA ≤ 0.5×
fp32 for every latent protocol on Qwen, bf16 accuracy inside fp32's CI. Run it alone: on 2 cores a
second job skews every figure. Writes docs/results/dtype_speed.{md,json}.
"""
from __future__ import annotations

import argparse
import gc
import json
import random
import shutil
import statistics
import time
from pathlib import Path

import torch

from latentwire.agent import Agent
from latentwire.bench.metrics import bootstrap_ci
from latentwire.bench.report import read_run
from latentwire.bench.folder import environment
from latentwire.bench.runner import RunConfig, parse_filters, run
from latentwire.demo import DOCUMENTS

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "results"
DTYPES = ("float32", "bfloat16")
PROTOCOLS = ("alone", "text", "fullkv(latent_steps=8)", "cacheback(ratio=8, latent_steps=8)")
LATENT = PROTOCOLS[2:]


@torch.inference_mode()
def raw_speed(agent: Agent, reps: int, prompt_tokens: int = 512, decode_tokens: int = 32) -> dict:
    """Prefill tok/s (`Agent.prefill`: the model's forward, no logits) and greedy decode tok/s (one token per
    step with its logits, after the same prompt); medians over `reps` after one warm-up."""
    ids = agent.tokenizer(" ".join(DOCUMENTS * 20), add_special_tokens=False)["input_ids"][:prompt_tokens]
    text = agent.tokenizer.decode(ids)
    prefill, decode = [], []
    for _ in range(reps + 1):  # the first is a warm-up
        t0 = time.perf_counter()
        state = agent.prefill(text)
        t1 = time.perf_counter()
        stream = agent.stream(text, max_new_tokens=decode_tokens)
        t2 = time.perf_counter()
        for _ in range(decode_tokens):
            stream.push(int(stream.logprobs.argmax()))
        prefill.append(t1 - t0)
        decode.append(time.perf_counter() - t2)
    return {"prompt_tokens": len(state), "prefill_tok_s": len(state) / statistics.median(prefill[1:]),
            "decode_tok_s": decode_tokens / statistics.median(decode[1:])}


def paired_ratio_ci(a: dict[str, float], b: dict[str, float], n_resamples: int = 2000, seed: int = 0):
    """median(b) / median(a) over the episodes both ran, with a paired percentile bootstrap CI."""
    keys = sorted(set(a) & set(b))
    if not keys:
        return None
    ratio = lambda ks: statistics.median(b[k] for k in ks) / statistics.median(a[k] for k in ks)  # noqa: E731
    rng = random.Random(seed)
    boots = sorted(ratio(rng.choices(keys, k=len(keys))) for _ in range(n_resamples))
    return ratio(keys), boots[int(0.025 * n_resamples)], boots[int(0.975 * n_resamples) - 1]


def compare(runs: dict[str, Path]) -> list[dict]:
    recs = {dt: read_run(path)[1] for dt, path in runs.items()}
    rows = []
    for p in PROTOCOLS:
        by = {dt: {r["episode"]: r for r in recs[dt] if r["protocol"] == p} for dt in DTYPES}
        acc = {dt: bootstrap_ci([r["accuracy"] for r in by[dt].values()]) for dt in DTYPES}
        common = sorted(set(by["float32"]) & set(by["bfloat16"]))
        diff = bootstrap_ci([by["bfloat16"][e]["accuracy"] - by["float32"][e]["accuracy"] for e in common])
        tteoa = {dt: {e: r["tteoa"] for e, r in by[dt].items() if r["tteoa"] is not None} for dt in DTYPES}
        med = {dt: statistics.median(tteoa[dt].values()) if tteoa[dt] else None for dt in DTYPES}
        rows.append({"protocol": p, "n": len(common), "accuracy": acc, "accuracy_diff": diff, "tteoa_median": med,
                     "tteoa_ratio": paired_ratio_ci(tteoa["float32"], tteoa["bfloat16"]),
                     "errors": {dt: sum(r["error"] is not None for r in by[dt].values()) for dt in DTYPES}})
    return rows


def ci(v, fmt="{:.2f}") -> str:
    return "—" if v is None else f"{fmt.format(v[0])} [{fmt.format(v[1])}, {fmt.format(v[2])}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="qwen2.5-coder-0.5b,smollm2-135m,gemma3-270m")
    ap.add_argument("--task", default="facts")
    ap.add_argument("--n", type=int, default=48)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--filter", action="append", default=None, metavar="KEY=VALUE")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    filters = args.filter if args.filter is not None else ["length_bucket=500"]
    results = {}
    out_json = OUT / "dtype_speed.json"
    if out_json.exists():  # models measured by an earlier invocation stay in the page
        results = json.loads(out_json.read_text()).get("models", {})
    for model in args.models.split(","):
        speed, runs = {}, {}
        for dt in DTYPES:
            agent = Agent.from_pretrained(model, device=args.device, dtype=dt)
            speed[dt] = raw_speed(agent, args.reps)
            print(model, dt, json.dumps(speed[dt]), flush=True)
            runs[dt] = ROOT / "runs" / "dtype_speed" / f"{model}_{dt}"
            run(RunConfig(args.task, ",".join(PROTOCOLS), model, args.n, args.seed, parse_filters(filters),
                          device=args.device, dtype=dt), runs[dt], agent=agent)
            dest = OUT / "dtype_speed" / f"{model}_{dt}"
            dest.mkdir(parents=True, exist_ok=True)
            for f in ("config.json", "records.jsonl"):
                shutil.copy(runs[dt] / f, dest / f)
            del agent
            gc.collect()
        results[model] = {"speed": speed, "protocols": compare(runs)}
        write(results, args, filters)


def write(results: dict, args, filters: list[str]) -> None:
    models = ",".join(results)  # every model on the page (earlier invocations' included)
    cmd = (f"python benchmarks/dtype_speed.py --models {models} --task {args.task} --n {args.n} --seed {args.seed}"
           + "".join(f" --filter {f}" for f in filters) + f" --device {args.device} --reps {args.reps}")
    env = environment()
    lines = ["# fp32 vs bf16: speed and fan-in accuracy per bundled model", "", f"Command: `{cmd}`", "",
             f"latentwire @ {str(env['git'])[:10]}, torch {env['torch']}, {env['cpus']} CPUs "
             f"({', '.join(env['cpu_bf16']) or 'no native bf16'}), {env['torch_threads']} threads, device "
             f"{args.device}. Fan-in: 3 senders, task {args.task} ({', '.join(filters)}); records in "
             "[dtype_speed/](dtype_speed/). Intervals: 95% bootstrap (accuracy: over episodes; TTEOA ratio: "
             "paired, episodes resampled).", "",
             "## Raw speed", "", "| model | prompt tokens | prefill tok/s fp32 | bf16 | × | decode tok/s fp32 | bf16 | × |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for model, res in results.items():
        s = res["speed"]
        lines.append(f"| {model} | {s['float32']['prompt_tokens']} | {s['float32']['prefill_tok_s']:,.0f} | "
                     f"{s['bfloat16']['prefill_tok_s']:,.0f} | "
                     f"{s['bfloat16']['prefill_tok_s'] / s['float32']['prefill_tok_s']:.2f} | "
                     f"{s['float32']['decode_tok_s']:.1f} | {s['bfloat16']['decode_tok_s']:.1f} | "
                     f"{s['bfloat16']['decode_tok_s'] / s['float32']['decode_tok_s']:.2f} |")
    lines += ["", "## Fan-in end to end", "",
              "| model | protocol | n | accuracy fp32 | accuracy bf16 | bf16 − fp32 | median TTEOA s fp32 | bf16 | "
              "bf16 ÷ fp32 | goal |", "|---|---|---:|---|---|---|---:|---:|---|---|"]
    for model, res in results.items():
        for r in res["protocols"]:
            ratio, acc = r["tteoa_ratio"], r["accuracy"]
            inside = acc["float32"][1] <= acc["bfloat16"][0] <= acc["float32"][2]
            goal = ""
            if r["protocol"] in LATENT and model.startswith("qwen"):
                goal = ("✓" if ratio and ratio[0] <= 0.5 else "✗ TTEOA") + ("" if inside else " ✗ accuracy")
            med = r["tteoa_median"]
            lines.append(f"| {model} | `{r['protocol']}` | {r['n']} | {ci(acc['float32'])} | {ci(acc['bfloat16'])} | "
                         f"{ci(r['accuracy_diff'], '{:+.2f}')} | {med['float32'] or float('nan'):.2f} | "
                         f"{med['bfloat16'] or float('nan'):.2f} | {ci(ratio)} | {goal} |")
    text = "\n".join(lines) + "\n"
    print(text)
    (OUT / "dtype_speed.md").write_text(text)
    (OUT / "dtype_speed.json").write_text(json.dumps({"command": cmd, "models": results, "environment": env},
                                                     indent=2) + "\n")


if __name__ == "__main__":
    main()

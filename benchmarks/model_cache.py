"""GGUF dequantisation load vs cached-safetensors load, for each bundled model.

    python benchmarks/model_cache.py [--models smollm2-135m,gemma3-270m,qwen2.5-coder-0.5b] [--repeats 2]

Prints a table and writes docs/results/model_cache.{md,json}.
"""
from __future__ import annotations

import argparse
import gc
import json
import platform
import time
from pathlib import Path

import torch
from transformers.utils import logging as hf_logging

from latentwire.models import ZOO, build_cache, load, load_gguf

OUT = Path(__file__).resolve().parents[1] / "docs" / "results"


def _time(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
        del out
        gc.collect()
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(ZOO))
    ap.add_argument("--repeats", type=int, default=2, help="best of N loads")
    args = ap.parse_args()
    hf_logging.disable_progress_bar()
    rows = []
    for name in args.models.split(","):
        if not ZOO[name].cached:
            build_cache(name)
        gguf_s = _time(lambda: load_gguf(name), args.repeats)
        cached_s = _time(lambda: load(name), args.repeats)
        rows.append({"model": name, "gguf_load_s": round(gguf_s, 2), "cached_load_s": round(cached_s, 2),
                     "speedup": round(gguf_s / cached_s, 1)})
        print(f"{name:14} gguf {gguf_s:6.2f} s   cached {cached_s:5.2f} s   ×{gguf_s / cached_s:5.1f}", flush=True)
    cmd = "python benchmarks/model_cache.py " + f"--models {args.models} --repeats {args.repeats}"
    meta = {"command": cmd, "torch": torch.__version__, "machine": platform.machine(),
            "threads": torch.get_num_threads(), "repeats": args.repeats}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "model_cache.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    lines = ["# Model cache: GGUF load vs cached load", "", f"Command: `{cmd}`  ",
             f"torch {torch.__version__}, {torch.get_num_threads()} threads, best of {args.repeats}.", "",
             "| model | GGUF load (dequantise) s | cached load s | speed-up |", "|---|---:|---:|---:|"]
    lines += [f"| {r['model']} | {r['gguf_load_s']} | {r['cached_load_s']} | {r['speedup']}× |" for r in rows]
    (OUT / "model_cache.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT / 'model_cache.md'}")


if __name__ == "__main__":
    main()

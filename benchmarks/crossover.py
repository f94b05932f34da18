"""Where the time goes, and the crossover: per-token costs of every TTEOA part, fitted, and the report
length beyond which CacheBack answers sooner than text.

    python benchmarks/crossover.py [--model qwen2.5-coder-0.5b] [--dtype bfloat16] [--ratio 8] [--latent-steps 8]
                                   [--senders 3] [--answer-tokens 12]

Measured on the model (median of `--repeats` runs each, machine otherwise idle):
    prefill(n)      a fresh prefill of n tokens                          fit a + b·n
    step(ctx)       one decode step (or latent step) at context ctx       fit d + e·ctx
    score(T)        CacheBack scoring of a T-row state for one question   fit f + g·T
    rows(R)         the receiver's prefill of R re-prefilled rows + prompt (a check: modelled as prefill(R + q))
Modelled (S senders in parallel, each with a T-token document; text reports of L tokens each; the
receiver answers A tokens):
    text      = prefill(T) + L·step(T)                  + prefill(S·L + q) + A·step(S·L + q)
    cacheback = prefill(T) + G·step(T) + score(T)       + prefill(S·(T/r + G) + q) + A·step(S·(T/r + G) + q)
The crossover L* is the report length where the two TTEOAs meet. Report lengths the models actually
produce are read from the text records of the runs under docs/results (per sender, `report_tokens`).
Agents that read their documents before the question arrives are not modelled: the page quotes the
question-time TTEOA that `stored_states.py` measured (docs/results/stored_states/).
Writes docs/results/crossover_<model>_<dtype>.{md,json,png}; `--page-only` rewrites the page from that json
(with the stored-states figures as they are now) without measuring.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from latentwire.agent import KV_PROMPT, Agent
from latentwire.bench.episode import jsonl_lines
from latentwire.bench.folder import environment
from latentwire.bench.tasks import facts
from latentwire.protocols.base import SENDER_PROMPT
from latentwire.protocols.cacheback import CacheBack

sys.path.insert(0, str(Path(__file__).resolve().parent))  # stored_states.py: the measured question-time figures

OUT = Path(__file__).resolve().parents[1] / "docs" / "results"
LENGTHS = (250, 500, 1000, 2000, 4000)
QUESTION = "Which team maintains the Larkspur project?"


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(agent: Agent, repeats: int, latent_steps: int) -> dict:
    """Raw timings at each document length (the documents are generated `facts` contexts)."""
    docs = {n: facts.episodes(7, 1, tokens=n, senders=1, hops=1)[0].contexts[0] for n in LENGTHS}
    cb = CacheBack(latent_steps=latent_steps)
    raw = {"prefill": [], "step": [], "score": [], "rows": [], "think": []}
    agent.prefill("warm up")  # first-call costs (kernels, allocator) stay out of the fits
    for n, doc in docs.items():
        prompt = SENDER_PROMPT.format(document=doc)
        state = agent.prefill(prompt)
        T = len(state)
        raw["prefill"].append((T, median_time(lambda: agent.prefill(prompt), repeats)))
        stream = agent.stream(prompt, max_new_tokens=8)
        raw["step"].append((T, median_time(lambda: stream.push(int(stream.logprobs.argmax())), repeats * 4)))
        raw["think"].append((T, median_time(lambda: agent.think(state, latent_steps), repeats)))
        raw["score"].append((T, median_time(lambda: cb.scores(agent, state, QUESTION), repeats)))
        rows = agent.rows(state.select(torch.arange(0, T, 8, device=state.device)))  # an 8× message
        ans = [agent.answer(QUESTION, message=rows, max_new_tokens=1) for _ in range(repeats)]
        raw["rows"].append((len(rows), statistics.median(a.prefill_seconds for a in ans)))
    return raw


def fit(points: list[tuple[int, float]], degree: int) -> list[float]:
    x, y = np.array([p[0] for p in points], float), np.array([p[1] for p in points], float)
    return [float(c) for c in np.polyfit(x, y, degree)[::-1]]  # c0 + c1·x (+ c2·x²)


def poly(c: list[float], x: float) -> float:
    return sum(ci * x ** i for i, ci in enumerate(c))


def model(f: dict, T: float, L: float, args, q: int) -> dict:
    S, A, G, r = args.senders, args.answer_tokens, args.latent_steps, args.ratio
    recv_text = poly(f["prefill"], S * L + q) + A * poly(f["step"], S * L + q)
    rows = S * (math.ceil(T / r) + G) + q
    recv_cb = poly(f["prefill"], rows) + A * poly(f["step"], rows)  # re-prefilled rows cost what tokens do
    return {"text": poly(f["prefill"], T) + L * poly(f["step"], T) + recv_text,
            "cacheback": poly(f["prefill"], T) + G * poly(f["step"], T) + poly(f["score"], T) + recv_cb}


def crossover(f: dict, T: float, args, q: int) -> float | None:
    """Smallest report length L (tokens per sender) at which text's TTEOA exceeds CacheBack's."""
    for L in range(0, 4001):
        m = model(f, T, L, args, q)
        if m["text"] > m["cacheback"]:
            return float(L)
    return None


def held_lines() -> list[str]:
    """The measured question-time TTEOA of agents that hold their documents (stored_states.py's records as they
    are now): median per protocol and document length, and the ratio to held text reports."""
    import stored_states as ss

    cells = [c for c in ss.CELLS if c.startswith("facts") and (ss.OUT / c / "records.jsonl").exists()]
    if not cells:
        return []
    times = {c: ss.question_times(ss.OUT / c) for c in cells}
    cpu = json.loads((ss.OUT / cells[0] / "config.json").read_text())["environment"].get("cpu_model")
    lines = ["", "## Agents that hold their documents: measured", "",
             "Agents that read before the question arrives pay only the question-time TTEOA. It is measured, not "
             "modelled: median question-time TTEOA in seconds over every question of the stored-states study "
             f"(first questions and follow-ups; {cpu}, so compare its ratios with this page, not its seconds), "
             "and its ratio to text reports from held documents ([stored states](stored_states/README.md), "
             "which has the CIs, accuracy and the plot).", "",
             "| protocol | " + " | ".join(f"{int(c.split('_')[1]):,} tokens" for c in cells) + " |",
             "|---|" + "---:|" * len(cells)]
    for label in [ss.TEXTH, ss.CB8, ss.CB8KVR, ss.CBM, ss.CBKVRM, ss.CBKVM, ss.FULLKV]:
        row = []
        for c in cells:
            v, ref = times[c].get(label), times[c].get(ss.TEXTH)
            held = v and ref and label != ss.TEXTH
            ratio = f" (×{statistics.median(v) / statistics.median(ref):.2f})" if held else ""
            row.append(f"{statistics.median(v):.2f}{ratio} (n = {len(v)})" if v else "—")
        lines.append(f"| `{label}` | " + " | ".join(row) + " |")
    return lines


def report_lengths(model_name: str) -> list[int]:
    """Per-sender report lengths (tokens) in every text record of this model under docs/results."""
    out = []
    for rec in OUT.glob("**/records.jsonl"):
        cfg = rec.parent / "config.json"
        if not cfg.exists() or json.loads(cfg.read_text())["config"].get("model") != model_name:
            continue
        for line in jsonl_lines(rec.read_text(encoding="utf-8")):
            r = json.loads(line)
            if r["protocol"].startswith("text") and r.get("details", {}).get("report_tokens"):
                out += r["details"]["report_tokens"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--ratio", type=float, default=8)
    ap.add_argument("--latent-steps", type=int, default=8)
    ap.add_argument("--senders", type=int, default=3)
    ap.add_argument("--answer-tokens", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--page-only", action="store_true", help="rewrite the page from its json, measuring nothing")
    args = ap.parse_args()
    if args.page_only:  # the measuring command's options, from the json it wrote
        found = sorted(OUT.glob(f"crossover_{args.model}_{args.dtype or '*'}.json"))
        if len(found) != 1:
            sys.exit(f"--page-only needs one measured json for {args.model}, found {[p.name for p in found]}: "
                     "pass --dtype, or measure first")
        data, dtype = json.loads(found[0].read_text()), found[0].stem.rsplit("_", 1)[1]
        args = ap.parse_args(data["command"].split()[2:])
    else:
        agent = Agent.from_pretrained(args.model, dtype=args.dtype)
        dtype = str(agent.dtype).removeprefix("torch.")
        raw = measure(agent, args.repeats, args.latent_steps)
        q = len(agent.tokenizer(agent.continuation_text(KV_PROMPT.format(question=QUESTION)))["input_ids"])
        f = {"prefill": fit(raw["prefill"], 1), "step": fit(raw["step"], 1), "score": fit(raw["score"], 1)}
        lengths = report_lengths(args.model)
        data = {"command": " ".join(["python benchmarks/crossover.py"] + sys.argv[1:]), "raw": raw, "fits": f,
                "question_tokens": q, "report_lengths": lengths, "environment": environment()}
    write_page(data, args, dtype, " ".join(["python benchmarks/crossover.py"] + sys.argv[1:]))


def page_stem(model: str, dtype: str) -> Path:
    return OUT / f"crossover_{model}_{dtype}"


def write_page(data: dict, args, dtype: str, written_by: str) -> None:
    """The page, its json and its plot from the measured costs in `data` (the fits model the cold TTEOA);
    `written_by`: the command writing the page (the measuring one, or a `--page-only` rewrite)."""
    raw, f, q, lengths, cmd = data["raw"], data["fits"], data["question_tokens"], data["report_lengths"], data["command"]
    L_med = statistics.median(lengths) if lengths else None
    lines = [f"# Where the time goes: {args.model} ({dtype}), {args.senders} senders, CacheBack {args.ratio:g}×, "
             f"G = {args.latent_steps}", "", f"Command: `{cmd}`"
             + (f" (page rewritten by `{written_by}`)" if written_by != cmd else ""), "",
             "Measured costs (median of repeats) and their fits:", "",
             "| document rows T | prefill s | decode step s | 8 latent steps s | CacheBack scoring s | "
             "receiver prefill of T/8 rows s (prefill fit) |", "|---:|---:|---:|---:|---:|---:|"]
    for i in range(len(LENGTHS)):
        R = raw["rows"][i][0]
        lines.append(f"| {raw['prefill'][i][0]} | {raw['prefill'][i][1]:.3f} | {raw['step'][i][1]:.4f} | "
                     f"{raw['think'][i][1]:.3f} | {raw['score'][i][1]:.3f} | {raw['rows'][i][1]:.3f} "
                     f"({poly(f['prefill'], R + q):.3f}) |")
    lines += ["", f"Fits: prefill(n) = {f['prefill'][0]:.3f} s + {1e3 * f['prefill'][1]:.3f} ms·n; "
              f"step(ctx) = {1e3 * f['step'][0]:.2f} ms + "
              f"{1e6 * f['step'][1]:.3f} µs·ctx; score(T) = {1e3 * f['score'][0]:.1f} ms + {1e3 * f['score'][1]:.4f} ms·T.",
              "", f"Report lengths the models wrote in this repository's text runs ({args.model}): "
              + (f"median {L_med:.0f} tokens per sender (n = {len(lengths)}, 90th percentile "
                 f"{sorted(lengths)[int(0.9 * (len(lengths) - 1))]})." if lengths else "none recorded."), "",
              "| T | cold TTEOA text at the median report s | cold TTEOA CacheBack s | crossover L* (tokens per report) |",
              "|---:|---:|---:|---:|"]
    table = {}
    for T in (500, 2000, 4000):
        m = model(f, T, L_med or 0, args, q)
        c = crossover(f, T, args, q)
        table[T] = {"model_at_median_report": m, "crossover": c}
        lines.append(f"| {T} | {m['text']:.2f} | {m['cacheback']:.2f} | {c if c is not None else '> 4000'} |")
    lines += ["", "Below L*, text answers sooner; above it, CacheBack does. The plot shows TTEOA against the "
              "report length for each document length, with the measured report lengths marked.", "",
              f"![crossover](crossover_{args.model}_{dtype}.png)"] + held_lines()
    stem = page_stem(args.model, dtype)
    stem.with_name(stem.name + ".md").write_text("\n".join(lines) + "\n")
    stem.with_name(stem.name + ".json").write_text(json.dumps(data | {"table": table}, indent=2) + "\n")
    plot(f, args, q, lengths, stem.with_name(stem.name + ".png"), f"{args.model} ({dtype})")
    print("\n".join(lines))


def plot(f: dict, args, q: int, lengths: list[int], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    Ls = list(range(0, 401, 4))
    for T, color in zip((500, 2000, 4000), ("C0", "C1", "C2")):
        ax.plot(Ls, [model(f, T, L, args, q)["text"] for L in Ls], color=color, label=f"text, T = {T}")
        ax.axhline(model(f, T, 0, args, q)["cacheback"], color=color, ls="--", label=f"CacheBack {args.ratio:g}×, T = {T}")
    if lengths:
        ax.axvspan(min(lengths), sorted(lengths)[int(0.9 * (len(lengths) - 1))], color="grey", alpha=0.15,
                   label="reports written (min–p90)")
        ax.axvline(statistics.median(lengths), color="grey", lw=1)
    ax.set(xlabel="report length per sender (tokens)", ylabel="modelled TTEOA (s)", title=f"{title}: text vs CacheBack")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()

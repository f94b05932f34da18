"""Ablations of the CacheBack score: evidence recall of each variant against today's CacheBack, paired.

    python benchmarks/ablations.py [--model qwen2.5-0.5b] [--task facts] [--n 48] [--latent-steps 8]
                                   [--ratios 8,16] [--variant p=1 --variant inner_power=3,p=1 ...]
                                   [--generate-seed 7]   # fresh development episodes, e.g. --task coref

The score (docs/methods.md, "CacheBack scores") is S_t = Q_t · C_t^p with C_t a ratio of
`inner_power`-th powers, summed over KV heads after averaging layers. Each variant changes the
`cacheback` selector's fields (`p`, `inner_power`, `correction_over`, `pooling`, `window`, `min_depth`,
`max_depth`)
or CacheBack's scoring fields (`calibration`, `probe`, `query_format`) and nothing else: the same read of
each document (prefill + G latent steps, shared by every variant), the same question (the receiver's turn), span mode (`--span-mode`, default sentence) and budget
B = ceil(T / r). Recall = gold evidence tokens kept ÷ gold evidence tokens, pooled per episode, as
`benchmarks/evidence_recall.py` measures it (its functions are reused). Printed: one line per
variant with its mean recall and its paired difference from the default at each ratio (points, 95%
paired bootstrap CI, episodes resampled together), and the median seconds to score one state.
Writes <out>/ablations_cacheback_<task>[_<filters>]_<model>.{md,json} (per-episode recalls included).
A model named `tiny-<arch>` is the tiny random-weight model (for tests).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from latentwire.agent import Agent
from latentwire.bench.episode import Episode
from latentwire.errors import ConfigError
from latentwire.bench.metrics import paired_bootstrap_diff
from latentwire.bench.folder import environment
from latentwire.bench.runner import load_task_episodes, parse_filters, select_episodes
from latentwire.protocols.cacheback import CacheBack, document_rows
from latentwire.select.cacheback import CacheBackSelector

from evidence_recall import gold_positions, kept_gold
from recall_summary import diff

OUT = Path(__file__).resolve().parents[1] / "docs" / "results"
BASELINE = "cacheback"  # the selector's defaults: p = 2, inner_power = 2, correction_over = "kv_head"
VARIANTS = ("p=0", "p=1", "p=4", "inner_power=1.5", "inner_power=3", "inner_power=4", "inner_power=3,p=1",
            "correction_over=layer_kv_head")


# CacheBack's own scoring fields a variant may set beside the selector's (everything else, e.g. the read, is shared)
PROTOCOL_FIELDS = ("calibration", "calibration_floor", "probe", "query_format")


def variant_params(spec: str) -> dict:
    """"p=1,inner_power=3" -> {"p": 1, "inner_power": 3} (values as JSON, else strings)."""
    return parse_filters([x for x in spec.split(",") if x], "variant")


def variant_reader(params: dict, latent_steps: int, span_mode: str) -> CacheBack:
    """The CacheBack of one variant: `PROTOCOL_FIELDS` go to the protocol, the rest to the `cacheback` selector
    (an unknown field is a ConfigError naming both lists)."""
    selector_fields = set(CacheBackSelector.__dataclass_fields__)
    if unknown := sorted(set(params) - selector_fields - set(PROTOCOL_FIELDS)):
        raise ConfigError(f"unknown variant fields {unknown}; selector fields: {', '.join(sorted(selector_fields))}; "
                         f"CacheBack fields: {', '.join(PROTOCOL_FIELDS)}")
    own = {k: v for k, v in params.items() if k in PROTOCOL_FIELDS}
    return CacheBack(latent_steps=latent_steps, selector="cacheback", span_mode=span_mode, **own,
                     selector_params={k: v for k, v in params.items() if k not in PROTOCOL_FIELDS})


def load_agent(name: str) -> Agent:
    """A bundled / local / hub model, or `tiny-<arch>`: a tiny random-weight model (no files)."""
    if name.startswith("tiny-"):
        from latentwire.models import tiny_model, tiny_tokenizer

        return Agent(tiny_model(name.removeprefix("tiny-")), tiny_tokenizer(), model_name=name)
    return Agent.from_pretrained(name)


def recalls(agent: Agent, episodes: list[Episode], variants: dict[str, dict], ratios, latent_steps: int,
            span_mode: str = "sentence") -> tuple[dict, dict]:
    """Per-episode evidence recall of each variant at each ratio, and its seconds to score one state.

    variants: label -> `cacheback` selector fields and `PROTOCOL_FIELDS` ({} is the default). Returns ({label:
    {ratio: [recall per episode]}}, {label: [seconds]}); episodes without gold evidence are skipped.
    """
    readers = {label: variant_reader(params, latent_steps, span_mode) for label, params in variants.items()}
    reader = CacheBack(latent_steps=latent_steps, span_mode=span_mode)  # one read per document, every variant
    tok = agent.tokenizer
    out = {label: {r: [] for r in ratios} for label in variants}
    seconds: dict[str, list[float]] = {label: [] for label in variants}
    for ep in episodes:
        gold_total, kept = 0, {(label, r): 0 for label in variants for r in ratios}
        for a in sorted({s.agent for s in ep.evidence}):
            doc, gold = ep.contexts[a], gold_positions(ep, a, tok)
            gold_total += len(gold)
            state = reader.read(agent, doc)
            per_row, eligible = document_rows(agent, doc, len(state))
            groups = reader.span_groups(per_row, doc)
            for label, r_ in readers.items():
                t0 = time.perf_counter()
                scores = r_.scores(agent, state, ep.question)
                seconds[label].append(time.perf_counter() - t0)
                for r in ratios:
                    kept[(label, r)] += kept_gold(scores, state, r, eligible, per_row, doc, tok, gold, groups)
        if gold_total:
            for (label, r), k in kept.items():
                out[label][r].append(k / gold_total)
    return out, seconds


def summary(per: dict, ratios, baseline: str = BASELINE) -> list[str]:
    """One line per variant: mean recall and the paired difference from `baseline` at each ratio."""
    lines = []
    for label, by_ratio in per.items():
        cells = []
        for r in ratios:
            x = by_ratio[r]
            mean = sum(x) / len(x) if x else float("nan")
            cells.append(f"{r}× {mean:.3f}" + ("" if label == baseline or not x else
                                                 f" ({diff(x, per[baseline][r])} pp)"))
        lines.append(f"{label}: " + "; ".join(cells))
    return lines


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-0.5b")
    ap.add_argument("--task", default="facts")
    ap.add_argument("--n", type=int, default=48)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--generate-seed", type=int, default=None,
                    help="fresh episodes generate(SEED) of the task, or of a rival/latent_vs_text cell (facts1_500, "
                         "code1), instead of the committed file: development episodes no study uses")
    ap.add_argument("--latent-steps", type=int, default=8)
    ap.add_argument("--ratios", default="8,16")
    ap.add_argument("--span-mode", default="sentence", choices=("sentence", "fixed"))
    ap.add_argument("--variant", action="append", default=None, metavar="FIELD=VALUE[,FIELD=VALUE]",
                    help="cacheback selector fields (and CacheBack's " + ", ".join(PROTOCOL_FIELDS) + ") of one "
                         "variant, repeatable; default: " + " ".join(VARIANTS))
    ap.add_argument("--filter", action="append", default=[], metavar="KEY=VALUE",
                    help="keep episodes whose meta[KEY] == VALUE, repeatable")
    ap.add_argument("--out", default=str(OUT), help="folder of the result files")
    args = ap.parse_args(argv)
    ratios = [int(r) if float(r).is_integer() else float(r) for r in args.ratios.split(",")]
    specs = args.variant or list(VARIANTS)
    variants = {BASELINE: {}} | {spec: variant_params(spec) for spec in specs}
    filters = parse_filters(args.filter)
    for params in variants.values():  # a bad field or value fails here, before the model loads
        variant_reader(params, args.latent_steps, args.span_mode)
    agent = load_agent(args.model)
    if args.generate_seed is None:
        episodes = select_episodes(load_task_episodes(args.task), args.n, args.seed, filters)
    else:
        from rival import episodes_for

        episodes = select_episodes(episodes_for(args.task, args.n, args.generate_seed), args.n, args.seed, filters)
    per, seconds = recalls(agent, episodes, variants, ratios, args.latent_steps, args.span_mode)
    n = len(per[BASELINE][ratios[0]])
    tag = "".join(f"_{k}{v}" for k, v in filters.items())
    task_name = Path(args.task).stem if args.task.endswith(".jsonl") or "/" in args.task else args.task
    gen = "" if args.generate_seed is None else f" --generate-seed {args.generate_seed}"
    tag += f"_dev{args.generate_seed}" if gen else ""
    cmd = (f"python benchmarks/ablations.py --model {args.model} --task {args.task} --n {args.n} "
           f"--seed {args.seed}{gen} "
           f"--latent-steps {args.latent_steps} --ratios {args.ratios} --span-mode {args.span_mode}"
           + "".join(f" --variant {s}" for s in specs) + "".join(f" --filter {f}" for f in args.filter))
    lines = summary(per, ratios)
    for line in lines:
        print(line)
    md = [f"# CacheBack score ablations ({task_name}{tag}, {args.model}, {n} episodes, G = {args.latent_steps}, "
          f"{args.span_mode} spans)", "", f"Command: `{cmd}`", "",
          f"Evidence recall; each variant's paired difference from `{BASELINE}` (p = 2, inner_power = 2, C_t over "
          "KV heads) in points, 95% paired bootstrap CI (episodes resampled together). Score s: median seconds "
          "to score one state for one question.", "",
          "| variant | " + " | ".join(f"{r}× | − {BASELINE}" for r in ratios) + " | score s |",
          "|---|" + "---:|---|" * len(ratios) + "---:|"]
    for label, by_ratio in per.items():
        cells = []
        for r in ratios:
            x = by_ratio[r]
            cells += [f"{sum(x) / len(x):.3f}" if x else "–",
                      "—" if label == BASELINE or not x else diff(x, per[BASELINE][r])]
        secs = f"{statistics.median(seconds[label]):.3f}" if seconds[label] else "–"
        md.append(f"| {label} | " + " | ".join(cells) + f" | {secs} |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"ablations_cacheback_{task_name}{tag}_{args.model}"
    stem.with_name(stem.name + ".md").write_text("\n".join(md) + "\n")
    result = {"command": cmd, "variants": variants, "ratios": ratios,
              "recall": {label: {str(r): (sum(x) / len(x) if x else None) for r, x in t.items()}
                         for label, t in per.items()},
              "diff_vs_baseline": {label: {str(r): list(paired_bootstrap_diff(t[r], per[BASELINE][r]))
                                           for r in ratios if t[r]}
                                   for label, t in per.items() if label != BASELINE},
              "per_episode": {f"{label}@{r}": x for label, t in per.items() for r, x in t.items()},
              "score_seconds_median": {label: statistics.median(s) for label, s in seconds.items() if s},
              "episodes": [ep.id for ep in episodes], "environment": environment()}
    stem.with_name(stem.name + ".json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {stem}.md")
    return result


if __name__ == "__main__":
    main()

"""Evidence-recall diagnostic: every selector × compression ratio on the same finished sender states.

    python benchmarks/evidence_recall.py [--model smollm2-135m] [--task facts] [--n 20] [--latent-steps 8]
                                         [--filter length_bucket=1000]

Each sender that holds gold evidence reads its document once (prefill + G latent steps); every
selector scores that one state; each ratio r keeps B = ceil(T/r) rows in spans of 16. Recall = gold
evidence tokens kept ÷ gold evidence tokens, pooled per episode; tables give the mean over episodes
and its 95% bootstrap CI. `cacheback[unrelated q]` is the query ablation: CacheBack scored with
another episode's question; `cacheback+generic` / `cacheback+masked` are the background-calibrated
variants (a `calibrated(...)` score stage). Also reports the share of the sender's time spent scoring +
selecting. Writes docs/results/evidence_recall_<task>[_<filters>]_<model>.{md,json,png} (a task given
as a file path is named by its file stem).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from latentwire.agent import Agent
from latentwire.bench.episode import span_token_positions
from latentwire.bench.metrics import bootstrap_ci
from latentwire.errors import PressUnsupportedError
from latentwire.bench.folder import environment
from latentwire.bench.runner import load_task_episodes, parse_filters, select_episodes
from latentwire.protocols.cacheback import CacheBack, document_rows, kept_document_spans
from latentwire.select import always_kept, fanin_budget, get_selector, select_rows, sentence_groups

OUT = Path(__file__).resolve().parents[1] / "docs" / "results"
RATIOS = (2, 4, 8, 16, 32, 64, 128)
QA = "snapkv[question in sender]"  # SnapKV's window = the question (the rows after the document)
QA64 = "snapkv[question in sender, window 64]"  # kvpress's default window: also the document's last rows
SELECTORS = ("cacheback", "cacheback+generic", "cacheback+masked", "mean_query", "snapkv", "h2o", "tova", "knorm",
             "chunkkv", "kvzip", "streaming_llm", "random")


def scorer(name: str, latent_steps: int):
    """`name`, `name+calibration` (and either with `/sentence`: the same scores, sentence spans) -> the
    (agent, state, question) -> (T,) scores of CacheBack.scores with that selector and calibration."""
    return CacheBack.variant(name.split("[")[0].split("/")[0], latent_steps=latent_steps).scores


def gold_positions(ep, agent_index: int, tok) -> set[int]:
    """Token positions of the gold evidence in sender `agent_index`'s document."""
    doc = ep.contexts[agent_index]
    return set(span_token_positions(doc, [(s.start, s.end) for s in ep.evidence if s.agent == agent_index], tok))


def kept_gold(scores, state, ratio: float, eligible, per_row: list, doc: str, tok, gold: set[int],
              groups: list[list[int]] | None = None) -> int:
    """Gold evidence tokens kept when `scores` select B = ceil(T / ratio) rows of `state` (fixed spans, or
    `groups`, e.g. sentence spans)."""
    rows = select_rows(scores, fanin_budget(len(state), ratio), always_kept(state), eligible=eligible, groups=groups)
    return len(gold & set(span_token_positions(doc, kept_document_spans(per_row, rows), tok)))


def parse_args() -> argparse.Namespace:
    """The command line: model, task, episodes, latent steps, the selectors and their sentence-span rows, filters."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--task", default="facts")
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--latent-steps", type=int, default=8)
    ap.add_argument("--selectors", default=",".join(SELECTORS))
    ap.add_argument("--no-question-aware", dest="question_aware", action="store_false",
                    help=f"skip the `{QA}` row (a second read of every document)")
    ap.add_argument("--sentence-spans", default="cacheback,cacheback+generic,cacheback+masked",
                    help="selectors also run with spans snapped to sentences / lines (rows NAME/sentence)")
    ap.add_argument("--filter", action="append", default=[], metavar="KEY=VALUE",
                    help="keep episodes whose meta[KEY] == VALUE (a Python literal), repeatable")
    return ap.parse_args()


def table_rows(args: argparse.Namespace) -> tuple[list[str], dict[str, CacheBack]]:
    """The table's rows in order (selectors, the query ablation, sentence-span rows, question-aware rows) and
    the question-aware rows' readers (none with --no-question-aware)."""
    names = list(args.selectors.split(",")) + ["cacheback[unrelated q]"]
    names += [f"{n}/sentence" for n in args.sentence_spans.split(",") if n in names]
    # The strongest baseline that sees the question without a receiver query: the sender reads the
    # question with its document and SnapKV's observation window covers it (a state per question).
    qa_readers = {QA: CacheBack(latent_steps=args.latent_steps, selector="snapkv", query_aware=True),
                  QA64: CacheBack(latent_steps=args.latent_steps, selector="snapkv", query_aware=True,
                                  selector_params={"window_size": 64})} if args.question_aware else {}
    names += list(qa_readers)
    return names, qa_readers


def read_document(agent: Agent, reader: CacheBack, doc: str, times: dict) -> tuple:
    """The sender's state of `doc` (prefill + latent steps), its rows' document spans, the eligible rows and the
    sentence groups; the read's and the prefill's seconds go to `times`."""
    t0 = time.perf_counter()
    state = reader.read(agent, doc)
    times["read"].append(time.perf_counter() - t0)
    times["prefill"].append(next(c.seconds for c in reversed(agent.calls) if c.op == "prefill"))
    per_row, eligible = document_rows(agent, doc, len(state))
    return state, per_row, eligible, sentence_groups(per_row, doc)


def question_aware_kept(agent: Agent, qa_readers: dict, doc: str, question: str, gold: set[int], kept: dict) -> None:
    """Adds to `kept` the gold tokens each question-aware row keeps per ratio: one read of the document with
    the question, scored with both windows."""
    qa_reader = qa_readers[QA]
    prompt = qa_reader.sender_prompt(doc, question)
    qa_state = qa_reader.read(agent, doc, question)
    qa_rows, qa_eligible = document_rows(agent, doc, len(qa_state), prompt)
    for qa_name, reader_ in qa_readers.items():
        qa_scores = reader_.scores(agent, qa_state, question, qa_rows)
        for r in RATIOS:
            kept[(qa_name, r)] += kept_gold(qa_scores, qa_state, r, qa_eligible, qa_rows, doc, agent.tokenizer, gold)


def selector_scores(name: str, score, agent: Agent, state, question: str, unrelated: str, memo: dict,
                    score_s: dict[str, list[float]]) -> tuple:
    """Row `name`'s (T,) scores of `state` (memoised: `x/sentence` re-uses x's) and the clock reading they started
    at, less the time a `+generic` follow-up question took (timed apart in `score_s`)."""
    t1 = time.perf_counter()
    key = name.split("/")[0]  # `x/sentence` re-uses x's scores of this state
    if key not in memo:
        memo[key] = score(agent, state, unrelated if "unrelated" in name else question)
        score_s.setdefault(key, []).append(time.perf_counter() - t1)
        if key == "cacheback+generic":  # a follow-up question reuses the stored background
            t3 = time.perf_counter()
            score(agent, state, unrelated)
            score_s.setdefault(key + " follow-up", []).append(time.perf_counter() - t3)
            t1 += time.perf_counter() - t3
    return memo[key], t1


def document_kept(agent: Agent, reader: CacheBack, names: list[str], qa_readers: dict, scorers: dict, ep, a: int,
                  unrelated: str, kept: dict, times: dict, unsupported: dict[str, str]) -> int:
    """Reads sender `a`'s document once and adds to `kept` the gold tokens every row keeps at every ratio;
    returns the document's gold token count. A selector this model cannot run goes to `unsupported`."""
    doc = ep.contexts[a]
    gold = gold_positions(ep, a, agent.tokenizer)
    state, per_row, eligible, groups = read_document(agent, reader, doc, times)
    memo = {}
    if qa_readers:  # one read with the question, scored with both windows
        question_aware_kept(agent, qa_readers, doc, ep.question, gold, kept)
    for name in names:
        if name in unsupported or name in qa_readers:
            continue
        try:
            scores, t1 = selector_scores(name, scorers[name], agent, state, ep.question, unrelated, memo,
                                         times["score"])
        except PressUnsupportedError as e:  # e.g. kvzip on Gemma3: reported, not hidden
            unsupported[name] = str(e).split(". ")[0]
            continue
        if name == "cacheback":
            select_rows(scores, fanin_budget(len(state), 8), always_kept(state), eligible=eligible)
            times["select"].append(time.perf_counter() - t1)
        for r in RATIOS:
            kept[(name, r)] += kept_gold(scores, state, r, eligible, per_row, doc, agent.tokenizer, gold,
                                         groups if name.endswith("/sentence") else None)
    return len(gold)


def measure(agent: Agent, episodes: list, reader: CacheBack, names: list[str], qa_readers: dict,
            scorers: dict) -> tuple[dict, dict, dict[str, str]]:
    """Per-episode recall of every (row, ratio), the seconds spent (read, prefill, select, score per selector),
    and the rows this model cannot run, with why."""
    hits = {(s, r): [] for s in names for r in RATIOS}  # per-episode recall
    times = {"read": [], "prefill": [], "select": [], "score": {}}  # score: selector -> seconds per state, question
    unsupported: dict[str, str] = {}
    for i, ep in enumerate(episodes):
        unrelated = episodes[(i + len(episodes) // 2) % len(episodes)].question
        gold_total, kept = 0, {k: 0 for k in hits}
        for a in sorted({s.agent for s in ep.evidence}):
            gold_total += document_kept(agent, reader, names, qa_readers, scorers, ep, a, unrelated, kept, times,
                                        unsupported)
        for k in hits:
            if k[0] not in unsupported:
                hits[k].append(kept[k] / gold_total)
        print(f"[{i + 1}/{len(episodes)}] {ep.id}: " + "  ".join(
            f"{n}@8x {hits[(n, 8)][-1]:.2f}" for n in names if n not in unsupported), flush=True)
    return hits, times, unsupported


def summarise(hits: dict, names: list[str], episodes: list, times: dict) -> dict:
    """Mean recall per (row, ratio) with its bootstrap CI, recall at 8× by hops, the selection's share of the
    sender's time, and the best receiver-agnostic row per ratio."""
    table = {name: {r: statistics.mean(hits[(name, r)]) for r in RATIOS} for name in names}
    cis = {name: {r: bootstrap_ci(hits[(name, r)]) for r in RATIOS} for name in names}
    hops = [ep.meta.get("hops") for ep in episodes]
    by_hops = {h: {n: statistics.mean(v for v, hh in zip(hits[(n, 8)], hops) if hh == h) for n in names}
               for h in sorted(set(hops), key=str)}
    select_s = times["select"]
    share, share_prefill = sum(select_s) / sum(times["read"]), sum(select_s) / sum(times["prefill"])
    agnostic = [n for n in names if n in SELECTORS and "+" not in n and "/" not in n
                and not get_selector(n).query_conditioned]  # receiver-agnostic and question-blind
    best = {r: max(agnostic, key=lambda n: table[n][r]) for r in RATIOS} if agnostic else {}
    return {"table": table, "cis": cis, "hops": hops, "by_hops": by_hops, "share": share,
            "share_prefill": share_prefill, "best": best}


def command(args: argparse.Namespace) -> str:
    """The command line that reproduces this run, every option spelled out."""
    return (f"python benchmarks/evidence_recall.py --model {args.model} --task {args.task} --n {args.n} "
            f"--seed {args.seed} --latent-steps {args.latent_steps} --selectors {args.selectors}"
            + f" --sentence-spans {args.sentence_spans}" + ("" if args.question_aware else " --no-question-aware")
            + "".join(f" --filter {f}" for f in args.filter))


def recall_lines(stats: dict, names: list[str], unsupported: dict[str, str], model: str) -> list[str]:
    """The recall table: a row per selector, CacheBack's margins, the unsupported rows, recall at 8× by hops."""
    table, cis, best, by_hops, hops = stats["table"], stats["cis"], stats["best"], stats["by_hops"], stats["hops"]
    header = "| selector | " + " | ".join(f"{r}×" for r in RATIOS) + " |"
    lines = [header + " 8× CI | 16× CI |", "|---|" + "---:|" * len(RATIOS) + "---|---|"]
    lines += [f"| {n} | " + " | ".join(f"{table[n][r]:.2f}" for r in RATIOS) + " | "
              + " | ".join(f"[{cis[n][r][1]:.2f}, {cis[n][r][2]:.2f}]" for r in (8, 16)) + " |" for n in names]
    if best and "cacheback" in table:
        lines += ["| *cacheback − best receiver-agnostic* | " + " | ".join(
            f"{100 * (table['cacheback'][r] - table[best[r]][r]):+.0f} pp ({best[r]})" for r in RATIOS) + " |"]
    if QA in table and "cacheback" in table:
        lines += [f"| *cacheback − {QA}* | " + " | ".join(
            f"{100 * (table['cacheback'][r] - table[QA][r]):+.0f} pp" for r in RATIOS) + " |"]
    lines += [f"| {n} | unsupported on {model}: {why} |" for n, why in unsupported.items()]
    if len(by_hops) > 1:
        lines += ["", "Recall at 8× by `meta.hops`:", "",
                  "| hops | n | " + " | ".join(names) + " |", "|---|---:|" + "---:|" * len(names)]
        lines += [f"| {h} | {hops.count(h)} | " + " | ".join(f"{by_hops[h][n]:.2f}" for n in names) + " |"
                  for h in by_hops]
    return lines


def timing_lines(stats: dict, times: dict) -> list[str]:
    """The selection's share of the sender's time, and the median seconds to score one state per selector."""
    return ["", f"Scoring + selection (CacheBack, one query, 8×) took {100 * stats['share_prefill']:.1f}% of the "
            f"sender's prefill time and {100 * stats['share']:.1f}% of prefill + latent steps (median prefill "
            f"{statistics.median(times['prefill']):.2f} s, read {statistics.median(times['read']):.2f} s, score + "
            f"select {statistics.median(times['select']):.3f} s).", "",
            "Median seconds to score one state for one question (`+generic`: the first question on a state, "
            "which also scores the generic query; `+generic follow-up`: a second question on the same state, "
            "which reuses it; `+masked`: every question pays a second pass): "
            + ", ".join(f"{k} {statistics.median(v):.3f}" for k, v in times["score"].items()
                        if k.startswith("cacheback") and "[" not in k) + "."]


def plot(stem: Path, table: dict, names: list[str], title: str) -> None:
    """Recall vs compression ratio, a line per row, saved beside the page as <stem>.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.2))
    for n in names:
        ax.plot(RATIOS, [table[n][r] for r in RATIOS], "o-" if "unrelated" not in n else "x--", label=n)
    ax.set(xscale="log", xlabel="compression ratio r (log)", ylabel="evidence recall", ylim=(-0.05, 1.05),
           title=title)
    ax.set_xticks(RATIOS, [f"{r}×" for r in RATIOS])
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(stem.with_name(stem.name + ".png"), dpi=120)


def main() -> None:
    """Score every selector on the same sender states, then write the recall page, its JSON and its plot."""
    args = parse_args()
    filters = parse_filters(args.filter)
    agent = Agent.from_pretrained(args.model)
    episodes = select_episodes(load_task_episodes(args.task), args.n, args.seed, filters)
    reader = CacheBack(latent_steps=args.latent_steps)
    names, qa_readers = table_rows(args)
    scorers = {name: scorer(name, args.latent_steps) for name in names if name not in qa_readers}
    hits, times, unsupported = measure(agent, episodes, reader, names, qa_readers, scorers)

    names = [n for n in names if n not in unsupported]
    stats = summarise(hits, names, episodes, times)
    tag = "".join(f"_{k}{v}" for k, v in filters.items())
    task_name = Path(args.task).stem if args.task.endswith(".jsonl") or "/" in args.task else args.task
    cmd = command(args)
    lines = [f"# Evidence recall vs compression ({task_name}{tag}, {args.model}, {len(episodes)} episodes, "
             f"G = {args.latent_steps})", "", f"Command: `{cmd}`", "",
             "Mean recall over episodes; 95% bootstrap CI (episodes resampled) at 8× and 16×.", ""]
    lines += recall_lines(stats, names, unsupported, args.model) + timing_lines(stats, times)
    lines += ["", f"![recall](evidence_recall_{task_name}{tag}_{args.model}.png)"]
    print("\n".join(lines))
    OUT.mkdir(parents=True, exist_ok=True)
    stem = OUT / f"evidence_recall_{task_name}{tag}_{args.model}"
    stem.with_name(stem.name + ".md").write_text("\n".join(lines) + "\n")
    stem.with_name(stem.name + ".json").write_text(json.dumps({
        "command": cmd, "recall": {n: {str(r): v for r, v in t.items()} for n, t in stats["table"].items()},
        "recall_ci": {n: {str(r): list(v) for r, v in t.items()} for n, t in stats["cis"].items()},
        "per_episode": {f"{n}@{r}": v for (n, r), v in hits.items()},
        "recall_at_8x_by_hops": {str(h): v for h, v in stats["by_hops"].items()},
        "score_seconds_median": {k: statistics.median(v) for k, v in times["score"].items()},
        "select_share": stats["share"], "select_share_of_prefill": stats["share_prefill"],
        "episodes": [ep.id for ep in episodes], "environment": environment()}, indent=2) + "\n")
    plot(stem, stats["table"], names, f"{task_name} / {args.model}: evidence kept vs compression")
    print(f"wrote {stem}.md")


if __name__ == "__main__":
    main()

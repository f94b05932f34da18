"""The honest rival: CacheBack against retrieval sent as text, per task, on the same episodes and budgets.

    python benchmarks/rival.py [--cells paraphrase,coref,aggregate,facts1_500,code1] [--n 100]
                               [--model qwen2.5-coder-0.5b] [--out docs/results/rival] [--upto K] [--skip-recall]
                               [--report-only] [--committed-episodes]

A cell is a task (fan-in of 3 senders, one receiver, one model, default placement), run episode by episode
over `--n` fresh episodes (seed 2026: not the shipped files), resumable. Inside an episode each sender's state
is read once and shared by everything that starts from it (each protocol is charged the read's measured time):

1. Evidence recall (`recall.jsonl`), like with like: every selector in `RECALL_SELECTORS` ranks the same
   units (sentence spans and fixed 16-row spans) of the same sender state under the same budget
   (CacheBack's, ceil(T / r) at r = 8 and 16), through the same `select_rows`.
2. End to end (`records.jsonl`, the bench runner's records and config): `PROTOCOLS`. Verdicts: the
   pre-specified `FAMILY` of paired comparisons (accuracy difference with its paired bootstrap CI, exact
   McNemar, Holm over the cell's family, median TTEOA ratio).

A cell's episodes are its generator's; a folder whose committed episodes differ (the generator changed after the
cell ran: `paraphrase` since 2026-12-07) is refused, or run as it is with `--committed-episodes`.

`README.md` in the output folder: per task, which of CacheBack / retrieval / text reports / full context
wins (accuracy with CIs, Holm p), the recall table, and the commands.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from latent_vs_text import cell_episodes, ensure_episodes, log_command, commands  # noqa: E402

from latentwire.agent import Agent  # noqa: E402
from latentwire.bench.episode import load_episodes, span_token_positions  # noqa: E402
from latentwire.bench.metrics import bootstrap_ci, evidence_recall, paired_bootstrap_diff  # noqa: E402
from latentwire.bench.report import complete_episodes, compare, read_run, verdict, with_holm, write_report  # noqa: E402
from latentwire.bench.report import PAIRING_NOTE, VERDICT_HEADER, holm_note, mixed_note  # noqa: E402
from latentwire.bench.episode import jsonl_lines  # noqa: E402
from latentwire.bench.folder import (check_episodes, check_resume, drop_cut_lines, episode_hashes,  # noqa: E402
                                     finished, hardware, replace_text, run_lock, write_config)
from latentwire.bench.runner import RunConfig, run_episode  # noqa: E402
from latentwire.protocols import get_protocol  # noqa: E402
from latentwire.protocols.reads import shared_reads  # noqa: E402
from latentwire.bench.tasks import TASKS  # noqa: E402
from latentwire.protocols.cacheback import SCORING_PRESETS, CacheBack, document_rows, kept_document_spans  # noqa: E402
from latentwire.select import (SPAN, always_kept, fanin_budget,  # noqa: E402
                               fused_row_scores, select_rows, span_units, sentence_groups, unit_ranks, unit_row_scores)

OUT = Path(__file__).resolve().parents[1] / "docs" / "results" / "rival"
CELLS = ("paraphrase", "coref", "aggregate", "facts1_500", "code1")
CB8, CB16 = "cacheback(ratio=8)", "cacheback(ratio=16)"
CBX8 = "cacheback_x(ratio=8)"  # CacheBack's selection, its rows' text delivered as spans (no first or latent rows)
CBG8 = "cacheback(ratio=8, calibration='generic')"  # the candidate default: scores ÷ a content-free query's
CBKV8 = "cacheback(ratio=8, encoding='kv')"  # the selected rows' own K/V attached: no re-prefill, context kept
# Contrastive CacheBack: mean query attention (p = 0) on the deeper half of the layers, ÷ a content-free query's.
# Chosen on dev episodes (seed 7, never this study's) where it kept the most coref evidence; added after coref ran.
DEEP = SCORING_PRESETS["deep"]  # {"p": 0.0, "min_depth": 0.5}
CBD8 = f"cacheback(ratio=8, calibration='generic', selector_params={DEEP!r})"
# The same, and BM25, with each selected sentence's paragraph lead taken along (who "he" is), inside the budget.
CBDL8 = f"cacheback(ratio=8, calibration='generic', selector_params={DEEP!r}, context='lead')"
BM25L = "retrieval(selector='bm25', context='lead')"
# Contrastive scores fused (reciprocal rank) with the dense retriever's sentence ranks: chosen on the dev episodes
# (seed 7), where it kept 0.77 of the coref evidence (contrastive alone 0.78, dense 0.44) and 0.93 of paraphrase's
# (contrastive 0.70, dense 1.00); added after coref and 16 paraphrase episodes had run.
CBDF8 = f"cacheback(ratio=8, calibration='generic', selector_params={DEEP!r}, fuse='dense')"
# Answer-probe CacheBack: each sender's first 16 greedy answer tokens join the question's attention (`probe`), with
# default and with contrastive scores. Chosen on dev episodes (seed 7; `benchmarks/ablations.py --generate-seed 7`):
# coref evidence recall at 8× 0.86 / 1.00 (default 0.37), paraphrase 0.73 / 0.75 (0.61), facts 1.00 / 0.96 (0.96).
# Added after paraphrase 48, coref 100, aggregate 26, facts1_500 25 and code1 16.
CBP8 = "cacheback(ratio=8, probe=16)"
CBDP8 = f"cacheback(ratio=8, calibration='generic', selector_params={DEEP!r}, probe=16)"
# The probe's selection delivered as text spans (`cacheback_x`: no first or latent rows). Chosen on dev paraphrase
# episodes (seed 7, n = 30: `latentwire bench run`), where spans answered 0.50 against the same selection's re-prefilled
# rows 0.33 and dense text 0.53; added after paraphrase 100, coref 100, aggregate 27, facts1_500 25 and code1 16.
CBXP8 = "cacheback_x(ratio=8, probe=16)"
# Draft queries (`text_query='draft'`): each sender decodes its 16-token answer draft on its held state, and a text
# selector (the dense retriever, or BM25) picks its sentences against the question followed by that draft; sent as
# spans. Chosen on dev episodes (seed 7, n = 30; docs/results/rival/dev7): paraphrase dense + draft 0.67 (dense text
# 0.53), BM25 + draft 0.53; coref BM25 + draft and the probe's spans lead, dense + draft loses. Added after
# paraphrase 100, coref 100, aggregate 39, facts1_500 28 and code1 16.
CBXDD8 = "cacheback_x(ratio=8, probe=16, selector='dense', text_query='draft')"
CBXBD8 = "cacheback_x(ratio=8, probe=16, selector='bm25', text_query='draft')"
BM25, DENSE, BM25_16 = ("retrieval(selector='bm25')", "retrieval(selector='dense')",
                        "retrieval(selector='bm25', ratio=16)")
TEXT, TEXT8, FULLKV, FULLCTX = "text", "text(ratio=8)", "fullkv(latent_steps=8)", "fullcontext"
PROTOCOLS = [TEXT, TEXT8, BM25, DENSE, BM25_16, CB8, CB16, CBX8, CBG8, CBKV8, FULLKV, FULLCTX, CBD8, CBDL8, BM25L,
             CBDF8, CBP8, CBDP8, CBXP8, CBXDD8, CBXBD8]
FAMILY = [(CB8, BM25), (CB8, DENSE), (CB8, TEXT8), (CB8, TEXT), (CB8, FULLCTX), (CB8, FULLKV), (CB16, BM25_16),
          (CBX8, BM25), (CBX8, CB8), (CBG8, CB8), (CBG8, BM25), (CBKV8, BM25), (CBKV8, CB8), (BM25, TEXT),
          (BM25, FULLCTX),
          (DENSE, BM25), (CBD8, BM25), (CBD8, CB8), (CBDL8, BM25L), (CBDL8, CBD8), (CBDL8, BM25),
          (BM25L, BM25), (CBDF8, DENSE), (CBDF8, BM25), (CBDF8, CBD8),
          (CBP8, CB8), (CBP8, BM25), (CBDP8, BM25), (CBDP8, BM25L), (CBDP8, DENSE),
          (CBDP8, CBD8), (CBXP8, BM25), (CBXP8, DENSE),
          (CBXDD8, DENSE), (CBXDD8, BM25), (CBXBD8, BM25)]  # pre-specified: the cell's Holm family
# Comparisons the write-up quotes that were chosen after seeing results: listed per cell, unadjusted (Holm "—"), never
# bold, and outside the family so they cannot weaken its verdicts.
POST_HOC = [(CBXBD8, BM25L), (CBXBD8, DENSE), (CBXBD8, CBXP8), (CBXBD8, FULLCTX), (CBXBD8, CBXDD8), (CBXP8, CBP8),
            (CBXDD8, CBXP8)]
# A pair in the family must not come back post hoc (in either order): its unadjusted p would sidestep Holm.
assert not {frozenset(p) for p in POST_HOC} & {frozenset(p) for p in FAMILY}, "a post-hoc pair is in the family"
CONTENDERS = {"CacheBack 8×": CB8, "CacheBack 8× calibrated": CBG8, "CacheBack 8× contrastive": CBD8,
              "CacheBack 8× contrastive + lead": CBDL8, "BM25 text + lead": BM25L,
              "CacheBack 8× contrastive ⊕ dense": CBDF8,
              "CacheBack 8× probe": CBP8, "CacheBack 8× contrastive + probe": CBDP8,
              "CacheBack 8× spans": CBX8, "CacheBack 8× spans + probe": CBXP8,
              "draft + dense text": CBXDD8, "draft + BM25 text": CBXBD8,
              "CacheBack 8× K/V": CBKV8, "BM25 text": BM25, "dense text": DENSE, "text reports": TEXT,
              "full KV": FULLKV, "full context": FULLCTX}
RECALL_SELECTORS = ("cacheback", "cacheback+generic", "mean_query", "lexical", "bm25", "dense", "random")
CONTRASTIVE = "cacheback@deep+generic"  # recall key of CBD8's scores (p = 0, min_depth 0.5, generic calibration)
FUSED = (("cacheback", "bm25"), ("cacheback", "dense"))  # CacheBack(fuse=...): reciprocal rank fusion of units
RECALL_RATIOS = (8, 16)
MODES = ("sentence", "fixed")


def episodes_for(cell: str, n: int, seed: int) -> list:
    if cell in TASKS:  # the people tasks: generate(seed, n) is prefix-stable in n
        return TASKS[cell](seed, n)
    return cell_episodes(cell, n, seed)


def recall_row(agent: Agent, ep) -> dict:
    """Evidence recall of every selector (and `FUSED` pair) × span mode × ratio on this episode's sender states,
    each read once."""
    reader = CacheBack(latent_steps=8)
    gold, kept = [], {}
    for a, doc in enumerate(ep.contexts):
        state = reader.read(agent, doc)
        per_row, eligible = document_rows(agent, doc, len(state))
        keep = always_kept(state)
        spans = [(s.start, s.end) for s in ep.evidence if s.agent == a]
        gold += [(a, p) for p in span_token_positions(doc, spans, agent.tokenizer)]
        protos = {sel: CacheBack.variant(sel, latent_steps=8) for sel in RECALL_SELECTORS}
        protos[CONTRASTIVE] = CacheBack.variant(CONTRASTIVE, latent_steps=8)
        attention = {sel: p.scores(agent, state, ep.question) for sel, p in protos.items()
                     if p.attention is not None}
        for mode in MODES:
            groups = sentence_groups(per_row, doc, 2 * SPAN) if mode == "sentence" else None
            units = span_units(keep, eligible, SPAN, groups)
            scores = {sel: attention[sel] if sel in attention else unit_row_scores(
                p.score._selector, ep.question, per_row, doc, len(state), units, state.device) for sel, p in protos.items()}
            for a_sel, t_sel in FUSED:
                scores[f"{a_sel}⊕{t_sel}"] = fused_row_scores([unit_ranks(scores[a_sel], units),
                                                              unit_ranks(scores[t_sel], units)], units, len(state),
                                                             60.0, state.device)
            for sel, sc in scores.items():
                for r in RECALL_RATIOS:
                    rows = select_rows(sc, fanin_budget(len(state), r), keep, SPAN, eligible, groups)
                    kept.setdefault(f"{sel}/{mode}/{r}", []).extend(
                        (a, p) for p in span_token_positions(doc, kept_document_spans(per_row, rows), agent.tokenizer))
    return {"episode": ep.id, "recall": {k: evidence_recall(gold, v) for k, v in kept.items()}}


def read_recall(path: Path, repair: bool = False) -> list[dict]:
    """recall.jsonl's rows; with `repair` (before a run resumes) a line cut short by an interrupted run is
    dropped from the file, so that episode reruns."""
    if not path.exists():
        return []
    text = path.read_text(encoding="utf-8")
    rows, good = [], []
    for line in jsonl_lines(text):
        try:
            rows.append(json.loads(line))
            good.append(line)
        except json.JSONDecodeError:
            continue
    if repair and (kept := "".join(line + "\n" for line in good)) != text:
        replace_text(path, kept)  # whole or not at all; nothing to drop: untouched
    return list({r["episode"]: r for r in rows}.values())  # a recomputed row (more selectors) replaces the older


def run_cell(agent: Agent, folder: Path, episodes: list, model: str, recall: bool = True,
             upto: int | None = None) -> None:
    """Both passes, episode by episode, resumable; records and config.json as the bench runner writes them.
    `upto` stops after that many of the cell's episodes (so every cell can reach a common n before any goes on)."""
    config = RunConfig(os.path.relpath(folder / "episodes.jsonl"), ",".join(PROTOCOLS), model)
    resolved = config.resolved(agent)
    cfg_path, rec_path, recall_path = folder / "config.json", folder / "records.jsonl", folder / "recall.jsonl"
    first = check_resume(cfg_path, resolved, ("task", "model", "n", "seed", "filters", "device", "dtype"))
    protocols = {label: get_protocol(spec["name"], **spec["params"]) for label, spec in resolved["protocols"].items()}
    drop_cut_lines(rec_path)
    done = finished(rec_path, "episode")
    want = {f"{CONTRASTIVE}/sentence/8"}  # a row written before a selector was added is recomputed
    recalled = {r["episode"] for r in read_recall(recall_path, repair=True) if want <= set(r["recall"])}
    hashes = episode_hashes(episodes)
    check_episodes(first, hashes, folder)
    run_id = write_config(cfg_path, first, resolved, {"episodes": [e.id for e in episodes],
                                                      "episode_sha256": hashes})["run"]
    with rec_path.open("a", encoding="utf-8") as f, recall_path.open("a", encoding="utf-8") as g:
        for i, ep in enumerate(episodes[:upto]):
            with shared_reads():
                if recall and ep.id not in recalled:
                    g.write(json.dumps(recall_row(agent, ep)) + "\n")
                    g.flush()
                for label, protocol in protocols.items():
                    if (ep.id, label) not in done:
                        f.write(json.dumps(run_episode(protocol, label, ep, agent) | {"run": run_id},
                                           ensure_ascii=False) + "\n")
                        f.flush()
            print(f"  {folder.name}: episode {i + 1}/{len(episodes)}", flush=True)


def recall_table(folder: Path, episodes: list) -> list[str]:
    ids = {e.id for e in episodes}
    rows = [r for r in read_recall(folder / "recall.jsonl") if r["episode"] in ids]
    keys = list(dict.fromkeys(k.split("/")[0] for r in rows for k in r["recall"]))
    if not rows:
        return []

    def values(key: str) -> dict[str, float]:
        return {r["episode"]: r["recall"][key] for r in rows if r["recall"].get(key) is not None}

    lines = [f"Evidence recall (mean [95% bootstrap CI] over the episodes with gold evidence, n = {len(rows)}; "
             "every selector ranks the same units of the same sender state under CacheBack's budget; ⊕ = reciprocal "
             "rank fusion of the two rankings, `cacheback(fuse=...)`):", "",
             "| selector | " + " | ".join(f"{m} {r}×" for r in RECALL_RATIOS for m in MODES) + " |",
             "|---|" + "---:|" * (len(MODES) * len(RECALL_RATIOS))]
    for sel in keys:
        cells = []
        for r in RECALL_RATIOS:
            for m in MODES:
                v = list(values(f"{sel}/{m}/{r}").values())
                cells.append("—" if not v else "{:.2f} [{:.2f}, {:.2f}]".format(*bootstrap_ci(v)))
        lines.append(f"| {sel} | " + " | ".join(cells) + " |")
    lines.append("")
    for a_sel, b_sel in (("cacheback", "bm25"), ("cacheback", "dense"), ("cacheback⊕dense", "dense"),
                         (CONTRASTIVE, "bm25"), (CONTRASTIVE, "cacheback")):
        for r in RECALL_RATIOS:
            a, b = values(f"{a_sel}/sentence/{r}"), values(f"{b_sel}/sentence/{r}")
            both = sorted(set(a) & set(b))
            if both:
                d, lo, hi = paired_bootstrap_diff([a[e] for e in both], [b[e] for e in both])
                lines.append(f"- {a_sel} − {b_sel} at {r}×, sentence spans (paired, n = {len(both)}): "
                             f"{100 * d:+.0f} pp [{100 * lo:+.0f}, {100 * hi:+.0f}]")
    return lines


def cell_summary(folder: Path) -> tuple[list[str], list[dict], dict]:
    """Winner row pieces, the family's comparisons (Holm within the cell) and accuracy per contender, over the
    episodes every protocol has run (an episode a paused run left half done waits for its resume)."""
    config, records = read_run(folder)
    ran = set(config["config"]["protocols"])
    records = complete_episodes(records, ran)
    comps = with_holm([c for a, b in FAMILY if a in ran and b in ran and (c := compare(records, a, b))])
    acc = {}
    for name, label in CONTENDERS.items():
        vals = [r["accuracy"] for r in records if r["protocol"] == label]
        if vals:
            tt = [r["tteoa"] for r in records if r["protocol"] == label and r.get("tteoa")]
            qt = [r.get("tteoa_question") for r in records  # recorded since 2026-12-05; a failed episode has none
                  if r["protocol"] == label and not r.get("error")]
            acc[name] = (bootstrap_ci(vals), len(vals), statistics.median(tt) if tt else None,
                         statistics.median(qt) if qt and None not in qt else None)
    return sorted(ran), comps, acc


GOALS = [(CB8, BM25), (CBG8, BM25), (CBD8, BM25), (CBDL8, BM25L), (CBDF8, DENSE), (CBDP8, BM25), (CBDP8, BM25L),
         (CBXP8, BM25), (CBXDD8, BM25), (CBXDD8, DENSE), (CBXBD8, BM25)]  # the index's verdict rows (in FAMILY)
NAMES = {label: name for name, label in CONTENDERS.items()}


def contender_rows(cells: dict[str, tuple]) -> list[str]:
    """The index's first table: a row per contender, a column per cell; accuracy [CI] and median TTEOA; "(n = k)"
    where a contender added later ran fewer of the cell's episodes."""
    rows = []
    for name in CONTENDERS:
        cols = []
        for n, _, acc in cells.values():
            v = acc.get(name)
            cols.append("—" if v is None else "{:.2f} [{:.2f}, {:.2f}]".format(*v[0])
                        + (f" (n = {v[1]})" if v[1] < n else "") + (f", {v[2]:.1f} s" if v[2] else "")
                        + (f" ({v[3]:.1f} s)" if v[3] is not None else ""))
        rows.append(f"| {name} | " + " | ".join(cols) + " |")
    return rows


def goal_rows(cells: dict[str, tuple]) -> list[str]:
    """The index's second table: each pre-specified goal comparison per cell, paired difference [CI] and Holm p
    over the cell's family; bold only where that Holm p is ≤ 0.05."""
    rows = []
    for a, b in GOALS:
        cols = []
        for _, comps, _ in cells.values():
            c = next((c for c in comps if c["a"] == a and c["b"] == b), None)
            text = "—" if c is None else "{:+.0f} pp [{:+.0f}, {:+.0f}], Holm p {:.2g}".format(
                *(100 * x for x in c["diff"]), c["p_holm"])
            cols.append(f"**{text}**" if c is not None and c["p_holm"] <= 0.05 else text)
        rows.append(f"| {NAMES[a]} − {NAMES[b]} | " + " | ".join(cols) + " |")
    return rows


def write_index(out: Path, cells: list[str], n: int, seed: int) -> None:
    details, environments, summaries = [], set(), {}
    for cell in cells:
        folder = out / cell
        if not has_records(folder):
            summaries[f"{cell} (not run yet)"] = (0, [], {})
            continue
        config, records = read_run(folder)
        if not (folder / "report.md").exists():  # a cell another call started: its report, so the link resolves
            write_report(folder, [p for p in FAMILY if p[0] in config["config"]["protocols"]], complete=True)
        _, comps, acc = cell_summary(folder)
        for env in [config["environment"], *config.get("resumed", [])]:  # each call that added records
            environments.add(f"{config['config']['dtype']} on {hardware(env)}")
        eps = load_episodes(folder / "episodes.jsonl")
        have = {(r["episode"], r["protocol"]) for r in records}
        done = {e.id for e in eps if all((e.id, p) in have for p in config["config"]["protocols"])}
        runs = max((v[1] for v in acc.values()), default=0)
        summaries[f"{cell} ({runs})"] = (runs, comps, acc)
        follow = (f" Rerun after retrieval's text became spans, with BM25 at twice the budget: "
                  f"[{cell}_spans/README.md]({cell}_spans/README.md) (`benchmarks/rival_spans.py`)."
                  if (out / f"{cell}_spans" / "README.md").exists() else "")
        details += ["", f"## {cell}", "", f"{len(done)} of {len(eps)} episodes run end to end; full report: "
                    f"[{cell}/report.md]({cell}/report.md).{follow}", "", VERDICT_HEADER[0], VERDICT_HEADER[1]]
        details += [verdict(c) for c in comps] + ["", holm_note(len(comps))] + mixed_note(comps)
        details += [""] + recall_table(folder, eps)
        ran, records = set(config["config"]["protocols"]), complete_episodes(records, config["config"]["protocols"])
        if extra := [c for a, b in POST_HOC if a in ran and b in ran and (c := compare(records, a, b))]:
            details += ["", "Post hoc, outside the family (chosen after results; exact p unadjusted):", "",
                        VERDICT_HEADER[0], VERDICT_HEADER[1]] + [verdict(c) for c in extra] + mixed_note(extra)
        details += ["", "Commands: `" + "`, then `".join(commands(folder)) + "`"]
    head = "| {} | " + " | ".join(summaries) + " |"
    rule = "|---|" + "---|" * len(summaries)
    mixed = (" (cells, or calls resuming one, ran on different machines: compare timings within a call; each "
             "record's `run` names its call, and config.json's `resumed` that call's environment)"
             ) if len(environments) > 1 else ""
    lines = ["# The honest rival: CacheBack against retrieval sent as text", "",
             "Fan-in of 3 senders, Qwen2.5-Coder-0.5B-Instruct for every agent, default placement; a column per "
             "task (episodes run). Per contender: accuracy [95% bootstrap CI], median TTEOA (cold: each sender "
             "reads its document after the question arrives) and, in brackets where every record carries it, the "
             "median question-time TTEOA (from the question's arrival, for senders that already hold their read "
             "documents: each sender's read left out; retrieval's senders never read, so its question-time TTEOA is "
             "its TTEOA; text reports read with the question; records written before the field have none). "
             "Why attention selection loses to BM25 on coref and "
             "what contrastive scores change, on two episodes' inspect pages: [inspect/](inspect/README.md).",
             "", head.format("contender"), rule, *contender_rows(summaries), "",
             "The pre-specified goal comparisons: paired difference [95% CI], exact p adjusted by Holm over the "
             "cell's family of verdicts (listed in its section below); bold only where that Holm p is ≤ 0.05.",
             "", head.format("a − b"), rule, *goal_rows(summaries), "",
             f"Ran in {'; '.join(sorted(environments))}{mixed}." if environments else "",
             "", "Holm p: the exact p adjusted over the cell's family (the rows of its section below). "
             + PAIRING_NOTE] + details
    (out / "README.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:len(CONTENDERS) + len(GOALS) + 12]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--cells", default=",".join(CELLS))
    ap.add_argument("--dtype", default=None, help="default: latentwire's choice for this machine")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--upto", type=int, default=None,
                    help="run each cell only up to this many of its --n episodes (the rest on a later call)")
    ap.add_argument("--skip-recall", action="store_true", help="only the end-to-end pass")
    ap.add_argument("--report-only", action="store_true", help="rewrite the reports from the records")
    ap.add_argument("--episodes-only", action="store_true",
                    help="only write each cell's episodes.jsonl (dev episodes: --seed 7 --out elsewhere), run nothing")
    ap.add_argument("--committed-episodes", action="store_true",
                    help="run the episodes each cell folder already holds, as they are: for a cell whose task "
                         "generator changed after it ran (a plain run refuses it rather than mix two episode sets)")
    args = ap.parse_args()
    if args.upto is not None and args.upto < 1:
        sys.exit(f"--upto must be ≥ 1, got {args.upto}")
    cells = args.cells.split(",")
    unknown = sorted(set(cells) - set(CELLS))
    if unknown:
        sys.exit(f"unknown cells {unknown}; valid: {', '.join(CELLS)}")
    if args.episodes_only:
        for cell in cells:
            (args.out / cell).mkdir(parents=True, exist_ok=True)
            ensure_episodes(args.out / cell / "episodes.jsonl", episodes_for(cell, args.n, args.seed))
            print(args.out / cell / "episodes.jsonl")
        return
    cmd = " ".join(["python benchmarks/rival.py"] + sys.argv[1:])
    agent = None
    for cell in cells:
        folder = args.out / cell
        if not args.report_only:
            folder.mkdir(parents=True, exist_ok=True)
            if args.committed_episodes:
                if not (folder / "episodes.jsonl").exists():
                    sys.exit(f"--committed-episodes: {folder} holds no episodes.jsonl")
                episodes = load_episodes(folder / "episodes.jsonl")[:args.n]
            else:
                episodes = episodes_for(cell, args.n, args.seed)
            if agent is None:
                agent = Agent.from_pretrained(args.model, dtype=args.dtype)
            print(f"== {cell}: {args.n} episodes, {len(PROTOCOLS)} protocols -> {folder}", flush=True)
            with run_lock(folder):  # one run per folder: a second would duplicate and lose records
                if not args.committed_episodes:
                    ensure_episodes(folder / "episodes.jsonl", episodes)
                log_command(folder, cmd)
                run_cell(agent, folder, episodes, args.model, not args.skip_recall, args.upto)
        if has_records(folder):
            config, _ = read_run(folder)
            write_report(folder, [p for p in FAMILY if p[0] in config["config"]["protocols"]], complete=True)
    write_index(args.out, list(CELLS), args.n, args.seed)


def has_records(folder: Path) -> bool:
    """Whether a cell has run: its records file holds at least one line (a run that starts opens it empty)."""
    path = folder / "records.jsonl"
    return path.exists() and any(line.strip() for line in path.open(encoding="utf-8"))


if __name__ == "__main__":
    main()

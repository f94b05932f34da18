"""Turn a run folder into `report.md` (mean ± 95% bootstrap CI per protocol), paired verdicts and two
PNG plots: accuracy vs TTEOA with the Pareto front and both intervals, and evidence recall vs ratio.

    latentwire bench report runs/X [--compare A B ...]

Verdicts compare two protocols on the episodes both ran: the paired accuracy difference with a 95%
paired bootstrap CI (episodes resampled with both scores together), an exact p-value of that same
difference (the paired sign-flip test: McNemar's exact test when every score is 0 or 1, and the test that keeps
partial credit, e.g. 2 of 3 parts of an `aggregate` answer, instead of dichotomising it), and the median over
episodes of the TTEOA ratio with a bootstrap CI. A typed error counts as a wrong answer and leaves its episode
out of the ratio. Without `--compare`, every latent protocol is compared with text at the same compression ratio
(the natural report when no text run has that ratio), with full KV and with full context.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Sequence

from ..errors import LatentWireError
from .episode import jsonl_lines
from .folder import parse_line
from .metrics import bootstrap_ci, holm, median_ratio_ci, paired_bootstrap_diff, sign_flip_exact
from .plots import pareto_front, plot_accuracy, plot_recall

REFERENCES = ("alone", "text", "fullcontext", "packllm")  # protocols that send no latent message

COLUMNS = [  # (record field, header, format)
    ("accuracy", "accuracy", "{:.2f}"), ("strict", "strict", "{:.2f}"), ("em", "EM", "{:.2f}"),
    ("f1", "F1", "{:.2f}"), ("evidence_recall", "evidence recall", "{:.2f}"), ("tteoa", "TTEOA s", "{:.2f}"),
    ("sender_max", "sender s (max)", "{:.2f}"), ("receiver_seconds", "receiver s", "{:.2f}"),
    ("message_bytes", "message bytes", "{:,.0f}"), ("receiver_context", "receiver ctx", "{:.0f}"),
]


def read_run(run_dir: str | Path) -> tuple[dict, list[dict]]:
    """(config, records) of a run folder. A last line without its newline that does not parse is a record still
    being written (a run in progress) or cut short by a crash: left out, so a running benchmark can be reported on.
    Where config.json lists the run's episodes, records of other episodes (an earlier selection's) are left out."""
    run_dir = Path(run_dir)
    try:
        config = json.loads((run_dir / "config.json").read_text())
        text = (run_dir / "records.jsonl").read_text(encoding="utf-8")
        lines = jsonl_lines(text)
        if lines and not text.endswith("\n") and parse_line(lines[-1]) is None:
            lines.pop()
        records = [json.loads(line) for line in lines]
    except (OSError, json.JSONDecodeError) as e:
        raise LatentWireError(f"{run_dir} is not a readable run folder ({e})") from e
    if (bad := next((n for n, r in enumerate(records, 1) if not isinstance(r, dict)), None)) is not None:
        raise LatentWireError(f"{run_dir} is not a readable run folder (records.jsonl line {bad} is not a record)")
    if isinstance(listed := config.get("episodes"), list):  # the run's episodes: a record of one the selection
        keep = set(listed)  # dropped since (the task file grew and the seeded sample moved) is not counted
        records = [r for r in records if r.get("episode") in keep]
    for r in records:
        r["sender_max"] = max(r["sender_seconds"], default=0.0) if r.get("error") is None else None
    return config, records


def summarize(records: list[dict], order: list[str], clusters: dict[str, str] | None = None) -> dict[str, dict]:
    """protocol -> {n, errors, field: (mean, lo, hi) or None, tteoa_median}. `clusters` (episode id → cluster id,
    as `compare`): the CIs resample whole clusters (the means stay episode means)."""
    out = {}
    labels = [p for p in order if any(r["protocol"] == p for r in records)]
    labels += sorted({r["protocol"] for r in records} - set(labels))
    for label in labels:
        rs = list(_by_episode(records, label).values())  # one record per episode: a duplicate is refused
        row = {"n": len(rs), "errors": sum(r.get("error") is not None for r in rs)}
        for key, _, _ in COLUMNS:
            # Answer scores count failed episodes as 0; costs are over episodes that ran.
            kept = [r for r in rs if r.get(key) is not None]
            ids = None if clusters is None else [clusters[r["episode"]] for r in kept]
            row[key] = bootstrap_ci([r[key] for r in kept], clusters=ids) if kept else None
        ok = [r["tteoa"] for r in rs if r.get("tteoa") is not None]
        row["tteoa_median"] = statistics.median(ok) if ok else None
        q = [r["tteoa_question"] for r in rs if r.get("tteoa_question") is not None]
        row["tteoa_question_median"] = statistics.median(q) if q else None
        row["tteoa_question_n"] = len(q)  # records older than the field have none: shown where it is fewer
        ratios = [r["compression_ratio"] for r in rs if r.get("compression_ratio")]
        row["ratio"] = statistics.median(ratios) if ratios else None
        out[label] = row
    return out


def default_pairs(protocols: dict[str, dict]) -> list[tuple[str, str]]:
    """(a, b) verdict pairs from a run's {label: {name, params}}: each latent protocol vs text at its ratio
    (else the natural report), vs full KV (same G when there is one) and vs full context."""
    by_name: dict[str, list[str]] = {}
    for label, spec in protocols.items():
        by_name.setdefault(spec["name"], []).append(label)
    params = {label: spec["params"] for label, spec in protocols.items()}
    pairs = []
    for a, spec in protocols.items():
        if spec["name"] in REFERENCES:
            continue
        texts = by_name.get("text", [])
        same = [t for t in texts if params[t].get("ratio") == params[a].get("ratio") and "ratio" in params[a]]
        pairs += [(a, t) for t in (same or [t for t in texts if "ratio" not in params[t]])[:1]]
        if spec["name"] != "fullkv" and by_name.get("fullkv"):
            fk = by_name["fullkv"]
            g = [f for f in fk if params[f].get("latent_steps") == params[a].get("latent_steps")]
            pairs.append((a, (g or fk)[0]))
        pairs += [(a, f) for f in by_name.get("fullcontext", [])[:1]]
    return pairs


def compare(records: list[dict], a: str, b: str, clusters: dict[str, str] | None = None,
            question_time: bool = False) -> dict | None:
    """Paired statistics of protocol a against b on the episodes both ran (None when they share none). A typed
    error counts as a wrong answer (accuracy 0) and leaves its episode out of the TTEOA ratio (`n_timed`).
    `clusters` (episode id → cluster id; e.g. several questions over one set of documents): the accuracy CI and
    exact p treat each cluster's mean as one paired observation, so correlated questions do not count as
    independent (n stays the episode count; `n_clusters` is set; the accuracies are means of cluster means, as the
    difference is), and the TTEOA ratio's CI resamples them too.
    `question_time`: the TTEOA ratio uses
    `tteoa_question` where both records of every timed pair have it (`time` says which was used).
    LatentWireError if a protocol has two records of one episode (pairing would silently keep one)."""
    ra, rb = _by_episode(records, a), _by_episode(records, b)
    eps = sorted(set(ra) & set(rb))
    if not eps:
        return None
    acc_a, acc_b = [ra[e]["accuracy"] for e in eps], [rb[e]["accuracy"] for e in eps]
    key = "tteoa"
    if question_time and all(ra[e].get("tteoa_question") and rb[e].get("tteoa_question")
                             for e in eps if ra[e].get("tteoa") and rb[e].get("tteoa")):
        key = "tteoa_question"
    timed = [e for e in eps if ra[e].get(key) and rb[e].get(key)]
    # A record's "run" names the invocation that wrote it. Paired times from two invocations may come from two
    # hosts or loads: counted, and flagged by `verdict`. A record older than the field names no run, so nothing
    # shows its pair ran together: counted too.
    mixed = sum(ra[e].get("run") is None or ra[e].get("run") != rb[e].get("run") for e in timed)
    out = {"a": a, "b": b, "n": len(eps), "acc_a": sum(acc_a) / len(eps), "acc_b": sum(acc_b) / len(eps)}
    if clusters is not None:
        if missing := sorted(e for e in eps if e not in clusters):
            raise LatentWireError(f"episodes without a cluster: {', '.join(missing[:5])}")
        acc_a, acc_b = cluster_means(eps, acc_a, clusters), cluster_means(eps, acc_b, clusters)
        # the accuracies shown beside the difference weigh clusters as it does (equal to the episode means where
        # every cluster has as many episodes)
        out |= {"n_clusters": len(acc_a), "acc_a": sum(acc_a) / len(acc_a), "acc_b": sum(acc_b) / len(acc_b)}
    return out | {"diff": paired_bootstrap_diff(acc_a, acc_b),
                  "p": sign_flip_exact(acc_a, acc_b),  # McNemar's exact test on 0/1 scores; partial credit kept
                  "tteoa_ratio": median_ratio_ci([ra[e][key] for e in timed], [rb[e][key] for e in timed],
                                                 clusters=None if clusters is None else [clusters[e] for e in timed])
                  if timed else None, "n_timed": len(timed), "tteoa_mixed": mixed, "time": key}


def cluster_means(eps: Sequence[str], values: Sequence[float], clusters: dict[str, str]) -> list[float]:
    """The mean of `values` per cluster, clusters in order of first appearance."""
    sums: dict[str, list[float]] = {}
    for e, v in zip(eps, values):
        sums.setdefault(clusters[e], []).append(v)
    return [sum(v) / len(v) for v in sums.values()]


def _by_episode(records: list[dict], protocol: str) -> dict[str, dict]:
    out = {}
    for r in records:
        if r["protocol"] == protocol:
            if r["episode"] in out:
                raise LatentWireError(f"two records of protocol {protocol!r} on episode {r['episode']!r}: "
                                      "remove the duplicate before pairing")
            out[r["episode"]] = r
    return out


VERDICT_HEADER = ["| a vs b | n | accuracy a vs b | difference | exact p | Holm p | median TTEOA ratio a ÷ b |",
                  "|---|---:|---|---|---:|---:|---|"]


def holm_note(m: int) -> str:
    return (f"Holm p: the exact p adjusted over the {m} verdict{'s' * (m != 1)} of this table (Holm–Bonferroni), "
            "so that \"Holm p ≤ 0.05\" keeps the chance of any false difference among them at most 5%.")


PAIRING_NOTE = ("Pairs: the episodes both protocols ran; an episode that failed with a typed error counts as a wrong "
                "answer and is left out of the TTEOA ratio, which is the median of the per-episode ratios "
                "(\"(n = k)\" where it covers fewer episodes than the row). Exact p: the paired sign-flip test of "
                "the accuracy difference, which is McNemar's exact test where every answer scores 0 or 1, and keeps "
                "partial credit where answers have several parts (`aggregate`). The difference's interval is a "
                "percentile bootstrap: with few discordant episodes it can exclude 0 while the exact p is above "
                "0.05, so only the p (Holm-adjusted for a verdict) decides.")


def with_holm(comparisons: list[dict]) -> list[dict]:
    """The comparisons of one table, each with `p_holm`: its exact p adjusted over the table (the family)."""
    for c, q in zip(comparisons, holm([c["p"] for c in comparisons])):
        c["p_holm"] = q
    return comparisons


def verdict(c: dict) -> str:
    """One table row that reads as a verdict (columns: VERDICT_HEADER); a TTEOA ratio over pairs timed by
    different runs is marked †; the Holm column is "—" until `with_holm` has set it."""
    d, lo, hi = (100 * x for x in c["diff"])
    t = "—" if c["tteoa_ratio"] is None else "×{:.2f} [{:.2f}, {:.2f}]".format(*c["tteoa_ratio"])
    t += f" (n = {c['n_timed']})" if c["tteoa_ratio"] is not None and c.get("n_timed", c["n"]) < c["n"] else ""
    t += " (question-time)" if c.get("time") == "tteoa_question" else ""
    t += " †" if c.get("tteoa_mixed") else ""
    q = "—" if c.get("p_holm") is None else f"{c['p_holm']:.3g}"
    n = f"{c['n']} ({c['n_clusters']} sets)" if c.get("n_clusters") else c["n"]
    return (f"| `{c['a']}` vs `{c['b']}` | {n} | {c['acc_a']:.2f} vs {c['acc_b']:.2f} | {d:+.0f} pp "
            f"[{lo:+.0f}, {hi:+.0f}] | {c['p']:.3g} | {q} | {t} |")


def verdict_table(comparisons: list[dict]) -> list[str]:
    """Header, one verdict row per comparison (Holm-adjusted over them) and the footnotes that apply."""
    rows = [verdict(c) for c in with_holm(comparisons)]
    return VERDICT_HEADER + rows + ["", holm_note(len(comparisons)), "", PAIRING_NOTE] + mixed_note(comparisons)


def mixed_note(comparisons: list[dict]) -> list[str]:
    """The footnote for verdict rows marked †, or nothing when no row is."""
    if not any(c.get("tteoa_mixed") for c in comparisons):
        return []
    return ["", "† TTEOA ratio over episodes whose two records were written by different runs of the command "
            "(a resume, another session, possibly another host or load), or by a run that recorded no run id: the "
            "two protocols' times are not known to be measured side by side, so read the ratio as indicative "
            "only. Accuracy columns are unaffected."]


def _cell(v, fmt: str) -> str:
    if v is None:
        return "—"
    mean, lo, hi = v
    return f"{fmt.format(mean)} ± {fmt.format((hi - lo) / 2)}"


def complete_episodes(records: list[dict], protocols) -> list[dict]:
    """The records of the episodes every one of `protocols` has a record of: an episode a paused run left half
    done waits for its resume, so every protocol is summarised over the same episodes."""
    have = {(r["episode"], r["protocol"]) for r in records}
    done = {e for e, _ in have if all((e, p) in have for p in protocols)}
    return [r for r in records if r["episode"] in done]


def write_report(run_dir: str | Path, pairs: list[tuple[str, str]] | None = None,
                 clusters: dict[str, str] | None = None, question_time: bool = False,
                 complete: bool = False) -> Path:
    """Writes report.md and its two PNG plots into `run_dir`; returns the path of report.md. `pairs`: the
    verdicts to draw (default: `default_pairs` of the run's protocols); `clusters`, `question_time`: as `compare`;
    `complete`: only the episodes every protocol of the run has finished (`complete_episodes`)."""
    import matplotlib

    matplotlib.use("Agg")
    run_dir = Path(run_dir)
    config, records = read_run(run_dir)
    if "pairs" in config:  # `bench pair` writes its own table
        raise LatentWireError(f"{run_dir} holds a `bench pair` run (sharer → receiver pairs), not a fan-in run: its "
                              "table is printed by `latentwire bench pair` (bench.pair_runner.format_table)")
    if not records:
        raise LatentWireError(f"{run_dir}/records.jsonl has no records yet")
    cfg = config["config"]
    if complete and not (records := complete_episodes(records, cfg["protocols"])):
        raise LatentWireError(f"{run_dir}: no episode has a record of every protocol yet")
    if clusters is not None and (missing := sorted({r["episode"] for r in records} - clusters.keys())):
        raise LatentWireError(f"episodes without a cluster: {', '.join(missing[:5])}")
    summary = summarize(records, list(cfg["protocols"]), clusters)
    lines = _header_lines(config, clusters is not None) + _summary_lines(summary)
    lines += _verdict_lines(records, default_pairs(cfg["protocols"]) if pairs is None else pairs, clusters,
                            question_time)
    lines += _error_lines(records)
    points = _tteoa_points(summary)
    front = pareto_front(points)
    task = _task_name(cfg["task"])
    plot_accuracy(run_dir / "accuracy_vs_tteoa.png", records, summary, points, front,
                   f"{task} / {cfg['model']}: accuracy vs time to answer")
    plot_recall(run_dir / "recall_vs_ratio.png", records, summary, f"{task}: evidence recall vs compression")
    lines += _plot_lines(front)
    path = run_dir / "report.md"
    path.write_text("\n".join(lines))
    return path


def _header_lines(config: dict, clustered: bool = False) -> list[str]:
    """The report's title, the run's provenance (episodes, seed, filters, versions, CPUs) and how to read the
    table."""
    cfg, env, n = config["config"], config["environment"], len(config["episodes"])
    return [f"# Run report: task `{cfg['task']}`, model `{cfg['model']}`", "",
            f"{n} episodes ({_sample_note(cfg, n)}, filters {cfg['filters'] or 'none'}); "
            f"latentwire {env['latentwire']}{' @ ' + str(env['git'])[:10] if env.get('git') else ' (no git checkout)'}, "
            f"torch {env['torch']}, transformers "
            f"{env['transformers']}, {env['cpus']} CPUs, {env['torch_threads']} threads.", "",
            "Mean ± half-width of the 95% bootstrap CI" + (" (resampling whole clusters: the sets of documents "
                                                            "questions share)" if clustered else "")
            + ". Answer scores count episodes that failed with a typed "
            "error as 0; costs are over episodes that ran. TTEOA = slowest sender + receiver "
            "(senders in parallel).", ""]


def _sample_note(cfg: dict, listed: int) -> str:
    """How the episodes were chosen: the seed only where it drew a sample (`n`, and `listed` episodes ran: fewer than
    `n` means the task had no more, so every one ran); otherwise the seed chose nothing (a task file's own
    generation seed is not the run's)."""
    if cfg.get("n") is None or listed < cfg["n"]:
        return "every episode of the task"
    return f"a sample of {cfg['n']}, seed {cfg['seed']}"


def _summary_lines(summary: dict[str, dict]) -> list[str]:
    """The per-protocol table (header, then one row per protocol of `summarize`)."""
    held = any(row.get("tteoa_question_median") is not None for row in summary.values())
    extra = " median question-time TTEOA s |" if held else ""
    lines = ["| protocol | n | errors | " + " | ".join(h for _, h, _ in COLUMNS) + " | median TTEOA s |" + extra,
             "|---|---:|---:|" + "---:|" * (len(COLUMNS) + 1 + held)]
    for label, row in summary.items():
        cells = " | ".join(_cell(row[k], fmt) for k, _, fmt in COLUMNS)
        med = "—" if row["tteoa_median"] is None else f"{row['tteoa_median']:.2f}"
        q = row.get("tteoa_question_median")
        n_q = row.get("tteoa_question_n", row["n"])
        tail = (" — |" if q is None else f" {q:.2f}{f' (n = {n_q})' if n_q < row['n'] else ''} |") if held else ""
        lines.append(f"| `{label}` | {row['n']} | {row['errors']} | {cells} | {med} |{tail}")
    if held:
        lines += ["", "Question-time TTEOA: from the question's arrival for agents that already hold their documents "
                  "(each sender's seconds without its query-blind read: prefill and latent steps); — where the "
                  "protocol reads its documents with the question (text reports, query-aware reads)."]
    return lines


def _verdict_lines(records: list[dict], pairs: list[tuple[str, str]], clusters: dict[str, str] | None = None,
                   question_time: bool = False) -> list[str]:
    """The verdicts section for the pairs that share episodes, or nothing when none does."""
    comparisons = [c for c in (compare(records, a, b, clusters, question_time) for a, b in pairs) if c]
    if not comparisons:
        return []
    return ["", "Verdicts (paired, on the episodes both protocols ran): accuracy difference a − b with its "
            "95% paired bootstrap CI, exact p (the paired sign-flip test: McNemar's exact test on 0/1 scores, and it "
            "keeps partial credit), median of the per-episode TTEOA "
            "ratios a ÷ b with its 95% bootstrap CI."] + ([CLUSTER_NOTE] if clusters else []) + [""] \
        + verdict_table(comparisons)


CLUSTER_NOTE = ("Questions asked over the same documents are not independent: the accuracy CI and the exact p "
                "resample and sign-flip each set of documents as one pair (the mean over its questions); \"n (k "
                "sets)\" gives both counts.")


def _error_lines(records: list[dict]) -> list[str]:
    """The first 5 typed errors of the run as a list, or nothing when no episode failed."""
    errors = [r for r in records if r.get("error")]
    if not errors:
        return []
    return ["", "Errors (first 5):", ""] + [f"- `{r['protocol']}` on `{r['episode']}`: {r['error'][:200]}"
                                           for r in errors[:5]]


def _plot_lines(front: list[str]) -> list[str]:
    """The report's tail: the Pareto front's labels and the two plots' image links."""
    return ["", f"Pareto front (accuracy vs median TTEOA): {', '.join(f'`{a}`' for a in front) or '—'}", "",
            "![accuracy vs TTEOA](accuracy_vs_tteoa.png)", "", "![recall vs ratio](recall_vs_ratio.png)", ""]


def _tteoa_points(summary: dict[str, dict]) -> dict[str, tuple[float, float]]:
    """protocol -> (median TTEOA, mean accuracy), for the protocols that have both."""
    return {lab: (row["tteoa_median"], row["accuracy"][0]) for lab, row in summary.items()
            if row["tteoa_median"] is not None and row["accuracy"] is not None}


def _task_name(task: str) -> str:
    """The task as the plot titles name it: a .jsonl path's stem, else the shipped task's name."""
    return Path(task).stem if "/" in task or task.endswith(".jsonl") else task

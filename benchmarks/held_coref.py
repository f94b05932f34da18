"""Coreference from agents that hold their documents: the whole state against retrieval, timed from the question.

    python benchmarks/held_coref.py [--n 60] [--seed 2027] [--model qwen2.5-coder-0.5b] [--dtype D]
                                    [--out docs/results/held_coref] [--upto K] [--report-only]

Why: in the rival study (cold reads, seed 2026) full KV answered `coref` 0.63 against BM25 text 0.21 and dense text
0.24, and its receiver's median seconds (its whole question-time cost once the senders hold their states: it
attaches them and prefills only the question) were 3.2 against BM25's median TTEOA of 4.3 (means: 5.6 and 5.4, a
few long answers). That was read off records timed for another purpose, cold.
This study measures it as designed, on fresh episodes (`coref.generate(2027, n)`: neither the rival's seed nor the
dev seed 7), every protocol reading from held documents as in `stored_states.py` (`run_cell`: one HeldReads per
set of documents; the question-time TTEOA leaves each sender's query-blind read out, the cold TTEOA keeps it).

Fixed before any record: the protocols (`PROTOCOLS`), the family of paired verdicts (`FAMILY`, Holm over all of
them), n = 60 and the seed (60 episodes fit one session on 2 cores, ~1 min each; in the rival study full KV led
BM25 text by 42 pp on coref, which 60 paired episodes decide many times over, while a lead of ~10 pp, as full KV
over the probe there, would need several hundred). Contenders: full KV (the sender's whole state, attached),
CacheBack with the answer probe (the rival's coref setting) and the probe's draft as a BM25 query sent as spans
(the rival's best compressed message on coref); against retrieval from held documents (BM25 and the embedding model
at 8x, index built before the question), text reports from held documents and the full context. One question per
set of documents.

Output in `--out`: `coref/` (records, config, episodes, the bench report) and `README.md`: per protocol accuracy
[95% CI], median question-time TTEOA [95% CI] and cold TTEOA, median message bytes and receiver context, over the
episodes every protocol has finished (as `report.md`; costs over the records without an error); the verdicts
(exact paired p, Holm, question-time TTEOA ratios); where the question time goes. `--dtype` defaults to the
default placement (float32 on a CPU without native bf16, as this study's first run); one study holds one dtype.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from latent_vs_text import commands, ensure_episodes, log_command  # noqa: E402
from stored_states import check_study_dtype, document_sets, run_cell, set_accuracy, time_lines  # noqa: E402

from latentwire.agent import Agent  # noqa: E402
from latentwire.bench.folder import hardware, run_lock  # noqa: E402
from latentwire.bench.metrics import bootstrap_median_ci  # noqa: E402
from latentwire.bench.report import (PAIRING_NOTE, VERDICT_HEADER, compare, complete_episodes,  # noqa: E402
                                     holm_note, mixed_note, read_run, verdict, with_holm, write_report)
from latentwire.bench.tasks import coref  # noqa: E402
from latentwire.placement import dtype_name  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "results" / "held_coref"
CELL = "coref"
FULLKV, FULLCTX, TEXTH = "fullkv(latent_steps=8)", "fullcontext", "text(read='held')"
PROBE = "cacheback(ratio=8, probe=16)"
DRAFT = "cacheback_x(ratio=8, probe=16, selector='bm25', text_query='draft')"
BM25H, DENSEH = "retrieval(selector='bm25', read='held')", "retrieval(selector='dense', read='held')"
PROTOCOLS = [TEXTH, FULLKV, PROBE, DRAFT, BM25H, DENSEH, FULLCTX]
FAMILY = [(FULLKV, BM25H), (FULLKV, DENSEH), (FULLKV, TEXTH), (FULLKV, PROBE), (FULLKV, FULLCTX),
          (PROBE, BM25H), (DRAFT, BM25H), (DRAFT, DENSEH)]


def episodes(n: int, seed: int) -> list:
    """The study's episodes: a pure function of (n, seed), prefix-stable in n."""
    return coref.generate(seed, n)


def summary_lines(folder: Path, config: dict, records: list[dict]) -> list[str]:
    """Per protocol: accuracy [95% CI], median question-time and cold TTEOA [95% CI], bytes, receiver context."""
    sets = document_sets(folder)
    lines = ["| protocol | n | accuracy [95% CI] | median question-time TTEOA s [95% CI] | median cold TTEOA s | "
             "median message bytes | median receiver context |", "|---|---:|---|---|---:|---:|---:|"]
    for label in config["config"]["protocols"]:
        rs = [r for r in records if r["protocol"] == label]
        if not rs:
            continue
        ran = [r for r in rs if r.get("error") is None]  # an error scores 0 (accuracy) and has no costs
        q = [(r["tteoa_question"], sets[r["episode"]]) for r in ran if r.get("tteoa_question") is not None]
        qt = "{:.2f} [{:.2f}, {:.2f}]".format(*bootstrap_median_ci([t for t, _ in q], clusters=[s for _, s in q])) \
            if q else "—"
        med = lambda key, fmt: format(statistics.median(r[key] for r in ran), fmt) if ran else "—"  # noqa: E731
        lines.append(f"| `{label}` | {len(rs)} | {set_accuracy(rs, sets)} | {qt} | {med('tteoa', '.2f')} | "
                     f"{med('message_bytes', ',.0f')} | {med('receiver_context', ',.0f')} |")
    return lines


def finished_records(folder: Path) -> tuple[dict, list[dict]]:
    """The run's config and the records of the episodes every protocol has finished (`report.md` reads the same)."""
    config, records = read_run(folder)
    return config, complete_episodes(records, config["config"]["protocols"])


def write_index(out: Path, n: int, seed: int) -> None:
    folder = out / CELL
    config, records = finished_records(folder)
    comps = with_holm([c for a, b in FAMILY if (c := compare(records, a, b, None, True))])  # one question a set
    done = len({r["episode"] for r in records})
    hosts = sorted({hardware(env) for env in [config["environment"], *config.get("resumed", [])]})
    lines = ["# Coreference from agents that hold their documents", "",
             f"`coref` fan-in (3 senders, the entity named in one sentence and referred to by a pronoun or an alias "
             f"in the evidence), {config['config']['model']}, {config['config']['dtype']} on {', '.join(hosts)}; "
             f"{done} of {n} fresh episodes "
             f"(seed {seed}), one question per set of documents, every sender holding its document before the "
             "question. Question-time TTEOA leaves out each sender's query-blind read (prefill + 8 latent steps, "
             "or a retriever's index), cold TTEOA keeps it. Protocols, verdicts, n and seed were fixed before the "
             "first record (`benchmarks/held_coref.py`).", ""] + summary_lines(folder, config, records)
    lines += ["", "## Verdicts", "", VERDICT_HEADER[0], VERDICT_HEADER[1]] \
        + [verdict(c) for c in comps] + ["", holm_note(len(comps)), "", PAIRING_NOTE] + mixed_note(comps)
    lines += [""] + time_lines(out, [CELL])
    lines += ["", "Commands: `" + "`, then `".join(commands(folder)) + "`"]
    (out / "README.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--n", type=int, default=60)
    ap.add_argument("--seed", type=int, default=2027)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--upto", type=int, default=None, help="run only the first K episodes (resumable)")
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args()
    if args.n < 1 or (args.upto is not None and args.upto < 1):
        sys.exit(f"--n and --upto must be ≥ 1, got {args.n} and {args.upto}")
    folder = args.out / CELL
    if not args.report_only:
        folder.mkdir(parents=True, exist_ok=True)
        agent = Agent.from_pretrained(args.model, dtype=args.dtype)
        check_study_dtype(args.out, dtype_name(agent.dtype))
        eps = episodes(args.n, args.seed)
        with run_lock(folder):  # one run per folder
            ensure_episodes(folder / "episodes.jsonl", eps)
            log_command(folder, " ".join(["python benchmarks/held_coref.py"] + sys.argv[1:]))
            run_cell(agent, folder, [[e] for e in eps], args.model, PROTOCOLS, args.upto)
    if not (folder / "records.jsonl").exists():
        sys.exit(f"no records in {folder}: run without --report-only first")
    write_report(folder, FAMILY, None, question_time=True, complete=True)
    write_index(args.out, args.n, args.seed)


if __name__ == "__main__":
    main()

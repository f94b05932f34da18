"""Latent vs text, decided: fan-in end-to-end runs with paired verdicts, one cell per (task, length).

    python benchmarks/latent_vs_text.py [--model qwen2.5-0.5b] [--n 100] [--cells facts1_500,code1]
                                        [--protocols all|core|long] [--out docs/results/latent_vs_text]

Cells (each a fresh deterministic episode set written next to its records; 3 senders each):
    facts1_500, facts1_2000, facts1_4000   one-hop `facts`, each sender's document ≈ 500 / 2,000 / 4,000 tokens
    code1                                  single-scope `code` (documents are stdlib modules, ≈ 850-1,300 tokens)
    facts2_500, facts2_2000                two-hop `facts` (the hard row), ≈ 500 / 2,000 tokens
Every cell runs the same protocols (`PROTOCOLS`), episode by episode, each sender's state read once
and shared by every protocol that starts from it (each is charged that read's measured time). A cell
is resumable: re-running the command continues where it stopped. Each cell folder gets the runner's
report (with paired verdicts); `README.md` in the output folder collects the verdict rows of every cell.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

from latentwire.bench.episode import write_episodes
from latentwire.bench.report import (PAIRING_NOTE, VERDICT_HEADER, compare, default_pairs, mixed_note, read_run,
                                     verdict, with_holm, write_report)
from latentwire.bench.runner import RunConfig, run
from latentwire.bench.tasks import code, facts

OUT = Path(__file__).resolve().parents[1] / "docs" / "results" / "latent_vs_text"
RATIOS = (4, 8, 16, 32)
PROTOCOLS = {
    "all": ["alone", "fullcontext", "text"] + [f"text(ratio={r})" for r in RATIOS]
    + [f"fullkv(latent_steps={g}, query_aware={q})" for q in (False, True) for g in (0, 8)]
    + [f"cacheback(ratio={r}, latent_steps={g})" for g in (0, 8) for r in RATIOS]
    + ["cacheback(ratio=8, latent_steps=8, encoding='token_ids')"]
    + [f"latentmas_sequential(latent_steps=8, query_aware={q})" for q in (False, True)],
    # the verdict rows of the headline table, for a quicker pass
    "core": ["alone", "fullcontext", "text", "text(ratio=8)", "fullkv(latent_steps=8, query_aware=False)",
             "fullkv(latent_steps=8, query_aware=True)", "cacheback(ratio=8, latent_steps=8)",
             "cacheback(ratio=16, latent_steps=8)", "latentmas_sequential(latent_steps=8, query_aware=False)"],
}
# long documents (4,000 tokens): full KV only query-blind, no sequential chain (12,000-row caches are what they cost
# at 500 tokens, ×8), and CacheBack at 32× and without latent steps, where the crossover page puts its TTEOA gain
PROTOCOLS["long"] = ([p for p in PROTOCOLS["core"] if "query_aware=True" not in p and "latentmas" not in p]
                     + ["text(ratio=32)", "cacheback(ratio=32, latent_steps=8)", "cacheback(ratio=32, latent_steps=0)",
                        "cacheback(ratio=16, latent_steps=0)"])
CELLS = ("facts1_500", "facts1_2000", "facts1_4000", "code1", "facts2_500", "facts2_2000")
HEADLINE = [  # (a, b) rows of the summary table, when both ran
    ("cacheback(ratio=8, latent_steps=8)", "text(ratio=8)"), ("cacheback(ratio=8, latent_steps=8)", "text"),
    ("cacheback(ratio=16, latent_steps=8)", "text(ratio=16)"), ("cacheback(ratio=32, latent_steps=8)", "text(ratio=32)"),
    ("cacheback(ratio=32, latent_steps=0)", "text(ratio=32)"), ("cacheback(ratio=16, latent_steps=0)", "text"),
    ("cacheback(ratio=8, latent_steps=8)", "fullkv(latent_steps=8, query_aware=False)"),
    ("cacheback(ratio=8, latent_steps=8)", "fullcontext"),
    ("fullkv(latent_steps=8, query_aware=False)", "fullkv(latent_steps=8, query_aware=True)"),
    ("fullkv(latent_steps=8, query_aware=False)", "text"),
    ("cacheback(ratio=8, latent_steps=8)", "cacheback(ratio=8, latent_steps=0)"),
    ("cacheback(ratio=8, latent_steps=8, encoding='token_ids')", "cacheback(ratio=8, latent_steps=8)"),
    ("fullkv(latent_steps=8, query_aware=False)", "latentmas_sequential(latent_steps=8, query_aware=False)"),
]


def cell_episodes(cell: str, n: int, seed: int):
    """A cell's episodes: a pure function of (cell, n, seed)."""
    if cell == "code1":
        return code1_episodes(n, seed)
    kind, length = cell.split("_")
    return facts.episodes(seed, n, tokens=int(length), senders=3, hops=int(kind[-1]))


def code1_episodes(n: int, seed: int, block: int = 160, max_blocks: int = 20) -> list:
    """Single-scope `code` episodes, prefix-stable in n: block k is `code.generate(seed + k, n=block)`'s
    single-scope episodes in order, each question kept once (a later block's repeat of a question is
    skipped); episodes of block k ≥ 1 are renamed `code-b<k>-<i>` so ids stay unique."""
    out, seen = [], set()
    for k in range(max_blocks):
        for e in code.generate(seed + k, n=block):
            if e.meta["scope"] != "single" or e.question in seen:
                continue
            seen.add(e.question)
            out.append(e if k == 0 else dataclasses.replace(e, id=f"code-b{k}-{e.id.removeprefix('code-')}"))
            if len(out) == n:
                return out
    sys.exit(f"code1: {max_blocks} generator blocks gave {len(out)} distinct single-scope questions, fewer than "
             f"--n {n}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-0.5b")
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--cells", default=",".join(CELLS))
    ap.add_argument("--protocols", default="all", choices=sorted(PROTOCOLS))
    ap.add_argument("--dtype", default=None, help="default: latentwire's choice for this machine (bf16 here)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--report-only", action="store_true",
                    help="rewrite each --cells folder's report and the index from the records (no model loads)")
    args = ap.parse_args()
    cells = args.cells.split(",")
    unknown = sorted(set(cells) - set(CELLS))
    if unknown:
        sys.exit(f"unknown cells {unknown}; valid: {', '.join(CELLS)}")
    cmd = " ".join(["python benchmarks/latent_vs_text.py"] + sys.argv[1:])
    for cell in cells:
        folder = args.out / f"{cell}_{args.model}"
        if args.report_only:
            write_report(folder, cell_pairs(read_run(folder)[0]["config"]["protocols"]), complete=True)
            continue
        folder.mkdir(parents=True, exist_ok=True)
        task = folder / "episodes.jsonl"
        ensure_episodes(task, cell_episodes(cell, args.n, args.seed))
        print(f"== {cell}: {args.n} episodes, {len(PROTOCOLS[args.protocols])} protocols -> {folder}", flush=True)
        log_command(folder, cmd)  # before the run: an interrupted run resumes with it
        run(RunConfig(os.path.relpath(task), ",".join(PROTOCOLS[args.protocols]), args.model, dtype=args.dtype),
            folder)
        write_report(folder, cell_pairs(read_run(folder)[0]["config"]["protocols"]), complete=True)
    write_index(args.out)


def cell_pairs(protocols: dict[str, dict]) -> list[tuple[str, str]]:
    """A cell's verdicts, its Holm family: the report's default pairs, then the HEADLINE rows not among them
    (those whose protocols the cell ran). The cell's report and the index adjust over this same family, so a
    comparison has one Holm p wherever it is quoted, whatever other cells exist."""
    pairs = default_pairs(protocols)
    return pairs + [h for h in HEADLINE if h not in pairs and h[0] in protocols and h[1] in protocols]


def commands(folder: Path) -> list[str]:
    """Every command that added records to a cell, in the order they first ran (command.txt, one per line)."""
    path = folder / "command.txt"
    return [c for c in path.read_text().splitlines() if c.strip()] if path.exists() else []


def log_command(folder: Path, cmd: str) -> None:
    """Append `cmd` to the cell's command.txt unless it is there already (a resume of the same command)."""
    cmds = commands(folder)
    (folder / "command.txt").write_text("\n".join(cmds + ([cmd] if cmd not in cmds else [])) + "\n")


def ensure_episodes(task: Path, episodes: list) -> None:
    """Write the cell's episodes; a larger --n extends an existing file (the generators are prefix-stable, so
    the episodes already run keep their records), a smaller one keeps the file as it is."""
    have = task.read_text(encoding="utf-8").splitlines() if task.exists() else []
    want = [e.to_json() for e in episodes]
    if [json.loads(x) for x in have[:len(want)]] != [json.loads(x) for x in want[:len(have)]]:
        sys.exit(f"{task} holds other episodes than this cell's generator gives; use a new --out")
    if len(want) > len(have):
        write_episodes(task, episodes)


def write_index(out: Path) -> None:
    """README.md and verdicts.json over every cell folder in `out` (whichever command filled it)."""
    rows, progress = [], []
    for folder in sorted(p.parent for p in out.glob("*/records.jsonl")):
        config, records = read_run(folder)
        cell = folder.name
        done = {(r["episode"], r["protocol"]) for r in records}
        planned = config.get("episodes", [])
        complete = sum(all((e, p) in done for p in config["config"]["protocols"]) for e in planned)
        if complete < len(planned):
            progress.append(f"- {cell}: {complete} of {len(planned)} episodes complete (the command resumes)")
        ran = [(pair, c) for pair in cell_pairs(config["config"]["protocols"]) if (c := compare(records, *pair))]
        family = dict(zip([pair for pair, _ in ran], with_holm([c for _, c in ran])))  # as the cell's report
        for a, b in HEADLINE:
            if (a, b) in family:
                rows.append((cell, family[(a, b)], config["config"]["dtype"], "`, then `".join(commands(folder))))
    lines = ["# Latent vs text: paired verdicts per cell", "",
             "Accuracy difference a − b with its 95% paired bootstrap CI, exact McNemar p, median of the "
             "per-episode TTEOA ratios a ÷ b with its 95% bootstrap CI. Each cell's folder holds its episodes, "
             "config, records, full report, plots and the command that ran it.", "",
             "| cell " + VERDICT_HEADER[0], "|---" + VERDICT_HEADER[1]]
    comparisons = [c for _, c, _, _ in rows]
    lines += [f"| {cell} " + verdict(c) for cell, c, _, _ in rows]
    lines += ["", "Holm p: the McNemar p adjusted over the verdicts of the cell's own report (its family; the "
              "same Holm p is quoted there), so that \"Holm p ≤ 0.05\" keeps the chance of any false difference "
              "in that cell at most 5%.", "", PAIRING_NOTE] + mixed_note(comparisons)
    lines += ["", "Commands:", ""] + sorted({f"- {cell.rsplit('_', 1)[0]} ({dtype}): `{cmd}`"
                                             for cell, _, dtype, cmd in rows})
    lines += ["", "In progress:", ""] + progress if progress else []
    (out / "README.md").write_text("\n".join(lines) + "\n")
    (out / "verdicts.json").write_text(json.dumps([{"cell": cell, "dtype": dtype} | c for cell, c, dtype, _ in rows],
                                                  indent=2) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

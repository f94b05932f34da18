"""Re-score run folders' records from their stored answers under the current metrics (`bench/metrics.py`).

    python benchmarks/rescore.py docs/results/rival/code1 [more folders] [--check]
    python benchmarks/rescore.py --all --check        # every folder under docs/results that it can resolve

A record keeps the receiver's answer, so when scoring is corrected (code answers matched as code; hyphens,
Unicode punctuation and decimal points in text answers) every committed record can be scored again without a
model: em / f1 / accuracy / strict are recomputed against the folder's episodes (`episodes.jsonl` beside the
records, else config.json's `task`: a path or a shipped task name) with each episode's `answer_match`.
records.jsonl is rewritten whole; config.json gains a `rescored` entry (when, how many records changed, how
many of them in accuracy);
the folder's report must then be regenerated (its benchmark's `--report-only`). `--check` writes nothing
and exits 1 if any record would change. Folders whose episodes cannot be resolved, or none of whose records
name one of them (translator folders key theirs by `pair`), are listed as skipped. Never rescore a folder a
run is still writing: the run appends to the file this replaces.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

from latentwire.bench.episode import Episode, jsonl_lines, load_episodes
from latentwire.bench.folder import replace_text, run_lock
from latentwire.bench.metrics import answer_scores
from latentwire.bench.tasks import TASKS, load_task

ROOT = Path(__file__).resolve().parents[1]
FIELDS = ("em", "f1", "accuracy", "strict")


def folder_episodes(folder: Path) -> dict[str, Episode] | None:
    """The episodes a folder's records were scored against, by id; None if they cannot be resolved."""
    if (folder / "episodes.jsonl").exists():
        return {e.id: e for e in load_episodes(folder / "episodes.jsonl")}
    try:
        task = json.loads((folder / "config.json").read_text(encoding="utf-8"))["config"].get("task")
    except (OSError, KeyError, ValueError):
        return None
    if task in TASKS:
        return {e.id: e for e in load_task(task)}
    if isinstance(task, str) and (ROOT / task).is_file():
        return {e.id: e for e in load_episodes(ROOT / task)}
    return None


def same(a, b) -> bool:
    return a == b or (a is not None and b is not None and abs(a - b) <= 1e-12)


def rescore(folder: Path, write: bool) -> tuple[Counter, Counter] | None:
    """Per protocol, how many records' scores change and how many of those change accuracy (written back when
    `write`); None if the folder's episodes cannot be resolved."""
    episodes = folder_episodes(folder)
    if episodes is None:
        return None
    path = folder / "records.jsonl"
    lines, changed, accuracy, matched = [], Counter(), Counter(), 0
    for line in jsonl_lines(path.read_text(encoding="utf-8")):
        rec = json.loads(line)
        ep = episodes.get(rec.get("episode"))
        if ep is None or "answer" not in rec or rec.get("accuracy") is None or rec.get("error"):
            lines.append(line)  # not an answer record (or a failed one: it scored "" and still does)
            continue
        matched += 1
        new = answer_scores(rec["answer"], ep.answers, ep.answer_match)
        if not all(same(rec.get(k), new[k]) for k in FIELDS if k in rec):
            changed[rec.get("protocol", "?")] += 1
            accuracy[rec.get("protocol", "?")] += not same(rec["accuracy"], new["accuracy"])
            rec.update({k: new[k] for k in FIELDS if k in rec})
            line = json.dumps(rec, ensure_ascii=False)  # as the runners write them
        lines.append(line)
    if not matched and lines:  # records keyed otherwise (translator pairs by "pair"): not this script's to score
        return None
    if write and changed:
        replace_text(path, "".join(f"{ln}\n" for ln in lines))
        cfg_path = folder / "config.json"
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
        cfg.setdefault("rescored", []).append({"at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                               "changed": sum(changed.values()),
                                               "accuracy_changed": sum(accuracy.values())})
        replace_text(cfg_path, json.dumps(cfg, indent=2) + "\n")
    return changed, accuracy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="*", type=Path)
    ap.add_argument("--all", action="store_true", help="every folder with records.jsonl under docs/results")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if any record would change")
    args = ap.parse_args()
    folders = sorted({p.parent for p in (ROOT / "docs" / "results").rglob("records.jsonl")}) if args.all else []
    folders += [f.resolve() for f in args.folders]
    if not folders:
        ap.error("name folders or pass --all")
    total = total_acc = 0
    for folder in folders:
        if not (folder / "records.jsonl").exists():
            sys.exit(f"{folder}: no records.jsonl")
        if args.check:
            result = rescore(folder, write=False)
        else:
            with run_lock(folder):  # a run writing this folder would append to the file this replaces: refused
                result = rescore(folder, write=True)
        name = folder.relative_to(ROOT) if folder.is_relative_to(ROOT) else folder
        if result is None:
            print(f"{name}: skipped (its episodes cannot be resolved)")
        elif result[0]:
            changed, accuracy = result
            total, total_acc = total + sum(changed.values()), total_acc + sum(accuracy.values())
            print(f"{name}: {sum(changed.values())} records {'would change' if args.check else 'rescored'}, "
                  f"{sum(accuracy.values())} of them in accuracy")
            for protocol, k in changed.most_common():
                print(f"    {k:4d} ({accuracy[protocol]:3d} accuracy)  {protocol}")
    print(f"{total} records {'would change' if args.check else 'rescored'}, {total_acc} of them in accuracy")
    if args.check and total:
        sys.exit(1)


if __name__ == "__main__":
    main()

"""Write the shipped task files: `python tasks/generate.py [--check] [--only NAME ...]`.

Writes src/latentwire/bench/tasks/data/{aggregate,code,coref,facts,paraphrase,reasoning}.jsonl (package data,
located by `task_path`) from `latentwire.bench.tasks` (seed `SEED`). With --check it regenerates in memory and exits
1, naming the files, if any committed file differs (or is missing). Run it from a source checkout (editable install).
"""
from __future__ import annotations

import argparse
import sys

from latentwire.bench.tasks import SEED, TASKS, generate, task_path


NEWLINE = b"\n"


def render(name: str) -> bytes:
    return "".join(ep.to_json() + "\n" for ep in generate(name, SEED)).encode("utf-8")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed files; write nothing")
    ap.add_argument("--only", nargs="+", choices=sorted(TASKS), default=sorted(TASKS), metavar="NAME")
    args = ap.parse_args(argv)
    stale = []
    for name in args.only:
        path, data = task_path(name), render(name)
        if args.check:
            if not path.is_file() or path.read_bytes() != data:
                stale.append(str(path))
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        print(f"wrote {path} ({data.count(NEWLINE)} episodes, {len(data) / 1e6:.2f} MB)")
    if stale:
        print("stale task files (run `python tasks/generate.py`):\n  " + "\n  ".join(stale), file=sys.stderr)
        return 1
    if args.check:
        print(f"ok: {', '.join(args.only)} match a fresh generation")
    return 0


if __name__ == "__main__":
    sys.exit(main())

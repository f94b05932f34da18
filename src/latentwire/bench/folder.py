"""A run folder: one run writes it at a time, and what it holds survives a crash and a resume.

    runs/X/config.json      the resolved configuration and the environment of the first run, each resume's beside it
    runs/X/records.jsonl    one JSON record per line, appended as they are made
    runs/X/.lock            held (flock) by the run writing the folder; git ignores it

`open_run` holds a folder and reads it under the lock: the first run's config, refused if it ran with other
settings (`check_resume`), a last line cut short by a crash dropped (`drop_cut_lines`), and the records already
written (`finished`), so a resumed run skips them. `environment()` is what every run records about its machine.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import platform
import subprocess
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..errors import ConfigError
from ..placement import cpu_bf16_flags
from .episode import jsonl_lines

log = logging.getLogger(__name__)


def environment() -> dict:
    import torch
    import transformers

    from .. import __version__

    try:
        git = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        git = None
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    return {"latentwire": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "git": git, "machine": platform.machine(),
            "processor": platform.processor(), "cpu_model": cpu_model(), "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "cpu_bf16": list(cpu_bf16_flags()),
            "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "started": started, "run": f"{started}#{uuid.uuid4().hex[:6]}"}  # run: labels this invocation's records


def hardware(env: dict) -> str:
    """One run environment (`environment()`) in words: the CPU, and the GPU or the CPU's bf16 support."""
    if env.get("cuda"):
        return f"{env.get('cpu_model') or env.get('machine')}, CUDA {env['cuda']}"
    if "cpu_bf16" not in env:  # an environment recorded before the flags were
        return f"{env.get('cpu_model') or env.get('machine')}, bf16 support not recorded"
    flags = env["cpu_bf16"]
    return f"{env.get('cpu_model') or env.get('machine')}, " + (f"native bf16 ({', '.join(flags)})" if flags
                                                                 else "no native bf16")


def cpu_model() -> str | None:
    """The CPU's model name (Linux /proc/cpuinfo), so a record says which machine its timings come from."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    except OSError:
        return None


LOCK = ".lock"  # locked by the run writing a folder (`run_lock`); the file itself stays


@contextmanager
def run_lock(out_dir: Path) -> Iterator[None]:
    """Hold `out_dir` for one run: ConfigError, before anything is written, if another process is writing it (two
    runs appending to one records file would lose and duplicate records). The lock file stays (git ignores it):
    removing a file others may have opened would let two runs each lock a different one."""
    with open(out_dir / LOCK, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released when the file closes
        except BlockingIOError:
            f.seek(0)
            raise ConfigError(f"{out_dir} is being written by another run (pid {f.read().strip() or '?'}); wait for "
                              "it to end, or use another --out") from None
        except OSError as e:  # a filesystem without locks (some NFS and FUSE mounts): run, unguarded
            log.warning("cannot lock %s (%s): nothing stops a second run from writing it meanwhile", out_dir, e)
        else:  # the holder's pid, for the message a refused run prints
            f.seek(0)
            f.truncate()
            f.write(str(os.getpid()))
            f.flush()
        yield


@contextmanager
def open_run(out_dir: Path, cfg_path: Path, rec_path: Path, resolved: dict, keys: tuple[str, ...],
             key: str) -> Iterator[tuple[dict | None, set[tuple[str, str]]]]:
    """Hold `out_dir` for one run (`run_folder`) and read, under its lock, what the folder holds: (the first run's
    config record or None, the (record[key], protocol) pairs already recorded). ConfigError for an `out_dir` that is
    a file, or a folder whose run had other values of `keys` (`check_resume`)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"--out {out_dir} is a file; give a folder")
    with run_folder(out_dir, cfg_path, rec_path):
        first = check_resume(cfg_path, resolved, keys, rec_path)
        drop_cut_lines(rec_path)
        yield first, finished(rec_path, key)


@contextmanager
def run_folder(out_dir: Path, *files: Path) -> Iterator[Path]:
    """Create `out_dir` for a run and hold it (`run_lock`). If the run fails before its first record (the last of
    `files`, the records file, is missing or empty), the files and folder this run created are removed again;
    a run refused the lock removes nothing (the files are the other run's)."""
    created = [p for p in (out_dir, *files) if not p.exists()]
    out_dir.mkdir(parents=True, exist_ok=True)
    held = False
    try:
        with run_lock(out_dir):
            held = True
            yield out_dir
    except BaseException:
        records = files[-1] if files else None
        if held and (records is None or not records.exists() or records.stat().st_size == 0):
            for p in files:
                if p in created:
                    p.unlink(missing_ok=True)
            if out_dir in created:
                (out_dir / LOCK).unlink(missing_ok=True)
                if not any(out_dir.iterdir()):
                    out_dir.rmdir()
        raise


def check_resume(cfg_path: Path, resolved: dict, keys: tuple[str, ...], rec_path: Path | None = None) -> dict | None:
    """The folder's first config record, if any; ConfigError if it ran with other values of `keys`, or a protocol
    label with another value of a parameter both runs recorded (`runner.protocol_record`). A folder
    whose records file (`rec_path`, default records.jsonl beside the config) is missing or empty holds no run:
    its config is ignored (and overwritten), so a corrected command can reuse the folder."""
    rec_path = cfg_path.parent / "records.jsonl" if rec_path is None else rec_path
    has_records = rec_path.exists() and rec_path.stat().st_size > 0
    try:
        first = json.loads(cfg_path.read_text()) if cfg_path.exists() and has_records else None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{cfg_path} is not valid JSON ({e}) beside {rec_path.name}: the folder's run cannot be "
                          "resumed safely; use a new --out") from e
    if first and {k: first["config"].get(k) for k in keys} != {k: resolved[k] for k in keys}:
        differ = "; ".join(f"{k}: {first['config'].get(k)!r} there, {resolved[k]!r} now" for k in keys
                           if first["config"].get(k) != resolved[k])
        raise ConfigError(f"{cfg_path.parent} holds a run with another {'/'.join(keys)} ({differ}); use a new --out")
    for label, spec in (first["config"].get("protocols", {}) if first else {}).items():
        there, now = spec.get("parameters") or {}, resolved.get("protocols", {}).get(label, {}).get("parameters") or {}
        # a parameter on one side only (added to the protocol since, or removed) is not compared: a new field's
        # default keeps the old behaviour, which is the project's rule for adding one
        if differ := [f"{k}: {there[k]!r} there, {now[k]!r} now" for k in sorted(there.keys() & now.keys())
                      if there[k] != now[k]]:
            raise ConfigError(f"{cfg_path.parent}: protocol {label!r} ran with other parameters ({'; '.join(differ)}; "
                              "a default changed?); its records would mix two settings under one label: use a new "
                              "--out")
    return first


def write_config(cfg_path: Path, first: dict | None, resolved: dict, listing: dict) -> dict:
    """config.json: the resolved config and environment; resuming keeps the first run's environment and protocol
    entries, logs each resume's and adds new protocols (an entry written before entries held every parameter gains
    this run's, marked `parameters_since` with its run id: earlier records may have run with others). `listing`
    names what the run covers (episode / pair ids). Returns this invocation's environment, whose `run` id labels the
    records it writes."""
    env = environment()
    if first is None:
        record = {"config": resolved, "environment": env, "resumed": []}
    else:
        record = first | {"resumed": first.get("resumed", []) + [env]}
        had, now = first["config"]["protocols"], resolved["protocols"]
        kept = {}
        for label, spec in had.items():
            full = now.get(label, {}).get("parameters")
            kept[label] = (spec | {"parameters": full, "parameters_since": env["run"]}
                           if "parameters" not in spec and full is not None else spec)
        record["config"]["protocols"] = kept | {label: spec for label, spec in now.items() if label not in had}
    replace_text(cfg_path, json.dumps(record | listing, indent=2) + "\n")
    return env


def replace_text(path: Path, text: str) -> None:
    """Write `path` whole or not at all: a temporary file beside it, then renamed over it (a crash or a full disk
    midway leaves the old file as it was)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # gone already when the rename happened


def drop_cut_lines(rec_path: Path) -> None:
    """Rewrite a records file without a last line cut short by a crash (before a run appends to it again); a file
    with nothing to drop is left untouched. Any other line that does not parse is refused (ConfigError naming it),
    not dropped: a record is never lost silently."""
    if not rec_path.exists():
        return
    text = rec_path.read_text(encoding="utf-8")
    lines = jsonl_lines(text)
    if lines and parse_line(lines[-1]) is None:
        lines.pop()  # cut short by a crash (or written whole but torn): the run computes it again
    bad = next((n for n, line in enumerate(lines, 1) if parse_line(line) is None), None)
    if bad is not None:
        raise ConfigError(f"{rec_path}: line {bad} is not a JSON record (not a crash's cut last line: two runs "
                          "writing at once?); mend or remove it, then resume")
    kept = "".join(line + "\n" for line in lines)
    if kept != text:
        replace_text(rec_path, kept)


def finished(rec_path: Path, key: str) -> set[tuple[str, str]]:
    """(record[key], protocol) pairs already recorded (a line that does not parse is skipped; reads only)."""
    if not rec_path.exists():
        return set()
    return {(r[key], r["protocol"]) for line in jsonl_lines(rec_path.read_text(encoding="utf-8"))
            if (r := parse_line(line))}


def parse_line(line: str) -> dict | None:
    """One JSONL line's object, or None for a line that does not parse (cut short by a crash or still being written)."""
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return None

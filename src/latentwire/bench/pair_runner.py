"""Run pair protocols over split-evidence pairs: one JSONL record per pair × protocol, resumable.

    latentwire bench pair --sharer gemma3-270m --receiver smollm2-135m --task facts --n 20 \
        --protocols "alone,t2t,fullcontext,translated(checkpoint='runs/translators/xkv_gemma3-270m_smollm2-135m')"

`OUT/config.json` holds the resolved configuration (sharer, receiver, task, split, n, seed, protocols),
the environment, and every resume's environment; `OUT/records.jsonl` one record per (pair, protocol).
Re-running skips the records already written; another sharer/receiver/task/split/n/seed/placement is refused,
and so is a protocol label whose parameters changed in between (`folder.check_resume`).
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from ..agent import Agent
from ..errors import ConfigError, LatentWireError
from ..protocols.base import Outcome
from ..protocols.pair import PairProtocol, get_pair_protocol
from .metrics import answer_scores
from .episode import jsonl_lines
from .folder import open_run, write_config
from .runner import (UNRECOVERABLE, describe_protocols, memory_usage, parse_protocols, placement_record,
                     protocol_record)
from .tasks.pairs import Pair, pairs

RECORDS, CONFIG = "records.jsonl", "config.json"
_KEYS = ("sharer", "receiver", "task", "split", "n", "seed", "device", "dtype")


def run_pairs(sharer_name: str, receiver_name: str, task: str, protocols: str, n: int, out_dir: str | Path,
              seed: int = 0, split: str = "test", sharer: Agent | None = None, receiver: Agent | None = None,
              progress: bool = True, device: str | None = None, dtype: str | None = None) -> Path:
    """Run every protocol of `protocols` ("alone,translated(checkpoint='...')") on `n` pairs; returns out_dir.

    Protocols are parsed and built (checkpoints read) before any model loads, so a bad spec fails fast; the
    models load under the folder's lock before anything is written, and a run that fails before its first record
    leaves nothing behind. `sharer` / `receiver` override loading the named models (tests pass tiny agents)."""
    from tqdm import tqdm

    if n < 1:
        raise ConfigError(f"n must be ≥ 1, got {n}")
    specs = parse_protocols(protocols)
    built = {label: get_pair_protocol(name, **params) for label, (name, params) in specs.items()}
    todo_pairs = pairs(task, split, n, seed)
    config = {"sharer": sharer_name, "receiver": receiver_name, "task": task, "split": split, "n": n, "seed": seed,
              "protocols": {label: protocol_record(name, params, built[label]) for label, (name, params) in specs.items()}}
    config |= placement_record(device, dtype, receiver)
    out_dir = Path(out_dir)
    cfg_path, rec_path = out_dir / CONFIG, out_dir / RECORDS
    with open_run(out_dir, cfg_path, rec_path, config, _KEYS, "pair") as (first, done):
        if not all((p.id, label) in done for label in built for p in todo_pairs):  # before anything is written
            load = lambda name: Agent.from_pretrained(name, device=config["device"], dtype=config["dtype"])  # noqa: E731
            sharer = sharer or load(sharer_name)
            receiver = receiver or (sharer if receiver_name == sharer_name else load(receiver_name))
        if progress:
            print(describe_protocols(built), flush=True)
        run_id = write_config(cfg_path, first, config, {"pairs": [p.id for p in todo_pairs]})["run"]
        with rec_path.open("a", encoding="utf-8") as f:
            for label, protocol in built.items():
                todo = [p for p in todo_pairs if (p.id, label) not in done]
                for pair in tqdm(todo, desc=f"{label[:24]:>24}", disable=not progress):
                    rec = run_pair(protocol, label, pair, sharer, receiver) | {"run": run_id}
                    f.write(json.dumps(rec, ensure_ascii=False) + "\n")
                    f.flush()
    return out_dir


def run_pair(protocol: PairProtocol, label: str, pair: Pair, sharer: Agent, receiver: Agent) -> dict:
    """One record. A typed error (context overflow, geometry...) is recorded, scored 0, and the run goes on."""
    base = {"pair": pair.id, "task": pair.task, "protocol": label}
    try:
        out = protocol.run(sharer, receiver, pair.sharer_doc, pair.receiver_doc, pair.question)
        rec = base | _scored(out, pair)
    except UNRECOVERABLE:  # a missing model or extra, a broken translator checkpoint: every pair would fail alike
        raise
    except LatentWireError as e:
        rec = base | {"answer": "", **answer_scores("", list(pair.answers)), "tteoa": None, "ttft": None,
                      "sender_seconds": [],
                      "receiver_seconds": None, "message_bytes": None, "receiver_context": None, "details": {},
                      "error": f"{type(e).__name__}: {e}"}
    return rec | memory_usage()


def _scored(out: Outcome, pair: Pair) -> dict:
    return {"answer": out.answer, **answer_scores(out.answer, list(pair.answers)), "tteoa": out.tteoa, "ttft": out.ttft,
            "sender_seconds": list(out.sender_seconds), "receiver_seconds": out.receiver_seconds,
            "message_bytes": out.message_bytes, "receiver_context": out.receiver_context, "details": out.details,
            "error": None}


def read_records(out_dir: str | Path) -> list[dict]:
    path = Path(out_dir) / RECORDS
    return [json.loads(line) for line in jsonl_lines(path.read_text(encoding="utf-8"))]


def summarize_pairs(records: list[dict]) -> list[dict]:
    """Per protocol (first-seen order): n, errors, mean accuracy / EM / F1 (errors count as 0), median
    TTEOA, message bytes and translator ms over the records that ran, and the translator's parameters."""
    groups: dict[str, list[dict]] = {}
    for r in records:
        groups.setdefault(r["protocol"], []).append(r)
    rows = []
    for label, rs in groups.items():
        ok = [r for r in rs if r.get("error") is None]
        ms = [r["details"]["translator_ms"] for r in ok if "translator_ms" in r.get("details", {})]
        params = {r["details"]["parameters"] for r in ok if "parameters" in r.get("details", {})}
        rows.append({"protocol": label, "n": len(rs), "errors": len(rs) - len(ok),
                     "accuracy": _mean(r["accuracy"] for r in rs), "em": _mean(r["em"] for r in rs),
                     "f1": _mean(r["f1"] for r in rs), "tteoa": _median(r["tteoa"] for r in ok),
                     "message_bytes": _median(r["message_bytes"] for r in ok), "translator_ms": _median(ms),
                     "parameters": params.pop() if len(params) == 1 else None})
    return rows


def _mean(xs) -> float | None:
    xs = [float(x) for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _median(xs) -> float | None:
    xs = [float(x) for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def format_table(rows: list[dict]) -> str:
    """A markdown table of `summarize_pairs` rows."""
    head = ["protocol", "n", "errors", "accuracy", "EM", "F1", "TTEOA s (median)", "message bytes",
            "translator ms", "parameters"]

    def num(x, fmt):
        return "–" if x is None else format(x, fmt)

    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" if i == 0 else "---:" for i in range(len(head))) + "|"]
    for r in rows:
        cells = [r["protocol"].replace("|", "\\|"), str(r["n"]), str(r["errors"]), num(r["accuracy"], ".3f"),
                 num(r["em"], ".3f"), num(r["f1"], ".3f"), num(r["tteoa"], ".3f"), num(r["message_bytes"], ",.0f"),
                 num(r["translator_ms"], ".2f"), num(r["parameters"], ",d")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)

"""Run protocols over a task's episodes: one JSONL record per episode × protocol, resumable.

    latentwire bench run --task facts --protocols text,fullkv(latent_steps=8) --model smollm2-135m --n 20 --out runs/X

`runs/X/records.jsonl` gets one record per (episode, protocol), `runs/X/config.json` the resolved configuration
(the folder's mechanics, resuming included, are `folder.py`'s). Re-running the same command skips the records
already written; a different configuration in the same folder is refused. Everything (protocols,
their parameters, the task, the placement, the model) is validated before the folder is created, and a run
that fails before its first record leaves no folder or config.json behind.
"""
from __future__ import annotations

import ast
import json
import math
import os
import random
import re
import resource
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from ..agent import Agent
from ..errors import CheckpointError, ConfigError, LatentWireError, MissingExtraError, ModelNotFoundError
from ..message import merge_spans
from ..placement import dtype_name, resolve
from ..protocols import Outcome, Protocol, get_protocol
from ..protocols.reads import shared_reads
from ..protocols.stages import Stage, parse_value, to_flat
from .episode import Episode, load_episodes, span_token_positions
from .folder import check_episodes, episode_hashes, open_run, write_config
from .metrics import answer_scores, evidence_recall

_SPEC = re.compile(r"^\s*([\w.-]+)\s*(?:\((.*)\))?\s*$", re.DOTALL)


def parse_protocols(text: str) -> dict[str, tuple[str, dict]]:
    """'text,fullkv(latent_steps=8)' -> {label: (name, params)}; values are Python literals. ConfigError for anything
    it cannot read whole: unbalanced parentheses, a call of a call, a parameter or a protocol given twice."""
    out, depth, cur, quote, escaped = {}, 0, "", None, False
    for ch in text + ",":
        if quote:  # inside a string literal: parentheses and commas are its text
            quote = None if ch == quote and not escaped else quote
            escaped = ch == "\\" and not escaped  # '\\' is one backslash: the quote after it closes
        elif ch in "'\"":
            quote = ch
        elif ch == "," and depth == 0:
            if cur.strip():
                label, spec = _parse_one(cur.strip())
                if label in out:
                    raise ConfigError(f"protocol {label!r} is given twice in {text!r}")
                out[label] = spec
            cur = ""
            continue
        else:
            depth += (ch == "(") - (ch == ")")
            if depth < 0:
                raise ConfigError(f"bad protocol spec {(cur + ch).strip()!r}: a ')' closes nothing")
        cur += ch
    if quote:
        raise ConfigError(f"bad protocol spec {cur[:-1].strip()!r}: a string is never closed")
    if depth:  # the loop's closing "," went into the open spec: leave it out of the message
        raise ConfigError(f"bad protocol spec {cur[:-1].strip()!r}: a '(' is never closed")
    if not out:
        raise ConfigError(f"no protocol in {text!r}; want e.g. 'text,cacheback(ratio=8)'")
    return out


def _parse_one(spec: str) -> tuple[str, tuple[str, dict]]:
    """'name(key=value, ...)' -> (label, (name, params))."""
    m = _SPEC.match(spec)
    if not m:
        raise ConfigError(f"bad protocol spec {spec!r}; want name or name(key=value, ...)")
    name, args = m.group(1), m.group(2)
    params = {}
    if args and args.strip():
        try:
            call = ast.parse(f"f({args})", mode="eval").body
        except SyntaxError as e:
            raise ConfigError(f"protocol spec {spec!r}: {e.msg}") from e
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)):
            raise ConfigError(f"bad protocol spec {spec!r}; want name or name(key=value, ...)")
        if call.args or any(kw.arg is None for kw in call.keywords):
            raise ConfigError(f"protocol spec {spec!r}: parameters must be key=value")
        names = [kw.arg for kw in call.keywords]
        if twice := sorted({k for k in names if names.count(k) > 1}):
            raise ConfigError(f"protocol spec {spec!r}: {', '.join(twice)} given twice")
        for kw in call.keywords:
            try:
                params[kw.arg] = parse_value(kw.value)  # a literal, or a stage: score=probe(16)
            except (ValueError, TypeError, RecursionError) as e:  # TypeError: an unhashable key, {[1]: 2}
                if isinstance(e, LatentWireError):  # a stage's own typed error, naming the stage
                    raise
                raise ConfigError(f"protocol spec {spec!r}: {kw.arg}={ast.unparse(kw.value)} is not a Python literal "
                                  "(a number, string, bool, None, list, tuple or dict; quote strings) or a stage "
                                  "(e.g. probe(16))") from e
    label = name if not params else f"{name}({', '.join(f'{k}={v!r}' for k, v in params.items())})"
    return label, (name, params)


@dataclass
class RunConfig:
    task: str  # a shipped task name or a path to a JSONL file
    protocols: str  # e.g. "text,fullkv(latent_steps=8)"
    model: str = "smollm2-135m"
    n: int | None = None  # episodes (a seeded sample, the same for every protocol); None = all
    seed: int = 0
    filters: dict = field(default_factory=dict)  # meta key -> required value, e.g. {"hops": 2}
    device: str | None = None  # None = placement.resolve's default (CUDA if available, else CPU)
    dtype: str | None = None  # None = bf16 where the device runs it natively, else fp32

    def resolved(self, agent: Agent | None = None) -> dict:
        """The config with protocols parsed and built (`protocol_record`: an unknown name or a bad value is refused
        here) and device/dtype as they will run (the given agent's, if any)."""
        d = asdict(self)
        d["protocols"] = {label: protocol_record(n, p, get_protocol(n, **p))
                          for label, (n, p) in parse_protocols(self.protocols).items()}
        return d | placement_record(self.device, self.dtype, agent)


def protocol_record(name: str, params: dict, protocol) -> dict:
    """A protocol as config.json records it: the spec as given and every parameter of the protocol itself, defaults
    included, so that resuming after a default changed is refused instead of mixing two settings under one label.
    Not covered: the defaults of a selector it builds by name, and what a file it names holds; a value JSON cannot
    hold is recorded by its type (a path as its text)."""
    full = json.dumps(protocol_parameters(protocol),
                      default=lambda v: os.fspath(v) if isinstance(v, os.PathLike) else f"<{type(v).__name__}>")
    return {"name": name, "params": params, "parameters": json.loads(full)}


def placement_record(device, dtype, agent: Agent | None = None) -> dict:
    """{"device", "dtype", "placement"}: what a run uses; validated (DeviceError) before anything loads."""
    if agent is not None:
        return {"device": str(agent.device), "dtype": dtype_name(agent.dtype), "placement": "agent given"}
    place = resolve(device, dtype)
    return {"device": str(place.device), "dtype": dtype_name(place.dtype), "placement": place.reason}


def parse_filters(items: list[str], what: str = "filter") -> dict:
    """['hops=2', 'kind=x'] -> {'hops': 2, 'kind': 'x'}: values are JSON (numbers, true/false), else strings."""
    filters = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ConfigError(f"bad {what} {item!r}; want KEY=VALUE")
        try:
            filters[key] = json.loads(value, parse_constant=_no_constant, parse_float=_finite)
        except json.JSONDecodeError:
            filters[key] = value
        except ValueError as e:
            raise ConfigError(f"bad {what} {item!r}: {e}") from e
    return filters


def _no_constant(name: str):
    raise ValueError(f"{name} is not a finite number")


def _finite(text: str) -> float:
    if not math.isfinite(value := float(text)):
        raise ValueError(f"{text} is not a finite number")
    return value


def select_episodes(episodes: list[Episode], n: int | None, seed: int, filters: dict) -> list[Episode]:
    eps = [e for e in episodes if all(e.meta.get(k) == v for k, v in filters.items())]
    if n is not None and n < len(eps):
        eps = sorted(random.Random(seed).sample(eps, n), key=lambda e: e.id)
    return eps


def load_task_episodes(task: str) -> list[Episode]:
    """A shipped task by name, or a JSONL task file; a missing file or unknown name names the fix."""
    if task.endswith(".jsonl") or os.sep in task:
        if not Path(task).is_file():
            from .tasks import TASKS

            raise ConfigError(f"task file {task!r} does not exist; give a JSONL task file or a shipped task "
                              f"({', '.join(TASKS)})")
        return load_episodes(task)
    from .tasks import load_task

    return load_task(task)


def score(ep: Episode, label: str, out: Outcome, tokenizer) -> dict:
    rec = {"episode": ep.id, "protocol": label, "answer": out.answer,
           **answer_scores(out.answer, ep.answers, ep.answer_match),
           "message_bytes": out.message_bytes, "receiver_context": out.receiver_context,
           "sender_seconds": list(out.sender_seconds), "receiver_seconds": out.receiver_seconds,
           "tteoa": out.tteoa, "tteoa_question": out.question_tteoa, "ttft": out.ttft, "evidence_recall": None,
           "compression_ratio": None, "error": None, "meta": ep.meta, "details": out.details}
    if out.kept_spans is not None:  # both sides mapped to the tokens of each context alone
        gold, kept, total = [], [], 0
        for agent, (context, keep) in enumerate(zip(ep.contexts, out.kept_spans)):
            spans = [(s.start, s.end) for s in ep.evidence if s.agent == agent]
            gold += [(agent, p) for p in span_token_positions(context, spans, tokenizer)]
            kept += [(agent, p) for p in span_token_positions(context, keep, tokenizer)]
            total += len(tokenizer(context, add_special_tokens=False)["input_ids"])
        rec["evidence_recall"] = evidence_recall(gold, kept)
        rec["compression_ratio"] = total / max(1, len(kept))
        # the character spans of each context that the message kept: what was sent, readable from episodes.jsonl
        rec["kept_spans"] = [[[a, b] for a, b in merge_spans(keep)] for keep in out.kept_spans]
    return rec


def memory_usage() -> dict:
    """What every record carries about the process's memory and the machine's load when it closed."""
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    with open("/proc/self/statm") as f:
        rss_mb = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    # load_1min: the machine's 1-minute load average when the record closed; above the core count, other work
    # shared the cores and this record's seconds are inflated (reports can flag or drop such records)
    return {"rss_mb": round(rss_mb, 1), "peak_rss_mb": round(peak_mb, 1), "load_1min": round(os.getloadavg()[0], 2)}


def run(config: RunConfig, out_dir: str | Path, progress: bool = True, agent: Agent | None = None) -> Path:
    """Run (or resume) `config` into `out_dir`. Protocol specs and parameters, task file and placement are
    validated before `out_dir` is created, the folder's earlier run and the model before anything is written;
    a run that fails before its first record leaves nothing behind, so the corrected command starts afresh.
    `progress`: a progress bar and, first, every protocol's full parameter set."""
    from tqdm import tqdm

    out_dir = Path(out_dir)
    if config.n is not None and config.n < 1:
        raise ConfigError(f"n must be ≥ 1, got {config.n}")
    resolved = config.resolved(agent)
    cfg_path, rec_path = out_dir / "config.json", out_dir / "records.jsonl"
    protocols = {label: get_protocol(spec["name"], **spec["params"]) for label, spec in resolved["protocols"].items()}
    episodes = select_episodes(load_task_episodes(config.task), config.n, config.seed, config.filters)
    if not episodes:
        raise ConfigError(f"no episode of task {config.task!r} matches the filters {config.filters}")
    keys = ("task", "model", "n", "seed", "filters", "device", "dtype")
    hashes = episode_hashes(episodes)
    with open_run(out_dir, cfg_path, rec_path, resolved, keys, "episode") as (first, done):
        check_episodes(first, hashes, out_dir)
        todo = [e for e in episodes if any((e.id, label) not in done for label in protocols)]
        if todo and agent is None:
            agent = Agent.from_pretrained(config.model, device=resolved["device"], dtype=resolved["dtype"])
        if progress:
            print(describe_protocols(protocols), flush=True)
        run_id = write_config(cfg_path, first, resolved, {"episodes": [e.id for e in episodes],
                                                          "episode_sha256": hashes})["run"]
        with rec_path.open("a", encoding="utf-8") as f:
            # Episode by episode: inside one episode every protocol shares each sender's read (`shared_reads`).
            for ep in tqdm(todo, desc=f"{len(protocols)} protocols", disable=not progress):
                with shared_reads():
                    for label, protocol in protocols.items():
                        if (ep.id, label) not in done:
                            rec = run_episode(protocol, label, ep, agent) | {"run": run_id}
                            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
                            f.flush()
    return out_dir


def protocol_parameters(protocol) -> dict:
    """Every parameter of a protocol (dataclass fields), defaults included; a staged protocol's stages as the flat
    keywords they stand for where they can be (`to_flat`: a folder written before stages compares alike)."""
    params = {f.name: getattr(protocol, f.name) for f in fields(protocol) if f.init and not f.name.startswith("_")}
    staged = {k: v for k, v in params.items() if isinstance(v, Stage)}
    return {k: v for k, v in params.items() if k not in staged} | (to_flat(protocol) if staged else {})


def describe_protocols(protocols: dict) -> str:
    """One line per protocol label: its name and full parameter set, as the run will use them."""
    lines = ["protocols (every parameter, defaults included):"]
    for label, p in protocols.items():
        params = ", ".join(f"{k}={v!r}" for k, v in protocol_parameters(p).items())
        lines.append(f"  {label}: {p.name}({params})")
    return "\n".join(lines)


UNRECOVERABLE = (ModelNotFoundError, MissingExtraError, CheckpointError)  # raised, not recorded: every one would fail


def run_episode(protocol: Protocol, label: str, ep: Episode, agent: Agent) -> dict:
    """One record. A typed error (context overflow, geometry...) is recorded, scored 0, and the run goes on."""
    try:
        out = protocol.run([agent] * len(ep.contexts), list(ep.contexts), agent, ep.question)
        rec = score(ep, label, out, agent.tokenizer)
    except UNRECOVERABLE:  # the machine lacks a model or an extra, or a checkpoint is broken: no episode can run
        raise
    except LatentWireError as e:
        rec = {"episode": ep.id, "protocol": label, "answer": "", **answer_scores("", ep.answers, ep.answer_match),
               "message_bytes": None, "receiver_context": None, "sender_seconds": [], "receiver_seconds": None,
               "tteoa": None, "tteoa_question": None, "ttft": None, "evidence_recall": None, "compression_ratio": None,
               "error": f"{type(e).__name__}: {e}", "meta": ep.meta}
    return rec | memory_usage()

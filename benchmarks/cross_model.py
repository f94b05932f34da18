"""Cross-model CacheBack: cheap readers select, a different model answers; paired verdicts per (task, pair).

    python benchmarks/cross_model.py [--n 100] [--tasks facts1,code1] [--ratios 8,16]
        [--pairs smollm2-135m:qwen2.5-coder-0.5b,gemma3-270m:qwen2.5-coder-0.5b,qwen2.5-coder-0.5b:smollm2-135m]
        [--latent-maps runs/latent_maps] [--translators runs/translators] [--sender-steps 0]
        [--dtype float32] [--out docs/results/cross_model]

Per task (fan-in of 3; `facts1` = one-hop facts with ≈ 500-token documents, `code1` = single-scope code,
the same generators and seed as benchmarks/latent_vs_text.py) and per ordered pair A:B (senders A,
receiver B), every episode runs, each labelled "A→B protocol":

    cacheback_x(ratio=r)                            A selects as CacheBack does, B reads the spans' text
    cacheback_x(ratio=r, delivery='spans+latent')   + A's 8 latent rows mapped into B (when --latent-maps
                                                    holds <A>_<B>/, written by benchmarks/fit_latent_map.py)
    cacheback_x(ratio=r, delivery='translated')     A's selected rows' K/V through a trained dense translator
                                                    (when --translators holds dense_<A>_<B>/, written by
                                                    benchmarks/train_translators.py --methods dense)
    cacheback_x(ratio=r, latent_steps=G)            spans from senders that think G steps, not 8, before
                                                    scoring (--sender-steps G; G = 0: a prefill-only read)
    text(ratio=r)                                   reports written by A at the same size, read by B
and once per receiver B ("B→B ..."): alone, fullcontext, same-model cacheback(ratio=r, latent_steps=8).
Every other CacheBack row reads with G = 8 (CacheBack's default), so senders read once per (episode, model, G;
the prefill is shared across G) and every protocol is charged its read (`shared_reads`); spans vs spans+latent
differ only in the latent rows.
Each task folder gets records.jsonl, config.json, report.md (paired verdicts: accuracy difference with a
95% paired bootstrap CI, exact McNemar p, median TTEOA ratio; per pair, the dtype and machines its rows ran
in), and the command. Resumable, and a folder may grow by pairs: each row records its dtype, and a run is
refused only where one pair's verdicts would compare rows of different dtypes.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from latent_vs_text import cell_episodes, commands, ensure_episodes, log_command  # noqa: E402  (its episodes, logs)

from latentwire.agent import Agent  # noqa: E402
from latentwire.bench.report import compare, verdict_table  # noqa: E402
from latentwire.bench.episode import jsonl_lines  # noqa: E402
from latentwire.bench.folder import drop_cut_lines, environment, finished, hardware  # noqa: E402
from latentwire.bench.runner import run_episode  # noqa: E402
from latentwire.errors import LatentWireError  # noqa: E402
from latentwire.protocols import get_protocol  # noqa: E402
from latentwire.protocols.cacheback_x import CacheBackX  # noqa: E402
from latentwire.protocols.reads import shared_reads  # noqa: E402
from latentwire.translate.latent_map import LatentMap  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "results" / "cross_model"
TASKS = {"facts1": "facts1_500", "code1": "code1"}
PAIRS = "smollm2-135m:qwen2.5-coder-0.5b,gemma3-270m:qwen2.5-coder-0.5b,qwen2.5-coder-0.5b:smollm2-135m"


class Mixed:
    """A protocol run with senders of one model and a receiver of another (runner.run_episode's agent slot)."""

    def __init__(self, protocol, sender: Agent, receiver: Agent):
        self.protocol, self.sender, self.receiver = protocol, sender, receiver

    def run(self, senders, documents, receiver, question):
        return self.protocol.run([self.sender] * len(documents), documents, self.receiver, question)


def plan(pairs: list[tuple[str, str]], ratios: list[int], maps: Path | None,
         translators: Path | None = None, extra_steps: tuple[int, ...] = ()) -> list[tuple[str, str, str, dict]]:
    """(label, sender, receiver, protocol spec) rows, in run order. `extra_steps`: further spans rows whose
    senders think G of these latent steps instead of 8 before scoring (G = 0: prefill only, the cheapest read;
    spans drop latent rows, so G acts only through the query's view of the thought-through cache)."""
    rows = []
    for b in dict.fromkeys(r for _, r in pairs):  # receivers' own references
        rows += [(f"{b}→{b} alone", b, b, {"name": "alone"}), (f"{b}→{b} fullcontext", b, b, {"name": "fullcontext"})]
        rows += [(f"{b}→{b} cacheback(ratio={r})", b, b, {"name": "cacheback", "ratio": r, "latent_steps": 8})
                 for r in ratios]
    for a, b in pairs:
        for r in ratios:
            rows.append((f"{a}→{b} cacheback_x(ratio={r})", a, b, {"name": "cacheback_x", "ratio": r, "latent_steps": 8}))
            rows += [(f"{a}→{b} cacheback_x(ratio={r}, latent_steps={g})", a, b,
                      {"name": "cacheback_x", "ratio": r, "latent_steps": g}) for g in extra_steps if g != 8]
            fitted = maps / f"{a}_{b}" if maps else None
            if fitted and (fitted / "latent_map.json").exists():
                rows.append((f"{a}→{b} cacheback_x(ratio={r}, delivery='spans+latent')", a, b,
                             {"name": "cacheback_x", "ratio": r, "latent_steps": 8, "delivery": "spans+latent",
                              "latent_map": str(fitted)}))
            trained = translators / f"dense_{a}_{b}" if translators else None
            if trained and (trained / "config.json").exists():
                rows.append((f"{a}→{b} cacheback_x(ratio={r}, delivery='translated')", a, b,
                             {"name": "cacheback_x", "ratio": r, "latent_steps": 8, "delivery": "translated",
                              "translator": str(trained)}))
            rows.append((f"{a}→{b} text(ratio={r})", a, b, {"name": "text", "ratio": r}))
    return rows


def recorded(spec: dict) -> dict:
    """A protocol spec as the committed config records it: a latent map or translator inside the repository by its
    relative path."""
    out = dict(spec)
    for key in ("latent_map", "translator"):
        folder = Path(spec.get(key, ""))
        if folder.is_relative_to(ROOT):  # False for a relative path or one outside the repository
            out[key] = str(folder.relative_to(ROOT))
    return out


def check_maps(rows, agents: dict[str, Agent]) -> dict[str, dict]:
    """Every latent map the plan uses, loaded and checked against its sender and receiver models and the
    senders' latent mode (exit naming both models otherwise); returns each map's identity (SHA-256 of its
    weights and its fit header), which a resumed folder must match."""
    out = {}
    for _, a, b, spec in rows:
        if "latent_map" not in spec or f"{a}_{b}" in out:
            continue
        folder = Path(spec["latent_map"])
        try:
            m = LatentMap.load(folder, expect=(agents[a], agents[b]))
        except LatentWireError as e:
            sys.exit(f"{folder}: {e}")
        mode = spec.get("latent_mode", CacheBackX.latent_mode)  # the protocol's own check would not name the models
        if m.latent_mode != mode:
            sys.exit(f"{folder}: fitted on {m.latent_mode!r} latent rows of {a}, but {a}'s senders think with {mode!r}")
        header = json.loads((folder / "latent_map.json").read_text())
        out[f"{a}_{b}"] = {"sha256": hashlib.sha256((folder / "latent_map.safetensors").read_bytes()).hexdigest(),
                           **{k: header[k] for k in ("ridge", "samples", "texts", "latent_mode", "shift")}}
    return out


def check_translators(rows, agents: dict[str, Agent]) -> dict[str, dict]:
    """Every translator the plan uses, loaded and checked against its sender and receiver models and for
    context-unaware use (exit naming both models otherwise); returns each one's identity (SHA-256 of its
    weights, its training step), which a resumed folder must match."""
    from latentwire.translate import load

    out = {}
    for _, a, b, spec in rows:
        if "translator" not in spec or f"{a}_{b}" in out:
            continue
        folder = Path(spec["translator"])
        try:
            t = load(folder)
            t.check_pair(agents[a].geometry, agents[b].geometry)
            t.check_mode(False)
        except LatentWireError as e:
            sys.exit(f"{folder}: {e}")
        header = json.loads((folder / "config.json").read_text())
        out[f"{a}_{b}"] = {"sha256": hashlib.sha256((folder / "translator.safetensors").read_bytes()).hexdigest(),
                           "method": header["method"], "step": header.get("step")}
    return out


def verdict_pairs(pairs: list[tuple[str, str]], ratios: list[int], labels: set[str]) -> list[tuple[str, str]]:
    out = []
    for a, b in pairs:
        for r in ratios:
            x = f"{a}→{b} cacheback_x(ratio={r})"
            for y in (f"{b}→{b} alone", f"{a}→{b} text(ratio={r})", f"{b}→{b} cacheback(ratio={r})",
                      f"{b}→{b} fullcontext", f"{a}→{b} cacheback_x(ratio={r}, delivery='spans+latent')",
                      f"{a}→{b} cacheback_x(ratio={r}, delivery='translated')"):
                if y in labels:
                    out.append((y, x) if "delivery=" in y else (x, y))
            for v in sorted(lab for lab in labels if lab.startswith(f"{a}→{b} cacheback_x(ratio={r}, latent_steps=")):
                out += [(v, y) for y in (x, f"{b}→{b} cacheback(ratio={r})") if y in labels]  # G vs 8; vs b's own
    return out


def joint(a: str, b: str) -> str:
    """A row's dtype from its sender's and receiver's: one name, or "sender→receiver" when they differ."""
    return a if a == b else f"{a}→{b}"


def row_dtypes(config: dict) -> dict[str, str]:
    """Each protocol row's dtype: its own entry, or in a folder written before rows recorded one (one dtype per
    model then, in config["dtype"]) its sender's and receiver's."""
    return {label: p.get("dtype") or joint(config["dtype"][p["sender"]], config["dtype"][p["receiver"]])
            for label, p in config["protocols"].items()}


def comparison_groups(pairs, ratios, labels: set[str]) -> dict[tuple[str, str], set[str]]:
    """Per pair, every row its verdicts read: the pair's own rows and its receiver's references."""
    return {(a, b): {x for v in verdict_pairs([(a, b)], ratios, labels) for x in v} for a, b in pairs}


def dtype_clashes(recorded: dict[str, str], planned: dict[str, str], pairs, ratios) -> list[str]:
    """One line per pair whose verdicts would compare rows of different dtypes, from the rows the folder holds
    records of (label → dtype) and the rows this run would add. Pairs that share no row are free to differ:
    a pair's paired verdicts only ever read its own rows and its receiver's references."""
    out = []
    for (a, b), group in comparison_groups(pairs, ratios, set(recorded) | set(planned)).items():
        seen: dict[str, list[str]] = {}
        for lab in sorted(group):
            for d in sorted({recorded.get(lab), planned.get(lab)} - {None}):
                seen.setdefault(d, []).append(f"`{lab}`" + (" (recorded)" if recorded.get(lab) == d else ""))
        if len(seen) > 1:
            out.append(f"{a}→{b}: " + "; ".join(f"{d}: {', '.join(labs)}" for d, labs in sorted(seen.items())))
    return out


def how_pairs_ran(config: dict, records: list[dict], pairs, ratios) -> list[str]:
    """Per pair, the dtype and the machines of the rows its verdicts read (a record's "run" names its invocation's
    environment; records without one belong to the folder's only environment without a run id, if there is one)."""
    envs = [config["environment"]] + config.get("resumed", [])
    by_run = {e["run"]: hardware(e) for e in envs if e.get("run")}
    legacy = [hardware(e) for e in envs if not e.get("run")]
    unknown = legacy[0] if len(legacy) == 1 else "machine not recorded"
    dtypes, where = row_dtypes(config), {}
    for r in records:
        where.setdefault(r["protocol"], set()).add(by_run.get(r.get("run"), unknown))  # by_run has no None key
    lines = ["How each pair's comparisons ran (its rows and its receiver's references):", ""]
    for (a, b), group in comparison_groups(pairs, ratios, set(where)).items():
        machines: dict[str, list[str]] = {}
        for lab in sorted(group):
            for m in sorted(where[lab]):
                machines.setdefault(m, []).append(lab)
        ran = "; ".join(sorted(machines)) if len(machines) == 1 else "; ".join(
            f"{m} ({len(labs)} rows: {', '.join(f'`{x}`' for x in labs)})" for m, labs in sorted(machines.items()))
        line = f"- `{a}→{b}`: {', '.join(sorted({dtypes.get(lab, '?') for lab in group}))} on {ran}"
        lines.append(line + (" — its TTEOA ratios across these machines compare machines too" if len(machines) > 1
                             else ""))
    return lines + [""]


def report(folder: Path, pairs, ratios, cmds: list[str]) -> str:
    records = [json.loads(l) for l in jsonl_lines((folder / "records.jsonl").read_text(encoding="utf-8"))]
    labels = list(dict.fromkeys(r["protocol"] for r in records))
    lines = [f"# Cross-model CacheBack: {folder.name}", "", "Commands: " + "; ".join(f"`{c}`" for c in cmds), "",
             "| protocol | n | errors | accuracy | evidence recall | median bytes | median TTEOA s "
             "| median slowest sender s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for lab in labels:
        rs = [r for r in records if r["protocol"] == lab]
        ok = [r for r in rs if r.get("error") is None]
        med = lambda xs: statistics.median(xs) if xs else float("nan")  # noqa: E731
        rec = [r["evidence_recall"] for r in ok if r.get("evidence_recall") is not None]
        lines.append(f"| `{lab}` | {len(rs)} | {len(rs) - len(ok)} | "
                     f"{sum(r['accuracy'] for r in rs) / len(rs):.2f} | "
                     + (f"{sum(rec) / len(rec):.2f}" if rec else "—") + " | "
                     f"{med([r['message_bytes'] for r in ok if r['message_bytes'] is not None]):,.0f} | "
                     f"{med([r['tteoa'] for r in ok]):.2f} | "
                     f"{med([max(r['sender_seconds'], default=0.0) for r in ok]):.2f} |")
    config = json.loads((folder / "config.json").read_text())
    lines += [""] + how_pairs_ran(config, records, pairs, ratios)
    lines += ["Paired verdicts (accuracy a − b, 95% paired bootstrap CI, exact McNemar p; median of the per-episode "
              "TTEOA ratios a ÷ b). Accuracy above counts an episode that failed with a typed error as wrong.", ""]
    comparisons = [c for c in (compare(records, a, b) for a, b in verdict_pairs(pairs, ratios, set(labels))) if c]
    lines += verdict_table(comparisons)
    text = "\n".join(lines) + "\n"
    (folder / "report.md").write_text(text)
    return text


def parse_args() -> argparse.Namespace:
    """The command line (defaults shown in --help)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--n", type=int, default=100, help="episodes per task")
    ap.add_argument("--seed", type=int, default=2026, help="episode generator seed (latent_vs_text's)")
    ap.add_argument("--tasks", default="facts1,code1", help=f"comma-separated, of {sorted(TASKS)}")
    ap.add_argument("--ratios", default="8,16", help="CacheBack / text compression ratios")
    ap.add_argument("--pairs", default=PAIRS, help="comma-separated SENDER:RECEIVER model names")
    ap.add_argument("--latent-maps", type=Path, default=ROOT / "runs" / "latent_maps",
                    help="folder of fitted maps <sender>_<receiver>/ (spans+latent rows run where one exists)")
    ap.add_argument("--translators", type=Path, default=ROOT / "runs" / "translators",
                    help="folder of trained translators dense_<sender>_<receiver>/ (translated rows run where one "
                         "exists)")
    ap.add_argument("--sender-steps", default="",
                    help="comma-separated latent-step counts G for further spans rows (e.g. 0: senders only prefill "
                         "before scoring), each judged against the G = 8 spans row and the receiver's own CacheBack")
    ap.add_argument("--dtype", default=None,
                    help="default: latentwire's choice for this machine (bf16 where the CPU has native bf16)")
    ap.add_argument("--out", type=Path, default=OUT, help="results folder (one subfolder per task)")
    ap.add_argument("--report-only", action="store_true",
                    help="rewrite each --tasks folder's report.md from its records (no model loads)")
    return ap.parse_args()


def parsed_lists(args: argparse.Namespace) -> tuple[list[str], list[tuple[str, str]], list[int], tuple[int, ...]]:
    """--tasks, --pairs, --ratios and --sender-steps as lists; exits naming the option that is malformed."""
    tasks = args.tasks.split(",")
    if set(tasks) - set(TASKS):
        sys.exit(f"unknown tasks {sorted(set(tasks) - set(TASKS))}; valid: {', '.join(sorted(TASKS))}")
    pairs = [tuple(p.split(":")) for p in args.pairs.split(",")]
    if any(len(p) != 2 for p in pairs):
        sys.exit("--pairs: want SENDER:RECEIVER[,SENDER:RECEIVER...]")
    ratios = [int(r) for r in args.ratios.split(",")]
    try:
        steps = tuple(int(g) for g in args.sender_steps.split(",") if g.strip())
    except ValueError:
        sys.exit(f"--sender-steps: want comma-separated integers ≥ 0, got {args.sender_steps!r}")
    return tasks, pairs, ratios, steps


def task_config(args: argparse.Namespace, task: str, pairs, ratios: list[int], rows, agents: dict[str, Agent],
                maps: dict, trained: dict) -> dict:
    """This run's config.json for one task folder: its plan, each row's spec and dtype, the maps' and
    translators' identities, and this invocation's environment."""
    return {"task": task, "n": args.n, "seed": args.seed, "pairs": pairs, "ratios": ratios,
            "protocols": {label: {"sender": a, "receiver": b} | recorded(spec)
                          | {"dtype": joint(str(agents[a].dtype), str(agents[b].dtype))}
                          for label, a, b, spec in rows}, "latent_maps": maps,
            "translators": trained, "environment": environment(), "resumed": []}


def resumed(folder: Path, first: dict, config: dict, done) -> dict:
    """This run's `config` merged into the folder's `first` one (whose environment it keeps, logging this one's);
    exits where a pair's verdicts would compare rows of different dtypes, or where the folder's records were made
    with other latent maps or translators."""
    pairs, ratios, maps, trained = config["pairs"], config["ratios"], config["latent_maps"], config["translators"]
    old = row_dtypes(first)  # a folder from before rows recorded their dtype: its models' dtypes
    first["protocols"] = {lab: p | {"dtype": old[lab]} for lab, p in first["protocols"].items()}
    clash = dtype_clashes({lab: old[lab] for _, lab in done if lab in old},
                          {lab: p["dtype"] for lab, p in config["protocols"].items()},
                          [tuple(p) for p in first["pairs"]] + pairs,
                          sorted(set(first["ratios"]) | set(ratios)))
    if clash:
        sys.exit(f"{folder}: these paired verdicts would compare rows of different dtypes; use a new --out, or "
                 "--dtype as these rows recorded it:\n  " + "\n  ".join(clash))
    refit = sorted(k for k, v in maps.items() if first.get("latent_maps", {}).get(k, v) != v)
    if refit:
        sys.exit(f"{folder} holds spans+latent records made with other latent maps for {refit} (another "
                 "fit or folder); use a new --out, or the maps these records were made with")
    retrained = sorted(k for k, v in trained.items() if first.get("translators", {}).get(k, v) != v)
    if retrained:
        sys.exit(f"{folder} holds translated records made with other translators for {retrained}; use a new "
                 "--out, or the translators these records were made with")
    return config | {"n": max(first["n"], config["n"]), "environment": first["environment"],
                     "resumed": first.get("resumed", []) + [config["environment"]],
                     "pairs": first["pairs"] + [list(p) for p in pairs if list(p) not in first["pairs"]],
                     "ratios": sorted(set(first["ratios"]) | set(ratios)),
                     "protocols": first["protocols"] | config["protocols"],
                     "latent_maps": first.get("latent_maps", {}) | maps,
                     "translators": first.get("translators", {}) | trained}


def run_rows(folder: Path, task: str, episodes: list, rows, protocols: dict, agents: dict[str, Agent], done,
             run_id: str) -> None:
    """Every (episode, row) not `done` yet, appended to records.jsonl as it finishes; within an episode senders
    read once per (model, G) and every row is charged its read (shared_reads)."""
    t0 = time.perf_counter()
    with (folder / "records.jsonl").open("a", encoding="utf-8") as f:
        for i, ep in enumerate(episodes):
            with shared_reads():
                for label, a, b, _ in rows:
                    if (ep.id, label) in done:
                        continue
                    rec = run_episode(Mixed(protocols[label], agents[a], agents[b]), label, ep, agents[a])
                    rec |= {"sender_model": a, "receiver_model": b, "run": run_id}
                    f.write(json.dumps(rec, ensure_ascii=False) + "\n")
                    f.flush()
            print(f"{task}: episode {i + 1}/{len(episodes)} ({time.perf_counter() - t0:.0f} s)", flush=True)


def main() -> None:
    """Plan the rows, load and check every model, map and translator, then run and report each task's folder."""
    args = parse_args()
    tasks, pairs, ratios, steps = parsed_lists(args)
    if args.report_only:  # each folder's own plan (pairs, ratios), not this command line's
        for task in tasks:
            config = json.loads((args.out / task / "config.json").read_text())
            print(report(args.out / task, [tuple(p) for p in config["pairs"]], config["ratios"],
                         commands(args.out / task)))
        return
    rows = plan(pairs, ratios, args.latent_maps, args.translators, steps)
    try:  # every spec validated before any model loads (a latent map's folder and latent mode among them)
        protocols = {label: get_protocol(spec["name"], **{k: v for k, v in spec.items() if k != "name"})
                     for label, _, _, spec in rows}
    except LatentWireError as e:
        sys.exit(f"{type(e).__name__}: {e}")
    agents = {m: Agent.from_pretrained(m, dtype=args.dtype) for m in dict.fromkeys(x for p in pairs for x in p)}
    maps = check_maps(rows, agents)  # a map of another pair or latent mode stops the run before any episode
    trained = check_translators(rows, agents)  # so does a translator of another pair or context mode
    cmd = " ".join(["python benchmarks/cross_model.py"] + sys.argv[1:])
    for task in tasks:
        folder = args.out / task
        folder.mkdir(parents=True, exist_ok=True)
        episodes = cell_episodes(TASKS[task], args.n, args.seed)
        ensure_episodes(folder / "episodes.jsonl", episodes)  # refuses another seed's episodes in the folder
        config = task_config(args, task, pairs, ratios, rows, agents, maps, trained)
        drop_cut_lines(folder / "records.jsonl")
        cfg_path, done = folder / "config.json", finished(folder / "records.jsonl", "episode")
        if done and cfg_path.exists():  # resuming: keep the first run's environment, log this one's
            config = resumed(folder, json.loads(cfg_path.read_text()), config, done)
        cfg_path.write_text(json.dumps(config, indent=2) + "\n")
        run_id = (config["resumed"][-1] if config["resumed"] else config["environment"])["run"]  # this invocation
        run_rows(folder, task, episodes, rows, protocols, agents, done, run_id)
        log_command(folder, cmd)  # every command that added records to this folder, in order
        print(report(folder, [tuple(p) for p in config["pairs"]], config["ratios"], commands(folder)))  # resumes' union


if __name__ == "__main__":
    main()

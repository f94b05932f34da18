"""The command handlers behind `latentwire` (`cli/__init__.py` builds the parser and dispatches): each takes the
parsed arguments and returns the exit status; a typed error propagates to `main`, which prints it (exit 2)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..errors import LatentWireError


def _load_agent(args):
    from ..agent import Agent

    return Agent.from_pretrained(args.model, device=args.device, dtype=args.dtype)


def _models(args) -> int:
    from ..models import ZOO
    from ..placement import dtype_name, resolve

    print(f"{'name':18} {'arch':7} {'layers':>6} {'kv':>3} {'head':>5} {'hidden':>6}  installed cached  install")
    for m in ZOO.values():
        print(f"{m.name:18} {m.arch:7} {m.num_layers:>6} {m.num_kv_heads:>3} {m.head_dim:>5} {m.hidden_size:>6}  "
              f"{'yes' if m.installed else 'no':9} {'yes' if m.cached else 'no':6}  {m.pip}")
    for m in ZOO.values():
        print(f"{m.name}: {m.note}" + (f" (deprecated alias: {', '.join(m.aliases)})" if m.aliases else ""))
    print("Any local HF model directory (--model /path/to/model) or hub id (--model Qwen/Qwen3-0.6B) also works.")
    place = resolve()
    print(f"Default placement here: --device {place.device} --dtype {dtype_name(place.dtype)} ({place.reason})")
    return 0


def _check(args) -> int:
    from ..bench.model_check import check_model, describe

    agent = _load_agent(args)
    print("\n".join(describe(agent)))  # reading the geometry refuses what cannot work (a typed error, exit 2)
    try:
        checks = check_model(agent)
    except LatentWireError:
        raise
    except Exception as e:  # the model itself failed on a check's inputs: not a FAIL of a law, exit 2
        print(f"latentwire: error: the check could not run on this model: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    for c in checks:
        print(f"  {c.name:10} {'pass' if c.ok else 'FAIL'}  error {c.error:.2e} (bound {c.bound:g}): {c.detail}")
    ok = all(c.ok for c in checks)
    print("latentwire reproduces this model's states exactly enough to use it" if ok else
          "latentwire does not reproduce this model: see the FAIL lines")
    return 0 if ok else 1


def _demo(args) -> int:
    from ..errors import ConfigError

    if getattr(args, "transport", "inprocess") == "ray":
        return _demo_ray(args)
    if given := [flag for flag, value in (("--attach", getattr(args, "attach", False)),
                                          ("--address", getattr(args, "address", None)),
                                          ("--num-cpus", getattr(args, "num_cpus", None))) if value]:
        raise ConfigError(f"{', '.join(given)} only apply with --transport ray")
    from tqdm import tqdm
    from transformers.utils import logging as hf_logging

    from ..demo import run_demo

    from ..protocols import get_protocol

    protocols = {"alone": {}, "text": {},
                 "fullkv": {"latent_steps": args.latent_steps, "latent_mode": args.latent_mode},
                 "cacheback": {"ratio": args.ratio, "latent_steps": args.latent_steps, "latent_mode": args.latent_mode}}
    for name, params in protocols.items():  # a bad --ratio or --latent-steps fails here, before the model loads
        get_protocol(name, **params)
    hf_logging.disable_progress_bar()
    print(f"loading {args.model} ...", flush=True)
    agent = _load_agent(args)
    print(f"running on {agent.device} in {str(agent.dtype).removeprefix('torch.')}", flush=True)
    rows = []
    for ep, out in run_demo(agent, protocols, args.senders, progress=lambda xs, desc: tqdm(xs, desc=desc)):
        ok = ep.gold.lower() in out.answer.lower()
        rows.append((out.protocol, ep.question, ok, out))
    print(f"\nmodel {args.model}, {args.senders} senders; fullkv and cacheback ({args.ratio}x) with "
          f"{args.latent_steps} latent steps ({args.latent_mode})\n")
    print(f"{'protocol':9} {'ok':2} {'TTEOA s':>7} {'sender s':>8} {'recv s':>6} {'bytes':>10} {'ctx':>5}  answer")
    for name, q, ok, out in rows:
        ans = out.answer.replace("\n", " ")
        print(f"{name:9} {'✓' if ok else '✗':2} {out.tteoa:7.2f} {max(out.sender_seconds, default=0):8.2f} "
              f"{out.receiver_seconds:6.2f} {out.message_bytes:10,d} {out.receiver_context:5d}  {ans[:60]}")
    print("\nper protocol: correct / episodes (bytes: the message; ctx: the receiver's context in rows)")
    for name in protocols:
        oks = [ok for n, _, ok, _ in rows if n == name]
        print(f"  {name:9} {sum(oks)}/{len(oks)}")
    print("\nnext: `latentwire inspect --task facts --episode facts-0005` writes inspect.html: what CacheBack "
          "sent on a benchmark episode, per selector; docs/results.md has the measured comparisons "
          "(`latentwire bench run` reproduces them)")
    return 0


def _demo_ray(args) -> int:
    from transformers.utils import logging as hf_logging

    from ..placement import resolve
    from ..protocols import get_protocol
    from ..transport import AgentSpec
    from ..transport.demo import demo

    num_cpus = _num_cpus(args)
    for name in ("fullkv", "cacheback"):  # a bad --ratio, --latent-steps or placement: refused before Ray starts
        get_protocol(name, latent_steps=args.latent_steps, latent_mode=args.latent_mode,
                     **({"ratio": args.ratio} if name == "cacheback" else {}))
    resolve(args.device, args.dtype)
    hf_logging.disable_progress_bar()
    rows = demo(AgentSpec.pretrained(args.model, device=args.device, dtype=args.dtype), args.senders,
                args.latent_steps, args.latent_mode, ratio=args.ratio, address=args.address,
                num_cpus=num_cpus, attach=args.attach)
    print("\nper protocol: correct / episodes")
    for name in dict.fromkeys(r[0] for r in rows):
        oks = [ok for n, _, ok, _ in rows if n == name]
        print(f"  {name:9} {sum(oks)}/{len(oks)}")
    return 0


def _serve(args) -> int:
    from transformers.utils import logging as hf_logging

    from ..errors import ConfigError
    from ..placement import resolve
    from ..transport import AgentSpec
    from ..transport.demo import serve

    if args.senders < 1:
        raise ConfigError(f"--senders must be ≥ 1, got {args.senders}")
    num_cpus = _num_cpus(args)
    resolve(args.device, args.dtype)  # a bad placement: refused before Ray starts
    hf_logging.disable_progress_bar()
    return serve(AgentSpec.pretrained(args.model, device=args.device, dtype=args.dtype), args.senders,
                 address=args.address, num_cpus=num_cpus)


def _num_cpus(args) -> int:
    """--num-cpus for a local Ray: default 2; 0 or fewer is refused (not silently 2, nor handed to Ray)."""
    from ..errors import ConfigError

    if args.num_cpus is None:
        return 2
    if args.num_cpus < 1:
        raise ConfigError(f"--num-cpus must be ≥ 1, got {args.num_cpus}")
    return args.num_cpus


def _bench_run(args) -> int:
    from ..bench.runner import RunConfig, parse_filters, run

    config = RunConfig(args.task, args.protocols, args.model, args.n, args.seed, parse_filters(args.filter),
                       device=args.device, dtype=args.dtype)
    out = run(config, args.out)
    print(f"records in {out / 'records.jsonl'}; report with: latentwire bench report {out}")
    errors = error_summary(out / "records.jsonl")
    if errors:
        print("episodes that failed with a typed error (scored as wrong answers):\n" + errors, file=sys.stderr)
    return 0


def error_summary(records: Path) -> str:
    """One line per (protocol, error type) with its count and first message; empty when no record failed."""
    from collections import Counter

    from ..bench.episode import jsonl_lines

    counts, first = Counter(), {}
    for line in jsonl_lines(records.read_text(encoding="utf-8")):
        rec = json.loads(line)
        if rec.get("error"):
            key = (rec["protocol"], rec["error"].split(":", 1)[0])
            counts[key] += 1
            first.setdefault(key, rec["error"])
    return "\n".join(f"  {p}: {n} × {kind} (first: {first[(p, kind)][:160]})" for (p, kind), n in sorted(counts.items()))


def _bench_report(args) -> int:
    from ..bench.report import read_run, write_report
    from ..errors import UnknownNameError

    if args.compare:  # a mistyped label would draw no verdict, silently
        labels = sorted({r["protocol"] for r in read_run(args.run_dir)[1]})
        for label in (x for pair in args.compare for x in pair):
            if label not in labels:
                raise UnknownNameError("protocol label", label, labels)
    path = write_report(args.run_dir, [tuple(c) for c in args.compare] if args.compare else None)
    print(path.read_text())
    print(f"wrote {path} and PNGs beside it")
    return 0


def _bench_pair(args) -> int:
    from ..bench.pair_runner import format_table, read_records, run_pairs, summarize_pairs

    out = args.out or Path("runs") / "pairs" / f"{args.task}_{Path(args.sharer).name}_{Path(args.receiver).name}"
    out = run_pairs(args.sharer, args.receiver, args.task, args.protocols, args.n, out, seed=args.seed,
                    split=args.split, device=args.device, dtype=args.dtype)
    print(format_table(summarize_pairs(read_records(out))))
    print(f"\nrecords in {out / 'records.jsonl'}")
    return 0


def _train(args) -> int:
    from ..bench.runner import parse_filters
    from ..training.trainer import TRAINER, TrainConfig, train

    tasks = tuple(t.strip() for t in args.tasks.split(",") if t.strip())  # "facts, reasoning" works too
    cfg = TrainConfig(args.method, args.sharer, args.receiver, tasks=tasks, train_n=args.train_n, val_n=args.val_n,
                      steps=args.steps, batch=args.batch, lr=args.lr, stage1_steps=args.stage1_steps,
                      eval_every=args.eval_every, seed=args.seed, params=parse_filters(args.param, "--param"),
                      device=args.device, dtype=args.dtype, context_aware=args.context_aware,
                      sharer_docs=args.sharer_docs)
    mode = ("_aware" if args.context_aware else "") + ("" if args.sharer_docs == "own" else f"_{args.sharer_docs}")
    out = args.out or Path("runs") / "translators" / (f"{args.method}{mode}_{Path(args.sharer).name}_"
                                                      f"{Path(args.receiver).name}")
    out = train(cfg, out)
    log = json.loads((Path(out) / TRAINER).read_text())
    val = f"{log['val'][-1][1]:.4f} at step {log['val'][-1][0]}" if log.get("val") else "(none)"
    params = f"{log['parameters']:,}" if "parameters" in log else "?"
    print(f"checkpoint in {out} ({params} trainable parameters); final validation loss {val}")
    print(f"evaluate with: latentwire bench pair --sharer {args.sharer} --receiver {args.receiver} --task facts "
          f"--n 20 --protocols \"alone,t2t,fullcontext,translated(checkpoint='{out}')\"")
    return 0


def _inspect(args) -> int:
    from ..bench.inspect import chromium, inspect_episode, inspect_protocols, screenshot
    from ..bench.runner import load_task_episodes
    from ..errors import ConfigError, UnknownNameError

    inspect_protocols(args.selectors.split(","), args.ratio, args.latent_steps)  # bad selectors: before any model
    out = Path(args.out)
    if out.is_dir() or not out.parent.is_dir():
        raise ConfigError(f"--out {out}: want a file in an existing folder")
    if args.png:
        chromium()  # refused before any model loads or any episode is computed
    episodes = {e.id: e for e in load_task_episodes(args.task)}
    if not episodes:
        raise ConfigError(f"task {args.task!r} has no episodes")
    if args.episode is None:  # the task's first episode, named so the user can pick another
        args.episode = next(iter(episodes))
        print(f"episode {args.episode} (pick another with --episode)")
    if args.episode not in episodes:
        more = [f"… ({len(episodes)} in all)"] if len(episodes) > 20 else []
        raise UnknownNameError("episode", args.episode, list(episodes)[:20] + more)
    agent = _load_agent(args)
    page = inspect_episode(agent, episodes[args.episode], args.selectors.split(","), args.ratio, args.latent_steps)
    out.write_text(page, encoding="utf-8")
    print(f"wrote {out}")
    if args.png:
        print(f"wrote {screenshot(out, out.with_suffix('.png'))}")
    return 0


def read_documents(paths: list[str]) -> tuple[list[str], list[str]]:
    """(names, texts): one document per file; a folder gives its .txt and .md files (any case), sorted. A file
    named twice (itself and through its folder) is read once. Each text is stripped (the chat template would trim
    it anyway). ConfigError for a missing, unreadable, empty or non-UTF-8 file."""
    from ..errors import ConfigError

    files, seen = [], set()
    for p in map(Path, paths):
        try:
            if p.is_dir():
                found = sorted(f for f in p.iterdir() if f.suffix.lower() in (".txt", ".md") and f.is_file())
                if not found:
                    raise ConfigError(f"{p}: a folder with no .txt or .md file")
            elif p.exists():  # a file, or a pipe (<(command))
                found = [p]
            else:
                raise ConfigError(f"{p}: no such file or folder")
        except OSError as e:
            raise ConfigError(f"{p}: cannot be read ({e.strerror or e})") from e
        for f in found:
            if (real := f.resolve()) not in seen:
                seen.add(real)
                files.append(f)
    texts = []
    for f in files:
        try:
            text = f.read_text(encoding="utf-8-sig").strip()  # -sig: a byte-order mark is not text
        except UnicodeDecodeError as e:
            raise ConfigError(f"{f}: not UTF-8 text ({e.reason} at byte {e.start})") from e
        except OSError as e:
            raise ConfigError(f"{f}: cannot be read ({e.strerror or e})") from e
        if not text:
            raise ConfigError(f"{f}: empty document")
        texts.append(text)
    return [str(f) for f in files], texts


def _ask(args) -> int:
    """Questions over the user's files, one sender per file, with each protocol of --protocols in turn. The first
    question reads the documents; each follow-up (--then) finds every read held (`HeldReads`) and pays only what a
    question costs an agent that already holds its document."""
    from transformers.utils import logging as hf_logging

    from ..bench.runner import parse_protocols
    from ..errors import ConfigError, ContextOverflowError, MissingExtraError, ModelNotFoundError
    from ..protocols import get_protocol
    from ..protocols.reads import HeldReads, shared_reads

    protocols = {label: get_protocol(name, **params) for label, (name, params) in
                 parse_protocols(args.protocols).items()}  # a bad spec fails here, before any file or model
    questions = [args.question, *(args.then or [])]
    if blank := [q for q in questions if not q.strip()]:
        raise ConfigError(f"a question is empty ({len(blank)} of {len(questions)}); quote each question")
    if Path(args.question).exists():
        raise ConfigError(f"the first argument is the question, and {args.question!r} is a file or folder: "
                          "latentwire ask \"QUESTION\" FILE_OR_FOLDER ...")
    names, documents = read_documents(args.files)
    hf_logging.disable_progress_bar()
    agent = _load_agent(args)  # one agent plays every sender and the receiver
    held, ran = HeldReads(), 0
    for turn, question in enumerate(questions):
        if len(questions) > 1 and not args.json:
            print(f"{'Q' if turn == 0 else 'follow-up Q'}{turn + 1}: {question}")
        before = (held.reads_computed, held.indexes_computed)
        with shared_reads(held):  # every protocol of this question shares each sender's read; later ones keep it
            for label, protocol in protocols.items():
                try:
                    out = protocol.run([agent] * len(documents), documents, agent, question)
                except (ModelNotFoundError, MissingExtraError):  # nothing else could run either
                    raise
                except LatentWireError as e:  # this protocol cannot run here; the others still may
                    hint = (". Try a larger ratio (cacheback, retrieval), fewer or shorter documents, or a model "
                            "with a longer window") if isinstance(e, ContextOverflowError) else ""
                    print(f"{label}: {'does not fit' if hint else 'cannot run'}: {type(e).__name__}: {e}{hint}.",
                          file=sys.stderr)
                    if args.json:
                        print(json.dumps({"question": question, "turn": turn, "protocol": label,
                                          "error": f"{type(e).__name__}: {e}"}, ensure_ascii=False))
                    continue
                ran += 1
                _print_answer(args, label, question, turn, out, names, documents)
        if turn and not args.json and (held.reads_computed, held.indexes_computed) == before:
            print("  (every read and index was held from the first question: TTEOA is question-time)")
    return 0 if ran else 2


def _print_answer(args, label: str, question: str, turn: int, out, names: list[str], documents: list[str]) -> None:
    """One protocol's answer to one question: a JSON object, or two lines (and what each sender sent)."""
    from ..message import merge_spans

    sent = None if out.kept_spans is None else {
        n: [doc[a:b] for a, b in merge_spans(spans)] for n, doc, spans in zip(names, documents, out.kept_spans)}
    if args.json:
        print(json.dumps({"question": question, "turn": turn, "protocol": label, "answer": out.answer.strip(),
                          "message_bytes": out.message_bytes, "receiver_context": out.receiver_context,
                          "tteoa": out.tteoa, "tteoa_question": out.question_tteoa,
                          "sender_seconds": list(out.sender_seconds), "read_seconds":
                              None if out.read_seconds is None else list(out.read_seconds),
                          "receiver_seconds": out.receiver_seconds, "sent": sent}, ensure_ascii=False))
        return
    print(f"{label}: {out.answer.strip()}")
    q = "" if out.question_tteoa is None else f", question-time {out.question_tteoa:.2f} s"
    print(f"  {out.message_bytes:,} bytes sent, receiver context {out.receiver_context} rows, "
          f"TTEOA {out.tteoa:.2f} s{q} (slowest sender {max(out.sender_seconds, default=0):.2f} s)")
    if args.show_sent and sent:
        for n, pieces in sent.items():
            print(f"  {n} sent: " + " … ".join(p.replace("\n", " ").strip() for p in pieces))

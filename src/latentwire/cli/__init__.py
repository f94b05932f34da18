"""Command line: `latentwire models`, `latentwire check`, `latentwire demo`, `latentwire ask`,
`latentwire bench run|report|pair`, `latentwire inspect`, `latentwire train`, `latentwire serve`."""
from __future__ import annotations

import argparse
import logging
import os
import sys

from ..errors import LatentWireError
from .commands import (_ask, _bench_pair, _bench_report, _bench_run, _check, _demo, _inspect, _models,  # noqa: F401
                       _serve, _train, error_summary)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: X)" to each option's help, unless the help already names its default or there is
    none to show (a flag, a repeatable option, a required one)."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if "default" in text.lower() or action.required or default is None or default is False or default == []:
            return text
        return super()._get_help_string(action)


def parsers(parser: argparse.ArgumentParser):
    """`parser` and every sub-command parser under it (depth first)."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                yield from parsers(sub)


def _placement_args(p: argparse.ArgumentParser, dtype: str | None = None) -> None:
    """--device and --dtype; `dtype` overrides the dtype default (None: the machine's, placement.py)."""
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:N or mps; default: cuda if available, else cpu "
                                                   "($LATENTWIRE_DEVICE overrides the default)")
    p.add_argument("--dtype", default=dtype, help="float32, bfloat16 or float16" + (
        "" if dtype else "; default: bfloat16 on CUDA and on CPUs with AMX / AVX512-BF16, float32 otherwise "
                         "($LATENTWIRE_DTYPE)"))


def build_parser() -> argparse.ArgumentParser:
    """The `latentwire` parser with every sub-command; each option's help shows its default."""
    parser = argparse.ArgumentParser(prog="latentwire", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress messages (INFO level)")
    parser.add_argument("--version", action="version", version=f"latentwire {_version()}")
    sub = parser.add_subparsers(dest="cmd", required=True)
    _add_models(sub)
    _add_check(sub)
    _add_demo(sub)
    _add_serve(sub)
    _add_bench(sub)
    _add_train(sub)
    _add_inspect(sub)
    _add_ask(sub)
    for p in parsers(parser):
        p.formatter_class = _HelpFormatter
    return parser


def _add_models(sub) -> None:
    """Adds `latentwire models` to `sub` (the sub-parsers of the top-level parser)."""
    sub.add_parser("models", help="list bundled models, their geometry and install state").set_defaults(fn=_models)


def _add_check(sub) -> None:
    """Adds `latentwire check` to `sub`."""
    check = sub.add_parser("check", help="does latentwire work on this model? its geometry, then the laws it "
                                         "relies on, measured on the model (exit 0: all pass)")
    check.add_argument("--model", required=True, help="bundled model name, local HF directory or hub id")
    _placement_args(check, dtype="float32")  # the laws are exact in float32: checked there unless told otherwise
    check.set_defaults(fn=_check)


def _add_demo(sub) -> None:
    """Adds `latentwire demo` to `sub`."""
    demo = sub.add_parser("demo", help="senders read private documents, a receiver answers; every protocol")
    demo.add_argument("--model", default="smollm2-135m", help="bundled model name or local HF directory")
    demo.add_argument("--senders", type=int, default=3, choices=(1, 2, 3), help="sender agents, one document each")
    demo.add_argument("--latent-steps", type=int, default=8, help="G latent steps per sender (fullkv, cacheback)")
    demo.add_argument("--ratio", type=int, default=4, help="cacheback: each sender sends ceil(T / ratio) rows")
    demo.add_argument("--latent-mode", default="rescale", choices=("rescale", "realign"),
                      help="how a latent step maps the last hidden state back to an input embedding")
    demo.add_argument("--transport", default="inprocess", choices=("inprocess", "ray"),
                      help="ray: each agent a Ray actor (own process), messages signed wire bytes (cacheback, fullkv)")
    demo.add_argument("--address", default=None, help="ray: an existing cluster (e.g. ray://head:10001 or auto); "
                                                      "default RAY_ADDRESS, else a local Ray")
    demo.add_argument("--num-cpus", type=int, default=None, help="ray: CPUs of a local Ray (default 2)")
    demo.add_argument("--attach", action="store_true", help="ray: use the agents `latentwire serve` started")
    _placement_args(demo)
    demo.set_defaults(fn=_demo)


def _add_serve(sub) -> None:
    """Adds `latentwire serve` to `sub`."""
    serve = sub.add_parser("serve", help="start agents as Ray actors (separate processes) for other drivers to use")
    serve.add_argument("--model", default="smollm2-135m", help="bundled model name or local HF directory")
    serve.add_argument("--senders", type=int, default=3, help="sender agents (plus one receiver)")
    serve.add_argument("--address", default=None, help="an existing Ray cluster; default RAY_ADDRESS, else local")
    serve.add_argument("--num-cpus", type=int, default=None, help="CPUs of a local Ray (default 2)")
    _placement_args(serve)
    serve.set_defaults(fn=_serve)


def _add_bench(sub) -> None:
    """Adds `latentwire bench` and its sub-commands run, report and pair to `sub`."""
    bench = sub.add_parser("bench", help="run protocols over a task and report").add_subparsers(dest="bench",
                                                                                                required=True)
    _add_bench_run(bench)
    _add_bench_report(bench)
    _add_bench_pair(bench)


def _add_bench_run(bench) -> None:
    """Adds `latentwire bench run` to `bench` (the sub-parsers of `latentwire bench`)."""
    brun = bench.add_parser("run", help="one JSONL record per episode × protocol (resumable)")
    brun.add_argument("--task", required=True, help="shipped task name (facts, code, reasoning, paraphrase, coref, "
                                                     "aggregate) or a .jsonl path")
    brun.add_argument("--protocols", required=True, help="e.g. text,fullkv(latent_steps=8)")
    brun.add_argument("--model", default="smollm2-135m", help="bundled model name, local HF directory or hub id")
    brun.add_argument("--n", type=int, default=None, help="episodes (seeded sample); default all")
    brun.add_argument("--seed", type=int, default=0, help="seed of the episode sample (--n)")
    brun.add_argument("--filter", action="append", default=[], metavar="KEY=VALUE",
                      help="keep episodes whose meta[KEY] == VALUE, e.g. hops=2")
    brun.add_argument("--out", required=True, help="run folder (re-run to resume)")
    _placement_args(brun)
    brun.set_defaults(fn=_bench_run)


def _add_bench_report(bench) -> None:
    """Adds `latentwire bench report` to `bench`."""
    brep = bench.add_parser("report", help="markdown table with bootstrap CIs, paired verdicts and PNG plots")
    brep.add_argument("run_dir", help="a folder written by `latentwire bench run`")
    brep.add_argument("--compare", nargs=2, action="append", metavar=("A", "B"),
                      help="protocol labels to compare (paired), repeatable; default: each latent protocol vs "
                           "text at its ratio, vs full KV and vs full context")
    brep.set_defaults(fn=_bench_report)


def _add_bench_pair(bench) -> None:
    """Adds `latentwire bench pair` to `bench`."""
    bpair = bench.add_parser("pair", help="split-evidence pairs across two models: alone, t2t, fullcontext, "
                                          "translated(checkpoint=...)")
    bpair.add_argument("--sharer", required=True, help="model holding one document")
    bpair.add_argument("--receiver", required=True, help="model holding the other document and answering")
    bpair.add_argument("--task", default="facts", help="pair task: facts or reasoning")
    bpair.add_argument("--n", type=int, default=20, help="pairs")
    bpair.add_argument("--protocols", default="alone,t2t,fullcontext",
                       help="e.g. \"alone,t2t,fullcontext,translated(checkpoint='runs/translators/x')\"")
    bpair.add_argument("--split", default="test", choices=("train", "val", "test"), help="which pairs of the task")
    bpair.add_argument("--seed", type=int, default=0, help="seed of the pair sample")
    bpair.add_argument("--out", default=None, help="run folder (re-run to resume); default runs/pairs/TASK_SHARER_RECEIVER")
    _placement_args(bpair)
    bpair.set_defaults(fn=_bench_pair)


def _add_train(sub) -> None:
    """Adds `latentwire train` to `sub`."""
    trn = sub.add_parser("train", help="train a translator between two frozen models (resumable)")
    trn.add_argument("--method", required=True, help="xkv, dense, lcfx or c2c")
    trn.add_argument("--sharer", required=True, help="frozen model whose state is translated")
    trn.add_argument("--receiver", required=True, help="frozen model that reads the translated state")
    trn.add_argument("--tasks", default="facts,reasoning", help="comma-separated pair tasks")
    trn.add_argument("--steps", type=int, default=300, help="optimizer steps")
    trn.add_argument("--batch", type=int, default=4, help="pairs per step")
    trn.add_argument("--lr", type=float, default=1e-3, help="learning rate")
    trn.add_argument("--train-n", type=int, default=160, help="training pairs per task")
    trn.add_argument("--val-n", type=int, default=12, help="validation pairs per task")
    trn.add_argument("--stage1-steps", type=int, default=0, help="dense only: cache-reconstruction steps first")
    trn.add_argument("--context-aware", action="store_true",
                     help="dense only: train (and mark the checkpoint) for the context-aware mode")
    trn.add_argument("--sharer-docs", default="own", choices=("own", "shuffled", "blank"),
                     help="the no-sharer control: train on other pairs' sharer documents (shuffled) or empty ones")
    trn.add_argument("--eval-every", type=int, default=50, help="steps between validation losses")
    trn.add_argument("--seed", type=int, default=0, help="seed of the pairs and the initialisation")
    trn.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                     help="translator config field, e.g. --param slots=8 (repeatable)")
    trn.add_argument("--out", default=None, help="checkpoint folder; default runs/translators/METHOD_SHARER_RECEIVER")
    _placement_args(trn)
    trn.set_defaults(fn=_train)


def _add_inspect(sub) -> None:
    """Adds `latentwire inspect` to `sub`."""
    insp = sub.add_parser("inspect", help="one episode as HTML: kept spans per selector, gold evidence underlined",
                          description="One episode as an HTML page: per sender and selector, the document text "
                                      "CacheBack would send (highlighted) and the gold evidence (underlined). A "
                                      "sender's T rows are its prompt plus its G latent rows; it sends at most "
                                      "B = ceil(T / ratio) document rows (the budget) plus its first row and its G "
                                      "latent rows, which are always sent. Compression = the document's rows / the "
                                      "document rows sent: below --ratio, since B is taken over all T rows.")
    insp.add_argument("--task", default="facts", help="shipped task name or a .jsonl path")
    insp.add_argument("--episode", default=None, help="episode id, e.g. facts-0005 (default: the task's first)")
    insp.add_argument("--model", default="smollm2-135m", help="bundled model name, local HF directory or hub id")
    insp.add_argument("--selectors", default="cacheback,cacheback+generic,mean_query,streaming_llm",
                      help="comma-separated SELECTOR[@PRESET][+CALIBRATION][/sentence], e.g. cacheback+masked/sentence, "
                           "cacheback@deep+generic/sentence (contrastive), bm25/sentence")
    insp.add_argument("--ratio", type=float, default=8.0, help="compression ratio r: budget B = ceil(T / r)")
    insp.add_argument("--latent-steps", type=int, default=8, help="G latent steps per sender (rows always sent)")
    insp.add_argument("--out", default="inspect.html", help="HTML file to write")
    insp.add_argument("--png", action="store_true", help="also render a PNG with headless chromium")
    _placement_args(insp)
    insp.set_defaults(fn=_inspect)


def _add_ask(sub) -> None:
    """Adds `latentwire ask` to `sub`."""
    ask = sub.add_parser("ask", help="ask a question over your files: one sender per file, one receiver answers",
                         description="One sender agent per file (a folder: its .txt and .md files) reads its "
                                     "document; the receiver answers the question from what each protocol sends. "
                                     "One model plays every agent. A protocol that would overflow the receiver's "
                                     "window is refused before any compute and the others still run.")
    ask.add_argument("question", help="the question, quoted")
    ask.add_argument("files", nargs="+", help="UTF-8 text files or folders, one document per file")
    ask.add_argument("--then", action="append", metavar="QUESTION",
                     help="a follow-up question over the same files (repeatable): every sender keeps its read, so "
                          "a follow-up pays only question-time (default: none)")
    ask.add_argument("--protocols", default="cacheback(ratio=8)",
                     help="comma-separated, e.g. \"cacheback(ratio=8),retrieval(selector='bm25'),fullcontext\"")
    ask.add_argument("--model", default="smollm2-135m", help="bundled model name, local HF directory or hub id "
                                                             "(qwen2.5-coder-0.5b answers better)")
    ask.add_argument("--show-sent", action="store_true", help="print the document text each sender's message kept")
    ask.add_argument("--json", action="store_true", help="one JSON object per protocol (answer, costs, sent text)")
    _placement_args(ask)
    ask.set_defaults(fn=_ask)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("latentwire")
    except PackageNotFoundError:  # a source tree on sys.path, not installed
        return "(not installed)"


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    try:
        return args.fn(args)
    except LatentWireError as e:
        print(f"latentwire: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `latentwire models | head`: the reader left; stop quietly, as Unix tools do
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no second BrokenPipeError when Python flushes stdout at exit
        return 141


if __name__ == "__main__":
    sys.exit(main())

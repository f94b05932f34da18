"""The command line: every option of every sub-command has help text that shows its default."""
import argparse

from latentwire import cli
from latentwire.cli import commands


def _options(parser):
    return [a for a in parser._actions if a.option_strings and not isinstance(a, (argparse._HelpAction, argparse._VersionAction))]


def test_every_option_has_help_showing_its_default():
    parsers = list(cli.parsers(cli.build_parser()))
    names = {p.prog for p in parsers}
    assert {"latentwire inspect", "latentwire bench run", "latentwire bench pair", "latentwire train"} <= names
    for parser in parsers:
        page = parser.format_help()
        for action in _options(parser):
            where = f"{parser.prog} {action.option_strings[-1]}"
            assert action.help, f"{where} has no help"
            flag_like = action.default is None or action.default is False or action.default == [] or action.required
            assert flag_like or f"(default: {action.default})" in " ".join(page.split()), where
            assert action.required or action.default is not None or "default" in action.help.lower(), \
                f"{where}: its help must say what happens without it"
        for action in parser._actions:
            if not action.option_strings and not isinstance(action, argparse._SubParsersAction):
                assert action.help, f"{parser.prog} {action.dest} has no help"


def test_inspect_help_explains_rows_budget_and_compression(capsys):
    import pytest

    with pytest.raises(SystemExit):
        cli.main(["inspect", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "B = ceil(T / ratio)" in text and "first row" in text and "Compression" in text
    assert "(default: 8.0)" in text and "(default: facts)" in text


def test_the_demo_runs_every_protocol_on_every_episode(monkeypatch, capsys):
    """`make demo` / `latentwire demo` (in process), on a tiny model in place of the bundled one."""
    from latentwire.agent import Agent
    from latentwire.demo import EPISODES
    from latentwire.models import DEFAULT_MODEL, tiny_model, tiny_tokenizer

    agent = Agent(tiny_model("gemma3"), tiny_tokenizer(), "gemma3")
    asked = []
    monkeypatch.setattr(Agent, "from_pretrained", classmethod(lambda cls, name, **kw: asked.append(name) or agent))
    assert cli.main(["demo", "--senders", "1", "--latent-steps", "1", "--ratio", "4"]) == 0
    out = capsys.readouterr().out
    assert asked == [DEFAULT_MODEL]  # the bundled default model
    episodes = [e for e in EPISODES if e.source < 1]
    table = [line for line in out.splitlines() if line.split()[:1] and line.split()[0] in
             ("alone", "text", "fullkv", "cacheback") and line.split()[1] in "✓✗"]
    assert [line.split()[0] for line in table] == [p for p in ("alone", "text", "fullkv", "cacheback")
                                                   for _ in episodes]
    for name in ("alone", "text", "fullkv", "cacheback"):
        assert f"  {name:9} " in out and f"/{len(episodes)}" in out.split(f"  {name:9} ")[-1].splitlines()[0]
    assert len(episodes) == 1 and "1 senders; fullkv and cacheback (4x) with 1 latent steps" in out


def test_version_and_a_closed_pipe(capsys):
    import subprocess
    import sys

    import pytest

    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("latentwire ")
    # `latentwire models | head`: the reader closes the pipe long before the output ends (10 MB here, far past any
    # pipe buffer); no traceback, the exit status of a broken pipe
    script = ("import sys; from latentwire import cli; cli._models = lambda a: [print('x' * 99) for _ in "
              "range(100_000)] and 0; sys.exit(cli.main(['models']))")
    proc = subprocess.run(f"'{sys.executable}' -c \"{script}\" | head -c 10; exit ${{PIPESTATUS[0]}}", shell=True,
                          executable="/bin/bash", capture_output=True, text=True)
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr
    assert proc.returncode == 141 and proc.stdout == "x" * 10


def test_bench_run_names_failed_episodes_by_protocol_and_type(tmp_path):
    import json

    records = tmp_path / "records.jsonl"
    rows = [{"protocol": "cacheback", "error": "ContextOverflowError: needs 900 positions"},
            {"protocol": "cacheback", "error": "ContextOverflowError: needs 950 positions"},
            {"protocol": "text", "error": None}]
    records.write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = cli.error_summary(records)
    assert summary == "  cacheback: 2 × ContextOverflowError (first: ContextOverflowError: needs 900 positions)"
    records.write_text(json.dumps(rows[2]) + "\n")
    assert cli.error_summary(records) == ""


def test_demo_refuses_a_bad_parameter_before_loading_a_model(monkeypatch):
    def no_load(args):
        raise AssertionError("the model loaded before the parameters were checked")

    monkeypatch.setattr(commands, "_load_agent", no_load)
    assert cli.main(["demo", "--ratio", "0"]) == 2


def test_inspect_png_without_chromium_is_refused_before_any_compute(monkeypatch, capsys):
    import shutil

    def no_load(args):
        raise AssertionError("the model loaded before --png was checked")

    monkeypatch.setattr(commands, "_load_agent", no_load)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert cli.main(["inspect", "--task", "facts", "--episode", "facts-0000", "--png"]) == 2
    assert "chromium" in capsys.readouterr().err


def test_inspect_refuses_bad_selectors_and_outputs_before_any_model(monkeypatch, capsys, tmp_path):
    def no_load(args):
        raise AssertionError("the model loaded before the selectors and --out were checked")

    monkeypatch.setattr(commands, "_load_agent", no_load)
    assert cli.main(["inspect", "--selectors", "cacheback,cacheback:probez=4"]) == 2
    assert "did you mean 'probe'" in capsys.readouterr().err
    assert cli.main(["inspect", "--ratio", "0.5"]) == 2
    assert cli.main(["inspect", "--out", str(tmp_path / "no" / "such" / "page.html")]) == 2
    assert "existing folder" in capsys.readouterr().err


def test_agent_and_serve_arguments_are_checked_before_anything_loads(monkeypatch, capsys):
    import pytest

    import latentwire.agent
    from latentwire.agent import Agent
    from latentwire.errors import ConfigError, UnknownParameterError

    monkeypatch.setattr(latentwire.agent, "load", lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded")))
    with pytest.raises(UnknownParameterError, match="did you mean 'device'"):
        Agent.from_pretrained("smollm2-135m", devcie="cpu")
    for bad in (0, -5, True, 1.5):
        with pytest.raises(ConfigError, match="context_window"):
            Agent.from_pretrained("smollm2-135m", context_window=bad)
    assert cli.main(["serve", "--senders", "0"]) == 2
    assert cli.main(["serve", "--dtype", "fp64"]) == 2
    assert "--senders must be" in capsys.readouterr().err
    for argv in (["serve", "--num-cpus", "0"], ["demo", "--transport", "ray", "--num-cpus", "-1"]):
        assert cli.main(argv) == 2  # refused before Ray starts or a model loads (not silently 2)
        assert "--num-cpus must be ≥ 1" in capsys.readouterr().err


def test_bench_report_refuses_a_compare_label_the_run_does_not_hold(tmp_path, capsys):
    import json

    (tmp_path / "config.json").write_text(json.dumps({"config": {"protocols": {"text": {}, "fullcontext": {}}},
                                                      "episodes": ["e"]}))
    rows = [{"episode": "e", "protocol": p, "sender_seconds": [], "error": None} for p in ("text", "fullcontext")]
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert cli.main(["bench", "report", str(tmp_path), "--compare", "textt", "fullcontext"]) == 2
    assert "unknown protocol label 'textt'; valid: fullcontext, text" in capsys.readouterr().err
    assert not (tmp_path / "report.md").exists()


def _tiny_agent(monkeypatch, asked=None):
    from latentwire.agent import Agent
    from latentwire.models import tiny_model, tiny_tokenizer

    agent = Agent(tiny_model("llama"), tiny_tokenizer(), "llama")
    monkeypatch.setattr(Agent, "from_pretrained",
                        classmethod(lambda cls, name, **kw: (asked.append(name) if asked is not None else 0) or agent))
    return agent


def test_ask_answers_over_files_and_folders_with_each_protocol(monkeypatch, capsys, tmp_path):
    import json

    docs = {"a.txt": "The offsite is in Lisbon this year. Lunch is on Friday.",
            "notes/b.md": "Ana booked the hotel near the river. The budget was approved on Monday.",
            "notes/c.txt": "The printer on the second floor is broken again. Nobody has fixed it."}
    for name, text in docs.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(f"\n{text}\n", encoding="utf-8")
    (tmp_path / "notes" / "skip.bin").write_bytes(b"\xff\x00")  # neither .txt nor .md: not a document
    asked = []
    _tiny_agent(monkeypatch, asked)
    protocols = "cacheback(ratio=4, latent_steps=1),retrieval(selector='lexical', ratio=4),fullcontext"
    assert cli.main(["ask", "Where is the offsite?", str(tmp_path / "a.txt"), str(tmp_path / "notes"),
                     "--protocols", protocols, "--json", "--model", "some-model"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert asked == ["some-model"]  # one agent plays every sender and the receiver
    assert [r["protocol"] for r in rows] == ["cacheback(ratio=4, latent_steps=1)",
                                             "retrieval(selector='lexical', ratio=4)", "fullcontext"]
    files = [str(tmp_path / n) for n in ("a.txt", "notes/b.md", "notes/c.txt")]  # the folder's files, sorted
    for r in rows[:2]:
        assert list(r["sent"]) == files
        for f, pieces in r["sent"].items():  # what crossed is the documents' own (stripped) text
            assert pieces and all(p in docs[f.removeprefix(str(tmp_path) + "/")] for p in pieces)
        assert r["message_bytes"] > 0 and r["tteoa"] >= max(r["sender_seconds"])
    assert "Lisbon" in "".join(rows[1]["sent"][files[0]])  # word overlap keeps the offsite sentence
    assert rows[2]["sent"] == {f: [docs[f.removeprefix(str(tmp_path) + "/")]] for f in files}  # all of it


def test_ask_follow_ups_find_every_read_held(monkeypatch, capsys, tmp_path):
    import json

    from latentwire.protocols import reads

    (tmp_path / "a.txt").write_text("The offsite is in Lisbon this year. Lunch is on Friday.", encoding="utf-8")
    (tmp_path / "b.txt").write_text("Ana booked the hotel near the river. The budget was approved.", encoding="utf-8")
    _tiny_agent(monkeypatch)
    computed, real = [], reads.HeldReads.__init__
    monkeypatch.setattr(reads.HeldReads, "__init__", lambda self, *a, **k: (computed.append(self), real(self, *a, **k))[1])
    protocols = "cacheback(ratio=4, latent_steps=1),retrieval(selector='bm25', ratio=4, read='held')"
    assert cli.main(["ask", "Where is the offsite?", str(tmp_path), "--then", "Who booked the hotel?",
                     "--then", "When is lunch?", "--protocols", protocols, "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["turn"], r["protocol"][:9]) for r in rows] == [(t, p) for t in range(3) for p in ("cacheback", "retrieval")]
    assert [r["question"] for r in rows[::2]] == ["Where is the offsite?", "Who booked the hotel?", "When is lunch?"]
    (held,) = computed  # one store for every question: the documents are read once, then held
    assert held.reads_computed == 4  # 2 prefills + 2 latent runs
    assert held.indexes_computed == 4  # 2 BM25 indexes, 2 CacheBack document layouts (rows → text, sentences)
    for r in rows:
        first = r["turn"] == 0
        assert all((x > 0) == first for x in r["read_seconds"])  # follow-ups are charged no read
        assert r["tteoa"] > r["tteoa_question"] if first else r["tteoa"] == r["tteoa_question"]
    assert cli.main(["ask", "Where is the offsite?", str(tmp_path), "--then", "When is lunch?", "--protocols",
                     "cacheback(ratio=4, latent_steps=1)"]) == 0
    text = capsys.readouterr().out
    assert "Q1: Where is the offsite?" in text and "follow-up Q2: When is lunch?" in text
    assert text.count("question-time") == 3 and "every read and index was held from the first question" in text
    assert cli.main(["ask", "Q?", str(tmp_path), "--then", "  "]) == 2
    assert "a question is empty" in capsys.readouterr().err


def test_ask_refuses_bad_files_before_loading_a_model(monkeypatch, capsys, tmp_path):
    def no_load(args):
        raise AssertionError("the model loaded before the files were checked")

    monkeypatch.setattr(commands, "_load_agent", no_load)
    (tmp_path / "empty.txt").write_text("  \n", encoding="utf-8")
    (tmp_path / "latin1.txt").write_bytes("café".encode("latin-1"))
    (tmp_path / "nodocs").mkdir()
    cases = {str(tmp_path / "missing.txt"): "no such file", str(tmp_path / "empty.txt"): "empty document",
             str(tmp_path / "latin1.txt"): "not UTF-8", str(tmp_path / "nodocs"): "no .txt or .md"}
    for path, said in cases.items():
        assert cli.main(["ask", "q?", path]) == 2
        err = capsys.readouterr().err
        assert "ConfigError" in err and said in err and path in err
    assert cli.main(["ask", "q?", str(tmp_path / "empty.txt"), "--protocols", "nosuch"]) == 2  # the spec first
    assert "valid: alone, cacheback" in capsys.readouterr().err


def test_ask_runs_the_protocols_that_fit_and_says_what_to_change(monkeypatch, capsys, tmp_path):
    agent = _tiny_agent(monkeypatch)
    words = "The offsite is in Lisbon. " * (agent.context_window // 5)  # ~1.2 windows of tokens
    (tmp_path / "a.txt").write_text(words, encoding="utf-8")
    (tmp_path / "b.txt").write_text(words, encoding="utf-8")
    assert cli.main(["ask", "Where?", str(tmp_path / "a.txt"), str(tmp_path / "b.txt"),
                     "--protocols", "fullcontext,retrieval(selector='lexical', ratio=64)"]) == 0
    out, err = capsys.readouterr()
    assert "fullcontext: does not fit" in err and "larger ratio" in err
    assert out.startswith("retrieval(selector='lexical', ratio=64): ") and "bytes sent" in out
    assert cli.main(["ask", "Where?", str(tmp_path / "a.txt"), "--protocols", "fullcontext"]) == 2  # nothing ran


def test_ask_reads_each_file_once_and_a_failing_protocol_lets_the_others_run(monkeypatch, capsys, tmp_path):
    import json

    from latentwire.errors import StateFormatError
    from latentwire.protocols.fullcontext import FullContext

    (tmp_path / "A.MD").write_bytes("\ufeffThe offsite is in Lisbon this year.".encode("utf-8"))  # a BOM, upper case
    (tmp_path / "b.txt").write_text("Ana booked the hotel near the river.", encoding="utf-8")
    names, texts = commands.read_documents([str(tmp_path), str(tmp_path / "b.txt")])  # b.txt twice: read once
    assert names == [str(tmp_path / "A.MD"), str(tmp_path / "b.txt")]
    assert texts == ["The offsite is in Lisbon this year.", "Ana booked the hotel near the river."]
    _tiny_agent(monkeypatch)
    monkeypatch.setattr(FullContext, "run", lambda *a, **k: (_ for _ in ()).throw(StateFormatError("no such layout")))
    assert cli.main(["ask", "Where is the offsite?", str(tmp_path), "--json",
                     "--protocols", "fullcontext,retrieval(selector='lexical', ratio=4)"]) == 0
    out, err = capsys.readouterr()
    rows = [json.loads(line) for line in out.splitlines()]  # --json: every stdout line is one JSON object
    assert rows[0] == {"question": "Where is the offsite?", "turn": 0, "protocol": "fullcontext",
                       "error": "StateFormatError: no such layout"}
    assert rows[1]["protocol"].startswith("retrieval") and "answer" in rows[1]
    assert "fullcontext: cannot run: StateFormatError: no such layout" in err


def test_cli_refusals_before_any_model_loads(monkeypatch, capsys, tmp_path):
    def no_load(args):
        raise AssertionError("the model loaded before the arguments were checked")

    monkeypatch.setattr(commands, "_load_agent", no_load)
    (tmp_path / "a.txt").write_text("The offsite is in Lisbon.", encoding="utf-8")
    assert cli.main(["ask", str(tmp_path / "a.txt"), str(tmp_path), "--then", "Where?"]) == 2  # no question first
    assert "the first argument is the question" in capsys.readouterr().err
    for flags in (["--attach"], ["--address", "auto"], ["--num-cpus", "4"]):
        assert cli.main(["demo", *flags]) == 2
        assert f"{flags[0]} only apply with --transport ray" in capsys.readouterr().err
    (tmp_path / "empty.jsonl").write_text("\n", encoding="utf-8")
    assert cli.main(["inspect", "--task", str(tmp_path / "empty.jsonl")]) == 2
    assert "has no episodes" in capsys.readouterr().err
    (tmp_path / "latin1.jsonl").write_bytes('{"id": "café"}\n'.encode("latin-1"))
    assert cli.main(["inspect", "--task", str(tmp_path / "latin1.jsonl")]) == 2
    assert "TaskFormatError" in (err := capsys.readouterr().err) and "not UTF-8" in err

"""Bench harness: task loading and the runner (resume, typed errors, one run per folder, files written whole)."""
import json
from pathlib import Path

import pytest

from latentwire.agent import Agent
from latentwire.bench.episode import Episode, Span, load_episodes, write_episodes
from latentwire.bench.report import read_run, write_report
from latentwire.bench.runner import RunConfig, parse_protocols, run
from latentwire.errors import ConfigError, LatentWireError, TaskFormatError
from latentwire.models import tiny_model, tiny_tokenizer


def test_parse_protocols_specs():
    p = parse_protocols("text, fullkv(latent_steps=8, latent_mode='realign'),alone")
    assert list(p) == ["text", "fullkv(latent_steps=8, latent_mode='realign')", "alone"]
    assert p["fullkv(latent_steps=8, latent_mode='realign')"] == ("fullkv", {"latent_steps": 8, "latent_mode": "realign"})
    with pytest.raises(ValueError):
        parse_protocols("full kv")
    tail = parse_protocols(r"retrieval(selector='a\\'),alone")  # a string ending in an escaped backslash closes
    assert list(tail) == [r"retrieval(selector='a\\')", "alone"] and tail[r"retrieval(selector='a\\')"][1] == {
        "selector": "a\\"}


def test_loader_errors_name_file_line_and_field(tmp_path):
    good = Episode("e1", "t", "fanin", "Q?", ["x"], ("ctx one",), (Span(0, 0, 3),))
    path = tmp_path / "t.jsonl"
    write_episodes(path, [good])
    assert load_episodes(path)[0].to_json() == good.to_json()
    bad = json.loads(good.to_json()) | {"evidence": [{"agent": 0, "start": 2, "end": 99}]}
    path.write_text(good.to_json() + "\n" + json.dumps(bad | {"id": "e2"}) + "\n")
    with pytest.raises(TaskFormatError, match=r"t\.jsonl:2: .*evidence\[0\]"):
        load_episodes(path)
    path.write_text(json.dumps({k: v for k, v in json.loads(good.to_json()).items() if k != "question"}) + "\n")
    with pytest.raises(TaskFormatError, match=r"t\.jsonl:1: missing field 'question'"):
        load_episodes(path)
    path.write_text("{not json\n")
    with pytest.raises(TaskFormatError, match=r"t\.jsonl:1: not JSON"):
        load_episodes(path)


def test_runner_resumes_records_errors_and_reports(tiny_task, tmp_path):
    agent = Agent(tiny_model("llama"), tiny_tokenizer(), "llama", context_window=1000)
    out = tmp_path / "run"
    cfg = RunConfig(str(tiny_task), "alone(max_new_tokens=2),fullkv(latent_steps=0, max_new_tokens=2)", "llama")
    run(cfg, out, progress=False, agent=agent)
    records = [json.loads(l) for l in (out / "records.jsonl").read_text().splitlines()]
    assert len(records) == 6
    full = [r for r in records if r["protocol"].startswith("fullkv")]
    assert all(r["error"] is None and r["evidence_recall"] == 1.0 and r["compression_ratio"] == 1.0 for r in full)
    eps = {json.loads(l)["id"]: json.loads(l) for l in tiny_task.read_text().splitlines()}
    for r in full:  # full KV keeps every character of every context, and the record says so
        assert [[c[a:b] for a, b in keep] for c, keep in zip(eps[r["episode"]]["contexts"], r["kept_spans"])] \
            == [[c] for c in eps[r["episode"]]["contexts"]]
    assert all("kept_spans" not in r for r in records if r["protocol"].startswith("alone"))
    # Resuming skips finished records: the file is unchanged.
    before = (out / "records.jsonl").read_text()
    run(cfg, out, progress=False, agent=agent)
    assert (out / "records.jsonl").read_text() == before
    cfgd = json.loads((out / "config.json").read_text())
    assert cfgd["episodes"] == ["e0", "e1", "e2"] and "torch" in cfgd["environment"]
    # A different configuration in the same folder is refused.
    with pytest.raises(ConfigError, match=r"holds a run with another task/model/n/seed\S* \(seed: 0 there, 1 now\)"):
        run(RunConfig(str(tiny_task), "alone", "llama", seed=1), out, progress=False, agent=agent)
    report = write_report(out)
    assert "| `alone(max_new_tokens=2)` | 3 | 0 |" in report.read_text()
    assert "3 episodes (every episode of the task, filters none)" in report.read_text()  # no sample: no seed
    assert (out / "accuracy_vs_tteoa.png").stat().st_size > 1000 and (out / "recall_vs_ratio.png").exists()
    # A record still being written (cut, no newline yet) is left out of a report on a running folder; a whole one
    # whose newline is not there yet is read.
    from latentwire.bench.report import read_run

    (out / "records.jsonl").write_text(before + before.splitlines()[0][:40])
    assert len(read_run(out)[1]) == 6
    (out / "records.jsonl").write_text(before + before.splitlines()[0])
    assert len(read_run(out)[1]) == 7
    (out / "records.jsonl").write_text(before + "{cut\n")  # a broken line that ended: not a run in progress
    with pytest.raises(LatentWireError, match="not a readable run folder"):
        read_run(out)


def test_runner_records_typed_errors_and_goes_on(tiny_task, tmp_path):
    # with aware reads (the question after each document) e0 fits the window, e1 and e2 do not
    agent = Agent(tiny_model("llama"), tiny_tokenizer(), "llama", context_window=260)
    spec = "fullkv(latent_steps=0, query_aware=True, max_new_tokens=2)"
    run(RunConfig(str(tiny_task), spec, "llama"), tmp_path / "r", progress=False, agent=agent)
    records = [json.loads(l) for l in (tmp_path / "r" / "records.jsonl").read_text().splitlines()]
    assert len(records) == 3
    assert records[0]["error"] is None
    assert all(r["error"].startswith("ContextOverflowError") and r["accuracy"] == 0.0 for r in records[1:])
    assert "errors" in write_report(tmp_path / "r").read_text().lower()


def test_bad_specs_and_parameters_are_config_errors():
    from latentwire.errors import ConfigError
    from latentwire.protocols import get_protocol

    for spec in ("fullkv(8)", "fullkv(latent_steps=)", "full kv"):
        with pytest.raises(ConfigError):
            parse_protocols(spec)
    # nothing is dropped silently: every spec is read whole, or refused naming what is wrong
    for spec, what in [("text,cacheback(ratio=8", "never closed"), ("text),cacheback(ratio=8)", "closes nothing"),
                       ("cacheback(ratio=8)(latent_steps=4)", "want name"), ("cacheback(ratio=8, ratio=2)", "ratio given twice"),
                       ("text, text", "given twice"), ("cacheback(selector=bm25)", "selector=bm25 is not a Python literal"),
                       (" , ", "no protocol"), ("text(note='open", "string is never closed")]:
        with pytest.raises(ConfigError, match=what):
            parse_protocols(spec)
    assert parse_protocols("text(note='a, (b'), alone")["text(note='a, (b')"] == ("text", {"note": "a, (b"})
    with pytest.raises(ConfigError, match="latent_step"):
        get_protocol("fullkv", latent_step=8)  # unknown field
    with pytest.raises(ConfigError):
        get_protocol("fullkv", latent_steps=-1)


def test_an_episode_error_is_recorded_but_a_missing_model_or_extra_stops_the_run(tiny_task):
    from latentwire.bench.runner import run_episode
    from latentwire.errors import ContextOverflowError, MissingExtraError, ModelNotFoundError

    ep = load_episodes(tiny_task)[0]

    class Raises:
        def __init__(self, error):
            self.error = error

        def run(self, *args):
            raise self.error

    rec = run_episode(Raises(ContextOverflowError(9, 8, {"prompt": 9})), "p", ep, None)
    assert rec["error"].startswith("ContextOverflowError") and rec["accuracy"] == 0.0
    for error in (ModelNotFoundError("no encoder here"), MissingExtraError("the encoder", "dense", "pkg")):
        with pytest.raises(type(error)):  # the machine, not the episode: every later episode would fail alike
            run_episode(Raises(error), "p", ep, None)


def test_resume_drops_a_line_cut_short_and_refuses_another_n(tiny_task, tmp_path):
    from latentwire.errors import ConfigError

    agent = Agent(tiny_model("llama"), tiny_tokenizer(), "llama", context_window=1000)
    out, cfg = tmp_path / "run", RunConfig(str(tiny_task), "alone(max_new_tokens=1)", "llama")
    run(cfg, out, progress=False, agent=agent)
    lines = (out / "records.jsonl").read_text().splitlines()
    (out / "records.jsonl").write_text("\n".join(lines[:2]) + "\n" + lines[2][:25])  # crash mid-write
    run(cfg, out, progress=False, agent=agent)
    again = [json.loads(l) for l in (out / "records.jsonl").read_text().splitlines()]
    assert [r["episode"] for r in again] == ["e0", "e1", "e2"]
    cfgd = json.loads((out / "config.json").read_text())
    assert len(cfgd["resumed"]) == 1
    # each record names the invocation that wrote it: e2 was rewritten by the resume
    first, resumed = cfgd["environment"]["run"], cfgd["resumed"][0]["run"]
    assert first != resumed and [r["run"] for r in again] == [first, first, resumed]
    with pytest.raises(ConfigError):
        run(RunConfig(str(tiny_task), "alone(max_new_tokens=1)", "llama", n=2), out, progress=False, agent=agent)
    assert sorted(cfgd["episode_sha256"]) == ["e0", "e1", "e2"]
    task_text = tiny_task.read_text()
    tiny_task.write_text(task_text.replace('"answers": ["', '"answers": ["fixed alias", "', 1))  # a gold fixed
    with pytest.raises(ConfigError, match=r"episodes e0 \(1 in all\) had other content"):  # not scored on the old
        run(RunConfig(str(tiny_task), "alone(max_new_tokens=1),alone(max_new_tokens=2)", "llama"), out,
            progress=False, agent=agent)
    tiny_task.write_text(task_text)
    del cfgd["episode_sha256"]  # a folder written before the hashes: gains them
    (out / "config.json").write_text(json.dumps(cfgd))
    run(cfg, out, progress=False, agent=agent)
    assert sorted(json.loads((out / "config.json").read_text())["episode_sha256"]) == ["e0", "e1", "e2"]
    stray = json.loads((out / "records.jsonl").read_text().splitlines()[0]) | {"episode": "e-old"}
    with (out / "records.jsonl").open("a") as f:  # a record of an episode the run's selection no longer holds
        f.write(json.dumps(stray) + "\n")
    assert {r["episode"] for r in read_run(out)[1]} == {"e0", "e1", "e2"}
    (out / "records.jsonl").write_text("".join(line + "\n" for line in (out / "records.jsonl").read_text()
                                               .splitlines() if "e-old" not in line))
    good = (out / "records.jsonl").read_text()
    torn = good.replace("\n", "\n{torn\n", 1)  # a bad line mid-file is not a crash's cut last line: refused, kept
    (out / "records.jsonl").write_text(torn)
    with pytest.raises(ConfigError, match=r"records\.jsonl: line 2 is not a JSON record"):
        run(cfg, out, progress=False, agent=agent)
    assert (out / "records.jsonl").read_text() == torn


def test_one_run_per_folder_and_files_written_whole(tiny_task, tmp_path, monkeypatch):
    from latentwire.bench import folder, runner
    from latentwire.errors import ConfigError

    agent = Agent(tiny_model("llama"), tiny_tokenizer(), "llama", context_window=1000)
    out, cfg = tmp_path / "run", RunConfig(str(tiny_task), "alone(max_new_tokens=1)", "llama")
    with folder.run_lock(tmp_path):  # another process writing the folder: refused before anything is written
        out.mkdir()
        (out / "config.json").write_text("{}")  # the holder's, written after the refused run looked
        with folder.run_lock(out), pytest.raises(ConfigError, match="another run"):
            run(cfg, out, progress=False, agent=agent)
        assert sorted(p.name for p in out.iterdir()) == [folder.LOCK, "config.json"]  # nothing written or removed
        (out / "config.json").unlink()
    run(cfg, out, progress=False, agent=agent)
    rec = out / "records.jsonl"
    before = rec.stat().st_ino
    folder.drop_cut_lines(rec)  # nothing to drop: the file is not rewritten (a rewrite replaces the inode)
    assert rec.stat().st_ino == before
    text = rec.read_text()
    rec.write_text(text.rstrip("\n"))  # whole records, the last one's newline lost: restored, nothing dropped
    folder.drop_cut_lines(rec)
    assert rec.read_text() == text
    line = json.dumps({"episode": "e9", "protocol": "x", "answer": "a\u2028b\x85c"}, ensure_ascii=False)
    rec.write_text(text + line + "\n")  # line separators inside a string: one record, kept whole
    folder.drop_cut_lines(rec)
    assert rec.read_text() == text + line + "\n" and ("e9", "x") in folder.finished(rec, "episode")
    rec.write_text("[1, 2]\n" + text + line + "\n")  # JSON but not a record, mid-file: refused, not a TypeError
    with pytest.raises(ConfigError, match="line 1 is not a JSON record"):
        folder.drop_cut_lines(rec)
    assert ("e9", "x") in folder.finished(rec, "episode")  # reads past it
    with pytest.raises(LatentWireError, match="line 1 is not a record"):
        read_run(out)
    rec.write_text(text + line + "\n")
    writes = []
    real = folder.os.replace
    monkeypatch.setattr(folder.os, "replace", lambda a, b: (writes.append(Path(b).name), real(a, b))[1])
    run(RunConfig(str(tiny_task), "alone(max_new_tokens=1),alone(max_new_tokens=2)", "llama"), out, progress=False,
        agent=agent)
    assert writes == ["config.json"] and not list(out.glob(".*.tmp"))  # config.json replaced whole
    (out / "config.json").write_text('{"config": ')  # cut short: refused, named, not a raw JSON traceback
    with pytest.raises(ConfigError, match="config.json is not valid JSON"):
        run(cfg, out, progress=False, agent=agent)
    assert runner.parse_filters(["x=1.5"]) == {"x": 1.5}
    with pytest.raises(ConfigError, match="finite"):
        runner.parse_filters(["x=1e999"])
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(ConfigError, match="is a file"):
        run(cfg, afile, progress=False)  # before any model loads: agent=None would load "llama"


def test_a_byte_order_mark_an_unreadable_task_and_an_out_under_a_file_are_typed(tiny_task, tmp_path):
    """A task file saved with a BOM loads; a folder given as the task, or --out under a file, is a typed error
    naming the path, not an OSError traceback."""
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + tiny_task.read_bytes())
    assert [e.id for e in load_episodes(bom)] == [e.id for e in load_episodes(tiny_task)]
    with pytest.raises(TaskFormatError, match="cannot be read"):
        load_episodes(tmp_path)
    agent = Agent(tiny_model("llama"), tiny_tokenizer(), "llama", context_window=1000)
    with pytest.raises(ConfigError, match="cannot create the folder"):
        run(RunConfig(str(tiny_task), "alone(max_new_tokens=1)", "llama"), tiny_task / "run", progress=False,
            agent=agent)


def test_bad_arguments_leave_no_run_folder(tiny_task, tmp_path):
    """Model, protocol specs and parameters, task and filters are checked before --out is created."""
    from latentwire import cli

    out = tmp_path / "run"
    base = ["bench", "run", "--task", str(tiny_task), "--protocols", "alone", "--out", str(out), "--device", "cpu"]
    for swap in (["--model", "./no-such-model"], ["--protocols", "fullkv(latent_step=8)"], ["--protocols", "nope"],
                 ["--task", str(tmp_path / "missing.jsonl")], ["--filter", "hops=9"], ["--n", "0"],
                 ["--device", "nosuchdevice"]):
        assert cli.main(base + swap) == 2, swap
        assert not out.exists(), swap


def test_resuming_after_a_default_changed_is_refused(tiny_task, tmp_path):
    """config.json records every parameter a protocol ran with, defaults included: a resume whose protocol would
    run with another value under the same label is refused; a folder recorded before that gains them."""
    agent = Agent(tiny_model("llama"), tiny_tokenizer(), "llama", context_window=1000)
    out, label = tmp_path / "run", "alone(max_new_tokens=1)"
    run(RunConfig(str(tiny_task), label, "llama", n=2), out, progress=False, agent=agent)
    path = out / "config.json"
    record = json.loads(path.read_text())
    assert record["config"]["protocols"][label] == {"name": "alone", "params": {"max_new_tokens": 1},
                                                   "parameters": {"max_new_tokens": 1}}
    del record["config"]["protocols"][label]["parameters"]  # as an older run wrote it
    path.write_text(json.dumps(record))
    run(RunConfig(str(tiny_task), f"{label},alone", "llama", n=2), out, progress=False, agent=agent)
    protocols = json.loads(path.read_text())["config"]["protocols"]
    assert list(protocols) == [label, "alone"] and protocols[label]["parameters"] == {"max_new_tokens": 1}
    assert protocols["alone"]["parameters"] == {"max_new_tokens": 48}
    assert "parameters_since" in protocols[label] and "parameters_since" not in protocols["alone"]
    assert "2 episodes (a sample of 2, seed 0, filters none)" in write_report(out).read_text()
    run(RunConfig(str(tiny_task), "alone", "llama", n=5), tmp_path / "all", progress=False, agent=agent)
    assert "3 episodes (every episode of the task, filters none)" in write_report(tmp_path / "all").read_text()
    record = json.loads(path.read_text())
    record["config"]["protocols"]["alone"]["parameters"]["gone"] = 1  # a parameter on one side only: not compared
    path.write_text(json.dumps(record))
    run(RunConfig(str(tiny_task), "alone", "llama", n=2), out, progress=False, agent=agent)
    record = json.loads(path.read_text())
    record["config"]["protocols"]["alone"]["parameters"]["max_new_tokens"] = 32  # the default when it first ran
    path.write_text(json.dumps(record))
    lines = (out / "records.jsonl").read_text()
    with pytest.raises(ConfigError, match="'alone' ran with other parameters \\(max_new_tokens: 32 there, 48 now"):
        run(RunConfig(str(tiny_task), "alone", "llama", n=2), out, progress=False, agent=agent)
    assert (out / "records.jsonl").read_text() == lines


def test_run_failing_before_its_first_record_leaves_nothing(tiny_task, tmp_path, monkeypatch):
    import latentwire.bench.runner as runner

    agent = Agent(tiny_model("llama"), tiny_tokenizer(), "llama", context_window=1000)
    out, cfg = tmp_path / "run", RunConfig(str(tiny_task), "alone(max_new_tokens=1)", "llama")

    def boom(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run_episode", boom)
    with pytest.raises(KeyboardInterrupt):
        run(cfg, out, progress=False, agent=agent)
    assert not out.exists()
    monkeypatch.undo()
    # A folder an older run left with a config but no records is not "another run": it is reused.
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"config": {"model": "typo"}, "environment": {}, "resumed": []}))
    run(cfg, out, progress=False, agent=agent)
    assert json.loads((out / "config.json").read_text())["config"]["model"] == "llama"


def test_run_prints_every_protocol_parameter(tiny_task, tmp_path, capsys):
    agent = Agent(tiny_model("llama"), tiny_tokenizer(), "llama", context_window=1000)
    run(RunConfig(str(tiny_task), "alone(max_new_tokens=1),cacheback(ratio=4, max_new_tokens=1)", "llama", n=1),
        tmp_path / "run", agent=agent)
    text = capsys.readouterr().out
    assert "alone(max_new_tokens=1): alone(max_new_tokens=1)" in text
    line = next(l for l in text.splitlines() if l.strip().startswith("cacheback("))
    assert all(k in line for k in ("ratio=4", "latent_steps=8", "selector='cacheback'", "span_mode="))

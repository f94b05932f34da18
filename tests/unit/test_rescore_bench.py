"""benchmarks/rescore.py: a folder's records scored again from their answers, written whole, noted in config."""
from __future__ import annotations

import json
from pathlib import Path

from latentwire.bench.episode import Episode, write_episodes

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_stale_code_scores_are_rescored_once_and_noted(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import rescore

    write_episodes(tmp_path / "episodes.jsonl", [
        Episode("code-1", "code", "fanin", "What does f return?", ["-1"], ("def f(): return -1",)),
        Episode("facts-1", "facts", "fanin", "Which style?", ["hip hop"], ("She dances hip-hop.",))])
    old = {"em": 0.0, "f1": 1.0, "accuracy": 1.0, "strict": 1.0}  # as SQuAD text: "-1" == "1", "hip-hop" != "hip hop"
    records = [{"episode": "code-1", "protocol": "p", "answer": "It returns `1`.", **old},
               {"episode": "facts-1", "protocol": "p", "answer": "hip-hop", **old | {"accuracy": 0.0, "strict": 0.0}},
               {"episode": "code-1", "protocol": "q", "answer": "", "em": 0.0, "f1": 0.0, "accuracy": 0.0,
                "strict": 0.0, "error": "ContextOverflowError: too long"},
               {"kind": "summary", "note": "not an answer record"}]
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "config.json").write_text(json.dumps({"config": {"task": "elsewhere.jsonl"}}))

    changed, accuracy = rescore.rescore(tmp_path, write=False)
    assert changed == {"p": 2} and accuracy == {"p": 2}
    assert json.loads((tmp_path / "records.jsonl").read_text().splitlines()[0])["accuracy"] == 1.0  # not written

    rescore.rescore(tmp_path, write=True)
    got = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    assert got[0]["accuracy"] == 0.0 and got[0]["f1"] < 1.0 and got[0]["answer"] == "It returns `1`."
    assert got[1]["accuracy"] == 1.0 and got[1]["em"] == 1.0
    assert got[2:] == records[2:]  # failed and non-answer records untouched
    assert list(got[0]) == list(records[0])  # field order kept
    note = json.loads((tmp_path / "config.json").read_text())["rescored"]
    assert len(note) == 1 and note[0]["changed"] == 2 and note[0]["accuracy_changed"] == 2
    assert rescore.rescore(tmp_path, write=True) == ({}, {})  # idempotent: nothing left to change, no new note
    assert len(json.loads((tmp_path / "config.json").read_text())["rescored"]) == 1


def test_a_folder_without_resolvable_episodes_is_skipped(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import rescore

    (tmp_path / "records.jsonl").write_text("")
    (tmp_path / "config.json").write_text(json.dumps({"config": {"sharer": "a", "receiver": "b", "task": "pairs"}}))
    assert rescore.rescore(tmp_path, write=True) is None
    (tmp_path / "config.json").write_text(json.dumps({"config": {"task": "facts"}}))  # resolvable, but records are
    (tmp_path / "records.jsonl").write_text(json.dumps({"pair": "facts-test-0000", "answer": "x", "accuracy": 0.0})
                                            + "\n")  # keyed by pair (a translator folder): not scored here
    assert rescore.rescore(tmp_path, write=True) is None


def test_every_committed_record_is_scored_by_the_current_metrics(monkeypatch):
    """A scorer change must come with the committed records rescored (and their pages regenerated)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import rescore

    stale = {}
    for folder in sorted({p.parent for p in (rescore.ROOT / "docs" / "results").rglob("records.jsonl")}):
        result = rescore.rescore(folder, write=False)
        if result and result[0]:
            stale[str(folder.relative_to(rescore.ROOT))] = sum(result[0].values())
    assert not stale, f"run `python benchmarks/rescore.py --all`: {stale}"


def test_rescoring_a_folder_a_run_is_writing_is_refused(tmp_path, monkeypatch):
    """rescore replaces records.jsonl: a live run would go on appending to the replaced file and lose every record it
    wrote after. It takes the run lock first, so it refuses while a run holds the folder; --check reads only."""
    import sys

    import pytest

    from latentwire.bench import folder
    from latentwire.errors import ConfigError

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import rescore

    write_episodes(tmp_path / "episodes.jsonl", [Episode("code-1", "code", "fanin", "Q?", ["-1"], ("x = -1",))])
    line = json.dumps({"episode": "code-1", "protocol": "p", "answer": "1", "em": 1.0, "f1": 1.0, "accuracy": 1.0,
                       "strict": 1.0}) + "\n"
    (tmp_path / "records.jsonl").write_text(line)
    (tmp_path / "config.json").write_text(json.dumps({"config": {"task": "elsewhere.jsonl"}}))
    monkeypatch.setattr(sys, "argv", ["rescore.py", str(tmp_path)])
    with folder.run_lock(tmp_path), pytest.raises(ConfigError, match="being written by another run"):
        rescore.main()
    assert (tmp_path / "records.jsonl").read_text() == line  # untouched
    monkeypatch.setattr(sys, "argv", ["rescore.py", "--check", str(tmp_path)])
    with folder.run_lock(tmp_path), pytest.raises(SystemExit):  # reads only: runs, and exits 1 (a record would change)
        rescore.main()
    monkeypatch.setattr(sys, "argv", ["rescore.py", str(tmp_path)])
    rescore.main()  # no run: rescored
    assert json.loads((tmp_path / "records.jsonl").read_text())["accuracy"] == 0.0

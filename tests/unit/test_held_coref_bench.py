"""benchmarks/held_coref.py on a tiny model: every protocol from held documents, full KV's question time is its
receiver's alone, resumable, and its page names every pre-specified verdict."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from latentwire.agent import Agent
from latentwire.bench.episode import Episode, Span

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_the_study_runs_from_held_documents_resumes_and_reports(tmp_path, monkeypatch, models, tokenizer):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import held_coref

    monkeypatch.chdir(tmp_path)
    agent = Agent(models["qwen2"], tokenizer, model_name="qwen2")
    folder = tmp_path / held_coref.CELL
    folder.mkdir()
    docs = ("Mira Novak joined in 2019. She can play the cello. Rain fell.",
            "Bo Lind joined in 2020. He can play the oboe. The lift broke.", "Ada Berg can play the harp.")
    episode = Episode("coref-x", "coref", "fanin", "Which instrument can Mira Novak play?", ["cello"], docs,
                      (Span(0, 27, 50),))
    held_coref.ensure_episodes(folder / "episodes.jsonl", [episode])
    protocols = held_coref.PROTOCOLS
    held_coref.run_cell(agent, folder, [[episode]], "qwen2", protocols)
    records = {r["protocol"]: r for r in map(json.loads, (folder / "records.jsonl").read_text().splitlines())}
    assert sorted(records) == sorted(held_coref.PROTOCOLS) and all(r["error"] is None for r in records.values())
    kv = records[held_coref.FULLKV]  # the senders hold their states: the question costs the receiver alone
    assert kv["tteoa_question"] == pytest.approx(kv["receiver_seconds"])
    assert kv["tteoa"] == pytest.approx(max(kv["sender_seconds"]) + kv["receiver_seconds"])
    assert kv["tteoa"] > kv["tteoa_question"]  # cold: the reads the question did not wait for
    for label in (held_coref.TEXTH, held_coref.PROBE, held_coref.DRAFT, held_coref.BM25H, held_coref.DENSEH):
        r = records[label]  # a held read (an LLM's, or a retriever's index) is charged to the cold figure only
        assert r["tteoa_question"] is not None and r["tteoa_question"] < r["tteoa"], label
    assert records[held_coref.FULLCTX]["tteoa_question"] == pytest.approx(records[held_coref.FULLCTX]["tteoa"])
    held_coref.run_cell(agent, folder, [[episode]], "qwen2", protocols)  # resuming adds nothing
    assert len((folder / "records.jsonl").read_text().splitlines()) == len(records)
    held_coref.write_report(folder, held_coref.FAMILY, None, question_time=True, complete=True)
    held_coref.write_index(tmp_path, 1, 3)
    page = (tmp_path / "README.md").read_text()
    assert "1 of 1 fresh episodes (seed 3)" in page
    for label in held_coref.PROTOCOLS:
        assert f"| `{label}` | 1 |" in page, label
    verdicts = page.split("## Verdicts")[1].split("Holm p:")[0]
    rows = [line for line in verdicts.splitlines() if line.startswith("| `")]
    assert [r.split(" | ")[0] for r in rows] == [f"| `{a}` vs `{b}`" for a, b in held_coref.FAMILY]
    assert all(r.endswith("(question-time) |") for r in rows)  # every ratio from the question's arrival
    assert f"over the {len(held_coref.FAMILY)} verdicts" in page and "## Where the time goes" in page

    # a typed error scores 0 and has no costs: the page still writes, its costs over the records that ran
    lines = (folder / "records.jsonl").read_text().splitlines()
    failed = [json.loads(line) for line in lines]
    for r in failed:
        if r["protocol"] == held_coref.DENSEH:
            r.update(answer="", accuracy=0.0, message_bytes=None, receiver_context=None, receiver_seconds=None,
                     tteoa=None, tteoa_question=None, ttft=None, error="ContextOverflowError: too long")
    (folder / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in failed))
    held_coref.write_index(tmp_path, 1, 3)
    row = next(line for line in (tmp_path / "README.md").read_text().splitlines()
               if line.startswith(f"| `{held_coref.DENSEH}` | 1 |"))
    assert row.endswith("| 0.00 [0.00, 0.00] | — | — | — | — |")


def test_the_episodes_are_fresh_and_prefix_stable(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import held_coref

    few, more = held_coref.episodes(3, 2027), held_coref.episodes(5, 2027)
    assert [e.id for e in few] == [e.id for e in more[:3]] and few == more[:3]
    rival = held_coref.episodes(5, 2026)  # the rival study's seed: other documents
    assert all(a.contexts != b.contexts for a, b in zip(more, rival))

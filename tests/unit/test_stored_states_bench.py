"""benchmarks/stored_states.py on a tiny model: question groups read once, both timings recorded, resumable."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from latentwire.agent import Agent
from latentwire.bench.tasks import facts

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_a_cell_reads_each_group_once_and_records_both_timings(tmp_path, monkeypatch, models, tokenizer):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import stored_states

    monkeypatch.chdir(tmp_path)
    agent = Agent(models["qwen2"], tokenizer, model_name="qwen2")
    folder = tmp_path / "facts1_500"
    folder.mkdir()
    groups = facts.follow_up_episodes(3, 2, tokens=60)
    stored_states.ensure_episodes(folder / "episodes.jsonl", [e for g in groups for e in g])
    protocols = stored_states._split("text(max_report_tokens=4),cacheback(ratio=4, latent_steps=1),"
                                     "cacheback(ratio=4, latent_steps=1, mass=0.9),retrieval(selector='lexical'),"
                                     "text(max_report_tokens=4, read='held')")
    stored_states.run_cell(agent, folder, groups, "qwen2", protocols)
    records = [json.loads(line) for line in (folder / "records.jsonl").read_text().splitlines()]
    assert len(records) == 2 * 3 * len(protocols) and all(r["error"] is None for r in records)
    assert [r["turn"] for r in records if r["protocol"] == protocols[1]] == [0, 1, 2] * 2
    cb = [r for r in records if r["protocol"] == protocols[1]]
    for r in cb:
        if r["turn"] == 0:  # cold: the reads are in the TTEOA, not in the question-time figure
            assert r["tteoa_question"] < r["tteoa"]
        else:  # follow-ups find their reads held
            assert r["tteoa_question"] == pytest.approx(r["tteoa"])
    assert all(r["tteoa_question"] is None for r in records if r["protocol"] == protocols[0])  # text re-reads
    held_text = [r for r in records if r["protocol"] == protocols[4]]  # text from held documents: both timings
    assert all((r["tteoa_question"] < r["tteoa"]) if r["turn"] == 0 else r["tteoa_question"] == pytest.approx(
        r["tteoa"]) for r in held_text) and len(held_text) == 6
    for r in cb:  # each sender read once per group: the follow-ups' reads are held, charged 0 s
        reads = [t["read_s"] for t in r["details"]["senders"]]
        assert (min(reads) > 0) if r["turn"] == 0 else reads == [0.0, 0.0, 0.0]
    before = len(records)
    stored_states.run_cell(agent, folder, groups, "qwen2", protocols)  # resuming adds nothing
    assert len((folder / "records.jsonl").read_text().splitlines()) == before
    stored_states.write_index(tmp_path)
    page = (tmp_path / "README.md").read_text()
    assert "| facts1_500 | `cacheback(ratio=4, latent_steps=1)` | follow-up | 4 |" in page
    assert "## Measured crossover" in page and (tmp_path / "crossover.png").stat().st_size > 0
    assert "| `cacheback(ratio=4, latent_steps=1)` | " in page.split("## Measured crossover")[1]  # its own row

"""benchmarks/rival.py on a tiny model: both passes over one episode, resumable, and its pages."""
from __future__ import annotations

import json
from pathlib import Path

from latentwire.agent import Agent
from latentwire.bench.episode import Episode, Span

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_a_cell_runs_resumes_and_reports(tmp_path, monkeypatch, models, tokenizer):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import rival

    monkeypatch.chdir(tmp_path)
    agent = Agent(models["qwen2"], tokenizer, model_name="qwen2")
    folder = tmp_path / "coref"
    folder.mkdir()
    docs = ("Mira Novak joined in 2019. She can play the cello. Rain fell.",
            "Bo Lind joined in 2020. He can play the oboe. The lift broke.", "Ada Berg can play the harp.")
    episodes = [Episode("coref-x", "coref", "fanin", "Which instrument can Mira Novak play?", ["cello"], docs,
                        (Span(0, 27, 50),))]
    rival.ensure_episodes(folder / "episodes.jsonl", episodes)
    rival.run_cell(agent, folder, episodes, "qwen2")
    records = [json.loads(line) for line in (folder / "records.jsonl").read_text().splitlines()]
    assert sorted(r["protocol"] for r in records) == sorted(rival.PROTOCOLS)
    recall = json.loads((folder / "recall.jsonl").read_text())["recall"]
    want = {f"{s}/{m}/{r}" for s in (*rival.RECALL_SELECTORS, rival.CONTRASTIVE, *(f"{a}⊕{b}" for a, b in rival.FUSED))
            for m in rival.MODES for r in rival.RECALL_RATIOS}
    assert set(recall) == want and all(0.0 <= v <= 1.0 for v in recall.values())
    rival.run_cell(agent, folder, episodes, "qwen2")  # resuming adds nothing
    assert len((folder / "records.jsonl").read_text().splitlines()) == len(records)
    rival.write_index(tmp_path, ["coref", "paraphrase"], 1, 3)
    page = (tmp_path / "README.md").read_text()
    assert "| paraphrase | not run yet |" in page and "CacheBack 8× − BM25 text" in page
    assert "cacheback⊕dense" in page and "## coref" in page

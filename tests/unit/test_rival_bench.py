"""benchmarks/rival.py on a tiny model: both passes over one episode, resumable, and its pages."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from latentwire.agent import Agent
from latentwire.bench.episode import Episode, Span, write_episodes

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
    (tmp_path / "paraphrase").mkdir()
    (tmp_path / "paraphrase" / "records.jsonl").touch()  # a run opens its records file before the first record
    rival.write_index(tmp_path, ["coref", "paraphrase"], 1, 3)
    page = (tmp_path / "README.md").read_text()
    assert "coref_spans" not in page  # no rerun yet: no link
    (tmp_path / "coref_spans").mkdir()
    (tmp_path / "coref_spans" / "README.md").write_text("# rerun")
    rival.write_index(tmp_path, ["coref", "paraphrase"], 1, 3)
    page = (tmp_path / "README.md").read_text()
    assert "[coref_spans/README.md](coref_spans/README.md)" in page and "paraphrase_spans" not in page
    assert "| contender | coref (1) | paraphrase (not run yet) |" in page
    assert "| CacheBack 8× − BM25 text | " in page and "| dense text | " in page
    assert "cacheback⊕dense" in page and "## coref" in page


def test_given_evidence_pairs_only_episodes_where_both_messages_carried_it_all(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from rival_given_evidence import given_evidence

    def rec(protocol, episode, recall, accuracy):
        return {"protocol": protocol, "episode": episode, "evidence_recall": recall, "accuracy": accuracy}

    records = [rec("m", "e1", 1.0, 1.0), rec("d", "e1", 1.0, 0.0),  # both carried it: counted
               rec("m", "e2", 1.0, 0.0), rec("d", "e2", 1.0, 1.0),  # counted
               rec("m", "e3", 0.5, 0.0), rec("d", "e3", 1.0, 1.0),  # m missed part of it: left out
               rec("m", "e4", None, 1.0), rec("d", "e4", 1.0, 0.0),  # no recall recorded: left out
               rec("m", "e5", 1.0, 1.0), rec("d", "e5", 1.0, 1.0)]
    n, acc, base, (diff, lo, hi) = given_evidence(records, "m", "d")
    assert (n, acc, base, diff) == (3, 2 / 3, 2 / 3, 0.0) and lo <= 0.0 <= hi
    assert given_evidence(records, "m", "absent")[0] == 0


def test_the_hedge_proof_score_and_the_decoy_check(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import rival_robustness as rr

    docs = ("Mira Novak can play the cello.", "Bo Lind can play the oboe.", "Ada Berg was born in Hobart.")
    single = Episode("p-1", "paraphrase", "fanin", "Which musical instrument does Mira Novak practise?", ["cello"],
                     docs, (Span(0, 0, 30),), {"qtype": "instrument"})
    assert rr.hedge_proof({"answer": "The cello.", "accuracy": 1.0}, single) == 1.0
    assert rr.hedge_proof({"answer": "The cello or the oboe.", "accuracy": 1.0}, single) == 0.0  # a hedge
    assert rr.has_decoy(single)  # the oboe is another value of the asked relation
    alone = Episode("p-2", "paraphrase", "fanin", "Q?", ["cello"], docs[:1] + docs[2:], (), {"qtype": "instrument"})
    assert not rr.has_decoy(alone)
    agg = Episode("a-1", "aggregate", "fanin", "Q?", {"p0": ["cello"], "p1": ["oboe"]}, docs, (),
                  {"qtype": "instrument"})
    assert rr.hedge_proof({"answer": "cello and oboe", "accuracy": 1.0}, agg) == 1.0
    assert rr.hedge_proof({"answer": "cello, oboe, tuba, sitar", "accuracy": 1.0}, agg) == 2 * 2 / (4 + 2)  # set F1
    assert rr.hedge_proof({"answer": "a tuba", "accuracy": 0.0}, agg) == 0.0


def test_a_cell_whose_generator_changed_is_refused_or_run_as_committed(tmp_path, monkeypatch, models, tokenizer):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import rival

    agent = Agent(models["qwen2"], tokenizer, model_name="qwen2")
    monkeypatch.setattr(rival.Agent, "from_pretrained", classmethod(lambda cls, *a, **k: agent))
    folder = tmp_path / "coref"
    folder.mkdir()
    docs = ("Mira Novak can play the cello.", "Bo Lind can play the oboe.", "Ada Berg can play the harp.")
    committed = Episode("coref-0000", "coref", "fanin", "Which instrument can Mira Novak play?", ["cello"], docs,
                        (Span(0, 0, 30),))  # not what today's generator gives for seed 2026
    write_episodes(folder / "episodes.jsonl", [committed])
    argv = ["rival.py", "--cells", "coref", "--n", "1", "--skip-recall", "--out", str(tmp_path)]
    monkeypatch.setattr("sys.argv", argv)
    with pytest.raises(SystemExit, match="holds other episodes than this cell's generator gives"):
        rival.main()
    assert not (folder / "records.jsonl").exists()  # refused before anything ran
    monkeypatch.setattr("sys.argv", argv + ["--committed-episodes"])
    rival.main()
    records = [json.loads(line) for line in (folder / "records.jsonl").read_text().splitlines()]
    assert {r["episode"] for r in records} == {"coref-0000"} and len(records) == len(rival.PROTOCOLS)
    assert (folder / "episodes.jsonl").read_text().strip() == committed.to_json()  # kept as it was


def test_rival_spans_pairs_the_rerun_with_the_rival_records_on_finished_episodes(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import rival_spans as rs

    monkeypatch.setattr(rs, "RIVAL", tmp_path)

    def rec(protocol, episode, accuracy, run="new"):
        return {"protocol": protocol, "episode": episode, "accuracy": accuracy, "tteoa": 2.0, "run": run,
                "sender_seconds": [1.0], "evidence_recall": 1.0, "receiver_context": 10, "error": None}

    (tmp_path / "code1").mkdir()
    old = [rec(p, e, 0.0, "old") for e in ("e1", "e2", "e3") for p in (rs.CB8, rs.BM25, rs.DENSE, "text")]
    (tmp_path / "code1" / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in old))  # other protocols too
    folder = tmp_path / "code1_spans"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"config": {"dtype": "float32"}, "episodes": ["e1", "e2", "e3"]}))
    new = [rec(p, e, 1.0) for e in ("e1", "e2") for p in rs.PROTOCOLS] + [rec(rs.CB8, "e3", 1.0)]  # e3 unfinished
    (folder / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in new))
    page = rs.write_readme(folder, "code1", "python benchmarks/rival_spans.py").read_text()
    assert "2 of the rival cell's 3 committed episodes" in page  # e3 is left out: not every protocol finished it
    assert f"| `{rs.BM25}{rs.OLD}` | 2 | 0.00 [0.00, 0.00] |" in page
    assert f"| `{rs.BM25}` | 2 | 1.00 [1.00, 1.00] |" in page
    rows = [line for line in page.splitlines() if line.startswith("| `") and " vs " in line]
    assert len(rows) == len(rs.FAMILY) == 5 and "Holm over these 5" in page
    assert f"| `{rs.BM25}` vs `{rs.BM25}{rs.OLD}` | 2 | 1.00 vs 0.00 | +100 pp" in page
    assert "† TTEOA ratio" in page  # the rival's times come from another run
    assert "Command: `python benchmarks/rival_spans.py`" in page

"""benchmarks/stored_states.py on a tiny model: question groups read once, both timings recorded, resumable."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from latentwire.bench.episode import Episode, write_episodes
from latentwire.agent import Agent
from latentwire.bench.tasks import facts

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _cell(tmp_path, monkeypatch, models, tokenizer, n: int):
    """The benchmark module, a tiny Qwen2 agent, an empty facts1_500 cell in tmp_path (the working directory) and
    `n` question groups written to its episodes file."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import stored_states

    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "facts1_500"
    folder.mkdir()
    groups = facts.follow_up_episodes(3, n, tokens=60)
    stored_states.ensure_episodes(folder / "episodes.jsonl", [e for g in groups for e in g])
    return stored_states, Agent(models["qwen2"], tokenizer, model_name="qwen2"), folder, groups


def test_a_cell_reads_each_group_once_and_records_both_timings(tmp_path, monkeypatch, models, tokenizer):
    stored_states, agent, folder, groups = _cell(tmp_path, monkeypatch, models, tokenizer, 2)
    protocols = stored_states._split("text(max_report_tokens=4),cacheback(ratio=4, latent_steps=1),"
                                     "cacheback(ratio=4, latent_steps=1, mass=0.5),retrieval(selector='lexical'),"
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
    times = page.split("## Where the time goes")[1].split("##")[0]  # every protocol with a question-time figure
    assert f"| facts1_500 | `{protocols[4]}` | " in times and f"| facts1_500 | `{protocols[1]}` | " in times
    assert f"`{protocols[0]}`" not in times  # text that re-reads has no question-time figure to break down


def test_the_aggregation_cell_asks_for_notes_and_checks_its_own_goal(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import stored_states as ss

    groups = ss.groups_for("aggregate_2000", 3, 0)
    assert [len(g) for g in groups] == [1, 1, 1] and all(g[0].task == "aggregate" for g in groups)
    assert all(len(g[0].evidence) >= 6 and min(g[0].meta["approx_tokens"]) > 1700 for g in groups)
    family = ss.family_for("aggregate_2000")
    assert (ss.CBKVM, "text(report='notes', read='held')") in family and ss.TEXTH not in {a for p in family for a in p}
    assert ss.family_for("facts1_500") == ss.FAMILY

    def cell(name: str, times: dict[str, list[float]], runs: dict[str, str] | None = None) -> None:
        """A cell folder whose episodes each have their own documents, with these question-time TTEOAs."""
        folder = tmp_path / name
        folder.mkdir()
        n = len(next(iter(times.values())))
        eps = [Episode(f"e{i}", "facts", "fanin", "Q?", ["x"], (f"doc {i}",)) for i in range(n)]
        write_episodes(folder / "episodes.jsonl", eps)
        (folder / "config.json").write_text(json.dumps({"config": {"protocols": {p: {} for p in times}}}))
        recs = [{"episode": e.id, "protocol": p, "accuracy": 1.0, "tteoa": 9.0, "tteoa_question": t[i],
                 "sender_seconds": [1.0], "run": (runs or {}).get(p, "r1")}
                for p, t in times.items() for i, e in enumerate(eps)]
        (folder / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))

    notes = "text(report='notes', read='held')"
    cell("aggregate_2000", {ss.CBKVM: [1.0, 1.2, 1.1, 0.9, 1.0, 1.1], notes: [4.0, 4.4, 4.2, 4.0, 3.9, 4.1]})
    cell("facts1_4000", {ss.CBKVM: [3.0, 3.0, 3.3, 2.7, 3.0, 3.0], ss.CBKVRM: [1.6, 2.4, 1.8, 2.2, 1.9, 2.1],
                         ss.TEXTH: [4.0] * 6}, runs={ss.CBKVRM: "r2"})
    goals = {(line.split("`")[1], line.split()[2]): line for line in ss.goal_lines(tmp_path) if line}
    assert set(goals) == {(ss.CBKVM, "aggregate_2000:"), (ss.CBKVM, "facts1_4000:"), (ss.CBKVRM, "facts1_4000:")}
    met = goals[ss.CBKVM, "aggregate_2000:"]  # a contender with no figures in a cell (CBM) is not judged
    assert f"÷ `{notes}` question-time TTEOA ≤ ×0.33: ×0.26 [" in met and met.endswith(
        "(median of 6 paired ratios, CI over sets of documents), time **met** (accuracy: the verdict rows below).")
    assert "×0.75 [" in goals[ss.CBKVM, "facts1_4000:"] and "time **missed**" in goals[ss.CBKVM, "facts1_4000:"]
    around = goals[ss.CBKVRM, "facts1_4000:"]  # ratios 0.40-0.60 around the target, timed by another run
    assert "≤ ×0.5: ×0.50 [" in around and "] † (median" in around
    assert "time **not established (its CI holds the target)**" in around and "†" not in met


def test_a_group_resumed_after_its_first_question_still_finds_its_reads_held(tmp_path, monkeypatch, models,
                                                                             tokenizer):
    """A run cut after a group's first question resumes with its follow-ups: their reads were made before those
    questions (by the first), so they are charged 0 s there too, and no first-question record is written twice. The
    resume may run from another directory."""
    stored_states, agent, folder, groups = _cell(tmp_path, monkeypatch, models, tokenizer, 1)
    protocols = stored_states._split("cacheback(ratio=4, latent_steps=1),text(max_report_tokens=4, read='held')")
    stored_states.run_cell(agent, folder, groups, "qwen2", protocols)
    path = folder / "records.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:len(protocols) + 1]) + "\n")  # cut after the first question's records + one
    monkeypatch.chdir(folder)  # resumed from another directory: the same run
    stored_states.run_cell(agent, folder, groups, "qwen2", protocols)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert sorted((r["episode"], r["protocol"]) for r in records) == sorted(
        (e.id, p) for e in groups[0] for p in protocols)  # nothing lost, nothing twice
    for r in records:
        if r["turn"]:
            assert r["tteoa_question"] == pytest.approx(r["tteoa"])
    assert all(t["read_s"] == 0.0 for r in records if r["turn"] and "senders" in r["details"]
               for t in r["details"]["senders"])


def test_the_budget_curve_and_verdicts_resample_sets_of_documents_and_one_study_holds_one_dtype(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import stored_states as ss

    folder = tmp_path / "facts1_500"
    folder.mkdir()
    groups = facts.follow_up_episodes(3, 4, tokens=60)
    ss.ensure_episodes(folder / "episodes.jsonl", [e for g in groups for e in g])
    (folder / "config.json").write_text(json.dumps({"config": {"dtype": "float32", "protocols": []}}))
    recs = [{"episode": e.id, "protocol": p, "accuracy": float(p == ss.CB8KV and g < 3), "tteoa": 3.0,
             "tteoa_question": 1.0 if p == ss.CB8KV else 2.0, "message_bytes": 100, "sender_seconds": [], "run": "r",
             "turn": t} for g, group in enumerate(groups) for t, e in enumerate(group) for p in (ss.CB8KV, ss.CURVE[0])]
    (folder / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    sets = ss.document_sets(folder)
    assert len(set(sets.values())) == 4 and all(sets[e.id] == g[0].id for g in groups for e in g)
    curve = ss.curve_lines(tmp_path, ["facts1_500"])
    assert curve[0] == "## Budget curve" and [line.split(" | ")[1] for line in curve[6:]] == [
        f"`{ss.CURVE[0]}`", f"`{ss.CB8KV}`"]  # in ratio order; 16× and 32× not run here
    c = ss.compare(recs, ss.CB8KV, ss.CURVE[0], sets, True)
    assert (c["n"], c["n_clusters"], c["time"], c["tteoa_ratio"][0]) == (12, 4, "tteoa_question", 0.5)
    assert c["p"] == pytest.approx(0.25)  # 3 discordant sets of 4, not 9 discordant questions
    ss.check_study_dtype(tmp_path, "float32")
    with pytest.raises(SystemExit, match="ran in float32, this run would use bfloat16"):
        ss.check_study_dtype(tmp_path, "bfloat16")


def test_the_crossover_page_is_rewritten_from_its_json_without_measuring(tmp_path, monkeypatch):
    """benchmarks/crossover.py --page-only: the cold model from the saved costs, no modelled pre-read columns, and
    the measured question-time section only where the stored-states study has records."""
    import sys

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import crossover as xo
    import stored_states as ss

    monkeypatch.setattr(xo, "OUT", tmp_path)
    monkeypatch.setattr(ss, "OUT", tmp_path / "stored_states")  # no study here
    lengths = (300, 500, 900, 1800, 3500)
    raw = {k: [[T, 1e-3 * T] for T in lengths] for k in ("prefill", "step", "score", "rows", "think")}
    data = {"command": "python benchmarks/crossover.py --model m --ratio 4", "raw": raw, "question_tokens": 20,
            "fits": {"prefill": [0.0, 1e-3], "step": [0.07, 1e-6], "score": [0.07, 2e-5]},
            "report_lengths": [10, 11, 12], "environment": {}}
    (tmp_path / "crossover_m_bfloat16.json").write_text(json.dumps(data))
    monkeypatch.setattr(sys, "argv", ["crossover.py", "--model", "m", "--page-only"])
    xo.main()
    page = (tmp_path / "crossover_m_bfloat16.md").read_text()
    assert "CacheBack 4×" in page and "(page rewritten by `python benchmarks/crossover.py --model m --page-only`)" in page
    assert "pre-read" not in page and "| 4000 | " in page and "## Agents that hold their documents" not in page
    assert json.loads((tmp_path / "crossover_m_bfloat16.json").read_text())["command"] == data["command"]
    monkeypatch.setattr(sys, "argv", ["crossover.py", "--model", "other", "--page-only"])
    with pytest.raises(SystemExit, match="one measured json"):
        xo.main()

"""Bench harness: metrics, evidence recall on hand-built episodes, runner resume/errors, report files."""
import json
import random
from pathlib import Path

import pytest

from latentwire.agent import Agent
from latentwire.bench.episode import Episode, Span, load_episodes, span_token_positions, write_episodes
from latentwire.bench.metrics import answer_scores, bootstrap_ci, evidence_recall, normalize
from latentwire.bench.plots import pareto_front
from latentwire.bench.report import read_run, write_report
from latentwire.bench.runner import RunConfig, parse_protocols, run
from latentwire.errors import ConfigError, LatentWireError, TaskFormatError
from latentwire.models import tiny_model, tiny_tokenizer


def test_squad_normalisation_and_scores():
    assert normalize("The  Code, is: 7341!") == "code is 7341"
    s = answer_scores("The code is 7341.", ["7341"])
    assert s["accuracy"] == 1.0 and s["em"] == 0.0 and 0 < s["f1"] < 1
    assert answer_scores("7341", ["7341"])["em"] == 1.0
    assert answer_scores("73410", ["7341"])["accuracy"] == 0.0  # whole words only
    multi = {"city": ["Lisbon"], "lead": ["Ana Silva"]}
    assert answer_scores("Ana Silva, in Lisbon", multi)["strict"] == 1.0
    part = answer_scores("in Lisbon", multi)
    assert part["accuracy"] == 0.5 and part["strict"] == 0.0


def test_evidence_recall_exact_on_hand_built_spans():
    tok = tiny_tokenizer()  # byte-level: one token per character here
    text = "alpha beta gamma"
    gold = span_token_positions(text, [(6, 10)], tok)
    assert gold == [6, 7, 8, 9]  # "beta"
    assert evidence_recall(gold, range(6, 8)) == 0.5
    assert evidence_recall(gold, range(16)) == 1.0
    assert evidence_recall(gold, []) == 0.0
    assert evidence_recall([], [1, 2]) is None


def test_bootstrap_is_deterministic_and_brackets_the_mean():
    xs = [0, 1, 1, 0, 1, 1, 1, 0]
    m, lo, hi = bootstrap_ci(xs)
    assert (m, lo, hi) == bootstrap_ci(xs) and lo <= m <= hi and m == pytest.approx(0.625)


def test_parse_protocols_specs():
    p = parse_protocols("text, fullkv(latent_steps=8, latent_mode='realign'),alone")
    assert list(p) == ["text", "fullkv(latent_steps=8, latent_mode='realign')", "alone"]
    assert p["fullkv(latent_steps=8, latent_mode='realign')"] == ("fullkv", {"latent_steps": 8, "latent_mode": "realign"})
    with pytest.raises(ValueError):
        parse_protocols("full kv")
    tail = parse_protocols(r"retrieval(selector='a\\'),alone")  # a string ending in an escaped backslash closes
    assert list(tail) == [r"retrieval(selector='a\\')", "alone"] and tail[r"retrieval(selector='a\\')"][1] == {
        "selector": "a\\"}


def test_a_summary_refuses_two_records_of_one_episode():
    from latentwire.bench.report import summarize

    rec = {"episode": "e1", "protocol": "p", "accuracy": 1.0, "error": None}
    with pytest.raises(LatentWireError, match="two records of protocol 'p' on episode 'e1'"):
        summarize([rec, dict(rec)], ["p"])


def test_summary_cis_resample_whole_clusters():
    """Questions over one set of documents are not independent: with clusters the CI is wider (here every cluster
    answers alike), the mean unchanged."""
    from latentwire.bench.report import summarize

    recs = [{"episode": f"e{i}", "protocol": "p", "accuracy": float(i // 10 % 2), "error": None} for i in range(40)]
    clusters = {f"e{i}": f"set{i // 10}" for i in range(40)}
    plain, grouped = summarize(recs, ["p"])["p"]["accuracy"], summarize(recs, ["p"], clusters)["p"]["accuracy"]
    assert plain[0] == grouped[0] == 0.5 and grouped[2] - grouped[1] > 1.5 * (plain[2] - plain[1])


def test_pareto_front():
    pts = {"a": (1.0, 0.5), "b": (2.0, 0.9), "c": (3.0, 0.8), "d": (0.5, 0.1)}
    assert pareto_front(pts) == ["d", "a", "b"]


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


@pytest.fixture
def tiny_task(tmp_path):
    eps = [Episode(f"e{i}", "t", "fanin", "What is the code?", ["7341"],
                   ("The code is 7341. " * (1 + i), "Nothing here."), (Span(0, 0, 17),)) for i in range(3)]
    path = tmp_path / "task.jsonl"
    write_episodes(path, eps)
    return path


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


def test_paired_statistics():
    from latentwire.bench.metrics import mcnemar_exact, median_ratio_ci, paired_bootstrap_diff, sign_flip_exact

    # McNemar: 10 pairs where only a is right, 0 where only b is: p = 2 · 0.5^10
    a, b = [True] * 10 + [True] * 5, [False] * 10 + [True] * 5
    assert mcnemar_exact(a, b) == pytest.approx(2 / 1024)
    assert mcnemar_exact(a, a) == 1.0  # no discordant pair
    assert mcnemar_exact([1, 0], [0, 1]) == 1.0  # a fair split
    # scipy's binomtest(3, 12, 0.5) two-sided = 0.1460 (symmetric case: doubled tail)
    assert mcnemar_exact([1] * 3 + [0] * 9, [0] * 3 + [1] * 9) == pytest.approx(0.14599609375)
    # the sign-flip test is McNemar's on 0/1 scores, and keeps partial credit instead of dichotomising it
    rng = random.Random(5)
    for _ in range(50):
        n = rng.randint(1, 30)
        x, y = [rng.random() < 0.5 for _ in range(n)], [rng.random() < 0.6 for _ in range(n)]
        assert sign_flip_exact(x, y) == pytest.approx(mcnemar_exact(x, y), abs=1e-12)
    # 2/3 vs 1/3 on 8 episodes: every difference +1/3, only the all-"+" and all-"−" patterns are as extreme
    assert sign_flip_exact([2 / 3] * 8, [1 / 3] * 8) == pytest.approx(2 / 256)
    assert mcnemar_exact([x == 1.0 for x in [2 / 3] * 8], [x == 1.0 for x in [1 / 3] * 8]) == 1.0  # blind to it
    # differences +1, −1/2, +1/2: |Σ| = 1; patterns (±1 ±½ ±½) reach |Σ| ≥ 1 in 6 of 8
    assert sign_flip_exact([1, 0, 1], [0, 0.5, 0.5]) == pytest.approx(6 / 8)
    assert sign_flip_exact([0.5, 0.25], [0.5, 0.25]) == 1.0
    # scores off any small grid (an F1) take seeded random sign patterns: close to the exact p, and deterministic
    off = [2 / 3 + 1e-7 * i for i in range(8)]
    assert sign_flip_exact(off, [1 / 3] * 8) == pytest.approx(2 / 256, abs=1e-3)
    assert sign_flip_exact(off, [1 / 3] * 8) == sign_flip_exact(off, [1 / 3] * 8)
    assert sign_flip_exact([0.123456789], [0.0]) == 1.0  # one difference: both signs are as extreme
    d, lo, hi = paired_bootstrap_diff([1, 1, 0, 1], [0, 1, 0, 0])
    assert d == 0.5 and lo <= d <= hi
    # pairing matters: b = a + 0.1 exactly gives a zero-width interval, whatever the spread of a
    xs = [0.0, 1.0, 0.5, 0.2, 0.9]
    assert paired_bootstrap_diff([x + 0.1 for x in xs], xs)[1:] == pytest.approx((0.1, 0.1))
    m, lo, hi = median_ratio_ci([2, 4, 6], [1, 2, 3])
    assert (m, lo, hi) == (2.0, 2.0, 2.0)
    with pytest.raises(ValueError):
        paired_bootstrap_diff([1], [1, 0])


def test_holm_adjusts_a_family_of_p_values():
    from latentwire.bench.metrics import holm

    # sorted 0.005, 0.01, 0.03, 0.04 -> ×4, ×3, ×2, ×1 = 0.02, 0.03, 0.06, 0.04 -> monotone: 0.02, 0.03, 0.06, 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == [1.0, 1.0] and holm([0.2]) == [0.2] and holm([]) == []


def test_verdict_flags_times_paired_across_runs():
    from latentwire.bench.report import compare, mixed_note, verdict

    def rec(ep, proto, acc, t, run=None):
        return {"episode": ep, "protocol": proto, "accuracy": acc, "tteoa": t} | ({"run": run} if run else {})

    same = [rec(e, p, 1.0, 2.0 if p == "a" else 1.0, "r1") for e in ("e0", "e1") for p in ("a", "b")]
    c = compare(same, "a", "b")
    assert c["tteoa_mixed"] == 0 and c["tteoa_ratio"][0] == 2.0
    assert not verdict(c).endswith("† |") and mixed_note([c]) == []
    # b re-run in another invocation for one episode: that pair's times were not measured side by side
    mixed = same[:3] + [rec("e1", "b", 1.0, 1.0, "r2")]
    c = compare(mixed, "a", "b")
    assert c["tteoa_mixed"] == 1 and verdict(c).endswith("×2.00 [2.00, 2.00] † |")
    assert "different runs" in mixed_note([c])[1]
    # records older than the label name no run: nothing shows such a pair was timed together, so it is marked
    legacy = [{k: v for k, v in r.items() if k != "run"} for r in same]
    assert compare(legacy, "a", "b")["tteoa_mixed"] == 2
    assert compare(legacy[:3] + same[3:], "a", "b")["tteoa_mixed"] == 2


def test_errors_count_as_wrong_and_leave_the_time_ratio_which_says_so():
    from latentwire.bench.report import PAIRING_NOTE, compare, verdict, verdict_table

    recs = [{"episode": f"e{i}", "protocol": p, "accuracy": 1.0, "tteoa": 2.0 if p == "a" else 1.0, "run": "r1"}
            for i in range(4) for p in ("a", "b")]
    recs[0] |= {"accuracy": 0.0, "tteoa": None, "error": "ContextOverflowError: ..."}  # a fails on e0
    recs = [r for r in recs if (r["episode"], r["protocol"]) != ("e3", "b")]  # b never ran e3
    c = compare(recs, "a", "b")
    assert (c["n"], c["n_timed"], c["acc_a"], c["acc_b"]) == (3, 2, 2 / 3, 1.0)
    assert verdict(c).endswith("×2.00 [2.00, 2.00] (n = 2) |")
    assert PAIRING_NOTE in verdict_table([c]) and "typed error counts as a wrong" in PAIRING_NOTE
    full = compare([r for r in recs if r["episode"] != "e0"], "a", "b")
    assert "(n = " not in verdict(full)  # every paired episode timed: nothing to say
    with pytest.raises(LatentWireError, match="two records of protocol 'a' on episode 'e1'"):
        compare(recs + [recs[2]], "a", "b")


def test_clustered_pairs_count_each_set_of_documents_once_and_question_time_ratios_say_so():
    from latentwire.bench.metrics import sign_flip_exact
    from latentwire.bench.report import compare, verdict

    # 4 sets × 3 questions; a right on every question of sets 0–2, b wrong on them; set 3 both wrong
    recs = [{"episode": f"s{g}-q{q}", "protocol": p, "accuracy": float(p == "a" and g < 3), "tteoa": 4.0,
             "tteoa_question": 1.0 if p == "a" else 2.0, "run": "r"} for g in range(4) for q in range(3) for p in "ab"]
    clusters = {f"s{g}-q{q}": f"s{g}" for g in range(4) for q in range(3)}
    flat, grouped = compare(recs, "a", "b"), compare(recs, "a", "b", clusters, question_time=True)
    assert flat["p"] == pytest.approx(sign_flip_exact([1] * 9 + [0] * 3, [0] * 12))  # 9 discordant: 2/2⁹
    assert grouped["p"] == pytest.approx(2 / 2 ** 3) and grouped["p"] > 10 * flat["p"]  # 3 discordant sets
    assert grouped["n"] == 12 and grouped["n_clusters"] == 4 and grouped["diff"][0] == pytest.approx(0.75)
    assert (flat["time"], flat["tteoa_ratio"][0]) == ("tteoa", 1.0)
    assert (grouped["time"], grouped["tteoa_ratio"][0]) == ("tteoa_question", 0.5)
    assert "| 12 (4 sets) |" in verdict(grouped) and verdict(grouped).endswith("(question-time) |")
    one_cold = [r | {"tteoa_question": None} if r["episode"] == "s0-q0" and r["protocol"] == "b" else r for r in recs]
    assert compare(one_cold, "a", "b", question_time=True)["time"] == "tteoa"  # one pair lacks it: cold for all
    with pytest.raises(LatentWireError, match="without a cluster: s3-q2"):
        compare(recs, "a", "b", {k: v for k, v in clusters.items() if k != "s3-q2"})
    # unequal sets: 3 questions a right / b wrong, 1 question the other way round. The accuracies beside the
    # difference weigh each set once, as the difference does (episode means would read 0.75 vs 0.25 beside +0 pp)
    uneven = [{"episode": e, "protocol": p, "accuracy": float((p == "a") == (e != "t1")), "tteoa": 1.0}
              for e in ("s1", "s2", "s3", "t1") for p in "ab"]
    c = compare(uneven, "a", "b", {"s1": "s", "s2": "s", "s3": "s", "t1": "t"})
    assert (c["acc_a"], c["acc_b"], c["diff"][0]) == (0.5, 0.5, 0.0)


def test_an_alias_that_normalises_to_nothing_never_scores():
    for prediction in ("", '""', "the"):
        s = answer_scores(prediction, ['""', "the"])
        assert s == {"em": 0.0, "f1": 0.0, "accuracy": 0.0, "strict": 0.0}, prediction
    assert answer_scores("It is 7341", ['""', "7341"])["accuracy"] == 1.0  # the other aliases still count


def test_text_normalisation_splits_hyphens_drops_unicode_punctuation_and_keeps_decimal_points():
    assert normalize("Hip-hop – “Cello”, 6.0 million.") == "hip hop cello 6.0 million"
    assert answer_scores("She dances hip-hop.", ["hip hop"])["accuracy"] == 1.0
    assert answer_scores("She plays the “cello”.", ["cello"])["accuracy"] == 1.0
    assert answer_scores("60 million euros", ["6.0 million euros"])["accuracy"] == 0.0  # was a match: "60"
    assert normalize("It is 3.5.") == "it is 3.5" and normalize("3\x005") != "3.5"  # only a real point survives
    assert answer_scores("It is 35.", ["3.5"])["accuracy"] == 0.0 and answer_scores("3.5", ["3.5"])["em"] == 1.0
    assert answer_scores("-5", ["5"])["em"] == 0.0 and answer_scores("It fell to −5 degrees.", ["-5"])["accuracy"] == 1
    assert normalize("1-2 and n-1") == "1 2 and n 1"  # a hyphen between numbers or after a word still splits
    assert normalize("cafe\u0301 Straße") == normalize("café STRASSE") == "café strasse"  # NFC, case-folded
    assert normalize("\x00-\x005") == "-5"  # the sign's stand-in cannot come from the text itself


def test_code_answers_keep_signs_operators_and_string_literals():
    def acc(prediction, aliases):
        return answer_scores(prediction, aliases, "code")["accuracy"]

    assert acc("It returns `-1`.", ["-1"]) == 1.0 and acc("It returns `1`.", ["-1"]) == 0.0
    assert acc("returns -10", ["-1"]) == 0.0  # a number glued to more digits is another number
    assert acc("`(self // other, self % other)`", ["(self//other, self%other)"]) == 1.0
    assert acc("`(self / other, self * other)`", ["(self//other, self%other)"]) == 0.0
    assert acc("S_IFMT(mode) != S_IFLNK", ["S_IFMT(mode) == S_IFLNK"]) == 0.0
    assert acc("The base class is `calendar.Calendar`.", ["Calendar"]) == 1.0
    assert acc("It is `Calendars`.", ["Calendar"]) == 0.0 and acc("`true`", ["True"]) == 0.0
    assert acc('The default is `""`.', ['""']) == 1.0 and acc('The default is `" "`.', ['""']) == 0.0
    assert acc("It is `{}`.", ["{}"]) == 1.0
    assert answer_scores("It is `{}`.", ["{}"])["accuracy"] == 0.0  # as text, `{}` normalises to nothing
    s = answer_scores("`{}`.", ["{}"], "code")
    assert s["em"] == 1.0 and s["f1"] == 1.0  # wrapping backticks and a final stop are not part of the value
    # a number or operator standing alone: not a sign, a decimal part or a longer operator away
    for prediction, gold in [("The answer is -1.", "1"), ("`1.0`", "1"), ("0.1", "1"), ("9.00000000000000004", "9"),
                             ("The default is 1.0", "0"), ("6.5", "6"), ("a // b", "/"), ("a == b", "="),
                             ("x <= y", "<"), ("returns n - 1", "-1"), ("n-1", "-1"), ("f(x)-1", "-1")]:
        assert acc(prediction, [gold]) == 0.0, (prediction, gold)
    for prediction, gold in [("It is 1.", "1"), ("x = -1", "-1"), ("(-1)", "-1"), ("returns -1", "-1"),
                             ("is `''`", '""'), ("f(a,'b')", "f(a, 'b')"),
                             ("(sep or ' ').join(x)", "(sep or ' ').join(x)")]:
        assert acc(prediction, [gold]) == 1.0, (prediction, gold)  # the same literal, the same tokens
    assert acc("(sep or '').join(x)", ["(sep or ' ').join(x)"]) == 0.0  # a literal's spaces are its value
    with pytest.raises(ValueError, match="match: want one of text, code"):
        answer_scores("x", ["x"], "regex")


def test_episodes_pick_their_answer_match_and_refuse_answers_that_could_never_score():
    def ep(task="facts", answers=("7341",), meta=None):
        return Episode("e", task, "fanin", "Q?", list(answers), ("doc",), (), meta or {})

    assert ep().answer_match == "text" and ep("code", ["{}"]).answer_match == "code"
    assert ep(meta={"answer_match": "code"}, answers=["-1"]).answer_match == "code"
    with pytest.raises(TaskFormatError, match="meta.answer_match: want one of text, code"):
        ep(meta={"answer_match": "exact"})
    with pytest.raises(TaskFormatError, match="every alias normalises to nothing"):
        ep(answers=['""', "the"])  # as text nothing is left of either alias
    with pytest.raises(TaskFormatError, match=r"answers\['city'\]: every alias"):
        Episode("e", "facts", "fanin", "Q?", {"city": ["."], "lead": ["Ana"]}, ("doc",))
    assert ep(answers=['""', "7341"]).answers == ['""', "7341"]  # one scorable alias is enough


def test_bootstrap_intervals_have_the_normal_width_on_a_large_sample():
    """Not only lo ≤ mean ≤ hi: on 400 fair coin flips the 95% interval is ≈ ±1.96·√(p(1−p)/n) = ±0.049."""
    from latentwire.bench.metrics import paired_bootstrap_diff

    xs = [1.0, 0.0] * 200
    m, lo, hi = bootstrap_ci(xs)
    assert m == 0.5 and (hi - lo) == pytest.approx(2 * 1.96 * (0.25 / 400) ** 0.5, rel=0.15)
    assert lo < 0.5 < hi and (0.5 - lo) == pytest.approx(hi - 0.5, rel=0.2)
    d, dlo, dhi = paired_bootstrap_diff(xs, [0.0] * 400)  # b constant: the difference's spread is a's
    assert d == 0.5 and (dhi - dlo) == pytest.approx(hi - lo, rel=0.05)


def test_stratified_bootstrap():
    from latentwire.bench.metrics import stratified_bootstrap_ci

    xs = [1, 0, 1, 1, 0, 1, 0, 0, 1]
    assert stratified_bootstrap_ci([xs]) == bootstrap_ci(xs)  # one stratum: the plain bootstrap, same draws
    # cells weigh equally whatever their sizes (macro, not micro), and constant cells have no spread
    assert stratified_bootstrap_ci([[1, 1], [0] * 8]) == (0.5, 0.5, 0.5)
    m, lo, hi = stratified_bootstrap_ci([[1, 0, 1, 0], [1, 1, 1, 1]], seed=3)
    assert m == 0.75 and 0.5 <= lo <= m <= hi <= 1.0
    assert stratified_bootstrap_ci([[], [1.0]]) == (1.0, 1.0, 1.0)  # empty cells are left out


def test_default_verdict_pairs_and_report_table(tiny_task, tmp_path):
    from latentwire.bench.report import default_pairs

    protocols = {"text": {"name": "text", "params": {}}, "text(ratio=8)": {"name": "text", "params": {"ratio": 8}},
                 "fullkv": {"name": "fullkv", "params": {"latent_steps": 0}},
                 "fullcontext": {"name": "fullcontext", "params": {}},
                 "cb8": {"name": "cacheback", "params": {"ratio": 8, "latent_steps": 0}},
                 "cb4": {"name": "cacheback", "params": {"ratio": 4}}}
    pairs = default_pairs(protocols)
    assert ("cb8", "text(ratio=8)") in pairs and ("cb4", "text") in pairs  # same ratio, else the natural report
    assert ("cb8", "fullkv") in pairs and ("cb8", "fullcontext") in pairs and ("fullkv", "text") in pairs
    assert not any(a in ("text", "fullcontext") for a, _ in pairs)
    agent = Agent(tiny_model("llama"), tiny_tokenizer(), "llama", context_window=1000)
    out = tmp_path / "run"
    run(RunConfig(str(tiny_task), "alone(max_new_tokens=2),fullkv(latent_steps=0, max_new_tokens=2)", "llama"), out,
        progress=False, agent=agent)
    text = write_report(out, [("fullkv(latent_steps=0, max_new_tokens=2)", "alone(max_new_tokens=2)")]).read_text()
    assert "| `fullkv(latent_steps=0, max_new_tokens=2)` vs `alone(max_new_tokens=2)` | 3 |" in text
    assert "McNemar" in text and "| Holm p |" in text and "adjusted over the 1 verdict of this table" in text
    rec = out / "records.jsonl"
    lines = rec.read_text().splitlines()
    last = json.loads(lines[-1])["episode"]  # as a paused run leaves it: the last episode's second protocol missing
    rec.write_text("".join(line + "\n" for line in lines if not (json.loads(line)["episode"] == last and
                                                                 json.loads(line)["protocol"].startswith("fullkv"))))
    text = write_report(out, [("fullkv(latent_steps=0, max_new_tokens=2)", "alone(max_new_tokens=2)")],
                        complete=True).read_text()
    assert "| `fullkv(latent_steps=0, max_new_tokens=2)` vs `alone(max_new_tokens=2)` | 2 |" in text
    assert "| `alone(max_new_tokens=2)` | 2 |" in text  # the half-run episode waits: both over the same two


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


def test_pareto_front_in_the_legend_is_drawn(tiny_task, tmp_path, monkeypatch):
    """The legend's "Pareto front" entry is a line through the front's points, with markers (one point shows)."""
    from matplotlib.figure import Figure

    figs, save = [], Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **kw: figs.append(self) or save(self, *a, **kw))
    agent = Agent(tiny_model("llama"), tiny_tokenizer(), "llama", context_window=1000)
    out = tmp_path / "run"
    run(RunConfig(str(tiny_task), "alone(max_new_tokens=2),fullkv(latent_steps=0, max_new_tokens=2)", "llama"), out,
        progress=False, agent=agent)
    text = write_report(out).read_text()
    front = text.split("Pareto front (accuracy vs median TTEOA): ")[1].splitlines()[0].count("`") // 2
    ax = figs[0].axes[0]
    handles, labels = ax.get_legend_handles_labels()
    line = handles[labels.index("Pareto front")]
    assert len(line.get_xdata()) == front >= 1 and line.get_marker() == "o" and line.get_markersize() > 0


def test_median_cis_resample_whole_clusters():
    from latentwire.bench.metrics import bootstrap_median_ci, median_ratio_ci

    xs = [0.4, 0.5, 0.55, 0.6, 0.7, 0.45, 0.52]
    assert bootstrap_median_ci(xs, clusters=list(range(7))) == bootstrap_median_ci(xs)  # singletons: as before
    m, lo, hi = bootstrap_median_ci([1.0, 1.0, 1.0, 2.0, 2.0, 2.0], clusters="aaabbb")
    assert (m, lo, hi) == (1.5, 1.0, 2.0)  # a resample is AA, AB or BB: never a mix within a cluster
    assert median_ratio_ci([2.0, 4.0], [4.0, 4.0], clusters=["s", "s"])[:2] == (0.75, 0.75)
    with pytest.raises(ValueError, match="one cluster per value"):
        bootstrap_median_ci(xs, clusters="ab")


def test_the_summary_says_how_many_episodes_its_question_time_median_covers(tmp_path):
    from latentwire.bench.report import _summary_lines, summarize

    recs = [{"episode": f"e{i}", "protocol": "p", "accuracy": 1.0, "tteoa": 2.0,
             **({"tteoa_question": 1.0} if i < 3 else {})} for i in range(5)]  # two written before the field
    line = next(x for x in _summary_lines(summarize(recs, ["p"])) if x.startswith("| `p`"))
    assert line.endswith(" 1.00 (n = 3) |")

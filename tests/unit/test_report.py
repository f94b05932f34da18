"""Bench reports: summaries, paired statistics, Holm, verdict tables and their marks, the Pareto front."""
import json
import random

import pytest

from latentwire.agent import Agent
from latentwire.bench.plots import pareto_front
from latentwire.bench.report import write_report
from latentwire.bench.runner import RunConfig, run
from latentwire.errors import LatentWireError
from latentwire.models import tiny_model, tiny_tokenizer


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

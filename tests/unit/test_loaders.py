"""Dataset loaders (HotpotQA, MuSiQue, FanOutQA, LongBench v2) on small hand-made fixtures in the real formats."""
from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from latentwire.bench.episode import load_episodes, span_token_positions, write_episodes
from latentwire.bench.loaders import LOADERS, load_dataset
from latentwire.bench.loaders.fanoutqa import bundled_dev_path
from latentwire.bench.loaders.longbench import split_text
from latentwire.errors import TaskFormatError, UnknownNameError
from latentwire.models import tiny_tokenizer

FIX = Path(__file__).resolve().parents[1] / "fixtures"
HOTPOT, MUSIQUE = FIX / "hotpotqa_distractor.json", FIX / "musique.jsonl"
FANOUT, PAGES, LONGBENCH = FIX / "fanoutqa_dev.json", FIX / "fanoutqa_pages", FIX / "longbench_v2.json"
DEFAULT_ARGS = {"hotpotqa": (HOTPOT, {}), "musique": (MUSIQUE, {}),
                "fanoutqa": (FANOUT, {"pages_dir": PAGES}), "longbench_v2": (LONGBENCH, {})}


def raw(path: Path):
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return json.loads(path.read_text())


def dump(records, path: Path) -> Path:
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    else:
        path.write_text(json.dumps(records))
    return path


def paragraph_owner(ep, title: str) -> list[int]:
    return [a for a, c in enumerate(ep.contexts) if f"{title}: " in c]


# ---------------------------------------------------------------- HotpotQA

def test_hotpotqa_load():
    records = raw(HOTPOT)
    eps = load_dataset("hotpotqa", HOTPOT)
    assert [e.id for e in eps] == [r["_id"] for r in records]
    for ep, rec in zip(eps, records):
        assert (ep.task, ep.topology, ep.answers) == ("hotpotqa", "fanin", [rec["answer"]])
        assert ep.meta == {"type": rec["type"], "level": rec["level"]}
        assert len(ep.contexts) == 2
        # every paragraph is in exactly one agent, in "title: sentences" form; counts balanced
        for title, sentences in rec["context"]:
            assert len(paragraph_owner(ep, title)) == 1
            assert f"{title}: " + " ".join(s.strip() for s in sentences) in "\n\n".join(ep.contexts)
        counts = [c.count("\n\n") + 1 for c in ep.contexts]
        assert sum(counts) == len(rec["context"]) and max(counts) - min(counts) <= 1
        # evidence: exactly the supporting sentences (duplicate facts once), in supporting_facts order
        paras = dict((t, s) for t, s in rec["context"])
        want = list(dict.fromkeys(paras[t][i].strip() for t, i in rec["supporting_facts"]))
        assert ep.evidence_text() == want
    assert eps[0].evidence_text()[0] == "She discovered the comet Vesperine in 1931 while surveying the northern sky."


def test_hotpotqa_gold_apart_separates_gold_paragraphs():
    records = raw(HOTPOT)
    for n_agents in (2, 3):
        for ep, rec in zip(load_dataset("hotpotqa", HOTPOT, n_agents=n_agents), records):
            gold = dict.fromkeys(t for t, _ in rec["supporting_facts"])
            owners = [paragraph_owner(ep, t)[0] for t in gold]
            assert len(gold) == 2 and len(set(owners)) == 2, (ep.id, owners)
            assert sorted({s.agent for s in ep.evidence}) == sorted(owners)
    # the fixtures are built so that round-robin puts both gold paragraphs of each record in one agent
    for ep, rec in zip(load_dataset("hotpotqa", HOTPOT, split="round_robin"), records):
        gold = dict.fromkeys(t for t, _ in rec["supporting_facts"])
        assert len({paragraph_owner(ep, t)[0] for t in gold}) == 1
        assert [paragraph_owner(ep, t)[0] for t, _ in rec["context"]] == [i % 2 for i in range(len(rec["context"]))]


def test_hotpotqa_options():
    one = load_dataset("hotpotqa", HOTPOT, n_agents=1, split="round_robin")
    assert all(len(e.contexts) == 1 for e in one)
    assert one[0].evidence_text() == load_dataset("hotpotqa", HOTPOT)[0].evidence_text()
    with pytest.raises(ValueError, match="gold_apart"):
        load_dataset("hotpotqa", HOTPOT, n_agents=1)
    with pytest.raises(UnknownNameError, match="gold_apart, round_robin"):
        load_dataset("hotpotqa", HOTPOT, split="random")
    with pytest.raises(ValueError, match="n_agents"):
        load_dataset("hotpotqa", HOTPOT, n_agents=0)
    with pytest.raises(TaskFormatError, match=r"hotpotqa_distractor\.json\[1\]: context: 6 paragraphs cannot fill 7"):
        load_dataset("hotpotqa", HOTPOT, n_agents=7)


# ---------------------------------------------------------------- MuSiQue

def test_musique_load():
    records = raw(MUSIQUE)
    eps = load_dataset("musique", MUSIQUE)
    assert [e.id for e in eps] == [r["id"] for r in records if r["answerable"]]  # unanswerable skipped
    for ep, rec in zip(eps, records):
        assert ep.answers == [rec["answer"], *rec["answer_aliases"]]
        assert ep.meta == {"hops": len(rec["question_decomposition"]), "answerable": True}
        assert ep.evidence_text() == [p["paragraph_text"] for p in rec["paragraphs"] if p["is_supporting"]]
        assert len(ep.contexts) == 2
        for p in rec["paragraphs"]:
            assert len(paragraph_owner(ep, p["title"])) == 1
        # supporting paragraphs alternate between the agents (3 hops over 2 agents: 0, 1, 0)
        assert [s.agent for s in ep.evidence] == [k % 2 for k in range(len(ep.evidence))]
    assert eps[0].answers == ["Orla Vance", "Orla Hillard", "Vance"]
    three = load_dataset("musique", MUSIQUE, n_agents=3)
    assert len({s.agent for s in three[1].evidence}) == 3  # 3 hops, 3 agents: one supporting paragraph each


def test_musique_unanswerable_included_on_request():
    eps = load_dataset("musique", MUSIQUE, include_unanswerable=True)
    assert len(eps) == 3
    assert eps[2].meta == {"hops": 2, "answerable": False} and eps[2].evidence == ()
    assert eps[2].answers == ["Ada Pell"]


# ---------------------------------------------------------------- FanOutQA

def test_fanoutqa_load():
    eps = load_dataset("fanoutqa", FANOUT, pages_dir=PAGES)
    assert [e.id for e in eps] == ["a1f3c9d2e4b50617", "f6a8b0c2d3e5f7a9"]
    draft, lakes = eps
    assert draft.answers == {"Pat Ormond": ["Right"], "Lia Serrat": ["Left"], "Tom Achebe": ["Left"]}
    assert draft.multipart and not lakes.multipart and lakes.answers == ["2"]
    # one page per agent, in evidence order; .txt, .md and -dated.md pages all found
    assert draft.meta["pageids"] == [[9100001], [9100002], [9100003], [9100004]]
    assert [c.splitlines()[0] for c in draft.contexts] == [
        "# 2031 Arden League draft", "# Pat Ormond", "# Lia Serrat", "# Tom Achebe (baseball)"]
    assert draft.contexts[2] == (PAGES / "9100003.md").read_text().strip().join(["# Lia Serrat\n\n", ""])
    assert "bats left-handed" in draft.contexts[3]
    # nested decomposition walked depth-first; the repeated page appears once
    assert lakes.meta == {"categories": ["Geography"], "pageids": [[9200001], [9200002], [9200003]],
                          "n_pages": 3, "truncated_pages": 0}
    assert all(e.evidence == () for e in eps)  # FanOutQA has no span-level evidence


def test_fanoutqa_max_agents_and_truncation():
    draft = load_dataset("fanoutqa", FANOUT, pages_dir=PAGES, max_agents=2)[0]
    assert draft.meta["pageids"] == [[9100001, 9100003], [9100002, 9100004]]
    assert draft.contexts[0].count("\n# ") == 1  # two pages, blank-line separated
    uncapped = load_dataset("fanoutqa", FANOUT, pages_dir=PAGES, max_agents=None)[0]
    assert len(uncapped.contexts) == 4
    short = load_dataset("fanoutqa", FANOUT, pages_dir=PAGES, max_chars_per_page=20)
    assert short[0].contexts[1] == "# Pat Ormond\n\nPatrick \"Pat\" Ormond"
    assert short[0].meta["truncated_pages"] == 4
    with pytest.raises(ValueError, match="pages_dir: required"):
        load_dataset("fanoutqa", FANOUT)


def test_fanoutqa_answer_kinds_and_necessary_evidence(tmp_path):
    base = {"question": "Q?", "categories": [],
            "necessary_evidence": [{"pageid": 9200002, "revid": 1, "title": "Lake Orr", "url": "u"}]}
    recs = [dict(base, id="list", answer=["Lake Orr", "Greywater", "Lake Orr"]), dict(base, id="one", answer=["x"]),
            dict(base, id="bool", answer=False), dict(base, id="float", answer=100.0),
            dict(base, id="dict", answer={"Lake Orr": 1240, "Greywater": True}),
            dict(base, id="blank", answer={"Lake Orr": "1,240 m", "Greywater": " "})]  # as in the real dev set
    eps = load_dataset("fanoutqa", dump(recs, tmp_path / "q.json"), pages_dir=PAGES)
    assert [e.answers for e in eps] == [
        {"Lake Orr": ["Lake Orr"], "Greywater": ["Greywater"]}, ["x"], ["no"], ["100", "100.0"],
        {"Lake Orr": ["1240"], "Greywater": ["yes"]}, {"Lake Orr": ["1,240 m"]}]
    assert eps[5].meta["dropped_answer_parts"] == ["Greywater"] and "dropped_answer_parts" not in eps[4].meta
    assert eps[0].contexts == ("# Lake Orr\n\n" + (PAGES / "9200002.txt").read_text().strip(),)


def test_fanoutqa_bundled_questions_located_without_import(tmp_path, monkeypatch):
    pkg = tmp_path / "site" / "fanoutqa"
    (pkg / "data").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('the loader must not import fanoutqa')\n")
    shutil.copy(FANOUT, pkg / "data" / "fanout-final-dev.json")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert bundled_dev_path() == pkg / "data" / "fanout-final-dev.json"
    eps = load_dataset("fanoutqa", None, pages_dir=PAGES)
    assert [e.to_json() for e in eps] == [e.to_json() for e in load_dataset("fanoutqa", FANOUT, pages_dir=PAGES)]


def test_fanoutqa_not_installed_message(monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps fanoutqa"):
        bundled_dev_path()


# ---------------------------------------------------------------- LongBench v2

def test_longbench_v2_load():
    records = raw(LONGBENCH)
    eps = load_dataset("longbench_v2", LONGBENCH, n_agents=3)
    for ep, rec in zip(eps, records):
        assert ep.id == rec["_id"] and len(ep.contexts) == 3 and all(ep.contexts)
        assert "".join(ep.contexts) == rec["context"]  # contiguous, lossless
        assert all(c.endswith("\n") for c in ep.contexts)  # cut at line/paragraph breaks
        assert ep.question.startswith(rec["question"] + "\n\n(A) ")
        assert all(f"({x}) {rec['choice_' + x]}" in ep.question for x in "ABCD")
        assert ep.answers == [rec["answer"], rec["choice_" + rec["answer"]]]
        assert ep.evidence == ()
        assert ep.meta == {k: rec[k] for k in ("domain", "sub_domain", "difficulty", "length")} | {
            "answer_match": "choice"}
    assert eps[0].contexts[1].startswith("Segment review.")  # paragraph breaks preferred


def test_split_text_properties():
    rng = random.Random(0)
    for _ in range(500):
        n = rng.randint(1, 5)
        text = "".join(rng.choice("ab  \n") for _ in range(rng.randint(n, 60)))
        chunks = split_text(text, n)
        assert "".join(chunks) == text and len(chunks) == n and all(chunks)
    assert split_text("one two\n\nthree four five", 2) == ["one two\n\n", "three four five"]
    assert split_text("abcdef", 2) == ["abc", "def"]  # no whitespace: cut mid-word


# ---------------------------------------------------------------- common

@pytest.mark.parametrize("name", sorted(LOADERS))
def test_deterministic_and_round_trips_through_episode_files(name, tmp_path):
    path, kw = DEFAULT_ARGS[name]
    first, second = load_dataset(name, path, **kw), load_dataset(name, path, **kw)
    assert first and [e.to_json() for e in first] == [e.to_json() for e in second]
    write_episodes(tmp_path / "eps.jsonl", first)
    assert [e.to_json() for e in load_episodes(tmp_path / "eps.jsonl")] == [e.to_json() for e in first]


def test_unknown_loader_lists_valid_names():
    with pytest.raises(UnknownNameError) as err:
        load_dataset("squad", HOTPOT)
    assert str(err.value) == "unknown dataset loader 'squad'; valid: fanoutqa, hotpotqa, longbench_v2, musique"
    assert isinstance(err.value, KeyError)


@pytest.mark.parametrize("name", ["hotpotqa", "musique"])
def test_evidence_spans_map_to_tokens(name):
    tok = tiny_tokenizer()
    for ep in load_dataset(name, DEFAULT_ARGS[name][0]):
        for span, text in zip(ep.evidence, ep.evidence_text()):
            context = ep.contexts[span.agent]
            positions = span_token_positions(context, [(span.start, span.end)], tok)
            ids = tok(context, add_special_tokens=False)["input_ids"]
            assert positions == list(range(positions[0], positions[-1] + 1))  # one contiguous run
            assert text in tok.decode([ids[i] for i in positions])


def _del(key):
    return lambda r: r.pop(key)


def _set(value, *keys):
    def edit(r):
        for k in keys[:-1]:
            r = r[k]
        r[keys[-1]] = value
    return edit


# (fixture, record index in the file, edit, expected message after "<file><where>: ")
MALFORMED = [
    (HOTPOT, 1, _del("answer"), "answer: missing"),
    (HOTPOT, 0, _set(5, "context", 3, 1, 0), "context[3][1][0]: want a string, got int"),
    (HOTPOT, 1, _set(["Bluegrass"], "context", 2), "context[2]: want [title, [sentence, ...]]"),
    (HOTPOT, 1, _set("5a8f3c1e554299458435d5a2", "_id"), "_id: duplicate '5a8f3c1e554299458435d5a2'"),
    (HOTPOT, 0, _set(None, "level"), "level: want a string, got null"),
    (MUSIQUE, 2, lambda r: r["paragraphs"][2].pop("paragraph_text"), "paragraphs[2].paragraph_text: missing"),
    (MUSIQUE, 0, _set("yes", "paragraphs", 0, "is_supporting"), "paragraphs[0].is_supporting: want a boolean, got str"),
    (MUSIQUE, 1, _set("Salthaven", "answer_aliases"), "answer_aliases: want a list, got str"),
    (MUSIQUE, 1, lambda r: [p.update(is_supporting=False) for p in r["paragraphs"]],
     "paragraphs: no paragraph has is_supporting true"),
    (MUSIQUE, 0, _set("1", "paragraphs", 4, "idx"), "paragraphs[4].idx: want an integer, got str"),
    (FANOUT, 1, _set("9200002", "decomposition", 1, "decomposition", 0, "evidence", "pageid"),
     "decomposition[1].decomposition[0].evidence.pageid: want an integer, got str"),
    (FANOUT, 0, _del("answer"), "answer: missing (FanOutQA's test split has no answers"),
    (FANOUT, 0, _set(["Right"], "answer", "Pat Ormond"), "answer['Pat Ormond']: want a non-empty string, number or"),
    (FANOUT, 0, lambda r: r["decomposition"][3].pop("evidence"), "decomposition[3].evidence: missing"),
    (FANOUT, 0, lambda r: r["answer"].update(dict.fromkeys(r["answer"], "")), "answer: every part is an empty string"),
    (FANOUT, 1, _set("", "answer"), "answer: want a non-empty string, number or boolean, got ''"),
    (FANOUT, 1, _set(12, "decomposition", 0, "evidence", "pageid"),
     "decomposition[0].evidence: page 12 ('List of lakes of Veldmark') not found: looked for 12.txt, 12.md, "
     "12-dated.md in"),
    (LONGBENCH, 1, _set("E", "answer"), "answer: want one of A, B, C, D, got 'E'"),
    (LONGBENCH, 0, _del("choice_C"), "choice_C: missing"),
    (LONGBENCH, 1, _set(["a", "b"], "context"), "context: want a string, got list"),
]
LOADER_OF = {HOTPOT: "hotpotqa", MUSIQUE: "musique", FANOUT: "fanoutqa", LONGBENCH: "longbench_v2"}


@pytest.mark.parametrize("fixture, index, edit, message", MALFORMED,
                         ids=[f"{f.stem}-{m.split(':')[0]}" for f, _, _, m in MALFORMED])
def test_malformed_record_names_file_record_and_field(fixture, index, edit, message, tmp_path):
    records = raw(fixture)
    edit(records[index])
    bad = dump(records, tmp_path / fixture.name)
    name = LOADER_OF[fixture]
    where = f":{index + 1}: " if fixture.suffix == ".jsonl" else f"[{index}]: "  # JSONL: line; JSON: list index
    with pytest.raises(TaskFormatError) as err:
        load_dataset(name, bad, **DEFAULT_ARGS[name][1])
    assert str(err.value).startswith(f"{bad}{where}{message}"), str(err.value)


def test_musique_error_names_the_physical_line(tmp_path):
    lines = MUSIQUE.read_text().splitlines()
    bad = tmp_path / "musique.jsonl"
    bad.write_text(lines[0] + "\n\n" + lines[1] + "\n{not json\n")
    with pytest.raises(TaskFormatError, match=r"musique\.jsonl:4: not JSON"):
        load_dataset("musique", bad)


@pytest.mark.parametrize("name", ["hotpotqa", "fanoutqa", "longbench_v2"])
def test_malformed_file(name, tmp_path):
    kw = DEFAULT_ARGS[name][1]
    (tmp_path / "a.json").write_text('{"_id": "x"}')
    with pytest.raises(TaskFormatError, match=r"a\.json: want a JSON list of records, got dict"):
        load_dataset(name, tmp_path / "a.json", **kw)
    (tmp_path / "b.json").write_text('[{"_id": "x",]')
    with pytest.raises(TaskFormatError, match=r"b\.json: not JSON"):
        load_dataset(name, tmp_path / "b.json", **kw)
    (tmp_path / "c.json").write_text('[["not", "an", "object"]]')
    with pytest.raises(TaskFormatError, match=r"c\.json\[0\]: record: want a JSON object, got list"):
        load_dataset(name, tmp_path / "c.json", **kw)


# (loader, record index, edit making its answer unscorable)
UNSCORABLE = [
    ("hotpotqa", 1, _set("The The", "answer")),  # as text: articles dropped, nothing left
    ("musique", 0, lambda r: r.update(answer="—", answer_aliases=[])),
    ("fanoutqa", 1, _set("—", "answer")),
]


@pytest.mark.parametrize("name, index, edit", UNSCORABLE, ids=[u[0] for u in UNSCORABLE])
def test_a_record_that_could_never_score_is_skipped_and_counted_not_the_whole_file(name, index, edit, tmp_path):
    from latentwire.errors import SkippedRecordsWarning, UnscorableAnswerError

    fixture, kw = DEFAULT_ARGS[name]
    records = raw(fixture)
    edit(records[index])
    bad = dump(records, tmp_path / fixture.name)
    with pytest.warns(SkippedRecordsWarning, match=rf"skipped 1 of {len(records)} records whose answers could never"):
        kept = load_dataset(name, bad, **kw)
    full = load_dataset(name, fixture, **kw)
    assert [e.to_json() for e in kept] == [e.to_json() for i, e in enumerate(full) if i != index]
    where = f":{index + 1}: " if fixture.suffix == ".jsonl" else f"[{index}]: "
    with pytest.raises(UnscorableAnswerError) as err:
        load_dataset(name, bad, skip_unscorable=False, **kw)
    assert str(err.value).startswith(f"{bad}{where}episode ") and "no answer could score" in str(err.value)
    assert isinstance(err.value, TaskFormatError)


def test_multiple_choice_scores_the_chosen_letter():
    """Gold [letter, text]: the letter a reply chooses scores (A is not dropped as an article, a B inside "not B"
    or "vitamin D" is not a choice); a reply naming no letter is matched on the choice's text."""
    from latentwire.bench.metrics import answer_scores, chosen_letter

    acc = lambda reply, gold: answer_scores(reply, gold, "choice")["accuracy"]  # noqa: E731
    assert acc("(A)", ["A", "Paris"]) == acc("The answer is A.", ["A", "Paris"]) == acc("**A**", ["A", "x"]) == 1
    assert acc("The answer is (A), not B.", ["B", "Rome"]) == 0 and acc("Take vitamin D.", ["D", "x"]) == 0
    assert acc("It is Paris.", ["A", "Paris"]) == 1 and acc("It is Rome.", ["A", "Paris"]) == 0
    assert chosen_letter("C. Because it is") == "C" and chosen_letter("A cat sat") is None
    eps = load_dataset("longbench_v2", LONGBENCH, n_agents=3)
    assert all(ep.answer_match == "choice" for ep in eps)
    with pytest.raises(ValueError, match="letter"):
        answer_scores("A", ["Paris"], "choice")


def test_hotpotqa_supporting_facts_outside_their_paragraph_are_dropped_not_fatal(tmp_path):
    """Released HotpotQA files hold a few supporting facts that point past their paragraph: each such fact is
    dropped (one warning counts them and names the first), its episode and every other record kept."""
    from latentwire.errors import SkippedRecordsWarning

    records = raw(HOTPOT)
    records[0]["supporting_facts"][1][1] = 7
    records[1]["supporting_facts"][0][0] = "Nope"
    path = tmp_path / "hotpot.json"
    path.write_text(json.dumps(records))
    with pytest.warns(SkippedRecordsWarning, match=r"dropped 2 supporting facts.*first: .*\[0\]: "
                                                   r"supporting_facts\[1\]\[1\]: sentence 7 out of range"):
        eps = load_dataset("hotpotqa", path)
    full = load_dataset("hotpotqa", HOTPOT)
    assert [e.id for e in eps] == [e.id for e in full]
    assert len(eps[0].evidence) == len(full[0].evidence) - 1 and len(eps[1].evidence) == len(full[1].evidence) - 1


"""The shipped tasks: registry, determinism, committed data, and answers/evidence re-derived independently."""
from __future__ import annotations

import ast
import collections
import hashlib
import importlib.util
import os
import re
import subprocess
import sys
import textwrap
from fractions import Fraction
from pathlib import Path

import pytest

import latentwire
from latentwire.bench.episode import span_token_positions
from latentwire.bench.tasks import DATA_DIR, SEED, TASKS, generate, load_task, task_path
from latentwire.errors import UnknownNameError

REPO = Path(__file__).resolve().parents[2]
# data/ and stdlib/ are package data: read where latentwire is installed (src/ in an editable install)
PKG_TASKS = Path(latentwire.__file__).resolve().parent / "bench" / "tasks"
STDLIB = PKG_TASKS / "stdlib"
NAMES = ("code", "facts", "reasoning")


@pytest.fixture(scope="module")
def fresh():
    return {name: generate(name) for name in NAMES}


@pytest.fixture(scope="module")
def committed():
    return {name: load_task(name) for name in NAMES}


# --- registry, files, determinism -------------------------------------------------------------------------

def test_registry_and_paths():
    assert sorted(TASKS) == sorted(NAMES + ("aggregate", "coref", "paraphrase"))  # those: test_tasks_people.py
    assert DATA_DIR == PKG_TASKS / "data"
    for name in NAMES:
        assert task_path(name) == PKG_TASKS / "data" / f"{name}.jsonl" and task_path(name).is_file()
    with pytest.raises(UnknownNameError, match="valid: aggregate, code, coref, facts, paraphrase, reasoning"):
        load_task("fact")
    with pytest.raises(UnknownNameError):
        task_path("nope")


def _lines(episodes):
    return [ep.to_json() for ep in episodes]


def test_generation_is_deterministic_and_matches_committed_files(fresh, committed):
    for name in NAMES:
        again = TASKS[name](SEED)
        assert _lines(again) == _lines(fresh[name]), name
        data = "".join(line + "\n" for line in _lines(fresh[name])).encode("utf-8")
        assert task_path(name).read_bytes() == data, f"{name}: run `python tasks/generate.py`"
        assert committed[name] == fresh[name]
        assert _lines(TASKS[name](SEED + 1, n=6)) != _lines(fresh[name][:6])  # the seed matters


def test_generate_script_check_passes_under_another_hash_seed():
    env = dict(os.environ, PYTHONHASHSEED="12345")
    r = subprocess.run([sys.executable, "tasks/generate.py", "--check"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_generate_script_check_flags_a_stale_file(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("tasks_generate", REPO / "tasks" / "generate.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    import latentwire.bench.tasks as tasks_pkg
    monkeypatch.setattr(tasks_pkg, "DATA_DIR", tmp_path)
    assert gen.main(["--only", "reasoning"]) == 0
    assert gen.main(["--check", "--only", "reasoning"]) == 0
    path = tmp_path / "reasoning.jsonl"
    path.write_bytes(path.read_bytes().replace(b'"answers": ["', b'"answers": ["9', 1))
    assert gen.main(["--check", "--only", "reasoning"]) == 1
    assert gen.main(["--check", "--only", "facts"]) == 1  # missing file


def test_sizes_and_stdlib_snapshot():
    snapshot = sorted(p for p in STDLIB.iterdir() if p.name != "__pycache__")  # pip compiles the installed .py files
    owned = [task_path(n) for n in NAMES] + snapshot
    assert sum(p.stat().st_size for p in owned) < 4_000_000
    assert sum(p.stat().st_size for p in snapshot) < 1_000_000
    readme = (STDLIB / "README.md").read_text(encoding="utf-8")
    assert "3.11.7" in readme and "unmodified" in readme
    sums = dict((name, digest) for digest, name in re.findall(r"^([0-9a-f]{64})  (\S+)$", readme, re.M))
    files = sorted(p.name for p in snapshot if p.name != "README.md")
    assert sorted(sums) == files and "LICENSE" in files and 8 <= len(files) - 1 <= 12
    for name, digest in sums.items():
        assert hashlib.sha256((STDLIB / name).read_bytes()).hexdigest() == digest, f"{name} was modified"


def test_counts_and_meta_breakdown(fresh):
    assert [len(fresh[n]) for n in NAMES] == [120, 120, 160]
    for name in NAMES:
        eps = fresh[name]
        assert len({e.id for e in eps}) == len(eps) and all(e.task == name for e in eps)
        assert {e.topology for e in eps} == {"merge" if name == "reasoning" else "fanin"}
    facts = collections.Counter(e.meta["hops"] for e in fresh["facts"])
    assert facts == {1: 60, 2: 60}
    assert all(len(e.contexts) == 3 for e in fresh["facts"] + fresh["code"])
    code = collections.Counter(e.meta["scope"] for e in fresh["code"])
    assert code["single"] >= 60 and code["cross"] >= 30
    assert len({e.question for e in fresh["code"]}) == len(fresh["code"])
    r = fresh["reasoning"]
    assert collections.Counter(e.meta["thinkers"] for e in r) == {2: 40, 3: 40, 4: 40, 5: 40}
    assert collections.Counter(e.meta["regime"] for e in r) == {"query_blind": 80, "query_aware": 80}
    assert collections.Counter(e.meta["kind"] for e in r) == {"arithmetic": 80, "ordering": 80}
    assert all(len(e.contexts) == e.meta["thinkers"] for e in r)


def test_every_evidence_span_is_verbatim_and_trimmed(fresh):
    for eps in fresh.values():
        for e in eps:
            assert e.evidence
            for s, text in zip(e.evidence, e.evidence_text()):
                assert text.strip() and text.lstrip(" ") == text.lstrip() and text == text.rstrip(), e.id
                assert e.contexts[s.agent][s.start:s.end] == text


def test_spans_map_to_tokens():
    from latentwire.models import tiny_tokenizer
    tok = tiny_tokenizer()  # byte-level: the tokens of a span decode back to exactly its text
    for name in NAMES:
        for e in load_task(name)[:3]:
            for s, text in zip(e.evidence, e.evidence_text()):
                ctx = e.contexts[s.agent]
                pos = span_token_positions(ctx, [(s.start, s.end)], tok)
                ids = tok(ctx, add_special_tokens=False)["input_ids"]
                assert pos == list(range(pos[0], pos[-1] + 1))
                assert tok.decode([ids[i] for i in pos]) == text


# --- facts ------------------------------------------------------------------------------------------------

def test_facts_answers_occur_once_inside_the_evidence(fresh):
    for e in fresh["facts"]:
        ev = e.evidence_text()
        main = e.answers[0]
        hits = [(a, m.start()) for a, c in enumerate(e.contexts) for m in re.finditer(re.escape(main), c)]
        assert len(hits) == 1, (e.id, main, hits)  # no leakage, no ambiguity
        (agent, at), = hits
        assert any(s.agent == agent and s.start <= at < s.end for s in e.evidence), e.id
        assert all(any(a in t for t in ev) for a in e.answers[:2])
        if e.meta["hops"] == 1:
            assert len(e.evidence) == 1 and main in ev[0]
        else:
            assert len(e.evidence) == 2 and e.evidence[0].agent != e.evidence[1].agent
            bridge = e.meta["bridge"]
            assert all(bridge in t for t in ev)
            assert sum(main in t for t in ev) == 1
            entity = e.question.split(" by ")[-1].split(" in ")[-1].rstrip("?").removesuffix(" based")
            assert entity in ev[0] and entity not in ev[1] and entity not in e.answers, e.question
            assert sum(c.count(entity) for c in e.contexts) == 1  # the question's entity: only its fact


def test_facts_lengths_cover_500_to_4000_tokens(fresh):
    est = [len(c) / 4.2 for e in fresh["facts"] for c in e.contexts]
    assert min(est) < 550 and max(est) > 3800
    assert all(450 < t < 4200 for t in est)
    for e in fresh["facts"]:
        assert e.meta["approx_tokens"] == [round(len(c) / 4.2) for c in e.contexts]
        assert all(abs(t / e.meta["length_bucket"] - 1) < 0.08 for t in e.meta["approx_tokens"])
    buckets = collections.Counter(e.meta["length_bucket"] for e in fresh["facts"])
    assert sorted(buckets) == [500, 1000, 2000, 4000] and min(buckets.values()) >= 12


# --- code -------------------------------------------------------------------------------------------------

def _parse(text):
    snippet = textwrap.dedent(text) + "\n"
    for cand in (snippet, snippet + "    pass\n"):
        try:
            return snippet, ast.parse(cand).body[0]
        except SyntaxError:
            pass
    raise AssertionError(f"evidence does not parse: {text!r}")


def _value(src):
    try:
        return ast.literal_eval(src)
    except ValueError:
        return eval(compile(src, "<constant>", "eval"), {"__builtins__": {}})  # e.g. 7*3 - 1


def _header_module(context, at):
    return re.findall(r"^# file: (\w+)\.py", context[:at], re.M)[-1]


def test_code_answers_rederived_from_the_evidence(fresh):
    stdlib = {p.stem: p.read_text(encoding="utf-8") for p in STDLIB.glob("*.py")}
    for e in fresh["code"]:
        ev = e.evidence_text()
        for s, text in zip(e.evidence, ev):
            if text.startswith("# file: "):  # which_module's second span: the header naming the module
                continue
            mod = _header_module(e.contexts[s.agent], s.start)
            assert mod in e.meta["modules"] and ("\n" + text + "\n") in ("\n" + stdlib[mod]), e.id
        names = re.findall(r"`([^`]+)`", e.question)
        target = names[-1].split(".")
        kind, ans = e.meta["kind"], e.answers[0]
        src, node = _parse(ev[0])
        if kind == "default":
            assert isinstance(node, ast.FunctionDef) and node.name == target[-1]
            args = node.args.posonlyargs + node.args.args
            pairs = list(zip(args[len(args) - len(node.args.defaults):], node.args.defaults))
            pairs += list(zip(node.args.kwonlyargs, node.args.kw_defaults))
            d = dict((a.arg, d) for a, d in pairs)[names[0]]
            assert ast.get_source_segment(src, d) == ans
            value = ast.literal_eval(ans)
            if isinstance(value, str) and value.strip():
                assert e.answers[1] == value
        elif kind == "constant":
            assert isinstance(node, ast.Assign) and node.targets[0].id == target[-1]
            assert ast.get_source_segment(src, node.value) == ans
            assert ast.literal_eval(ans) == ast.literal_eval(node.value)
        elif kind == "return":
            assert isinstance(node, ast.FunctionDef) and node.name == target[-1]
            rsrc, ret = _parse(ev[-1]) if len(ev) == 2 else (src, node.body[0])
            assert isinstance(ret, ast.Return) and ast.get_source_segment(rsrc, ret.value) == ans
        elif kind == "base":
            assert isinstance(node, ast.ClassDef) and node.name == target[-1]
            assert ast.get_source_segment(src, node.bases[0]) == ans
        elif kind == "which_module":
            assert isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == names[0]
            assert e.answers == [_header_module(e.contexts[e.evidence[0].agent], e.evidence[0].start),
                                 ans + ".py"]
            header = e.evidence[1]  # the answer is read from the header of the piece that holds the definition
            assert len(e.evidence) == 2 and header.agent == e.evidence[0].agent and header.end < e.evidence[0].start
            assert re.fullmatch(rf"# file: {ans}\.py( \(lines \d+-\d+\))?", ev[1]), (e.id, ev[1])
            assert "# file: " not in e.contexts[header.agent][header.end:e.evidence[0].start]  # its own piece's
            defs = sum(len(re.findall(rf"^\s*(?:def|class) {names[0]}\b", c, re.M)) for c in e.contexts)
            assert defs == 1, e.id  # unambiguous within the episode
        elif kind == "const_default":
            args = node.args.posonlyargs + node.args.args
            d = dict(zip([a.arg for a in args[len(args) - len(node.args.defaults):]], node.args.defaults))[names[0]]
            csrc, const = _parse(ev[1])
            assert isinstance(d, ast.Name) and const.targets[0].id == d.id
            assert repr(_value(ast.get_source_segment(csrc, const.value))) == ans
        elif kind == "base_of_base":
            assert isinstance(node, ast.ClassDef) and node.name == target[-1]
            bsrc, base = _parse(ev[1])
            assert ast.get_source_segment(src, node.bases[0]).split(".")[-1] == base.name
            assert ast.get_source_segment(bsrc, base.bases[0]) == ans
            assert e.evidence[0].agent != e.evidence[1].agent
        else:
            raise AssertionError(kind)
        assert e.meta["hops"] == len(e.evidence) - (kind in ("return", "which_module") and len(e.evidence) == 2)


def test_code_contexts_are_whole_lines_within_bounds(fresh):
    for e in fresh["code"]:
        assert len(set(e.meta["modules"])) >= 1
        for c in e.contexts:
            assert c.startswith("# file: ") and 450 < len(c) / 4.2 < 4000
        assert len({s.agent for s in e.evidence}) == e.meta["senders_needed"]
        for s in e.evidence:
            c = e.contexts[s.agent]
            assert (s.start == 0 or c[s.start - 1] == "\n") and (s.end == len(c) or c[s.end] == "\n")


# --- reasoning --------------------------------------------------------------------------------------------

_RATIO = {"twice": Fraction(2), "three times": Fraction(3), "half": Fraction(1, 2), "a third": Fraction(1, 3)}


def _solve_arithmetic(premises):
    """Each premise: x = v, x = y + d, or x = r * y. Propagate both ways until nothing changes."""
    known, rels = {}, []
    for p in premises:
        if m := re.fullmatch(r"(\w+) has (\d+) \w+\.", p):
            known[m[1]] = Fraction(int(m[2]))
        elif m := re.fullmatch(r"(\w+) has (\d+) (more|fewer) \w+ than (\w+)\.", p):
            d = int(m[2]) * (1 if m[3] == "more" else -1)
            rels.append((m[1], m[4], lambda y, d=d: y + d, lambda x, d=d: x - d))
        elif m := re.fullmatch(r"(\w+) has (twice|three times|half|a third) as many \w+ as (\w+)\.", p):
            r = _RATIO[m[2]]
            rels.append((m[1], m[3], lambda y, r=r: y * r, lambda x, r=r: x / r))
        else:
            raise AssertionError(p)
    changed = True
    while changed:
        changed = False
        for x, y, fwd, back in rels:
            if y in known and x not in known:
                known[x], changed = fwd(known[y]), True
            elif x in known and y not in known:
                known[y], changed = back(known[x]), True
    return known


def _extreme(premises, top, items=()):
    """The unique item (of `items` and those named) with none above it (top) or below it; None if not unique."""
    above = collections.defaultdict(set)  # item -> items directly greater
    items = set(items)
    for p in premises:
        m = re.fullmatch(r"(.+) is (\w+) than (.+)\.", p)
        a, rel, b = m[1][0].lower() + m[1][1:] if m[1].startswith("The ") else m[1], m[2], m[3]
        hi, lo = (a, b) if rel in ("heavier", "taller", "older", "faster") else (b, a)
        above[lo].add(hi)
        items |= {hi, lo}
    below = collections.defaultdict(set)
    for lo, his in above.items():
        for hi in his:
            below[hi].add(lo)
    ends = [i for i in items if not (above if top else below)[i]]
    return (ends[0] if len(ends) == 1 else None), items


def test_reasoning_answers_recomputed_and_every_premise_needed(fresh):
    for e in fresh["reasoning"]:
        premises = e.evidence_text()
        if e.meta["kind"] == "arithmetic":
            assert len(premises) == e.meta["steps"] + 1
            target = re.fullmatch(r"How many \w+ does (\w+) have\?", e.question)[1]
            assert str(_solve_arithmetic(premises)[target]) == e.answers[0]
            for i in range(len(premises)):  # drop any premise and the answer is undetermined
                assert target not in _solve_arithmetic(premises[:i] + premises[i + 1:])
        else:
            assert len(premises) == e.meta["steps"]
            top = bool(re.search(r"(heaviest|tallest|oldest|fastest)\?$", e.question))
            answer, items = _extreme(premises, top)
            assert answer in e.answers and e.answers[0] in (answer, answer.removeprefix("the "))
            for i in range(len(premises)):  # drop any premise and the extreme is undetermined
                assert _extreme(premises[:i] + premises[i + 1:], top, items)[0] is None


def test_reasoning_premises_are_dealt_disjointly(fresh):
    by_problem = collections.defaultdict(list)
    for e in fresh["reasoning"]:
        by_problem[e.meta["problem"]].append(e)
        lines = [c.split("\n") for c in e.contexts]
        per_agent = collections.Counter(s.agent for s in e.evidence)
        assert sorted(per_agent) == list(range(e.meta["thinkers"]))  # every thinker holds a premise
        allp = [p for ls in lines for p in ls[1:] if not p.startswith("Question: ")]
        assert sorted(allp) == sorted(e.evidence_text())  # disjoint, and nothing but premises
        for c in e.contexts:
            if e.meta["regime"] == "query_aware":
                assert c.endswith("\nQuestion: " + e.question)
            else:
                assert e.question not in c and "Question" not in c
    for pair in by_problem.values():  # the two regimes share premises, dealing and answers
        aware, blind = sorted(pair, key=lambda e: e.meta["regime"])
        assert blind.evidence == aware.evidence and blind.answers == aware.answers
        assert [c + "\nQuestion: " + blind.question for c in blind.contexts] == list(aware.contexts)


@pytest.mark.parametrize("senders,tokens,hops", [(1, 300, 1), (4, 300, 2), (8, 120, None)])
def test_facts_episodes_of_any_size_and_sender_count(senders, tokens, hops):
    from latentwire.bench.episode import validate_fields
    from latentwire.bench.tasks.facts import CHARS_PER_TOKEN, episodes

    eps = episodes(1, 4, tokens, senders, hops=hops, topology="chain")
    assert eps == episodes(1, 4, tokens, senders, hops=hops, topology="chain")  # pure in the seed
    for ep in eps:
        assert not validate_fields(ep) and ep.topology == "chain" and len(ep.contexts) == senders
        assert hops is None or ep.meta["hops"] == hops
        assert all(0.9 * tokens < len(c) / CHARS_PER_TOKEN < 1.2 * tokens + 60 for c in ep.contexts)
        last = ep.evidence[-1]  # the answer fact (a two-hop chain's bridge fact comes first)
        assert any(a.split(" million")[0] in ep.contexts[last.agent][last.start:last.end] for a in ep.answers)


def test_facts_episodes_refuse_more_hops_than_senders():
    from latentwire.bench.tasks.facts import episodes

    with pytest.raises(ValueError, match="2-hop"):
        episodes(0, 1, 200, 1, hops=2)


def test_follow_up_groups_ask_several_questions_over_the_same_documents():
    from latentwire.bench.tasks import facts

    groups = facts.follow_up_episodes(5, 6, tokens=300)
    assert groups == facts.follow_up_episodes(5, 6, tokens=300)  # deterministic
    firsts = facts.episodes(5, 6, tokens=300, senders=3, hops=1)
    assert [g[0] for g in groups] == firsts  # the first question of a group is the plain one-hop episode
    for g in groups:
        assert len(g) == 3 and len({e.contexts for e in g}) == 1  # one world, three questions
        assert sorted(e.meta["qtype"] for e in g) == ["budget", "city", "leader"]
        assert [e.id for e in g[1:]] == [f"{g[0].id}-f1", f"{g[0].id}-f2"]
        assert all(e.meta["follow_up_of"] == g[0].id for e in g[1:])
        for e in g:
            (span,) = e.evidence
            text = e.contexts[span.agent][span.start:span.end]
            assert any(a in text for a in e.answers), (e.question, text)  # the evidence states the answer


def test_generators_refuse_parameters_they_cannot_honour_with_typed_errors():
    from latentwire.bench.tasks import aggregate, facts
    from latentwire.errors import ConfigError

    assert len(aggregate.generate(0, n=60, per_sender=6)) == 60  # the largest that keeps an answer's values distinct
    with pytest.raises(ConfigError, match="1 ≤ per_sender ≤ 6"):
        aggregate.generate(0, n=60, per_sender=7)  # was an IndexError at episode 53
    with pytest.raises(ConfigError, match="hops must be 1 or 2"):
        facts.episodes(0, 5, 500, 3, hops=3)  # was a ZeroDivisionError
    with pytest.raises(ConfigError, match="2-hop question needs ≥ 2 senders"):
        facts.episodes(0, 2, 500, 1, hops=2)
    with pytest.raises(UnknownNameError, match="valid: budget, budget_of_leader, city"):
        facts.follow_up_episodes(0, 1, 500, questions=("city", "bogus"))

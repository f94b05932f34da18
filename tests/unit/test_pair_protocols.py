"""Pair protocols (alone, t2t, fullcontext, translated), the pair runner and the train / bench pair CLI,
on tiny heterogeneous models (gemma3 sharer -> llama receiver, one shared tiny tokenizer)."""
from __future__ import annotations

import json

import pytest
import torch

from latentwire import cli
from latentwire.agent import Agent
from latentwire.bench.pair_runner import format_table, read_records, run_pair, run_pairs, summarize_pairs
from latentwire.bench.tasks.pairs import pairs
from latentwire.errors import ConfigError, GeometryMismatchError, StateFormatError, UnknownNameError
from latentwire.protocols.pair import PAIR_PROTOCOLS, both_prompt, get_pair_protocol, own_prompt
from latentwire.translate import build

SHARER, RECEIVER = "gemma3", "llama"


@pytest.fixture(scope="module")
def pair():
    return pairs("reasoning", "test", 2)[0]  # ~120 + ~50 characters: fits the tiny models' window


@pytest.fixture
def ckpt(agent_for, tmp_path):
    """Untrained (zero-init) checkpoint folder of `method` for sharer -> receiver."""
    def make(method="xkv", sharer=SHARER, receiver=RECEIVER, **params):
        t = build(method, agent_for(sharer).geometry, agent_for(receiver).geometry, **params)
        return str(t.save(tmp_path / f"{method}_{sharer}_{receiver}"))
    return make


def _spy(agent: Agent) -> list:
    """Record every Answer the agent returns (to compare answer token ids, not just text)."""
    replies, answer = [], agent.answer

    def wrapped(*a, **kw):
        replies.append(answer(*a, **kw))
        return replies[-1]

    agent.answer = wrapped
    return replies


def _sane(out, name):
    assert out.protocol == name and isinstance(out.answer, str)
    assert out.receiver_seconds > 0 and all(s > 0 for s in out.sender_seconds)
    assert out.tteoa == pytest.approx(max(out.sender_seconds, default=0.0) + out.receiver_seconds)
    assert out.receiver_context > 0 and out.message_bytes >= 0


def test_prompts_are_shared_with_training(pair):
    from latentwire.training import states

    assert states.own_prompt is own_prompt and states.both_prompt is both_prompt
    both = both_prompt(pair.sharer_doc, pair.receiver_doc, pair.question)
    assert both.index(pair.sharer_doc) < both.index(pair.receiver_doc) < both.index(pair.question)


def test_text_protocols_run_and_account_for_time_and_bytes(pair, agent_for):
    s, r = agent_for(SHARER), agent_for(RECEIVER)
    args = (s, r, pair.sharer_doc, pair.receiver_doc, pair.question)
    alone = get_pair_protocol("alone", max_new_tokens=4).run(*args)
    _sane(alone, "alone")
    assert alone.message_bytes == 0 and alone.sender_seconds == () and not s.calls
    t2t = get_pair_protocol("t2t", max_new_tokens=4, max_note_tokens=6).run(*args)
    _sane(t2t, "t2t")
    assert len(t2t.sender_seconds) == 1 and t2t.details["note_tokens"] <= 6
    assert t2t.message_bytes == len(t2t.details["notes"].encode())
    assert [c.op for c in s.calls] == ["answer"]  # the sharer decoded its notes
    full = get_pair_protocol("fullcontext", max_new_tokens=4).run(*args)
    _sane(full, "fullcontext")
    assert full.message_bytes == len(pair.sharer_doc.encode()) and full.receiver_context > alone.receiver_context


@pytest.mark.parametrize("method,aware", [("xkv", False), ("lcfx", False), ("dense", False), ("dense", True),
                                          ("c2c", False)])
def test_translated_runs_every_method(method, aware, pair, agent_for, ckpt):
    s, r = agent_for(SHARER), agent_for(RECEIVER)
    p = get_pair_protocol("translated", checkpoint=ckpt(method), context_aware=aware, max_new_tokens=3)
    out = p.run(s, r, pair.sharer_doc, pair.receiver_doc, pair.question)
    _sane(out, "translated")
    d = out.details
    assert d["method"] == method and d["context_aware"] == aware and d["parameters"] > 0 and d["translator_ms"] > 0
    assert len(out.sender_seconds) == 2  # sharer prefill ‖ receiver prefill, then translator + answer
    assert out.receiver_seconds == pytest.approx(d["translator_ms"] / 1e3 + d["answer_s"])
    assert out.message_bytes > s.calls[0].rows_in * 2 * 4  # the sharer's KV crosses the wire
    assert [c.op for c in s.calls] == ["prefill"] and [c.op for c in r.calls] == ["prefill", "answer"]
    if method == "c2c":
        assert "align_ms" in d


def test_untrained_xkv_answers_exactly_like_alone(pair, agent_for, ckpt, spy_decode):
    s, r = agent_for(SHARER), agent_for(RECEIVER)
    replies = _spy(r)
    seen = spy_decode(r)  # the decode's input, bit for bit: tiny models' tokens barely depend on it
    args = (s, r, pair.sharer_doc, pair.receiver_doc, pair.question)
    alone = get_pair_protocol("alone", max_new_tokens=8).run(*args)
    xkv = get_pair_protocol("translated", checkpoint=ckpt("xkv"), max_new_tokens=8).run(*args)
    assert len(replies) == 2 and replies[0].token_ids == replies[1].token_ids and len(replies[0].token_ids) > 0
    assert xkv.answer == alone.answer and xkv.receiver_context == alone.receiver_context
    (s0, h0, k0), (s1, h1, k1) = seen
    assert s0 == s1 and torch.equal(h0, h1) and all(torch.equal(x, y) for x, y in zip(k0, k1, strict=True))


def test_translator_for_another_pair_is_refused(pair, agent_for, ckpt):
    p = get_pair_protocol("translated", checkpoint=ckpt("xkv", sharer="qwen2"), max_new_tokens=2)
    s, r = agent_for(SHARER), agent_for(RECEIVER)
    with pytest.raises(GeometryMismatchError, match="sharer qwen2 -> receiver llama.*got sharer gemma3 -> receiver llama"):
        p.run(s, r, pair.sharer_doc, pair.receiver_doc, pair.question)
    assert not s.calls and not r.calls  # refused before any compute
    rec = run_pair(p, "translated", pair, s, r)  # the runner records it, scored 0
    assert rec["error"].startswith("GeometryMismatchError") and rec["accuracy"] == 0 and rec["tteoa"] is None


def test_a_broken_checkpoint_stops_the_run_instead_of_failing_every_pair(pair, agent_for, ckpt):
    """A checkpoint whose weights are gone would fail every pair alike: CheckpointError is raised, not recorded as
    one failed pair after another (records a resume would then never rerun)."""
    import os

    from latentwire.errors import CheckpointError

    folder = ckpt("xkv", sharer=SHARER)
    os.remove(os.path.join(folder, "translator.safetensors"))
    with pytest.raises(CheckpointError, match="cannot be read"):
        p = get_pair_protocol("translated", checkpoint=folder, max_new_tokens=2)
        run_pair(p, "translated", pair, agent_for(SHARER), agent_for(RECEIVER))
    import json

    from latentwire.translate.base import load

    other = ckpt("xkv", sharer=SHARER)
    header = json.loads(open(os.path.join(other, "config.json")).read())
    for edit in ({"method": "nope"}, {"sharer": {"model": "x"}}, {"config": {"bogus": 1}}):  # not this build's
        with open(os.path.join(other, "config.json"), "w") as f:
            json.dump(header | edit, f)
        with pytest.raises(CheckpointError, match="cannot build its translator"):
            load(other)


def test_registry_and_parameter_errors(ckpt, tmp_path):
    assert set(PAIR_PROTOCOLS) == {"alone", "t2t", "fullcontext", "translated"}
    with pytest.raises(UnknownNameError, match="alone, fullcontext, t2t, translated"):
        get_pair_protocol("nope")
    for name, params in [("alone", {"max_new_tokens": 0}), ("t2t", {"max_note_tokens": 0}), ("alone", {"bogus": 1}),
                         ("translated", {}), ("translated", {"checkpoint": ckpt("xkv"), "context_aware": True})]:
        with pytest.raises(ConfigError):
            get_pair_protocol(name, **params)
    with pytest.raises(StateFormatError, match="no translator checkpoint"):
        get_pair_protocol("translated", checkpoint=str(tmp_path / "missing"))


def test_run_pairs_records_resumes_and_summarizes(agent_for, ckpt, tmp_path):
    s, r = agent_for(SHARER), agent_for(RECEIVER)
    out = tmp_path / "run"
    spec = f"alone(max_new_tokens=2),translated(checkpoint={ckpt('xkv')!r}, max_new_tokens=2)"
    run_pairs(SHARER, RECEIVER, "reasoning", spec, 2, out, sharer=s, receiver=r, progress=False)
    recs = read_records(out)
    assert len(recs) == 4 and {r_["pair"] for r_ in recs} == {p.id for p in pairs("reasoning", "test", 2)}
    assert all(r_["error"] is None and r_["task"] == "reasoning" and "f1" in r_ for r_ in recs)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["config"]["sharer"] == SHARER and "torch" in cfg["environment"] and len(cfg["pairs"]) == 2
    calls = len(s.calls) + len(r.calls)
    run_pairs(SHARER, RECEIVER, "reasoning", spec, 2, out, sharer=s, receiver=r, progress=False)
    assert len(read_records(out)) == 4 and len(s.calls) + len(r.calls) == calls  # nothing redone
    n_s, n_r = len(s.calls), len(r.calls)
    run_pairs(SHARER, RECEIVER, "reasoning", spec + ",fullcontext(max_new_tokens=2)", 2, out, sharer=s, receiver=r,
              progress=False)
    assert len(read_records(out)) == 6 and len(s.calls) == n_s and len(r.calls) == n_r + 4  # only the new protocol
    runs = [json.loads((out / "config.json").read_text())[k] for k in ("environment", "resumed")]
    first, last = runs[0]["run"], runs[1][-1]["run"]  # each record names the invocation that wrote it
    assert [r_["run"] for r_ in read_records(out)] == [first] * 4 + [last] * 2
    with pytest.raises(ConfigError, match="another sharer"):
        run_pairs(SHARER, RECEIVER, "reasoning", spec, 3, out, sharer=s, receiver=r, progress=False)
    rows = {row["protocol"]: row for row in summarize_pairs(read_records(out))}
    label = spec.split(",", 1)[1]  # "translated(checkpoint='...', max_new_tokens=2)"
    assert list(rows) == ["alone(max_new_tokens=2)", label, "fullcontext(max_new_tokens=2)"]
    tr = rows[label]
    assert tr["n"] == 2 and tr["translator_ms"] > 0 and tr["parameters"] > 0 and tr["tteoa"] > 0
    assert rows["alone(max_new_tokens=2)"]["translator_ms"] is None
    table = format_table(list(rows.values()))
    assert table.startswith("| protocol |") and "translated(checkpoint=" in table and len(table.splitlines()) == 5


def test_cli_train_and_bench_pair(agent_for, ckpt, tmp_path, monkeypatch, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["train", "--help"])
    assert e.value.code == 0 and "--stage1-steps" in capsys.readouterr().out
    assert cli.main(["train", "--method", "nope", "--sharer", SHARER, "--receiver", RECEIVER]) == 2
    assert "unknown translator 'nope'; valid: c2c, dense, lcfx, xkv" in capsys.readouterr().err
    assert cli.main(["bench", "pair", "--sharer", SHARER, "--receiver", RECEIVER, "--protocols", "nope"]) == 2
    assert "unknown pair protocol 'nope'; valid: alone" in capsys.readouterr().err

    agents = {SHARER: agent_for(SHARER), RECEIVER: agent_for(RECEIVER)}
    monkeypatch.setattr(Agent, "from_pretrained", classmethod(lambda cls, name, **kw: agents[name]))
    monkeypatch.setenv("LATENTWIRE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "xkv"
    assert cli.main(["train", "--method", "xkv", "--sharer", SHARER, "--receiver", RECEIVER, "--tasks", "reasoning",
                     "--steps", "2", "--batch", "1", "--train-n", "2", "--val-n", "1", "--eval-every", "1",
                     "--param", "dim=32", "--param", "slots=2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"checkpoint in {out}" in printed and "final validation loss" in printed
    assert json.loads((out / "config.json").read_text())["config"]["dim"] == 32
    assert cli.main(["bench", "pair", "--sharer", SHARER, "--receiver", RECEIVER, "--task", "reasoning", "--n", "1",
                     "--protocols", f"alone(max_new_tokens=2),translated(checkpoint='{out}', max_new_tokens=2)",
                     "--out", str(tmp_path / "bench")]) == 0
    printed = capsys.readouterr().out
    assert "| alone(max_new_tokens=2) | 1 | 0 |" in printed and "translated(checkpoint=" in printed
    assert cli.main(["bench", "report", str(tmp_path / "bench")]) == 2  # a pair run has its own table
    assert "bench pair" in capsys.readouterr().err

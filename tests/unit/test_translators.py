"""XKV and LCF-X on tiny models of the three families: zero-init identity, pair checks, checkpoints, training."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from latentwire.agent import Agent
from latentwire.bench.tasks.pairs import PAIR_TASKS, SPLITS, check_disjoint, pairs
from latentwire.errors import ConfigError, GeometryMismatchError, StateFormatError, UnknownNameError
from latentwire.translate import build, load
from latentwire.translate.compose import PairStates, compose
from latentwire.training.objective import answer_loss
from latentwire.training.states import StateCache
from latentwire.training.trainer import TrainConfig, batch_indices, train

PAIRS = [("gemma3", "llama"), ("llama", "gemma3"), ("qwen2", "gemma3"), ("llama", "qwen2"), ("llama", "llama")]
RESIDUAL = ("xkv", "lcfx")


@pytest.fixture
def states(agent_for):
    def get(arch, text):
        return agent_for(arch).prefill(text)
    return get


def _same(a, b) -> bool:
    return all(torch.equal(x.keys, y.keys) and torch.equal(x.values, y.values) and torch.equal(x.positions, y.positions)
               for x, y in zip(a.layers, b.layers, strict=True))


@pytest.mark.parametrize("method", RESIDUAL)
@pytest.mark.parametrize("sharer,receiver", PAIRS)
def test_untrained_translator_leaves_receiver_bit_identical(method, sharer, receiver, states, agent_for):
    S, R = states(sharer, "the sharer read this: Ned has 9 coins."), states(receiver, "receiver: Ben has 5 fewer coins.")
    t = build(method, S.geometry, R.geometry)
    out = t(S, R)
    assert _same(out, R) and torch.equal(out.token_ids, R.token_ids)
    agent = agent_for(receiver)
    assert agent.answer("How many coins?", message=out, max_new_tokens=6).token_ids == \
        agent.answer("How many coins?", message=R, max_new_tokens=6).token_ids


@pytest.mark.parametrize("method", RESIDUAL)
def test_trained_weights_change_the_receiver_state(method, states):
    S, R = states("gemma3", "sharer text"), states("llama", "receiver text")
    t = build(method, S.geometry, R.geometry)
    with torch.no_grad():
        for p in t.parameters():
            p.add_(0.05 * torch.randn_like(p))
    out = t(S, R)
    assert not _same(out, R)
    assert all(torch.equal(x.positions, y.positions) for x, y in zip(out.layers, R.layers))


@pytest.mark.parametrize("method", RESIDUAL)
def test_wrong_pair_is_refused_naming_both(method, states):
    S, R = states("gemma3", "a"), states("llama", "b")
    t = build(method, S.geometry, R.geometry)
    with pytest.raises(GeometryMismatchError, match="gemma3 -> receiver llama.*got sharer qwen2 -> receiver llama"):
        t(states("qwen2", "a"), R)
    with pytest.raises(GeometryMismatchError, match="receiver.num_layers|receiver.model"):
        t(S, states("gemma3", "b"))
    with pytest.raises(ValueError, match="receiver="):
        t(S)


def test_unknown_translator_lists_the_valid_ones(states):
    S = states("llama", "a")
    with pytest.raises(UnknownNameError, match="xkv"):
        build("nope", S.geometry, S.geometry)
    with pytest.raises(ValueError, match="divisible"):
        build("xkv", S.geometry, S.geometry, dim=10, heads=4)


@pytest.mark.parametrize("method", RESIDUAL)
def test_checkpoint_roundtrip_is_exact(method, states, tmp_path):
    S, R = states("qwen2", "sharer"), states("gemma3", "receiver")
    t = build(method, S.geometry, R.geometry, seed=3)
    with torch.no_grad():
        for p in t.parameters():
            p.add_(0.05 * torch.randn_like(p))
    t.save(tmp_path)
    u = load(tmp_path)
    assert type(u) is type(t) and u.config == t.config
    assert _same(u(S, R), t.eval()(S, R))
    (tmp_path / "config.json").write_text(json.dumps({"format": "latentwire.translator", "version": 99}))
    with pytest.raises(StateFormatError, match="version"):
        load(tmp_path)


def test_dense_keeps_the_receivers_own_cache_in_its_own_dtype(states):
    """A bfloat16 sharer must not round a float32 receiver's own rows: the translation is cast to the receiver's
    dtype, and the own rows come through unchanged (re-placed after the translated ones)."""
    S, R = states("gemma3", "sharer"), states("llama", "receiver")
    t = build("dense", S.geometry, R.geometry)
    out = compose(t, PairStates(sharer=S.to(dtype=torch.bfloat16), receiver=R))
    assert out.dtype == R.dtype == torch.float32
    tail = out.select(list(range(len(S), len(out))))  # the receiver's own rows, moved after the translation
    assert torch.equal(tail.layers[0].values, R.layers[0].values)


def test_answer_loss_has_gradients_through_the_state(states, agent_for):
    S, R = states("gemma3", "sharer"), states("llama", "receiver")
    t = build("xkv", S.geometry, R.geometry)
    loss = answer_loss(agent_for("llama"), compose(t, PairStates(sharer=S, receiver=R)), "Who?", "Eva")
    loss.backward()
    assert loss.item() > 0 and t.head.weight.grad.abs().sum() > 0  # the zero-init head gets a gradient


def test_pairs_are_split_evidence_and_disjoint():
    for task in PAIR_TASKS:
        groups = [pairs(task, s, 30) for s in SPLITS]
        check_disjoint(*groups)
        assert pairs(task, "train", 30) == groups[0]  # pure
        for p in groups[2]:
            assert p.sharer_doc != p.receiver_doc and p.target
    fact = pairs("facts", "test", 6)
    for p in fact:  # the answer is stated in exactly one of the two documents
        assert (p.target in p.sharer_doc) != (p.target in p.receiver_doc)
    with pytest.raises(ValueError, match="splits must not share"):
        check_disjoint(groups[0], groups[0][:1])


def test_batch_order_is_a_pure_function_of_seed_and_step():
    a = [batch_indices(10, 0, s, 4) for s in range(5)]
    assert a == [batch_indices(10, 0, s, 4) for s in range(5)]
    assert sorted(sum(a, [])[:10]) == list(range(10))  # one epoch visits every pair once
    assert a != [batch_indices(10, 1, s, 4) for s in range(5)]


def _tiny_run(tmp_path, agent_for, method, steps, folder="run", **kw):
    cfg = TrainConfig(method, "gemma3", "llama", tasks=("reasoning",), train_n=6, val_n=3, steps=steps, batch=2,
                      eval_every=4, lr=3e-3, **kw)
    out = train(cfg, tmp_path / folder, agent_for("gemma3"), agent_for("llama"), StateCache(tmp_path / "cache"),
                progress=False)
    return out, json.loads((out / "trainer.json").read_text())


@pytest.mark.parametrize("method", RESIDUAL)
def test_training_lowers_the_training_loss(method, tmp_path, agent_for):
    _, log = _tiny_run(tmp_path, agent_for, method, 24)
    first = sum(x[2] for x in log["train"][:4]) / 4
    last = sum(x[2] for x in log["train"][-4:]) / 4
    assert last < first - 0.1, (first, last)
    assert log["val"][-1][1] < log["val"][0][1], log["val"]  # and on the held-out pairs


def test_resume_reproduces_an_uninterrupted_run(tmp_path, agent_for):
    straight, _ = _tiny_run(tmp_path, agent_for, "xkv", 8, "straight")
    _tiny_run(tmp_path, agent_for, "xkv", 4, "resumed")
    # same folder, longer run: a new config would be refused, so resume through the finished log
    log = json.loads((tmp_path / "resumed" / "trainer.json").read_text())
    log["config"]["steps"] = 8
    (tmp_path / "resumed" / "trainer.json").write_text(json.dumps(log))
    resumed, log2 = _tiny_run(tmp_path, agent_for, "xkv", 8, "resumed")
    a, b = load(straight).state_dict(), load(resumed).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert log2["step"] == 8 and len(log2["train"]) == 8


def test_cosine_schedule_step_zero_validation_and_resumable(tmp_path, agent_for):
    from latentwire.training.trainer import lr_at, resumable

    cfg = TrainConfig("xkv", "a", "b", steps=10, lr=2e-3, lr_schedule="cosine")
    assert lr_at(cfg, 0) == 2e-3 and lr_at(cfg, 5) == pytest.approx(1e-3) and 0 < lr_at(cfg, 9) < 1e-4
    assert lr_at(dataclasses.replace(cfg, lr_schedule="constant"), 9) == 2e-3
    with pytest.raises(UnknownNameError):
        TrainConfig("xkv", "a", "b", lr_schedule="linear")
    out, log = _tiny_run(tmp_path, agent_for, "xkv", 4, lr_schedule="cosine")
    assert [s for s, _ in log["val"]] == [0, 4]  # the untrained translator first: the receiver alone
    run = TrainConfig("xkv", "gemma3", "llama", tasks=("reasoning",), train_n=6, val_n=3, steps=4, batch=2,
                      eval_every=4, lr=3e-3, lr_schedule="cosine")
    assert resumable(run, out) == 4 and resumable(run, tmp_path / "new") == 0
    with pytest.raises(ConfigError, match="another configuration"):
        resumable(dataclasses.replace(run, lr_schedule="constant"), out)


def test_train_config_is_validated():
    with pytest.raises(ConfigError, match="stage1_steps"):
        TrainConfig("xkv", "a", "b", stage1_steps=5)
    with pytest.raises(UnknownNameError):
        TrainConfig("nope", "a", "b")
    with pytest.raises(ConfigError, match="tasks"):
        TrainConfig("xkv", "a", "b", tasks=("code",))


def test_state_cache_reads_back_what_it_wrote_and_respects_its_limit(tmp_path, agent_for):
    agent = agent_for("gemma3")
    cache = StateCache(tmp_path / "a", limit_mb=64)
    first = cache.get(agent, "Read this.")
    again = cache.get(agent, "Read this.")
    assert (cache.hits, cache.misses) == (1, 1) and len(list((tmp_path / "a").glob("*.kv"))) == 1
    assert _same(first, again) and first.dtype == torch.float32  # bf16 on disk, the same values either way
    fresh = agent.prefill("Read this.")
    assert max(float((a.keys - b.keys).abs().max()) for a, b in zip(first.layers, fresh.layers)) < 0.05
    full = StateCache(tmp_path / "b", limit_mb=0)  # over its limit: computes, never writes
    full.get(agent, "Read this.")
    full.get(agent, "Read this.")
    assert full.misses == 2 and not list((tmp_path / "b").glob("*.kv"))
    with pytest.raises(GeometryMismatchError):  # a file under another model's key is never trusted
        llama = agent_for("llama")
        (tmp_path / "a" / next((tmp_path / "a").glob("*.kv")).name).rename(cache._path(llama, llama.chat_ids("x")))
        cache.get(llama, "x")


def _bf16_agent(arch: str, tokenizer) -> Agent:
    """A tiny model as from_pretrained(dtype=bfloat16) loads one: weights in bf16, RoPE frequencies in float32."""
    from latentwire.models import tiny_model

    model = tiny_model(arch)
    for w in model.parameters():
        w.data = w.data.to(torch.bfloat16)
    return Agent(model, tokenizer, model_name=arch)


@pytest.mark.parametrize("method", ["xkv", "lcfx", "dense", "c2c"])
def test_bf16_frozen_models_train_a_float32_translator(method, tmp_path, tokenizer):
    """The bundled models run in bf16 by default; the translator trains in float32 and its rows reach the bf16
    receiver cast to its dtype (the grid's first run crashed in SDPA on a float32 key for a bf16 query)."""
    bf16 = {a: _bf16_agent(a, tokenizer) for a in ("gemma3", "llama")}
    cfg = TrainConfig(method, "gemma3", "llama", tasks=("reasoning",), train_n=2, val_n=1, steps=2, batch=1,
                      eval_every=2, stage1_steps=1 if method == "dense" else 0)
    out = train(cfg, tmp_path / method, bf16["gemma3"], bf16["llama"], StateCache(tmp_path / "cache"), progress=False)
    log = json.loads((out / "trainer.json").read_text())
    assert log["step"] == 2 and all(torch.isfinite(torch.tensor(v)) for _, v in log["val"])
    trained = load(out)
    assert {p.dtype for p in trained.parameters()} == {torch.float32}
    untrained = build(method, bf16["gemma3"].geometry, bf16["llama"].geometry)
    assert any(not torch.equal(a, b) for a, b in zip(trained.state_dict().values(), untrained.state_dict().values()))


def test_a_float32_state_reaches_a_bf16_receiver_in_its_dtype(agent_for, tokenizer):
    fp32 = agent_for("gemma3").prefill("some shared context")
    receiver = _bf16_agent("gemma3", tokenizer)
    cache, start, *_ = receiver._receiver_input("Who?", fp32, 4)
    ref = fp32.to(dtype=torch.bfloat16)
    assert start == len(fp32)
    for i, layer in enumerate(ref.layers):
        assert cache.layers[i].keys.dtype == torch.bfloat16
        assert torch.equal(cache.layers[i].keys[0], layer.keys) and torch.equal(cache.layers[i].values[0], layer.values)
    assert receiver.answer("Who?", message=fp32, max_new_tokens=3).text == receiver.answer("Who?", message=ref,
                                                                                           max_new_tokens=3).text


def test_a_save_interrupted_between_weights_and_log_is_refused(tmp_path, agent_for):
    """_save writes the weights, the optimizer, then the log; weights newer than the log cannot resume exactly."""
    out, log = _tiny_run(tmp_path, agent_for, "xkv", 4)
    header = json.loads((out / "config.json").read_text())
    header["training"]["step"] = 8  # as if the next save had written the weights and died before the log
    (out / "config.json").write_text(json.dumps(header))
    log["config"]["steps"] = 8
    (out / "trainer.json").write_text(json.dumps(log))
    with pytest.raises(ConfigError, match="log stops at step 4 but config.json is from step 8"):
        _tiny_run(tmp_path, agent_for, "xkv", 8)


def test_a_save_that_died_after_the_weights_is_refused_though_config_and_log_agree(tmp_path, agent_for):
    """The weights are renamed into place before config.json: a kill between the two leaves step-8 weights beside a
    step-4 config, optimizer and log. The weights' own step stamp tells it apart."""
    import safetensors.torch

    out, log = _tiny_run(tmp_path, agent_for, "xkv", 4)
    weights = out / "translator.safetensors"
    tensors = safetensors.torch.load_file(weights)
    safetensors.torch.save_file(tensors, weights, metadata={"step": "8"})  # the next save's weights, nothing else
    log["config"]["steps"] = 8
    (out / "trainer.json").write_text(json.dumps(log))
    with pytest.raises(ConfigError, match="log stops at step 4 but translator.safetensors is from step 8"):
        _tiny_run(tmp_path, agent_for, "xkv", 8)


def test_the_no_sharer_control_replaces_every_sharer_document_and_nothing_else():
    from latentwire.bench.tasks.pairs import pairs
    from latentwire.training.trainer import control_pairs

    ps = pairs("facts", "train", 8, 0) + pairs("reasoning", "train", 6, 0)
    shuffled = control_pairs(ps, "shuffled", 0)
    assert shuffled == control_pairs(ps, "shuffled", 0) and shuffled != control_pairs(ps, "shuffled", 1)
    for a, b in zip(ps, shuffled):
        assert (b.id, b.task, b.receiver_doc, b.question, b.answers) == (a.id, a.task, a.receiver_doc, a.question,
                                                                          a.answers)
        assert b.sharer_doc != a.sharer_doc  # never its own document
    for task in ("facts", "reasoning"):  # a permutation of the task's own sharer documents
        assert sorted(p.sharer_doc for p in shuffled if p.task == task) == \
            sorted(p.sharer_doc for p in ps if p.task == task)
    assert all(p.sharer_doc == "" for p in control_pairs(ps, "blank", 0))
    assert control_pairs(ps, "own", 0) == ps
    with pytest.raises(UnknownNameError):
        TrainConfig("xkv", "a", "b", sharer_docs="none")


def test_a_control_run_trains_on_the_replaced_documents(tmp_path, agent_for, monkeypatch):
    from latentwire.training import trainer

    seen = []
    real = trainer.pair_states
    monkeypatch.setattr(trainer, "pair_states", lambda pair, *a, **kw: seen.append(pair) or real(pair, *a, **kw))
    _, log = _tiny_run(tmp_path, agent_for, "xkv", 2, sharer_docs="shuffled")
    cfg = TrainConfig("xkv", "gemma3", "llama", tasks=("reasoning",), train_n=6, val_n=3, steps=2, batch=2)
    own = {p.id: p.sharer_doc for p in trainer.data(dataclasses.replace(cfg, sharer_docs="own"))[0] +
           trainer.data(dataclasses.replace(cfg, sharer_docs="own"))[1]}
    assert seen and all(p.sharer_doc != own[p.id] for p in seen)  # training and validation pairs alike
    assert log["config"]["sharer_docs"] == "shuffled"


def test_state_cache_keys_by_the_templated_tokens_and_refuses_a_foreign_file(tmp_path, agent_for, monkeypatch):
    """A changed chat template gives other token ids, so another entry (not a stale hit); a file whose rows are not
    its key's tokens is refused."""
    from latentwire.errors import StateFormatError
    from latentwire.training.states import StateCache

    agent, cache = agent_for("llama"), StateCache(tmp_path / "cache")
    first = cache.get(agent, "Ada leads Orion.")
    again = cache.get(agent, "Ada leads Orion.")
    assert (cache.hits, cache.misses) == (1, 1) and torch.equal(again.layers[0].keys, first.layers[0].keys)
    plain = agent.chat_text
    monkeypatch.setattr(agent, "chat_text", lambda chat, *a: "Be brief. " + plain(chat, *a))  # a new template
    changed = cache.get(agent, "Ada leads Orion.")
    assert (cache.hits, cache.misses) == (1, 2) and len(changed) > len(first)
    monkeypatch.undo()
    other = cache.get(agent, "Bo leads Vega.")
    files = sorted((tmp_path / "cache").glob("*.kv"), key=lambda p: p.stat().st_mtime_ns)
    files[0].write_bytes(files[-1].read_bytes())  # "Ada"'s key now holds "Bo"'s state
    with pytest.raises(StateFormatError, match="other tokens than its key's prompt"):
        cache.get(agent, "Ada leads Orion.")
    assert len(other) > 0

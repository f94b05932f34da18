"""Device cleanliness: the library never creates a tensor without naming its device.

Every tensor the library makes follows the model, state or input it belongs to (`device=ref.device`).
To catch one that does not, the core path runs with torch's default device set to "meta" while the
models and states live on the CPU: a tensor created without `device=` lands on meta, and the first op
that mixes it with a real tensor fails (or a meta tensor comes back, which the device checks catch).

Models, tokenizers, agents, states and translators are built *before* the meta context (construction
may follow torch's default device, the nn.Module convention); agent verbs, selectors, protocols and
translator forwards run inside it. Gemma3 runs too: transformers' DynamicSlidingWindowLayer makes a
tensor when it is constructed, so the library builds caches under `torch.device(model device)`
(`Agent.new_cache`, `KVState.to_cache`), which also keeps that tensor off the host on a GPU.

A source check completes it: no `.cuda()` and no hard-coded "cpu" device string in src/latentwire
outside `placement.py`, the one module that picks defaults (`.cpu()` before serialising is fine).
"""
from __future__ import annotations

import ast
import contextlib
import io
import os
import tokenize
from pathlib import Path

import pytest
import torch

from latentwire import wire
from latentwire.agent import SLOT, Agent
from latentwire.errors import MissingExtraError, PressUnsupportedError
from latentwire.select.presses import kvpress_installed
from latentwire.merge import Fragment, FragmentSet
from latentwire.message import Rows
from latentwire.models import tiny_model, tiny_tokenizer
from latentwire.protocols import PROTOCOLS, get_protocol
from latentwire.protocols.pair import Translated, load_translator
from latentwire.protocols.cacheback import CacheBack, document_rows
from latentwire.select import SELECTORS, TextSelector, always_kept, fanin_budget, get_selector, select_rows
from latentwire.state import KVState
from latentwire.training.objective import answer_loss
from latentwire.translate import TRANSLATORS, build
from latentwire.translate.compose import PairStates, compose
from latentwire.translate.token_alignment import align
from latentwire.attention import attend

ARCHS = ("llama", "qwen2", "gemma3")
DOC = "The blue crate holds 58 bolts. The red crate is empty. " * 2
DOCS = ["The blue crate holds 58 bolts. " * 2, "The red crate holds 12 nails. " * 2]
QUESTION = "How many bolts?"
SRC = Path(__file__).resolve().parents[2] / "src" / "latentwire"
# Where the tiny models live: the CPU here; benchmarks/gpu_smoke.py reruns this file with "cuda".
DEVICE = torch.device(os.environ.get("LATENTWIRE_TEST_DEVICE") or "cpu")


@contextlib.contextmanager
def meta_default():
    """torch's default device is "meta" inside; always restored on the way out, failure or not."""
    torch.set_default_device("meta")
    try:
        yield
    finally:
        torch.set_default_device(None)


@pytest.fixture(autouse=True)
def _default_device_restored():
    """Belt and braces: no test here leaves a default device behind for the rest of the session."""
    yield
    torch.set_default_device(None)


def _on(device: torch.device, *tensors: torch.Tensor) -> None:
    for t in tensors:
        assert t.device == device, f"tensor on {t.device}, want {device}"


def _state_on(device: torch.device, state: KVState) -> None:
    _on(device, state.positions, state.token_ids, state.latents,
        *(t for layer in state.layers for t in (layer.keys, layer.values, layer.positions)))


@pytest.fixture(scope="module")
def tiny():
    """arch -> (model, tokenizer), built once for this module, outside any meta context."""
    tok = tiny_tokenizer()
    return {arch: (tiny_model(arch).to(DEVICE), tok) for arch in ARCHS}


def _agent(tiny, arch: str) -> Agent:
    model, tok = tiny[arch]
    return Agent(model, tok, model_name=arch)


@pytest.fixture(scope="module")
def finished(tiny):
    """arch -> (agent, prefill + 2 latent steps), built outside the meta context."""
    out = {}
    for arch in ARCHS:
        agent = _agent(tiny, arch)
        out[arch] = (agent, agent.think(agent.prefill(DOC), 2))
    return out


def test_the_meta_default_catches_a_tensor_made_without_a_device(finished):
    _, state = finished["llama"]
    with meta_default():
        assert torch.arange(3).device.type == "meta"
        with pytest.raises(RuntimeError):
            state.positions + torch.arange(len(state))  # what a forgotten `device=` turns into
    assert torch.arange(3).device == state.device  # restored


# -- agent verbs ------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_agent_verbs_name_their_devices(tiny, arch):
    agent = _agent(tiny, arch)
    dev = agent.device
    with meta_default():
        state = agent.prefill(DOC)
        _state_on(dev, state)
        thought = agent.think(state, 3)
        _state_on(dev, thought)
        assert int(thought.is_latent.sum()) == 3
        realigned = agent.think(state, 1, mode="realign")
        _state_on(dev, realigned)
        attn = attend(agent, thought, QUESTION)
        _on(dev, attn)
        picked = thought.select([0, 2, 3, len(thought) - 2, len(thought) - 1])
        _state_on(dev, picked)
        _state_on(dev, picked.compact())
        rows = agent.rows(picked)
        _on(dev, rows.embeds, rows.token_ids)
        hop = agent.prefill("Notes:\n" + SLOT + "\nThen more.", rows=rows)
        _state_on(dev, hop)
        # A selected state cannot continue as a cache on Gemma3's sliding layers (by design: StateFormatError).
        states = (thought,) if "sliding" in thought.geometry.layer_types else (picked, thought)
        for message in (None, "The blue crate holds 58 bolts.", rows, *states):
            reply = agent.answer(QUESTION, message=message, max_new_tokens=3)
            assert len(reply.token_ids) <= 3
        stream = agent.stream(QUESTION, max_new_tokens=3)
        stream.push(7)
        _on(dev, stream.logprobs, stream.prompt_nll)


# -- selectors --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(SELECTORS))
@pytest.mark.parametrize("arch", ARCHS)
def test_selectors_score_on_the_states_device(finished, arch, name):
    agent, state = finished[arch]
    sel = get_selector(name)
    if isinstance(sel, TextSelector):  # scores the document's text, through CacheBack's units: rows on the device
        with meta_default():
            proto = CacheBack(selector=name, ratio=4, latent_steps=0)
            doc_state = proto.read(agent, DOC)
            per_row, eligible = document_rows(agent, DOC, len(doc_state))
            rows = proto.choose(agent, doc_state, QUESTION, eligible, proto.span_groups(per_row, DOC), per_row, DOC)
            _on(doc_state.device, rows)
        return
    if sel.extra == "kvpress" and not kvpress_installed():  # the core install: refused before any compute
        with meta_default(), pytest.raises(MissingExtraError, match="kvpress"):
            sel.score(agent, state, QUESTION)
        return
    if name == "kvzip" and arch == "gemma3":  # kvpress refuses Gemma3 for KVzip: the typed refusal, on any device
        with meta_default(), pytest.raises(PressUnsupportedError, match="Gemma3"):
            sel.score(agent, state, QUESTION)
        return
    with meta_default():
        scores = sel.score(agent, state, QUESTION)
        _on(state.device, scores)
        assert scores.shape == (len(state),) and bool(torch.isfinite(scores).all())
        rows = select_rows(scores, fanin_budget(len(state), 4), always_kept(state))
        _on(state.device, rows)
        picked = state.select(rows)
        _state_on(state.device, picked)
        _on(state.device, agent.rows(picked).embeds)


# -- protocols --------------------------------------------------------------------------------------
PROTOCOL_CASES = {
    "alone": dict(max_new_tokens=2),
    "fullcontext": dict(max_new_tokens=2),
    "text": dict(max_report_tokens=4, max_new_tokens=2),
    "fullkv": dict(latent_steps=2, max_new_tokens=2),
    "cacheback": dict(ratio=4, latent_steps=2, max_new_tokens=2),
    "cacheback-token_ids-random": dict(ratio=4, latent_steps=1, max_new_tokens=2, encoding="token_ids",
                                       selector="random"),
    "cacheback_x": dict(ratio=4, latent_steps=2, max_new_tokens=2),  # spans+latent: test_cacheback_x.py
    "cacheback_chain": dict(ratio=4, latent_steps=1, max_new_tokens=2),
    "cacheback_chain-fixed": dict(ratio=4, latent_steps=1, max_new_tokens=2, budget="fixed", max_rows=24),
    "merge": dict(latent_steps=1, max_new_tokens=2),
    "latentmas_sequential": dict(latent_steps=1, max_new_tokens=2),
    "merge-bag": dict(latent_steps=1, max_new_tokens=2, render="bag", order=(1, 0)),
    "packllm": dict(max_new_tokens=3),
    "retrieval": dict(ratio=4, max_new_tokens=2),
    "retrieval-lexical-fixed": dict(ratio=4, max_new_tokens=2, selector="lexical", span_mode="fixed"),
    "packllm-question": dict(max_new_tokens=3, scope="question"),
}


def test_every_registered_protocol_is_covered():
    assert set(PROTOCOLS) <= {case.split("-")[0] for case in PROTOCOL_CASES}


@pytest.mark.parametrize("case", list(PROTOCOL_CASES))
@pytest.mark.parametrize("arch", ARCHS)
def test_protocols_run_under_a_meta_default_device(tiny, arch, case):
    proto = get_protocol(case.split("-")[0], **PROTOCOL_CASES[case])
    senders, receiver = [_agent(tiny, arch) for _ in DOCS], _agent(tiny, arch)
    with meta_default():
        out = proto.run(senders, DOCS, receiver, QUESTION)
    assert out.protocol == case.split("-")[0] and out.receiver_context > 0


# -- translators ------------------------------------------------------------------------------------
def _pair(tiny, arch: str):
    """(sharer agent, receiver agent): the receiver is `arch`, the sharer the other tiny architecture."""
    other = ARCHS[1 - ARCHS.index(arch)]
    return _agent(tiny, other), _agent(tiny, arch)


def _perturbed(translator):
    """Nonzero residual heads (an untrained translator's zero-initialised heads skip nothing, but this
    makes every path carry real values)."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in translator.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g, dtype=p.dtype, device=g.device).to(p.device))
    return translator


@pytest.mark.parametrize("method", sorted(TRANSLATORS))
@pytest.mark.parametrize("arch", ARCHS)
def test_translator_forwards_name_their_devices(tiny, arch, method):
    sharer, receiver = _pair(tiny, arch)
    translator = _perturbed(build(method, sharer.geometry, receiver.geometry, seed=0))
    S, R = sharer.prefill("The sharer read this: Ned has 9 coins."), receiver.prefill("Ben has 5 fewer coins.")
    both = "The sharer read this: Ned has 9 coins. Ben has 5 fewer coins."
    S_b, R_b = sharer.prefill(both), receiver.prefill(both)
    dev = receiver.device
    with meta_default():
        if method == "c2c":
            al = align(receiver, sharer, both)
            _on(dev, al.index, al.mask, al.exact)
            states = PairStates(sharer_both=S_b, receiver_both=R_b, align=al.index, mask=al.mask)
        else:
            states = PairStates(sharer=S, receiver=R)
        with torch.inference_mode():
            out = compose(translator, states)
        _state_on(dev, out)
        reply = receiver.answer(QUESTION, message=out, max_new_tokens=2)
        assert len(reply.token_ids) <= 2
        # the training step: answer loss through the translator, and its gradient
        loss = answer_loss(receiver, compose(translator, states), QUESTION, "9")
        _on(dev, loss)
        loss.backward()
        assert all(p.grad is None or p.grad.device == dev for p in translator.parameters())
        if method == "dense":
            target = receiver.prefill("The sharer read this: Ned has 9 coins.")
            rec = translator.reconstruction_loss(S, target, probes=4)
            _on(dev, rec)
            rec.backward()


@pytest.mark.parametrize("method", sorted(TRANSLATORS))
def test_translated_pair_protocol_loads_onto_the_receivers_device(tiny, method, tmp_path):
    sharer, receiver = _pair(tiny, "llama")
    folder = build(method, sharer.geometry, receiver.geometry, seed=0).save(tmp_path / method)
    proto = Translated(checkpoint=str(folder), max_new_tokens=2)
    with meta_default():
        translator = load_translator(folder, receiver.device)  # built on the receiver's device, meta or not
        assert all(p.device == receiver.device for p in translator.parameters())
        out = proto.run(sharer, receiver, "Ned has 9 coins.", "Ben has 5 fewer coins.", "How many coins has Ben?")
    assert out.details["method"] == method


# -- the wire ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_wire_decodes_onto_the_receivers_device(finished, arch):
    agent, state = finished[arch]
    rows = agent.rows(state.select([0, 1, 2, len(state) - 1]))
    frags = FragmentSet([Fragment.of(state)])
    with meta_default():
        for body, kw in ((rows, {}), (rows, {"encoding": "token_ids"}), (state, {}), ("some notes", {}), (frags, {})):
            geometry = None if isinstance(body, (KVState, FragmentSet)) else agent.geometry
            data = wire.encode(body, protocol="test", sender_geometry=geometry, **kw)
            msg = wire.decode(data, expect=agent.geometry, device=agent.device)
            got = msg.body
            if isinstance(got, Rows):
                _on(agent.device, got.embeds, got.token_ids)
            elif isinstance(got, wire.TokenRows):
                back = got.to_rows(agent.embed)
                _on(agent.device, back.embeds, back.token_ids)
            elif isinstance(got, KVState):
                _state_on(agent.device, got)
            elif isinstance(got, FragmentSet):
                for f in got:
                    _state_on(agent.device, f.state)
            assert msg.to_bytes() == data


# -- source check -----------------------------------------------------------------------------------
def _library_sources():
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel == "placement.py" or rel.startswith("bench/tasks/stdlib/"):  # placement picks defaults; task data
            continue
        yield rel, path.read_text(encoding="utf-8")


def _hard_coded_devices(text: str) -> list[tuple[int, str]]:
    """(line, what) for every `.cuda(` call and every "cpu" / "cpu:N" string literal."""
    found = []
    toks = [t for t in tokenize.generate_tokens(io.StringIO(text).readline)
            if t.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT)]
    for prev, tok, nxt in zip(toks, toks[1:], toks[2:]):
        if prev.string == "." and tok.type == tokenize.NAME and tok.string == "cuda" and nxt.string == "(":
            found.append((tok.start[0], ".cuda("))
    for tok in toks:
        if tok.type == tokenize.STRING:
            try:
                value = ast.literal_eval(tok.string)
            except (ValueError, SyntaxError):
                continue
            if isinstance(value, str) and value.strip().lower().split(":")[0] == "cpu":
                found.append((tok.start[0], tok.string))
    return found


def test_no_hard_coded_devices_outside_placement():
    bad = [f"src/latentwire/{rel}:{line}: {what}" for rel, text in _library_sources()
           for line, what in _hard_coded_devices(text)]
    assert not bad, "hard-coded devices (take the device from the model/state, or from placement.py):\n" + \
        "\n".join(bad)


def test_the_source_check_finds_what_it_should():
    src = 'x = t.cuda()\ny = t.to("cpu")\nz = torch.device(\'cpu:0\')\nw = t.cpu()  # "cpu" in a comment\n'
    assert _hard_coded_devices(src) == [(1, ".cuda("), (2, '"cpu"'), (3, "'cpu:0'")]

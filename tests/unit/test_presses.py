"""kvpress baselines as selectors: shapes, determinism, untouched state and model, and pins to kvpress itself."""
import math
from types import SimpleNamespace

import pytest
import torch
from transformers.cache_utils import DynamicCache

from latentwire.agent import Agent
from latentwire.models import tiny_model, tiny_tokenizer
from latentwire.select import SELECTORS, always_kept, fanin_budget, get_selector, select_rows
from latentwire.errors import ConfigError
from latentwire.select import presses
from latentwire.select.presses import PressUnsupportedError, _kv, chunk_row_scores, kvzip_scores, recording_press
from latentwire.models.compat import cache_arg

pytestmark = pytest.mark.kvpress  # kvpress's own scorers: needs the `kvpress` extra

PRESSES = ("snapkv", "h2o", "tova", "knorm", "chunkkv", "kvzip")
DOC = "The blue crate holds 58 bolts. The red crate is empty. " * 2


@pytest.fixture(scope="module", params=["llama", "gemma3", "qwen2"])
def finished(request):
    torch.set_num_threads(1)
    agent = Agent(tiny_model(request.param), tiny_tokenizer(), request.param)
    state = agent.think(agent.prefill(DOC), 2)
    return agent, state


def _model_clean(model, impl):
    return model.config._attn_implementation == impl and not any(
        hasattr(layer.self_attn, "rotary_emb") for layer in model.model.layers)


def test_all_presses_registered():
    assert set(PRESSES) <= set(SELECTORS)
    assert not any(SELECTORS[n].query_conditioned for n in PRESSES)


@pytest.mark.parametrize("name", PRESSES)
def test_scores_finite_deterministic_and_nothing_changes(finished, name):
    agent, state = finished
    sel, digest, impl = get_selector(name), state.digest(), agent.model.config._attn_implementation
    if name == "kvzip" and "sliding" in state.geometry.layer_types:
        with pytest.raises(PressUnsupportedError, match="KVzipPress is not supported for Gemma3") as e:
            sel.score(agent, state, "How many bolts?")
        assert "sliding-window layers" in str(e.value) and "snapkv" in str(e.value)
        return
    s = sel.score(agent, state, "How many bolts?")
    assert s.shape == (len(state),) and s.dtype == torch.float64 and torch.isfinite(s).all()
    assert torch.equal(s, sel.score(agent, state, "an unrelated question"))  # deterministic, receiver-agnostic
    assert state.digest() == digest  # the state is not touched
    assert _model_clean(agent.model, impl)  # attention implementation restored, kvpress's rotary_emb removed
    tok = ~state.is_latent
    assert torch.all(s[state.is_latent] == s[tok].max())  # latent rows: the token rows' max
    assert s[tok].std() > 0
    assert sel.last_seconds >= 0 and sel.last_press_seconds > 0
    assert (sel.last_seconds == 0) == (name == "kvzip")  # kvzip scores the state's own cache: no re-run
    rows = select_rows(s, fanin_budget(len(state), 4), always_kept(state))
    assert len(rows) <= math.ceil(len(state) / 4) + 1 + int(state.is_latent.sum())


def test_snapkv_is_not_random_and_not_constant(finished):
    agent, state = finished
    snap = get_selector("snapkv").score(agent, state, "q")
    rand = get_selector("random").score(agent, state, "q")
    tok = ~state.is_latent
    assert snap[tok].std() > 0 and len(torch.unique(snap[tok])) > len(state) // 4
    assert not torch.allclose(snap, rand)
    keep, B = always_kept(state), fanin_budget(len(state), 4)
    assert not torch.equal(select_rows(snap, B, keep), select_rows(rand, B, keep))


def test_knorm_scores_are_the_states_own_negative_key_norms(finished):
    """The recording prefill sees the state's keys: -‖k‖, mean over KV heads then global layers."""
    agent, state = finished
    tok = ~state.is_latent
    glob = [i for i, t in enumerate(state.geometry.layer_types) if t == "global"]
    ref = torch.stack([-state.layers[i].keys[:, tok].norm(dim=-1).double().mean(0) for i in glob]).mean(0)
    s = get_selector("knorm").score(agent, state, "q")
    assert torch.allclose(s[tok], ref, rtol=1e-6, atol=1e-6)


def test_short_states():
    torch.set_num_threads(1)
    agent = Agent(tiny_model("llama"), tiny_tokenizer(), "llama")
    short = agent.prefill("Hi")  # fewer rows than SnapKV's 64-token window: the window shrinks
    assert len(short) < 64 and torch.isfinite(get_selector("snapkv").score(agent, short, "q")).all()
    one = short.select([0])
    for name in PRESSES:
        assert torch.equal(get_selector(name).score(agent, one, "q"), torch.zeros(1, dtype=torch.float64))


def test_chunk_scores_rank_the_chunks_chunkkv_keeps():
    """chunk_row_scores forms ChunkKVPress's chunk scores: its top chunks are the rows ChunkKVPress keeps."""
    kv = _kv()
    gen = torch.Generator().manual_seed(0)
    keys, values = torch.randn(1, 2, 57, 8, generator=gen), torch.randn(1, 2, 57, 8, generator=gen)
    module = SimpleNamespace(head_dim=8)
    press = kv.ChunkKVPress(press=kv.KnormPress(compression_ratio=0.5), chunk_length=10)
    kept, _ = press.compress(module, None, keys, values, None, {})
    rows = chunk_row_scores(kv.KnormPress().score(module, None, keys, values, None, {}), 10)[0, 0]
    chunk_ids = torch.arange(57) // 10
    chunk_score = torch.stack([rows[chunk_ids == c][0] for c in range(6)])
    top = chunk_score.topk(max(1, int(6 * 0.5))).indices
    assert torch.equal(kept, keys[:, :, torch.isin(chunk_ids, top)])
    assert torch.equal(rows, rows[torch.arange(57) // 10 * 10])  # constant inside each chunk
    short = torch.randn(1, 2, 7, generator=gen)  # no complete chunk: ChunkKVPress prunes per token
    assert torch.equal(chunk_row_scores(short, 10), short)


def test_chunkkv_over_knorm_and_invalid_fields(finished):
    agent, state = finished
    s = get_selector("chunkkv", scorer="knorm", chunk_length=16).score(agent, state, "q")
    assert s.shape == (len(state),) and torch.isfinite(s).all()
    bad = [("snapkv", {"window_size": 0}), ("snapkv", {"kernel_size": 4}), ("chunkkv", {"scorer": "h2o"}),
           ("chunkkv", {"chunk_length": 0}), ("kvzip", {"chunk_size": 0}), ("kvzip", {"plus": "yes"})]
    for name, kw in bad:
        with pytest.raises(ConfigError):
            get_selector(name, **kw)
    with pytest.raises(ConfigError, match="window_size"):  # built directly too, not only by name
        presses.SnapKVSelector(window_size=0)


def test_the_uncharged_rerun_is_never_negative():
    """KVzip scores the finished cache (no re-run: last_seconds 0, its passes its cost): subtracting
    last_seconds - last_press_seconds charged its passes twice."""
    assert presses.rerun_seconds(SimpleNamespace(last_seconds=0.0, last_press_seconds=2.0)) == 0.0
    assert presses.rerun_seconds(SimpleNamespace(last_seconds=5.0, last_press_seconds=2.0)) == 3.0
    assert presses.rerun_seconds(object()) == 0.0


def test_sliding_layers_hold_only_their_window_during_the_hook():
    """Why scores are recorded on global layers only: kvpress hooks Gemma3ForCausalLM's sliding layers too."""
    torch.set_num_threads(1)
    agent = Agent(tiny_model("gemma3"), tiny_tokenizer(), "gemma3")
    ids = torch.tensor(agent.chat_ids(DOC))
    rec = recording_press(_kv().KnormPress())
    with rec(agent.model), torch.inference_mode():
        agent._forward(DynamicCache(config=agent.model.config), 0, ids=ids)
    window = agent.model.config.sliding_window
    for i, t in enumerate(agent.geometry.layer_types):
        assert rec.scores[i].shape[-1] == (len(ids) if t == "global" else window - 1)


def test_attention_path_and_restore_on_an_sdpa_model():
    """SnapKV computes its window attention itself under sdpa and reads it under eager: same scores.
    h2o switches to eager for its pass and back."""
    torch.set_num_threads(1)
    agent = Agent(tiny_model("qwen2"), tiny_tokenizer(), "qwen2")
    state = agent.prefill(DOC)
    eager = {n: get_selector(n).score(agent, state, "q") for n in ("snapkv", "h2o", "tova")}
    agent.model.set_attn_implementation("sdpa")
    for n, ref in eager.items():
        assert torch.allclose(get_selector(n).score(agent, state, "q"), ref, atol=1e-5)
        assert _model_clean(agent.model, "sdpa")


def test_kvzip_driver_matches_kvzip_press_itself(tmp_path):
    """Our driver (agent's tokenizer, the state's cache, ratio 0) gives KVzipPress.__call__'s own scores."""
    torch.set_num_threads(1)
    tok, model = tiny_tokenizer(), tiny_model("llama")
    agent = Agent(model, tok, "llama")
    state = agent.prefill(DOC)
    ours = kvzip_scores(agent, state, chunk_size=40)[0]
    tok.save_pretrained(tmp_path)  # KVzipPress loads the tokenizer from model.config.name_or_path
    model.config.name_or_path = str(tmp_path)
    press, seen = _kv().KVzipPress(compression_ratio=0.5, chunk_size=40), []
    press.compress_post = lambda m: seen.append(press.score_val[:, 0].clone())  # scores, before any pruning
    with press(model), torch.inference_mode():
        model.model(input_ids=state.token_ids[None], **cache_arg(model.model, DynamicCache(config=model.config)))
    assert torch.allclose(ours, seen[0].double().mean(dim=(0, 1)), atol=1e-6)

"""KVState <-> transformers DynamicCache, and the row operations select / concat."""
import copy
import warnings

import pytest
import torch
from transformers.cache_utils import DynamicCache

from latentwire.errors import GeometryMismatchError, StateFormatError
from latentwire.state import KVState
from latentwire.models.compat import cache_arg, output_cache


def layers_equal(a: KVState, b: KVState) -> bool:
    return len(a.layers) == len(b.layers) and all(
        torch.equal(x.keys, y.keys) and torch.equal(x.values, y.values) and torch.equal(x.positions, y.positions)
        for x, y in zip(a.layers, b.layers))


# -- to_cache / from_cache ----------------------------------------------------------------------
def test_cache_round_trip_is_lossless(prefill_state, arch, random_ids):
    state = prefill_state(arch, random_ids(20))
    back = KVState.from_cache(state.to_cache(), state.geometry, state.token_ids)
    assert layers_equal(state, back)
    assert torch.equal(back.positions, state.positions) and torch.equal(back.token_ids, state.token_ids)


def test_to_cache_matches_model_cache_shape(prefill_state, arch, random_ids):
    state = prefill_state(arch, random_ids(20))
    cache = state.to_cache()
    assert cache.get_seq_length() == 20
    for kind, layer in zip(state.geometry.layer_types, cache.layers):
        assert layer.is_sliding == (kind == "sliding")
        assert layer.keys.shape[2] == (7 if kind == "sliding" else 20)


@pytest.mark.parametrize("T", [5, 20])  # below / above gemma3's window of 8 (generation crosses it either way)
def test_greedy_generation_from_state_cache_is_identical(models, geometry_for, greedy, arch, random_ids, T):
    model, ids = models[arch], random_ids(T, seed=3)
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        logits = model(input_ids=ids, **cache_arg(model, cache), use_cache=True).logits
    state = KVState.from_cache(cache, geometry_for(arch), ids[0])
    ours = state.to_cache()
    ref_tokens, ref_logits = greedy(model, copy.deepcopy(cache), logits, 12)
    tokens, step_logits = greedy(model, ours, logits, 12)
    assert tokens == ref_tokens and torch.equal(step_logits, ref_logits)  # same tensors in: bit-identical out
    assert ours.get_seq_length() == T + 11  # the generation really ran through our cache


def test_to_cache_needs_compact_state(prefill_state, arch, random_ids):
    with pytest.raises(StateFormatError, match="compact"):
        prefill_state(arch, random_ids(12)).shift(3).to_cache()


def test_gemma3_to_cache_refuses_selection_missing_window_rows(prefill_state, random_ids):
    state = prefill_state("gemma3", random_ids(24))
    with pytest.raises(StateFormatError, match="sliding"):
        state.select([r for r in range(24) if r != 22]).compact().to_cache()


def test_gemma3_to_cache_accepts_selection_outside_window(prefill_state, random_ids):
    state = prefill_state("gemma3", random_ids(24))
    cache = state.select(range(1, 24)).compact().to_cache()  # row 0 is not in any sliding window any more
    assert cache.get_seq_length() == 23
    assert [layer.keys.shape[2] for layer in cache.layers] == [7] * 5 + [23]


def test_from_cache_refuses_batch_of_two(models, geometry_for, arch, random_ids):
    ids = torch.cat([random_ids(10, seed=1), random_ids(10, seed=2)])
    with torch.inference_mode():
        cache = output_cache(models[arch](ids, use_cache=True))
    with pytest.raises(StateFormatError, match="batch"):
        KVState.from_cache(cache, geometry_for(arch), ids[0])


def test_from_cache_refuses_wrong_token_count(models, geometry_for, arch, random_ids):
    ids = random_ids(10)
    with torch.inference_mode():
        cache = output_cache(models[arch](ids, use_cache=True))
    with pytest.raises(StateFormatError):
        KVState.from_cache(cache, geometry_for(arch), ids[0, :9])


def test_from_cache_refuses_other_geometry(models, geometry_for, random_ids):
    ids = random_ids(10)
    with torch.inference_mode():
        cache = output_cache(models["llama"](ids, use_cache=True))
    with pytest.raises(GeometryMismatchError):
        KVState.from_cache(cache, geometry_for("gemma3"), ids[0])


# -- select ---------------------------------------------------------------------------------------
def test_select_keeps_positions(prefill_state, arch, random_ids):
    state = prefill_state(arch, random_ids(24))
    sel = state.select([23, 2, 5, 2, 20])  # any order, duplicates ignored
    assert torch.equal(sel.positions, torch.tensor([2, 5, 20, 23]))
    assert torch.equal(sel.token_ids, state.token_ids[[2, 5, 20, 23]])
    assert not sel.is_compact and sel.last_hidden is None
    for kind, old, new in zip(state.geometry.layer_types, state.layers, sel.layers):
        want = torch.tensor([2, 5, 20, 23] if kind == "global" else [20, 23])  # sliding layers: rows 17..23 held
        assert torch.equal(new.positions, want)
        rows = torch.searchsorted(old.positions, want)
        assert torch.equal(new.keys, old.keys[:, rows]) and torch.equal(new.values, old.values[:, rows])


def test_select_out_of_range(prefill_state, random_ids):
    state = prefill_state("llama", random_ids(5))
    for bad in ([5], [-1]):
        with pytest.raises(IndexError):
            state.select(bad)


def test_select_keeps_latents_aligned(agent_for):
    agent = agent_for("llama")
    state = agent.think(agent.prefill("hello there"), steps=3)
    T = len(state)
    assert torch.equal(state.token_ids[-3:], torch.full((3,), -1))
    sel = state.select([T - 1, 1, T - 3, 3])
    assert torch.equal(sel.positions, torch.tensor([1, 3, T - 3, T - 1]))
    assert torch.equal(sel.token_ids, state.token_ids[[1, 3, T - 3, T - 1]])
    assert torch.equal(sel.latents, state.latents[[0, 2]])
    only_middle = state.select([T - 2])
    assert torch.equal(only_middle.latents, state.latents[[1]])


# -- concat ---------------------------------------------------------------------------------------
def test_concat_places_states_back_to_back(prefill_state, kv_diff, arch, random_ids):
    a, b = prefill_state(arch, random_ids(10, seed=1)), prefill_state(arch, random_ids(7, seed=2))
    c = KVState.concat([a, b])
    assert len(c) == 17 and torch.equal(c.positions, torch.arange(17)) and c.is_compact
    assert torch.equal(c.token_ids, torch.cat([a.token_ids, b.token_ids]))
    moved = b.shift(10)
    for i, (cl, al, bl) in enumerate(zip(c.layers, a.layers, moved.layers)):
        n = al.positions.shape[0]
        assert torch.equal(cl.positions, torch.cat([al.positions, bl.positions])), i
        assert torch.equal(cl.keys[:, :n], al.keys)
        assert (cl.keys[:, n:] - bl.keys).abs().max() <= 1e-5
        assert torch.equal(cl.values[:, n:], bl.values)


def test_concat_keeps_internal_spacing(prefill_state, random_ids):
    a = prefill_state("llama", random_ids(6)).select([0, 2, 5])
    b = prefill_state("llama", random_ids(4)).shift(9)
    c = KVState.concat([a, b])
    assert c.positions.tolist() == [0, 2, 5, 6, 7, 8, 9]


def test_concat_refuses_other_arch(prefill_state, random_ids):
    with pytest.raises(GeometryMismatchError):
        KVState.concat([prefill_state("llama", random_ids(5)), prefill_state("qwen2", random_ids(5))])


def test_concat_refuses_other_model_name(models, geometry_for, random_ids):
    ids = random_ids(6)
    with torch.inference_mode():
        cache = output_cache(models["llama"](ids, use_cache=True))
    a = KVState.from_cache(cache, geometry_for("llama"), ids[0])
    b = KVState.from_cache(cache, geometry_for("llama", name="llama-finetune"), ids[0])
    with pytest.raises(GeometryMismatchError, match="model"):
        KVState.concat([a, b])


def test_gemma3_split_then_concat_continues_like_joint_prefill(models, geometry_for, greedy, random_ids):
    """Cut one prefill in two, move the tail to 0, concat again: the cache (incl. sliding rows that come
    from the first part's window) must continue exactly like the model's own prefill."""
    model, ids = models["gemma3"], random_ids(29, seed=5)
    with torch.inference_mode():
        joint = DynamicCache(config=model.config)
        logits = model(input_ids=ids, **cache_arg(model, joint), use_cache=True).logits
    whole = KVState.from_cache(joint, geometry_for("gemma3"), ids[0])
    head, tail = whole.select(range(24)), whole.select(range(24, 29)).compact()
    assert len(tail) < 8  # shorter than the window: its cache needs two rows of the head's window
    joined = KVState.concat([head, tail])
    tokens, step_logits = greedy(model, joined.to_cache(), logits, 8)
    ref_tokens, ref_logits = greedy(model, copy.deepcopy(joint), logits, 8)
    assert tokens == ref_tokens
    assert (step_logits - ref_logits).abs().max() <= 1e-4  # the tail's keys went through two re-rotations


def test_gemma3_concat_of_independent_states_to_cache(models, prefill_state, geometry_for, random_ids):
    """Independent prefills: to_cache takes the sliding rows it needs from both states. Layer 0 sees no
    context, so its KV must equal the joint prefill's; deeper layers legitimately differ."""
    a_ids, b_ids = random_ids(24, seed=1), random_ids(5, seed=2)
    cache = KVState.concat([prefill_state("gemma3", a_ids), prefill_state("gemma3", b_ids)]).to_cache()
    joint_ids = torch.cat([a_ids, b_ids], dim=1)
    joint = prefill_state("gemma3", joint_ids)
    assert cache.get_seq_length() == 29
    assert [layer.keys.shape[2] for layer in cache.layers] == [7] * 5 + [29]
    assert (cache.layers[0].keys[0] - joint.layers[0].keys).abs().max() <= 1e-5
    assert (cache.layers[0].values[0] - joint.layers[0].values).abs().max() <= 1e-6
    back = KVState.from_cache(cache, joint.geometry, joint_ids[0])
    assert torch.equal(back.layers[0].positions, torch.arange(22, 29))


def test_the_cache_goes_in_under_the_name_this_transformers_takes(models, random_ids):
    """transformers 5.25 renamed forward's `past_key_values` to `cache` (the old name warns until 5.40): the
    library passes and reads the cache under whichever name the installed release uses, without a warning."""
    for model in (models["llama"], models["gemma3"].model):
        ids = random_ids(6)
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)
            out = model(input_ids=ids, **cache_arg(model, DynamicCache(config=model.config)), use_cache=True)
        assert output_cache(out).get_seq_length() == 6

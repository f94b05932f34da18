"""The key property: a state prefilled at 0 and moved to p equals the state prefilled at p (and back)."""
import pytest
import torch

T = 24  # longer than gemma3's sliding window (8): sliding layers keep the last 7 rows
TOL = 1e-4


@pytest.fixture
def ids(random_ids):
    return random_ids(T, seed=11)


@pytest.mark.parametrize("p", [5, 300])
def test_shift_equals_prefill_at_offset(prefill_state, kv_diff, model_key, ids, p):
    at0, atp = prefill_state(model_key, ids), prefill_state(model_key, ids, start=p)
    assert torch.equal(atp.positions, torch.arange(p, p + T))
    # positions really change the keys: the comparison below is not vacuous
    assert all((a.keys - b.keys).abs().max() > 1e-3 for a, b in zip(at0.layers, atp.layers))
    moved = at0.shift(p)
    assert torch.equal(moved.positions, atp.positions)
    assert kv_diff(moved, atp) <= TOL
    assert kv_diff(moved, atp, "values") <= TOL
    assert torch.equal(moved.token_ids, at0.token_ids)


@pytest.mark.parametrize("p", [5, 300])
def test_compact_undoes_offset(prefill_state, kv_diff, model_key, ids, p):
    at0, atp = prefill_state(model_key, ids), prefill_state(model_key, ids, start=p)
    assert not atp.is_compact
    back = atp.compact()
    assert back.is_compact and torch.equal(back.positions, at0.positions)
    assert kv_diff(back, at0) <= TOL
    assert kv_diff(back, at0, "values") <= TOL


@pytest.mark.parametrize("p", [0, 5, 300])
def test_gemma3_layer_rows(prefill_state, ids, p):
    state = prefill_state("gemma3", ids, start=p)
    kinds = state.geometry.layer_types
    assert "sliding" in kinds and "global" in kinds
    for kind, layer in zip(kinds, state.layers):
        want = torch.arange(p + T - 7, p + T) if kind == "sliding" else torch.arange(p, p + T)
        assert torch.equal(layer.positions, want)
        assert layer.keys.shape[1] == layer.values.shape[1] == len(want)


def test_gemma3_sliding_and_global_both_checked(prefill_state, kv_diff, ids):
    """Per layer kind (sliding uses base 1e4, global 1e6): each one is moved exactly."""
    at0, atp = prefill_state("gemma3", ids), prefill_state("gemma3", ids, start=300)
    moved = at0.shift(300)
    for kind in ("sliding", "global"):
        for i, k in enumerate(at0.geometry.layer_types):
            if k == kind:
                assert (moved.layers[i].keys - atp.layers[i].keys).abs().max() <= TOL, (kind, i)


def test_uneven_rerotate_round_trip(prefill_state, kv_diff, model_key, ids):
    """Spreading rows over gapped positions and compacting again is exact."""
    state = prefill_state(model_key, ids)
    gapped = state.rerotate(torch.arange(T) * 7 + 3)
    assert gapped.last_hidden is None and not gapped.is_compact
    assert kv_diff(gapped.compact(), state) <= 1e-5

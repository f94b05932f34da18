"""What is exact in which dtype (docs/precision.md states the same table).

Re-rotation computes in float64 from the stored keys and casts once, so in any dtype a moved key is
the exact rotation of the stored key rounded once: within half a unit in the last place of the state's
dtype (unit roundoff: fp32 2⁻²⁴ relative, bf16 2⁻⁸ relative). Bytes, digests and CanonicalMerge renders are
bit-exact in every dtype: they involve no arithmetic beyond that one rotation.
"""
import itertools

import pytest
import torch

from latentwire.agent import Agent
from latentwire.merge import CanonicalMerge, Fragment
from latentwire.rope import half_split, rotate_keys
from latentwire.state import KVState

# Half an ulp, relative: what one round-to-nearest cast can change a value by.
ONE_CAST = {torch.float32: 2.0 ** -24, torch.bfloat16: 2.0 ** -8}  # unit roundoff 2^-p, p = 24 / 8 bits
T = 24


@pytest.fixture(params=[torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def dtype(request):
    return request.param


def _state(prefill_state, model_key, random_ids, dtype, start=0) -> KVState:
    return prefill_state(model_key, random_ids(T, seed=3), start=start).to(dtype=dtype)


@pytest.mark.parametrize("p", [7, 300])
def test_rerotation_is_one_cast_from_exact(prefill_state, random_ids, model_key, dtype, p):
    state = _state(prefill_state, model_key, random_ids, dtype)
    moved = state.shift(p)
    assert moved.dtype == dtype
    for i, (a, b) in enumerate(zip(state.layers, moved.layers)):
        delta = b.positions - a.positions
        exact = rotate_keys(a.keys.double(), delta, state.geometry.layer(i).rope)  # float64 throughout
        err = (b.keys.double() - exact).abs()
        assert bool((err <= ONE_CAST[dtype] * exact.abs() + 1e-30).all()), (i, float(err.max()))
        assert torch.equal(b.values, a.values)  # values do not depend on position


def test_round_trip_is_within_two_casts_of_each_pair(prefill_state, random_ids, model_key, dtype):
    state = _state(prefill_state, model_key, random_ids, dtype)
    back = state.shift(300).shift(-300)
    for i, (a, b) in enumerate(zip(state.layers, back.layers)):
        # The first cast's error is rotated back across each channel pair: bound it by the pair's norm
        # (rotations preserve it), one cast per trip.
        spec = state.geometry.layer(i).rope
        half = spec.rotary_dim // 2
        # in the layout where pair j is (j, j + R/2): interleaved rotations (Cohere, GLM) are reordered first
        layout = (lambda x: half_split(x, spec.rotary_dim)) if spec.interleaved else (lambda x: x)
        k = layout(a.keys.double())
        pair = torch.cat([k[..., :half].hypot(k[..., half:2 * half])] * 2 + [k[..., 2 * half:].abs()], dim=-1)
        err = (layout(b.keys.double()) - k).abs()
        assert bool((err <= 2 * ONE_CAST[dtype] * pair * 1.01 + 1e-30).all()), (i, float(err.max()))


def test_bytes_and_digest_are_exact_in_every_dtype(prefill_state, random_ids, model_key, dtype):
    state = _state(prefill_state, model_key, random_ids, dtype)
    again = KVState.from_bytes(state.to_bytes())
    assert again.dtype == dtype and again.digest() == state.digest()
    assert all(torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
               for a, b in zip(state.layers, again.layers))


def test_canonical_merge_is_byte_identical_in_every_dtype(models, tokenizer, arch, dtype):
    agent = Agent(models[arch], tokenizer, model_name=arch)
    texts = ("The red key is in the blue box.", "Alice left at noon.", "Seven is prime.")
    frags = [Fragment.of(agent.think(agent.prefill(t), steps=2).to(dtype=dtype)) for t in texts]
    digests = {CanonicalMerge().render([frags[i] for i in p]).digest() for p in itertools.permutations(range(3))}
    assert len(digests) == 1
    assert CanonicalMerge().render(frags).dtype == dtype

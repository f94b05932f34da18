"""rope.py: exact re-rotation of cached keys, RoPE specs read from models, refusal of dynamic RoPE."""
import pytest
import torch

from latentwire.errors import UnsupportedRopeError
from latentwire.models import tiny_model
from latentwire.rope import RopeSpec, rope_specs_from_model, rotate_keys
from latentwire.state import Geometry

H, T = 2, 9


def specs(model):
    return list(rope_specs_from_model(model).values())


def rand_keys(spec, seed=0, head_dim=None):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(H, T, head_dim or spec.rotary_dim, generator=g)


def rand_delta(seed, lo=-400, hi=400):
    return torch.randint(lo, hi, (T,), generator=torch.Generator().manual_seed(seed))


def test_rotate_then_unrotate_is_identity(model_for, model_key):
    for spec in specs(model_for(model_key)):
        k, d = rand_keys(spec), rand_delta(1)
        back = rotate_keys(rotate_keys(k, d, spec), -d, spec)
        assert (back - k).abs().max() <= 1e-5
        assert (rotate_keys(k, d, spec) - k).abs().max() > 1e-2  # the rotation did something


def test_rotations_compose(model_for, model_key):
    for spec in specs(model_for(model_key)):
        k, a, b = rand_keys(spec), rand_delta(2), rand_delta(3)
        two_steps = rotate_keys(rotate_keys(k, a, spec), b, spec)
        assert (two_steps - rotate_keys(k, a + b, spec)).abs().max() <= 1e-5


def test_zero_delta_is_identity(model_for, model_key):
    for spec in specs(model_for(model_key)):
        k = rand_keys(spec)
        out = rotate_keys(k, torch.zeros(T, dtype=torch.int64), spec)
        assert torch.equal(out, k) and out is not k


def test_partial_rotary_passes_rest_through():
    spec = RopeSpec("default", tuple(1.0 / 10000 ** (i / 4) for i in range(4)))  # rotary dim 8
    k = rand_keys(spec, head_dim=16)
    out = rotate_keys(k, rand_delta(4), spec)
    assert torch.equal(out[..., 8:], k[..., 8:])
    assert (out[..., :8] - k[..., :8]).abs().max() > 1e-2


def test_rotary_dim_larger_than_head_dim_refused():
    spec = RopeSpec("default", (1.0,) * 8)
    with pytest.raises(UnsupportedRopeError):
        rotate_keys(torch.zeros(1, T, 8), rand_delta(5), spec)


def test_delta_count_must_match_rows():
    with pytest.raises(ValueError):
        rotate_keys(torch.zeros(1, T, 4), torch.ones(T + 1, dtype=torch.int64), RopeSpec("default", (1.0, 0.1)))


@pytest.mark.parametrize("rope_type", ["dynamic", "longrope"])
def test_spec_refuses_non_static_rope(rope_type):
    with pytest.raises(UnsupportedRopeError, match=rope_type):
        RopeSpec(rope_type, (1.0, 0.1))


def test_spec_json_round_trip():
    spec = RopeSpec("yarn", (1.0, 0.25), 1.25)
    assert RopeSpec.from_json(spec.to_json()) == spec


def test_gemma3_has_two_rope_bases(models):
    s = rope_specs_from_model(models["gemma3"])
    assert set(s) == {"sliding_attention", "full_attention"}
    head_dim = 32
    for layer_type, base in (("sliding_attention", 10_000.0), ("full_attention", 1_000_000.0)):
        want = 1.0 / base ** (2 / head_dim)
        assert s[layer_type].inv_freq[1] == pytest.approx(want, rel=1e-6)
        assert s[layer_type].rotary_dim == head_dim


def test_rope_variant_spec(model_for, rope_variant):
    variant = rope_variant
    model = model_for(f"llama-{variant}")
    (spec,) = specs(model)
    assert spec.rope_type == variant
    assert spec.attention_scaling == pytest.approx(float(model.model.rotary_emb.attention_scaling))
    default = specs(model_for("llama"))[0]
    assert spec.inv_freq != default.inv_freq  # the scaling changed the frequencies
    if variant == "yarn":
        assert spec.attention_scaling != 1.0


def test_rotation_matches_models_own_rope(model_for, model_key):
    """Key roped by the model at p, moved by Δ == key roped by the model at p+Δ (no double scaling), with the
    rotation function of the model's own modeling file (pairs (i, i + R/2), or interleaved for Cohere, GLM)."""
    import sys

    model = model_for(model_key)
    rotary = model.model.rotary_emb
    apply_rotary_pos_emb = sys.modules[type(model.model.layers[0].self_attn).__module__].apply_rotary_pos_emb
    for layer_type, spec in rope_specs_from_model(model).items():
        kw = {"layer_type": layer_type} if isinstance(rotary.rope_type, dict) else {}
        raw = rand_keys(spec)[None]  # (1, H, T, D)
        p = torch.arange(T)[None] * 3
        d = rand_delta(6, 0, 60)

        def roped(pos):
            cos, sin = rotary(raw, pos, **kw)
            return apply_rotary_pos_emb(raw, raw, cos, sin)[1][0]

        moved = rotate_keys(roped(p), d, spec)
        assert (moved - roped(p + d[None])).abs().max() <= 1e-4


def test_dynamic_rope_model_is_refused():
    model = tiny_model("llama", rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0})
    with pytest.raises(UnsupportedRopeError, match="dynamic"):
        Geometry.from_model(model, "llama", "tok")


# -- check_rotation: a rotation latentwire cannot reproduce is refused, never cached wrongly -----------
def _modeling(model):
    import sys

    return sys.modules[type(model.model.layers[0].self_attn).__module__]


def test_a_rotation_neither_pair_layout_reproduces_is_refused(monkeypatch):
    model = tiny_model("llama")
    original = _modeling(model).apply_rotary_pos_emb

    def other(q, k, cos, sin, *a, **kw):  # rotates by the negated angle: not a RoPE rotate_keys can move
        return original(q, k, cos, -sin, *a, **kw)

    monkeypatch.setattr(_modeling(model), "apply_rotary_pos_emb", other)
    with pytest.raises(UnsupportedRopeError, match="does not reproduce the model's own rotation.*max errors"):
        rope_specs_from_model(model)
    monkeypatch.setattr(_modeling(model), "apply_rotary_pos_emb", original)
    assert specs(model)  # the real rotation passes


def test_a_modeling_file_without_apply_rotary_pos_emb_is_refused(monkeypatch):
    model = tiny_model("qwen2")
    monkeypatch.delattr(_modeling(model), "apply_rotary_pos_emb")
    with pytest.raises(UnsupportedRopeError, match="has no apply_rotary_pos_emb"):
        Geometry.from_model(model, "qwen2", "tok")


def test_a_rotation_that_fails_on_probe_keys_is_refused(monkeypatch):
    model = tiny_model("llama")

    def broken(q, k, cos, sin, *a, **kw):
        raise RuntimeError("shape mismatch in a custom kernel")

    monkeypatch.setattr(_modeling(model), "apply_rotary_pos_emb", broken)
    with pytest.raises(UnsupportedRopeError, match="could not be applied to probe keys.*custom kernel"):
        rope_specs_from_model(model)

"""Ablation switches: CacheBack's two exponents and where C_t is summed, on hand-made attention and tiny
models; the XKV vs LCF-X timing; the ablation and timing benchmarks run end to end on tiny models."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from latentwire.errors import ConfigError
from latentwire.protocols import get_protocol
from latentwire.select import get_selector
from latentwire.select.cacheback import cacheback_scores, grouped_attention_by_layer, pool
from latentwire.translate import build
from latentwire.translate.compose import PairStates
from latentwire.translate.timing import compare, time_forwards
from latentwire.attention import attend_grouped

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
DOC = "Ada led the Orion project in Lisbon. " * 4 + "Bo led Vega in Oslo. The budget was 40k."
QUERY = "Which project did Ada lead, and where?"


def _reference_scores(b: torch.Tensor, p: float, pooling: str, window: int) -> torch.Tensor:
    """CacheBack's scores as computed before the exponents were split (one parameter p, squares inside)."""
    def pool_(x):
        if pooling == "none" or window == 1:
            return x
        flat = x.reshape(-1, 1, x.shape[-1])
        fn = F.avg_pool1d if pooling == "avg" else F.max_pool1d
        kw = {"count_include_pad": False} if pooling == "avg" else {}
        return fn(flat, window, stride=1, padding=window // 2, **kw).reshape(x.shape)

    mean_r = b.mean(dim=1)
    q = pool_(mean_r.mean(dim=0))
    if p == 0:
        return q
    num = pool_(b).pow(2).mean(dim=1).sum(dim=0)
    den = pool_(mean_r).pow(2).sum(dim=0).clamp_min(1e-30)
    return q * (num / den).pow(p)


# -- CacheBack: two exponents -------------------------------------------------------------------------
@pytest.mark.parametrize("pooling", ["avg", "max", "none"])
@pytest.mark.parametrize("p", [0, 1, 2.0, 3.5])
def test_default_inner_power_is_bit_identical_to_the_reference(pooling, p):
    b = torch.rand(3, 6, 40, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    assert torch.equal(cacheback_scores(b, p, pooling, 7), _reference_scores(b, p, pooling, 7))
    assert torch.equal(cacheback_scores(b, p, pooling, 7, inner_power=2.0), _reference_scores(b, p, pooling, 7))


def test_default_selector_is_bit_identical_on_a_tiny_model(arch, agent_for):
    agent = agent_for(arch)
    state = agent.think(agent.prefill(DOC), steps=2)
    got = get_selector("cacheback").score(agent, state, QUERY)
    want = _reference_scores(attend_grouped(agent, state, QUERY).double(), 2.0, "avg", 7)
    assert torch.equal(got, want)
    sel = get_selector("cacheback")
    assert (sel.p, sel.inner_power, sel.correction_over) == (2.0, 2.0, "kv_head")


def test_inner_and_outer_exponents_are_separate():
    b = torch.rand(2, 5, 11, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    mean_r = b.mean(1)
    q = mean_r.mean(0)
    for inner, outer in [(3.0, 2.0), (2.0, 1.0), (1.5, 4.0)]:
        c = b.pow(inner).mean(1).sum(0) / mean_r.pow(inner).sum(0)  # closed form without pooling
        got = cacheback_scores(b, outer, "none", 1, inner_power=inner)
        assert torch.allclose(got, q * c.pow(outer), rtol=1e-12, atol=0)
    # inner power 1 with avg pooling (linear): C_t = 1, the ranking of mean query attention
    assert torch.allclose(cacheback_scores(b, 2, "avg", 7, inner_power=1), pool(q, "avg", 7), rtol=1e-12, atol=0)
    assert not torch.allclose(cacheback_scores(b, 2, "avg", 7, inner_power=3), cacheback_scores(b, 2, "avg", 7))


@pytest.mark.parametrize("bad", [{"p": -1}, {"p": float("inf")}, {"p": True}, {"inner_power": 0},
                                 {"inner_power": -2.0}, {"inner_power": float("nan")}, {"correction_over": "layer"},
                                 {"min_depth": 1.0}, {"min_depth": -0.5}, {"min_depth": "0.5"}, {"max_depth": 0},
                                 {"max_depth": 1.5}, {"max_depth": True}, {"min_depth": 0.5, "max_depth": 0.4}])
def test_bad_exponents_and_groups_are_refused(bad):
    with pytest.raises(ConfigError):
        get_selector("cacheback", **bad)
    with pytest.raises(ConfigError):
        get_protocol("cacheback", selector_params=bad)


# -- CacheBack: where C_t is summed -------------------------------------------------------------------
def test_correction_over_layers_differs_as_defined():
    """Two layers, one KV head, two query tokens. Row 0: layer 0 gives it all of token 0's attention and none of
    token 1's, layer 1 the reverse; so the layer average is flat (0.5, 0.5) but each layer is concentrated.

    Over KV heads after averaging layers, C_0 = mean_r 0.5² / 0.5² = 1. Over (layer, KV head) pairs,
    C_0 = Σ_l mean_r b_l² / Σ_l (mean_r b_l)² = (0.5 + 0.5) / (0.25 + 0.25) = 2. Row 2 is attended evenly
    everywhere: C_2 = 1 both ways. Q_t is the same in both."""
    per_layer = torch.tensor([[[[1.0, 0.0, 0.0], [0.0, 0.5, 0.5]]],    # layer 0: (S = 1, m = 2, T = 3)
                              [[[0.0, 0.5, 0.5], [1.0, 0.0, 0.0]]]],   # layer 1
                             dtype=torch.float64)
    per_layer[..., 2] = 0.25
    b = per_layer.mean(0)  # (S, m, T): the layer average
    q = b.mean(1).mean(0)
    averaged = cacheback_scores(b, 1, "none", 1)
    pairs = cacheback_scores(b, 1, "none", 1, groups=per_layer.flatten(0, 1))
    assert torch.allclose(averaged / q, torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64))
    c = pairs / q
    assert c[0] == pytest.approx(2.0) and c[2] == pytest.approx(1.0) and c[1] > 1
    assert torch.equal(cacheback_scores(b, 0, "none", 1), cacheback_scores(b, 0, "none", 1, groups=per_layer[0]))


def test_correction_over_layers_on_a_tiny_model(agent_for):
    agent = agent_for("llama")  # three global layers, two KV heads
    state = agent.think(agent.prefill(DOC), steps=2)
    b, per_layer = grouped_attention_by_layer(agent, state, QUERY)
    assert torch.equal(b, attend_grouped(agent, state, QUERY))  # the same average, bit for bit
    assert per_layer.shape == (3, 2, b.shape[1], len(state))
    assert torch.allclose(per_layer.mean(0), b, atol=1e-6, rtol=0)
    default = get_selector("cacheback").score(agent, state, QUERY)
    layered = get_selector("cacheback", correction_over="layer_kv_head").score(agent, state, QUERY)
    want = cacheback_scores(b.double(), 2.0, "avg", 7, groups=per_layer.double().flatten(0, 1))
    assert torch.equal(layered, want) and not torch.equal(layered, default)
    assert torch.equal(get_selector("cacheback", p=0, correction_over="layer_kv_head").score(agent, state, QUERY),
                       get_selector("mean_query").score(agent, state, QUERY))  # Q_t is unchanged


def test_min_depth_scores_on_the_deeper_layers_under_both_groupings(agent_for):
    """min_depth = 0.5 on the three-layer tiny Llama keeps layer 2 only (2/3 ≥ 0.5, 1/3 < 0.5): its scores are
    CacheBack's formula on that layer's attention, under either grouping."""
    agent = agent_for("llama")
    state = agent.think(agent.prefill(DOC), steps=2)
    deep = attend_grouped(agent, state, QUERY, 0.5).double()  # layers with i / 3 ≥ 0.5: layer 2
    b, per_layer = grouped_attention_by_layer(agent, state, QUERY, 0.5)
    assert per_layer.shape[0] == 1 and torch.equal(b.double(), deep)
    assert torch.equal(get_selector("cacheback", min_depth=0.5).score(agent, state, QUERY),
                       cacheback_scores(deep, 2.0, "avg", 7))
    assert not torch.equal(get_selector("cacheback", min_depth=0.5).score(agent, state, QUERY),
                           get_selector("cacheback").score(agent, state, QUERY))
    assert torch.equal(get_selector("cacheback", min_depth=0.5, correction_over="layer_kv_head").score(
        agent, state, QUERY), cacheback_scores(deep, 2.0, "avg", 7, groups=per_layer.double().flatten(0, 1)))


def test_max_depth_scores_on_the_shallower_layers(agent_for):
    """max_depth = 0.5 on the three-layer tiny Llama keeps layers 0 and 1 (0, 1/3 < 0.5): CacheBack's formula on
    their attention, from a query that stopped after layer 1."""
    agent = agent_for("llama")
    state = agent.think(agent.prefill(DOC), steps=2)
    shallow = attend_grouped(agent, state, QUERY, 0.0, 0.5).double()
    b, per_layer = grouped_attention_by_layer(agent, state, QUERY, 0.0, 0.5)
    assert per_layer.shape[0] == 2 and torch.equal(b.double(), shallow)
    assert torch.equal(get_selector("cacheback", max_depth=0.5).score(agent, state, QUERY),
                       cacheback_scores(shallow, 2.0, "avg", 7))
    assert not torch.equal(shallow, attend_grouped(agent, state, QUERY).double())


# -- CanonicalMerge direction in the merge protocol -----------------------------------------------------
def test_merge_protocol_passes_the_direction():
    assert get_protocol("merge")._render.direction == "ascending"
    assert get_protocol("merge", direction="descending")._render.direction == "descending"
    with pytest.raises(ConfigError, match="canonical"):
        get_protocol("merge", render="bag", direction="descending")
    with pytest.raises(ConfigError, match="direction"):
        get_protocol("merge", direction="sideways")


# -- XKV vs LCF-X timing ------------------------------------------------------------------------------
def test_timing_compares_xkv_and_lcfx_on_the_same_states(agent_for):
    S, R = agent_for("gemma3").prefill("the sharer read this: Ned has 9 coins."), agent_for("llama").prefill("Ben.")
    xkv, lcfx = build("xkv", S.geometry, R.geometry).eval(), build("lcfx", S.geometry, R.geometry).eval()
    out = compare(xkv, lcfx, PairStates(sharer=S, receiver=R), calls=50, warmup=2)
    assert out["xkv"].calls == out["lcfx"].calls == 50 and len(out["xkv"].times_ms) == 50
    assert out["time_ratio"] == pytest.approx(out["lcfx"].median_ms / out["xkv"].median_ms)
    assert out["param_ratio"] == xkv.num_parameters / lcfx.num_parameters
    with pytest.raises(ValueError, match="xkv"):
        compare(lcfx, xkv, PairStates(sharer=S, receiver=R))
    with pytest.raises(ValueError, match="calls"):
        time_forwards({"xkv": xkv}, PairStates(sharer=S, receiver=R), calls=0)


def test_translators_benchmark_timing_only_on_tiny_models(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import translators

    translators.main(["--timing-only", "--pairs", "tiny-gemma3:tiny-llama", "--calls", "50", "--warmup", "1",
                      "--threads", "1", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "translators_timing.json").read_text())["timing"]["tiny-gemma3:tiny-llama"]
    assert result["calls"] == 50 and result["time_ratio"] > 0 and result["weights"] == {"xkv": "fresh", "lcfx": "fresh"}
    assert result["param_ratio"] == result["xkv_parameters"] / result["lcfx_parameters"]
    assert "LCF-X ÷ XKV" in (tmp_path / "translators_timing.md").read_text()
    with pytest.raises(SystemExit):
        translators.main(["--timing-only", "--calls", "10"])  # fewer than 50 timed calls is refused


# -- the CacheBack ablation benchmark -----------------------------------------------------------------
def test_ablations_benchmark_on_a_tiny_model(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import ablations

    docs = ["Ada led the Orion project in Lisbon. Bo led Vega in Oslo.\nThe budget was 40k. " * 2,
            "Cy wrote the Lyra report in Rome. Di audited it.\nThe report was late. " * 2]
    lines = []
    for i, doc in enumerate(docs):
        start = doc.index("Bo led") if i == 0 else doc.index("Cy wrote")
        lines.append(json.dumps({"id": f"e{i}", "task": "t", "topology": "fanin", "question": "Who led what?",
                                 "answers": ["x"], "contexts": [doc, "Nothing here."],
                                 "evidence": [{"agent": 0, "start": start, "end": start + 20}]}))
    task = tmp_path / "tiny.jsonl"
    task.write_text("\n".join(lines) + "\n")
    out = ablations.main(["--model", "tiny-llama", "--task", str(task), "--n", "2", "--latent-steps", "1",
                          "--ratios", "2,4", "--variant", "p=1,inner_power=3", "--variant",
                          "correction_over=layer_kv_head", "--out", str(tmp_path)])
    assert set(out["recall"]) == {"cacheback", "p=1,inner_power=3", "correction_over=layer_kv_head"}
    assert out["variants"]["p=1,inner_power=3"] == {"p": 1, "inner_power": 3}
    assert all(len(x) == 2 and all(0 <= v <= 1 for v in x) for x in out["per_episode"].values())
    assert set(out["diff_vs_baseline"]["p=1,inner_power=3"]) == {"2", "4"}
    assert (tmp_path / "ablations_cacheback_tiny_tiny-llama.md").exists()
    with pytest.raises(ConfigError):
        ablations.main(["--model", "tiny-llama", "--task", str(task), "--variant", "inner_power=0"])
    with pytest.raises(ConfigError, match="probe"):  # names the fields it takes
        ablations.main(["--model", "tiny-llama", "--task", str(task), "--variant", "latent_steps=0"])


def test_ablation_variants_set_protocol_scoring_fields_on_fresh_dev_episodes(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import ablations
    import rival

    from latentwire.bench.episode import Episode, Span

    reader = ablations.variant_reader({"p": 0, "min_depth": 0.5, "calibration": "generic", "probe": 4}, 2, "sentence")
    assert (reader.flat["calibration"], reader.flat["probe"], reader.latent_steps) == ("generic", 4, 2)
    assert reader.flat["selector_params"] == {"p": 0, "min_depth": 0.5}
    doc = "Ada led Orion in Lisbon. She drinks tea.\nBo led Vega in Oslo. He drinks coffee."
    asked = []

    def episodes_for(task, n, seed):  # the real generators' documents overflow a tiny model's window
        asked.append((task, n, seed))
        return [Episode(f"dev-{i}", task, "fanin", "What does Ada drink?", ["tea"], (doc, "Nothing."),
                        evidence=(Span(0, doc.index("She"), doc.index("tea.") + 4),)) for i in range(n)]

    monkeypatch.setattr(rival, "episodes_for", episodes_for)
    out = ablations.main(["--model", "tiny-qwen2", "--task", "coref", "--generate-seed", "7", "--n", "2",
                          "--latent-steps", "1", "--ratios", "4", "--variant", "probe=3,calibration=generic",
                          "--out", str(tmp_path)])
    assert asked == [("coref", 2, 7)]  # fresh development episodes, not the committed file
    assert out["variants"]["probe=3,calibration=generic"] == {"probe": 3, "calibration": "generic"}
    assert len(out["per_episode"]["probe=3,calibration=generic@4"]) == 2
    assert "--generate-seed 7" in out["command"]
    assert (tmp_path / "ablations_cacheback_coref_dev7_tiny-qwen2.md").exists()

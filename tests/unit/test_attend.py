"""`Agent.attend` reads the query's attention from hooks, under any attention implementation.

The reference is what the library did before: switch the model to eager attention and read
`output_attentions`. The hook path must equal it to 1e-5 in fp32 while the model keeps its own
implementation (sdpa here), and must leave that implementation untouched.
"""
import os

import pytest
import torch

from latentwire.agent import Agent
from latentwire.models import tiny_model
from latentwire.attention import attend, attend_grouped
from latentwire.models.compat import cache_arg

DEVICE = torch.device(os.environ.get("LATENTWIRE_TEST_DEVICE") or "cpu")  # gpu_smoke.py sets "cuda"
QUERY = "Which project did Ada lead, and where?"
DOC = "Ada led the Orion project in Lisbon. " * 6 + "Bo led Vega in Oslo. The budget was 40k."


@torch.inference_mode()
def eager_attention(agent: Agent, state, query: str) -> torch.Tensor:
    """(L_g, H_q, m, T) from eager attention weights: the reference implementation."""
    ids = agent.ids(agent.tokenizer(query, add_special_tokens=False)["input_ids"])
    T = len(state)
    before = agent.model.config._attn_implementation
    agent.model.set_attn_implementation("eager")
    try:
        out = agent.model.model(input_ids=ids[None], **cache_arg(agent.model.model, state.compact().to_cache()), use_cache=True,
                                position_ids=torch.arange(T, T + len(ids), device=ids.device)[None],
                                output_attentions=True)
    finally:
        agent.model.set_attn_implementation(before)
    layers = [i for i, t in enumerate(state.geometry.layer_types) if t == "global"]
    return torch.stack([out.attentions[i][0, :, :, :T] for i in layers]).float()


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_attend_equals_eager_weights(arch, tokenizer, implementation):
    model = tiny_model(arch).to(DEVICE)
    model.set_attn_implementation(implementation)
    agent = Agent(model, tokenizer, model_name=arch)
    state = agent.think(agent.prefill(DOC), steps=3)  # token rows and latent rows
    got = attend(agent, state, QUERY)
    assert model.config._attn_implementation == implementation  # the model's own attention, untouched
    want = eager_attention(agent, state, QUERY)
    assert got.shape == want.shape and got.dtype == torch.float32
    assert torch.allclose(got, want, atol=1e-5, rtol=0), float((got - want).abs().max())
    n_global = sum(t == "global" for t in state.geometry.layer_types)
    assert got.shape[0] == n_global < (len(state.geometry.layer_types) if arch == "gemma3" else n_global + 1)


def test_attend_on_a_selected_then_compacted_state(tokenizer):
    """Scoring reads the state's keys as they are: a compacted selection scores like its own eager pass."""
    agent = Agent(tiny_model("qwen2").to(DEVICE), tokenizer, model_name="qwen2")
    agent.model.set_attn_implementation("sdpa")
    state = agent.prefill(DOC)
    part = state.select(range(0, len(state), 3)).compact()
    assert torch.allclose(attend(agent, part, QUERY), eager_attention(agent, part, QUERY), atol=1e-5, rtol=0)


def test_attend_in_bf16_is_close_to_fp32(tokenizer):
    """bf16 scoring (fp32 softmax over bf16 q/K) keeps the same row ranking, up to bf16 rounding."""
    fp32 = Agent(tiny_model("llama").to(DEVICE), tokenizer, model_name="llama")
    bf16 = Agent(tiny_model("llama").to(DEVICE, torch.bfloat16), tokenizer, model_name="llama")
    a32 = attend(fp32, fp32.prefill(DOC), QUERY).mean(dim=(0, 1, 2))  # (T,)
    a16 = attend(bf16, bf16.prefill(DOC), QUERY).mean(dim=(0, 1, 2))
    assert a16.dtype == torch.float32
    assert float((a32 - a16).abs().max()) <= 0.05 * float(a32.max())  # relative to the largest weight (~3e-3)
    top = lambda a: set(a.topk(len(a) // 8).indices.tolist())  # noqa: E731
    assert len(top(a32) & top(a16)) >= 0.75 * len(top(a32))


def test_grouped_attention_streams_the_same_numbers(arch, tokenizer):
    """attend_grouped (layer by layer, never holding (L, H, m, T)) = the grouped mean of the full tensor."""
    from latentwire.select.cacheback import grouped_attention

    agent = Agent(tiny_model(arch).to(DEVICE), tokenizer, model_name=arch)
    state = agent.think(agent.prefill(DOC), steps=2)
    want = grouped_attention(attend(agent, state, QUERY), state.geometry.num_kv_heads)
    got = attend_grouped(agent, state, QUERY)
    assert got.shape == (state.geometry.num_kv_heads, want.shape[1], len(state))
    assert torch.allclose(got.double(), want, atol=1e-6, rtol=0)


def test_min_depth_averages_the_deeper_scoring_layers_only(arch, tokenizer):
    """attend_grouped(min_depth=d) = the grouped mean over the global layers at relative depth ≥ d, read off the
    full per-layer tensor; d = 0 is every global layer, and a depth past the last keeps the deepest one."""
    from latentwire.attention import scoring_layers
    from latentwire.select.cacheback import grouped_attention

    agent = Agent(tiny_model(arch).to(DEVICE), tokenizer, model_name=arch)
    state = agent.think(agent.prefill(DOC), steps=2)
    types = state.geometry.layer_types
    glob = [i for i, t in enumerate(types) if t == "global"]
    full = attend(agent, state, QUERY)  # (L_g, H_q, m, T), one slice per global layer in `glob`
    for d in (0.0, 0.5, 0.99):
        keep = scoring_layers(types, d)
        assert keep == ([i for i in glob if i / len(types) >= d] or glob[-1:])
        want = grouped_attention(full[[glob.index(i) for i in keep]], state.geometry.num_kv_heads)
        assert torch.allclose(attend_grouped(agent, state, QUERY, d).double(), want, atol=1e-6, rtol=0)
    assert torch.equal(attend_grouped(agent, state, QUERY, 0.0), attend_grouped(agent, state, QUERY))
    import pytest

    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match="min_depth"):
            scoring_layers(types, bad)


def test_max_depth_stops_the_query_after_its_deepest_scoring_layer(arch, tokenizer):
    """query_attention(max_depth=d) yields the global layers at relative depth < d with the very weights of the
    whole forward (a layer reads nothing above it), and runs no layer above the deepest of them."""
    from latentwire.attention import query_attention, scoring_layers

    agent = Agent(tiny_model(arch).to(DEVICE), tokenizer, model_name=arch)
    state = agent.think(agent.prefill(DOC), steps=2)
    types, L = state.geometry.layer_types, len(state.geometry.layer_types)
    glob = [i for i, t in enumerate(types) if t == "global"]
    full = dict(query_attention(agent, state, QUERY))
    ran = []
    hooks = [layer.register_forward_pre_hook(lambda mod, args, i=i: ran.append(i))
             for i, layer in enumerate(agent.decoder.layers)]
    try:
        for d in (0.3, 0.7, 1.0):
            ran.clear()
            keep = scoring_layers(types, 0.0, d)
            assert keep == ([i for i in glob if i / L < d] or glob[:1])
            got = dict(query_attention(agent, state, QUERY, max_depth=d))
            assert list(got) == keep and all(torch.equal(got[i], full[i]) for i in keep)
            assert ran == list(range(keep[-1] + 1))  # nothing above the deepest scoring layer ran
    finally:
        for h in hooks:
            h.remove()
    for lo, hi in ((0.5, 0.5), (0.0, 0.0), (0.0, 1.5)):
        with pytest.raises(ValueError, match="max_depth"):
            scoring_layers(types, lo, hi)


def test_a_query_that_fails_leaves_no_hook_on_the_model(tokenizer, monkeypatch):
    """A hook left behind by a failed query would break every later forward of the agent: none is."""
    import latentwire.attention as attention
    from latentwire.errors import StateFormatError

    agent = Agent(tiny_model("llama").to(DEVICE), tokenizer, model_name="llama")
    state = agent.prefill(DOC)
    hooks = lambda: sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in agent.model.modules())  # noqa: E731
    before, want, real = hooks(), attend_grouped(agent, state, QUERY), attention._query_hook

    def second_layer_fails(attn, store):
        if hooks() > before:  # the first scoring layer's hooks are on
            raise StateFormatError("unsupported attention module")
        return real(attn, store)

    monkeypatch.setattr(attention, "_query_hook", second_layer_fails)
    with pytest.raises(StateFormatError):
        attend_grouped(agent, state, QUERY)
    monkeypatch.undo()
    assert hooks() == before and torch.equal(attend_grouped(agent, state, QUERY), want)

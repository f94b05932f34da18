"""Architectures users bring, beyond the three bundled ones: Qwen3 (per-head q/k norm), Mistral, Phi-3 (one
fused qkv projection; the tiny one rotates half of each head), Phi-2 (partial rotary split off before the
rotation function), OLMo2 (q/k norm over all heads) and Granite
(embedding, attention, residual and logit multipliers), Cohere and GLM (RoPE on interleaved channel pairs). The state laws (re-rotation, compaction)
run on them through `model_key` in test_state_rerotation.py; here: the query attention CacheBack scores with
equals eager attention, a think loop equals one forward, and a fan-in round trip works, on the wire too.
"""
import pytest
import torch

from latentwire.agent import Agent
from latentwire.models import OTHER_ARCHS, tiny_model
from latentwire.protocols import get_protocol
from latentwire.state import KVState
from latentwire.wire import decode, encode

from test_attend import DOC, QUERY, eager_attention
from latentwire.attention import attend
from latentwire.models.compat import cache_arg, output_cache

DOCS = ("The access code of the north warehouse is 7341. The lights were replaced.",
        "Maria Lopez leads the Falcon project, which is based in Lisbon.")


@pytest.fixture(scope="module", params=OTHER_ARCHS)
def other_arch(request, tokenizer):
    return request.param, Agent(tiny_model(request.param), tokenizer, model_name=request.param)


def test_logits_are_the_models_own(other_arch):
    _, agent = other_arch
    ids = torch.randint(5, 261, (1, 12), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        want = agent.model(ids).logits[0]
        got = agent.logits(agent.decoder(input_ids=ids).last_hidden_state[0])
    assert torch.allclose(got, want, atol=1e-5, rtol=0)


def test_rope_is_what_the_model_rotates_with(other_arch):
    arch, agent = other_arch
    (kind, spec), = agent.geometry.rope
    head_dim = agent.geometry.head_dim
    assert kind == "global" and spec.rotary_dim == (head_dim // 2 if arch in ("phi3", "phi", "glm") else head_dim)


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_query_attention_equals_eager_weights(other_arch, implementation):
    _, agent = other_arch
    agent.model.set_attn_implementation(implementation)
    try:
        state = agent.think(agent.prefill(DOC), steps=2)
        got = attend(agent, state, QUERY)
        want = eager_attention(agent, state, QUERY)
    finally:
        agent.model.set_attn_implementation("eager")
    assert got.shape == want.shape == (3, 4, got.shape[2], len(state))
    assert torch.allclose(got, want, atol=1e-5, rtol=0), float((got - want).abs().max())


def test_think_equals_one_forward_over_its_inputs(other_arch, kv_diff):
    """G latent steps fed one at a time = one forward over the prompt's embeddings then the G latent rows."""
    _, agent = other_arch
    state = agent.prefill("Read this. " + DOCS[0])
    out = agent.think(state, 3)
    with torch.inference_mode():
        embeds = torch.cat([agent.embed(state.token_ids), out.latents])[None]
        cache = output_cache(agent.model.model(inputs_embeds=embeds, use_cache=True))
    ref = KVState.from_cache(cache, agent.geometry, out.token_ids, out.latents)
    assert kv_diff(out, ref) <= 1e-4 and kv_diff(out, ref, "values") <= 1e-4


@pytest.mark.parametrize("name", ["cacheback", "fullkv"])
def test_fanin_runs_and_its_state_survives_the_wire(other_arch, name):
    _, agent = other_arch
    out = get_protocol(name, latent_steps=2, max_new_tokens=3).run([agent] * 2, list(DOCS), agent, QUERY)
    assert out.receiver_context > 0 and len(out.kept_spans) == 2
    state = agent.think(agent.prefill(DOCS[1]), steps=2).shift(40)
    back = decode(encode(state, protocol="fullkv"), expect=agent.geometry).body
    assert back.digest() == state.digest() and torch.equal(back.positions, state.positions)


def test_a_multimodal_gemma3_reads_and_answers_as_its_text_model(models, tokenizer):
    """Gemma3 4B and up load as Gemma3ForConditionalGeneration (a vision tower around the text model): the
    agent uses its language model, so with the tiny text model's weights every state and answer is the same."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    text = models["gemma3"]
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    config = Gemma3Config(text_config=text.config.to_dict(), vision_config=vision, mm_tokens_per_image=4)
    config.text_config._attn_implementation = text.config._attn_implementation
    mm = Gemma3ForConditionalGeneration(config).eval()
    mm.model.language_model.load_state_dict(text.model.state_dict())
    mm.lm_head.weight = mm.model.language_model.embed_tokens.weight
    a, b = Agent(text, tokenizer, model_name="gemma3"), Agent(mm, tokenizer, model_name="gemma3")
    assert a.geometry == b.geometry
    sa, sb = (x.think(x.prefill("Read this. " + DOCS[0]), steps=2) for x in (a, b))
    assert sa.digest() == sb.digest()
    assert torch.equal(attend(a, sa, QUERY), attend(b, sb, QUERY))
    outs = [get_protocol("cacheback", ratio=4, latent_steps=2, max_new_tokens=6).run([x] * 2, list(DOCS), x, QUERY)
            for x in (a, b)]
    assert outs[0].answer == outs[1].answer and outs[0].answer.strip()


def test_a_model_whose_layers_all_slide_is_scored_while_its_window_holds_the_state(tokenizer):
    """Mistral 7B v0.1 slides on every layer (window 4096): no global layer to score with. Inside the window
    every sliding layer sees every row, so the scores are its attention; past it, a typed error."""
    from latentwire.errors import StateFormatError

    agent = Agent(tiny_model("mistral", sliding_window=160), tokenizer, model_name="mistral-sliding")
    assert set(agent.geometry.layer_types) == {"sliding"}
    state = agent.prefill("Read. " + DOCS[1])
    got = attend(agent, state, QUERY)
    with torch.inference_mode():
        ids = agent.ids(agent.tokenizer(QUERY, add_special_tokens=False)["input_ids"])
        agent.model.set_attn_implementation("eager")
        out = agent.model.model(input_ids=ids[None], **cache_arg(agent.model.model, state.to_cache()), use_cache=True,
                                position_ids=torch.arange(len(state), len(state) + len(ids))[None],
                                output_attentions=True)
    want = torch.stack([a[0, :, :, :len(state)] for a in out.attentions]).float()
    assert got.shape == want.shape and torch.allclose(got, want, atol=1e-5, rtol=0)
    long = agent.prefill("Read. " + DOCS[0] + " " + DOCS[1][:40])  # fits the window alone, not with the query
    assert len(long) < 160  # the state itself is whole in every layer
    with pytest.raises(StateFormatError, match="slides"):
        attend(agent, long, QUERY)


def test_interleaved_rope_is_detected_and_translators_unrotate_it(other_arch):
    """Cohere and GLM rotate pairs (2i, 2i+1): the rotation check records it (else re-rotation would corrupt
    their caches, tested through the state laws); the translators' stacked un-rotation agrees with the
    per-layer one built on `rotate_keys`."""
    from latentwire.translate.layers import layer_groups, unrotated

    arch, agent = other_arch
    (_, spec), = agent.geometry.rope
    assert spec.interleaved == (arch in ("cohere", "glm"))
    state = agent.think(agent.prefill("Read this. " + DOCS[1]), steps=2).shift(7)
    (group,) = layer_groups(state)
    D = agent.geometry.head_dim
    for layer, (keys, _) in zip(group.layers, unrotated(state)):
        assert torch.allclose(group.kv[group.layers.index(layer), :, :, :D], keys.float(), atol=1e-5)


@pytest.mark.parametrize("name", ["smollm3", "exaone4", "cohere2"])
def test_layers_without_rope_are_refused(name, tokenizer):
    """SmolLM3 skips RoPE on some layers, EXAONE-4 and Cohere2 on their global layers when they slide: their
    keys do not move with position, so re-rotating them would corrupt the cache; refused, naming the layers."""
    from transformers import AutoModelForCausalLM, Cohere2Config, Exaone4Config, SmolLM3Config

    from latentwire.errors import UnsupportedRopeError

    common = dict(vocab_size=264, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_hidden_layers=4,
                  num_key_value_heads=2, max_position_embeddings=1024, bos_token_id=1, eos_token_id=4, pad_token_id=0)
    config = {"smollm3": lambda: SmolLM3Config(**common, no_rope_layers=[1, 1, 1, 0]),
              "exaone4": lambda: Exaone4Config(**common, sliding_window=8, sliding_window_pattern=2),
              "cohere2": lambda: Cohere2Config(**common, sliding_window=8, sliding_window_pattern=4)}[name]()
    model = AutoModelForCausalLM.from_config(config).eval()
    with pytest.raises(UnsupportedRopeError, match=r"layers \[(3|1, 3)\] apply no RoPE"):
        Agent(model, tokenizer, model_name=name).prefill("Read this.")


@pytest.mark.kvpress
@pytest.mark.parametrize("selector", ["snapkv", "chunkkv", "kvzip", "tova"])
def test_kvpress_scorers_that_rotate_queries_refuse_interleaved_or_partial_rope(selector, tokenizer):
    """kvpress rotates SnapKV's and KVzip's queries the Llama way, over the whole head: refused on Cohere
    (interleaved) and Phi-3 (partial) rather than scored wrongly; knorm reads keys only and still scores."""
    from latentwire.select import get_selector
    from latentwire.select.presses import PressUnsupportedError

    for arch in ("cohere", "phi3"):
        agent = Agent(tiny_model(arch), tokenizer, model_name=arch)
        state = agent.prefill("Read this. " + DOCS[1])
        with pytest.raises(PressUnsupportedError, match="interleaved or partial"):
            get_selector(selector).score(agent, state, QUERY)
        assert get_selector("knorm").score(agent, state, QUERY).shape == (len(state),)

"""Real SmolLM2-135M: geometry, exact state handling, and the first latent message."""
import copy

import pytest
import torch

from latentwire.demo import DOCUMENTS
from latentwire.models import ZOO
from latentwire.protocols import get_protocol
from latentwire.state import KVState
from latentwire.models.compat import cache_arg, output_cache

pytestmark = pytest.mark.integration
FACT_DOC, QUESTION, GOLD = DOCUMENTS[0], "What is the secret access code for the north warehouse?", "7341"


def test_geometry_matches_zoo(smollm2):
    g, z = smollm2.geometry, ZOO["smollm2-135m"]
    assert (g.num_layers, g.num_kv_heads, g.head_dim, g.hidden_size) == (
        z.num_layers, z.num_kv_heads, z.head_dim, z.hidden_size)
    assert set(g.layer_types) == {"global"}


def test_private_fact_reaches_receiver_by_fullkv_and_text(smollm2):
    """Only the sender read the document; the receiver alone cannot know the code."""
    alone = get_protocol("alone").run([], [], smollm2, QUESTION)
    assert GOLD not in alone.answer
    for name, params in [("fullkv", {"latent_steps": 0}), ("fullkv", {"latent_steps": 4}),
                         ("fullkv", {"latent_steps": 4, "query_aware": True}), ("text", {})]:
        out = get_protocol(name, **params).run([smollm2], [FACT_DOC], smollm2, QUESTION)
        assert GOLD in out.answer, (name, params, out.answer)
        assert out.message_bytes > 0
        if name == "fullkv":  # the whole sender state, latent rows included, sits in the receiver's context
            read = "Read this document.\n\n" + FACT_DOC  # query-blind (the default) ...
            if params.get("query_aware"):  # ... or with the question after the document
                read += "\n\nQuestion: " + QUESTION
            assert out.details["message_rows"] == len(smollm2.chat_ids(read)) + params["latent_steps"]


def test_rerotated_state_matches_direct_prefill(smollm2):
    ids = torch.tensor(smollm2.chat_ids(FACT_DOC))
    model, g, p = smollm2.model, smollm2.geometry, 300
    with torch.inference_mode():
        at0 = KVState.from_cache(output_cache(model(ids[None], use_cache=True)), g, ids)
        atp = KVState.from_cache(output_cache(model(ids[None], position_ids=torch.arange(p, p + len(ids))[None],
                                       use_cache=True)), g, ids, start=p)
    diff = max((a.keys - b.keys).abs().max().item() for a, b in zip(at0.shift(p).layers, atp.layers))
    assert diff <= 1e-4


def _greedy(model, cache, last_token, n):
    out, tok = [], last_token
    for _ in range(n):
        tok = int(model(input_ids=torch.tensor([[tok]]), **cache_arg(model, cache), use_cache=True).logits[0, -1].argmax())
        out.append(tok)
    return out


def test_cache_round_trip_generates_the_same_tokens(smollm2):
    ids = torch.tensor(smollm2.chat_ids(QUESTION))
    with torch.inference_mode():
        cache = output_cache(smollm2.model(ids[None, :-1], use_cache=True))
        state = KVState.from_cache(cache, smollm2.geometry, ids[:-1])
        reference = _greedy(smollm2.model, copy.deepcopy(cache), int(ids[-1]), 16)
        assert _greedy(smollm2.model, state.to_cache(), int(ids[-1]), 16) == reference
        restored = KVState.from_bytes(state.to_bytes())
        assert _greedy(smollm2.model, restored.to_cache(), int(ids[-1]), 16) == reference
    assert restored.digest() == state.digest()


def test_latent_steps_extend_state_and_keep_it_serialisable(smollm2):
    state = smollm2.think(smollm2.prefill(FACT_DOC), 3, "realign")
    assert int(state.is_latent.sum()) == 3 and state.latents.shape == (3, smollm2.geometry.hidden_size)
    assert KVState.from_bytes(state.to_bytes()).to_bytes() == state.to_bytes()


def test_the_tokenizer_is_the_cache_tokenizer_json_on_every_transformers(smollm2):
    """The GGUF conversion labels SmolLM2's byte-level BPE "CodeLlamaTokenizer"; transformers ≥ 5.25 would build
    that class and break every space (`make test-current` runs the newest release). The cache's tokenizer.json is
    loaded as is, with no BOS as SmolLM2's GGUF says (5.2 alone would add one): the same ids on 5.2 and on the
    newest, whichever release wrote the cache, one token per space-prefixed word."""
    ids = smollm2.tokenizer("The code is 7341.")["input_ids"]
    assert ids == [504, 2909, 314, 216, 39, 35, 36, 33, 30]
    assert smollm2.tokenizer.decode(ids) == "The code is 7341."

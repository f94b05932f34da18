"""LatentMAS's sequential chain: one growing cache, each agent reading after the previous agents' state."""
import pytest
import torch

from latentwire.protocols import get_protocol
from latentwire.protocols.reads import shared_reads

DOCS = ("The blue crate holds 58 bolts.", "The red crate holds 12 nails.", "The green crate is empty.")
Q = "How many bolts?"


def test_extend_equals_one_forward_over_the_whole_conversation(agent_for, arch):
    agent = agent_for(arch)
    first = agent.prefill("Read this document.\n\n" + DOCS[0])
    grown = agent.extend(first, "Read this document.\n\n" + DOCS[1])
    turn = agent.tokenizer(agent.continuation_text("Read this document.\n\n" + DOCS[1]),
                           add_special_tokens=False)["input_ids"]
    ids = first.token_ids.tolist() + turn
    assert grown.token_ids.tolist() == ids and grown.is_compact
    cache = agent.new_cache()
    with torch.inference_mode():
        agent._forward(cache, 0, ids=agent.ids(ids))
    for mine, ref in zip(grown.layers, cache.layers):
        n = mine.keys.shape[-2]  # sliding layers keep their last window
        assert torch.allclose(mine.keys, ref.keys[0][..., -n:, :], atol=1e-4)
        assert torch.allclose(mine.values, ref.values[0][..., -n:, :], atol=1e-4)


def test_extend_after_latent_steps_continues_the_latent_state(agent_for):
    agent = agent_for("llama")
    thought = agent.think(agent.prefill(DOCS[0]), 3)
    grown = agent.extend(thought, DOCS[1])
    assert int(grown.is_latent.sum()) == 3 and len(grown) > len(thought)
    assert torch.equal(grown.layers[0].keys[..., : len(thought), :], thought.layers[0].keys)


def test_sequential_chain_grows_one_cache_and_shares_its_first_read(agent_for):
    agent = agent_for("qwen2")
    seq = get_protocol("latentmas_sequential", latent_steps=2, query_aware=False, max_new_tokens=2)
    full = get_protocol("fullkv", latent_steps=2, query_aware=False, max_new_tokens=2)
    with shared_reads():
        fk = full.run([agent] * 3, list(DOCS), agent, Q)
        out = seq.run([agent] * 3, list(DOCS), agent, Q)
    hops = out.details["rows_after_hop"]
    assert len(hops) == 3 and hops[0] < hops[1] < hops[2] == out.details["message_rows"]
    assert out.details["shared_reads"] == 1  # agent 1's read is full KV's first sender's
    assert len(out.sender_seconds) == 1  # one critical path: the agents run one after another
    assert out.message_bytes > fk.message_bytes  # each hop ships the whole growing cache
    with pytest.raises(ValueError):
        get_protocol("latentmas_sequential", latent_steps=-1)

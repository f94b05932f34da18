"""bf16 on the real SmolLM2: CacheBack selects what it selects in fp32, and bf16 states travel as bf16.

The default on a CPU with AMX / AVX512-BF16 (and on CUDA) is bf16, so this is the path most runs take.
"""
import pytest
import torch

from latentwire.agent import Agent
from latentwire.bench.tasks import load_task
from latentwire.protocols.cacheback import CacheBack, document_rows
from latentwire.state import KVState
from latentwire.wire import decode, encode

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def agents(smollm2) -> dict[torch.dtype, Agent]:
    return {torch.float32: smollm2, torch.bfloat16: Agent.from_pretrained("smollm2-135m", dtype="bfloat16")}


def kept_document_rows(agent: Agent, cb: CacheBack, document: str, question: str) -> set[int]:
    state = cb.read(agent, document)
    _, eligible = document_rows(agent, document, len(state))
    rows = cb.choose(agent, state, question, eligible)
    return {int(r) for r in rows if r < len(eligible) and eligible[r]}  # the budgeted document rows


def test_cacheback_selects_the_same_rows_in_bf16_and_fp32(agents):
    """Mean Jaccard of the kept document rows ≥ 0.9 over 10 `facts` episodes (3 senders each). Measured per
    episode (2-core EPYC, emulated bf16): 0.87, 0.91, 1, 1, 0.95, 0.88, 1, 1, 0.95, 0.89 (mean 0.95), and 1, 1 on
    the next two. A broken bf16 path (scores in the wrong dtype, a lost cast) selects other sentences
    altogether; 10 episodes show that as well as 20 did, at half the cost where bf16 is emulated (~24 s an
    episode: the bf16 prefill)."""
    assert agents[torch.float32].dtype == torch.float32 and agents[torch.bfloat16].dtype == torch.bfloat16
    cb = CacheBack(ratio=8, latent_steps=8)
    episodes = [e for e in load_task("facts") if e.meta["length_bucket"] == 500][:10]
    per_episode = []
    for ep in episodes:
        inter = union = 0
        for doc in ep.contexts:
            a, b = (kept_document_rows(agents[dt], cb, doc, ep.question) for dt in (torch.float32, torch.bfloat16))
            inter, union = inter + len(a & b), union + len(a | b)
        per_episode.append(inter / union)
    mean = sum(per_episode) / len(per_episode)
    print(f"bf16 vs fp32 CacheBack 8x kept rows, Jaccard per episode: {[round(j, 3) for j in per_episode]}; "
          f"mean {mean:.3f}")
    assert len(per_episode) == 10 and mean >= 0.9, per_episode


def test_bf16_states_keep_their_dtype_on_the_wire(agents):
    agent = agents[torch.bfloat16]
    state = agent.think(agent.prefill("The access code of the north door is 7341."), steps=2)
    assert state.dtype == torch.bfloat16
    again = KVState.from_bytes(state.to_bytes())
    assert again.dtype == torch.bfloat16 and again.digest() == state.digest()
    assert all(torch.equal(a.keys, b.keys) for a, b in zip(state.layers, again.layers))
    received = decode(encode(state, protocol="fullkv"), expect=agent.geometry, device=agent.device).body
    assert received.dtype == torch.bfloat16 and received.digest() == state.digest()
    half = agents[torch.float32].prefill("The access code of the north door is 7341.")
    assert state.nbytes < 0.6 * half.nbytes  # a bf16 message is half the bytes (plus the 2 latent rows)

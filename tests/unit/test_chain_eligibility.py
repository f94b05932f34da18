"""CacheBack along a chain: inherited rows, latent ones included, compete for the hop's budget; only the
hop state's first row and the hop's own latent rows are always kept (tiny random-weight llama)."""
import math

import pytest
import torch

from latentwire.protocols import get_protocol
from latentwire.protocols.cacheback_chain import HOP_PROMPT, _hop_rows
from latentwire.select import fixed_chain_budget, relative_chain_budget

G = 2  # latent steps per hop
QUESTION = "How many bolts?"
DOCS = ["The blue crate holds 58 bolts. " * 3, "The red crate holds 12 nails. " * 3, "Doors lock at six. " * 3]


class Scores:
    """A stand-in selector: latent rows score `latent`, token rows 1.0 (later rows a little higher)."""

    def __init__(self, latent: float):
        self.latent = latent

    def score(self, agent, state, query):
        scores = 1.0 + torch.arange(len(state), dtype=torch.float64, device=state.device) / len(state)  # (T,)
        scores[state.is_latent] = self.latent
        return scores


@pytest.fixture
def agent(agent_for):
    return agent_for("llama")


def chain(**kw):
    return get_protocol("cacheback_chain", latent_steps=G, max_new_tokens=1, **kw)


def second_hop(proto, agent):
    """The first hop's message and origins, and the second hop's state (before selection)."""
    message, origins, _ = proto.hop(agent, DOCS[0], 0, QUESTION, None, [])
    state = agent.think(agent.prefill(HOP_PROMPT.format(document=DOCS[1]), rows=message), G)
    return message, origins, state


def test_inherited_latent_rows_are_eligible_and_only_the_hops_own_are_kept(agent):
    proto = chain(ratio=4)
    message, origins, state = second_hop(proto, agent)
    _, eligible, keep = _hop_rows(agent, DOCS[1], 1, message, origins, len(state), G)
    pre, _ = agent.slot_ids(agent.chat_text(HOP_PROMPT.format(document=DOCS[1])))
    inherited = torch.arange(len(pre), len(pre) + len(message))
    latent_inherited = inherited[message.token_ids.cpu() == -1]
    assert len(latent_inherited) == G  # the first hop's own latent rows travel on
    assert state.is_latent[latent_inherited].all()
    assert eligible[inherited].all() and not keep[inherited].any()  # every inherited row competes
    own = torch.arange(len(state) - G, len(state))
    assert state.is_latent[own].all() and keep[own].all()
    assert torch.nonzero(keep).flatten().tolist() == [0, *own.tolist()]  # first row + own latent rows only


def test_zero_latent_steps_keep_only_the_first_row(agent):
    proto = chain(ratio=4)
    message, origins, state = second_hop(proto, agent)
    _, _, keep = _hop_rows(agent, DOCS[1], 1, message, origins, len(state), 0)
    assert torch.nonzero(keep).flatten().tolist() == [0]


def test_a_small_budget_drops_inherited_latent_rows_but_never_the_hops_own(agent):
    proto = chain(budget="fixed", max_rows=4)
    message, origins, _ = proto.hop(agent, DOCS[0], 0, QUESTION, None, [])
    proto.score._selector = Scores(latent=-1.0)  # inherited latent rows score below every token row
    out, out_origins, info = proto.hop(agent, DOCS[1], 1, QUESTION, message, list(origins))
    assert info["budget"] == 4 and info["sent"] == 4 + 1 + G
    assert int((out.token_ids == -1).sum()) == G  # the hop's own latent rows only: the inherited ones dropped
    assert torch.equal(out.token_ids[-G:].cpu(), torch.full((G,), -1))
    proto.score._selector = Scores(latent=9.0)  # now they outrank every token row: they win the budget
    out, _, info = proto.hop(agent, DOCS[1], 1, QUESTION, message, list(origins))
    assert int((out.token_ids == -1).sum()) == 2 * G and info["sent"] == 4 + 1 + G


@pytest.mark.parametrize("budget", ["relative", "fixed"])
def test_budget_rule_is_unchanged(agent, budget):
    proto = chain(ratio=4, budget=budget, max_rows=40)
    message, origins, state = second_hop(proto, agent)
    _, eligible, keep = _hop_rows(agent, DOCS[1], 1, message, origins, len(state), G)
    t_old, t_new = len(message), len(state) - len(message) - G
    want = relative_chain_budget(t_old, t_new, 4) if budget == "relative" else fixed_chain_budget(t_old, t_new, 40)
    out, _, info = proto.hop(agent, DOCS[1], 1, QUESTION, message, list(origins))
    assert info["rows"] == len(state) and info["budget"] == want
    assert info["sent"] == len(out) == min(want, int((eligible & ~keep).sum())) + 1 + G


def test_every_hop_sends_at_most_its_budget_plus_first_row_plus_own_latents(agent):
    out = chain(ratio=4).run([agent] * 3, DOCS, agent, QUESTION)
    hops = out.details["hops"]
    assert hops[0]["budget"] == math.ceil(hops[0]["rows"] / 4)
    assert all(h["sent"] <= h["budget"] + 1 + G for h in hops)  # no unbudgeted inherited latent rows
    assert out.details["message_rows"] == hops[-1]["sent"]


def test_a_hops_document_rows_are_the_document_not_the_instruction_before_it(agent):
    """A document that "Read this document." holds ("document.") maps to the rows after the instruction."""
    from latentwire.agent import SLOT

    message, origins, _ = chain(ratio=4).hop(agent, DOCS[0], 0, QUESTION, None, [])
    document = "document."
    text = agent.chat_text(HOP_PROMPT.format(document=document))
    pre, post = agent.slot_ids(text)
    after = text.split(SLOT)[1]
    start = after.index("Read this document.\n\n") + len("Read this document.\n\n")
    offsets = agent.tokenizer(after, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    want = [len(pre) + len(message) + i for i, (a, b) in enumerate(offsets) if a < start + len(document) and b > start]
    n_rows = len(pre) + len(message) + len(post) + G
    row_origin, eligible, _ = _hop_rows(agent, document, 1, message, origins, n_rows, G)
    own = [r for r in range(len(pre) + len(message), len(row_origin)) if row_origin[r] is not None]
    assert own == want and all(row_origin[r][0] == 1 for r in own)
    assert eligible[own].all() and int(eligible[len(pre) + len(message):].sum()) == len(want)

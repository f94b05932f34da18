"""Token alignment between the real bundled tokenizers (SmolLM2, Qwen2.5, Gemma3): tokenizers only, no weights.

Each agent renders the chat with its own template (SmolLM2/Qwen: ChatML with different default system
prompts; Gemma3 base: no template, the plain transcript) and segments it with its own tokenizer.
"""
import itertools

import pytest
import torch
from transformers import AutoTokenizer

from latentwire.agent import Agent
from latentwire.models.zoo import ZOO, build_cache
from latentwire.translate.token_alignment import align, decoded_spans, token_spans

pytestmark = pytest.mark.integration

TEXT = ("Marie Curie (1867-1934) won two Nobel prizes: physics in 1903 and chemistry in 1911. "
        "Her notebooks are still radioactive; visitors to the Bibliothèque nationale sign a waiver.\n"
        "Q: In which year did she win the chemistry prize?  Answer with one number.")
CHATS = {"str": TEXT, "messages": [{"role": "system", "content": "You answer from the notes."},
                                   {"role": "user", "content": TEXT}]}


class TokenizerAgent:
    """The part of an Agent that alignment reads (rendering and tokenising), without model weights."""

    chat_text = Agent.chat_text
    chat_ids = Agent.chat_ids
    encode = Agent.encode
    _vocab_rows = 1 << 62  # no embedding table here: every id the tokenizer gives is accepted
    device = torch.device("cpu")  # where the alignment's index tensors go

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer


@pytest.fixture(scope="module")
def agents():
    out = {}
    for name, entry in ZOO.items():
        if not entry.cached:
            build_cache(name)
        out[name] = TokenizerAgent(AutoTokenizer.from_pretrained(str(entry.cache_dir), local_files_only=True))
    return out


def _content_spans(agent, chat):
    """Token spans of the rendered prompt, and the content's character ranges in it."""
    text = agent.chat_text(chat)
    contents = [TEXT] if isinstance(chat, str) else [m["content"] for m in chat]
    inside = torch.full((len(text),), -1, dtype=torch.int64)  # char -> index in the joined contents
    base = 0
    for c in contents:
        k = text.index(c)
        inside[k:k + len(c)] = torch.arange(base, base + len(c))
        base += len(c)
    return token_spans(agent.tokenizer, text, agent.chat_ids(chat)), inside


@pytest.mark.parametrize("chat", list(CHATS), ids=list(CHATS))
def test_real_tokenizers_align_on_shared_characters(agents, chat):
    chat = CHATS[chat]
    for r_name, s_name in itertools.product(agents, repeat=2):
        r, s = agents[r_name], agents[s_name]
        a = align(r, s, chat)
        r_spans, r_in = _content_spans(r, chat)
        s_spans, s_in = _content_spans(s, chat)
        has_content = torch.tensor([bool((r_in[x:y] >= 0).any()) for x, y in r_spans])
        assert torch.equal(a.mask, has_content), (r_name, s_name)
        idx = a.index[a.mask]
        assert bool(torch.all(idx[1:] >= idx[:-1])), f"{r_name} <- {s_name}: not monotone"
        for t in torch.nonzero(a.mask).flatten().tolist():
            rc = r_in[r_spans[t][0]:r_spans[t][1]]
            sc = s_in[s_spans[int(a.index[t])][0]:s_spans[int(a.index[t])][1]]
            last = int(rc[rc >= 0].max())
            assert last in sc.tolist(), f"{r_name} <- {s_name}: token {t} misses its last content character"
        if r_name == s_name:
            assert torch.equal(idx, torch.nonzero(a.mask).flatten()) and a.num_exact == a.num_aligned
        else:  # mostly word-level agreement on English text; byte pieces and digit runs differ
            assert 0.6 * a.num_aligned < a.num_exact < a.num_aligned, (r_name, s_name, a.num_exact, a.num_aligned)


def test_decoding_reproduces_the_offsets(agents):
    for name, agent in agents.items():
        text, ids = agent.chat_text(TEXT), agent.chat_ids(TEXT)
        assert decoded_spans(agent.tokenizer, text, ids) == token_spans(agent.tokenizer, text, ids), name

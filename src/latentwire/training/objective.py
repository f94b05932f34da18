"""The answer loss: teacher-forced cross-entropy of the gold answer, given a (translated) receiver state."""
from __future__ import annotations

import torch

from ..agent import Agent
from ..state import KVState
from ..models.compat import cache_arg

TURN_END = ("<|im_end|>", "<end_of_turn>", "<|eot_id|>")


def turn_end_id(agent: Agent) -> int:
    """The token that closes an assistant turn in this model's template (else EOS)."""
    tok = agent.tokenizer
    for t in TURN_END:
        tid = tok.convert_tokens_to_ids(t)
        if isinstance(tid, int) and tid != tok.unk_token_id and tid in agent.stop_ids:
            return tid
    return tok.eos_token_id


def answer_ids(agent: Agent, question: str, answer: str) -> tuple[list[int], list[int]]:
    """(prompt ids that follow a full-KV message, answer ids ending with the turn end)."""
    tok = agent.tokenizer
    prompt = agent.kv_prompt_ids(question)
    return prompt, tok(answer, add_special_tokens=False)["input_ids"] + [turn_end_id(agent)]


def answer_loss(agent: Agent, state: KVState, question: str, answer: str) -> torch.Tensor:
    """Mean NLL of the answer tokens after `state` + the question prompt; differentiable w.r.t. the state."""
    prompt, ans = answer_ids(agent, question, answer)
    device = agent.device
    ids = torch.tensor(prompt + ans, dtype=torch.int64, device=device)
    T = len(state)
    agent.geometry.check_same(state.geometry)
    # the translator trains in float32; the frozen receiver reads in its own dtype (the cast passes gradients)
    cache = (state if state.is_compact else state.compact()).to(device, agent.dtype).to_cache()
    out = agent.decoder(input_ids=ids[None], **cache_arg(agent.decoder, cache),
                        position_ids=torch.arange(T, T + len(ids), device=device)[None], use_cache=True)
    hidden = out.last_hidden_state[0, len(prompt) - 1:-1]  # (n_ans, d): each predicts the next answer token
    logits = agent.logits(hidden).float()
    return torch.nn.functional.cross_entropy(logits, ids[len(prompt):])

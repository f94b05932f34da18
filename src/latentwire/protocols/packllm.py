"""PackLLM (output-level fusion, a merge baseline: docs/methods.md#packllm): every agent reads its own
document with the question; their next-token distributions are fused at each step, weighted by how
well each agent's context explains its prompt.

Weights (PackLLM-sim): λ_i = softmax_i(−log PPL_i / τ), with PPL_i the perplexity of agent i's prompt
tokens under agent i (`scope="prompt"`, as in the paper), or of the question tokens alone given the
document (`scope="question"`: when every agent runs the same model, this is what differs with
relevance). Fusion: the next token is argmax_v Σ_i λ_i log p_i(v) — a weighted sum of logits up to a
per-agent constant, as PackLLM fuses logits. Agents must share one tokenizer (same vocabulary), else
GeometryMismatchError. Nothing crosses the wire but tokens; each agent keeps decoding in lockstep.
The first agent's stop tokens end the answer.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ..agent import Agent
from ..clock import now
from ..replies import answer_text, turn_begun
from ..errors import ConfigError, GeometryMismatchError, UnknownNameError
from .base import Outcome, Protocol, register

PACK_PROMPT = "Read this document.\n\n{document}\n\nQuestion: {question}\nAnswer briefly."
SCOPES = ("prompt", "question")


@register
@dataclass
class PackLLM(Protocol):
    """Sends no message: every agent decodes with its own document and their next-token distributions are fused,
    weighted by perplexity. Key parameters: `tau` (temperature), `scope` ("prompt" or "question")."""
    name = "packllm"
    tau: float = 1.0  # softmax temperature over −log PPL
    scope: str = "prompt"  # perplexity of the whole prompt, or of the question tokens alone

    def __post_init__(self):
        super().__post_init__()
        if self.tau <= 0:
            raise ConfigError(f"tau must be > 0, got {self.tau}")
        if self.scope not in SCOPES:
            raise UnknownNameError("perplexity scope", self.scope, SCOPES)

    def weights(self, nll: Sequence[torch.Tensor]) -> torch.Tensor:
        """(M,) float64 fusion weights from each agent's per-token NLL over the scored tokens, on the first
        agent's device (the agents' NLLs may live on different devices)."""
        if not len(nll):
            raise ValueError("packllm weights need at least one agent's NLL")
        log_ppl = torch.tensor([float(x.double().mean()) if len(x) else 0.0 for x in nll], dtype=torch.float64,
                               device=nll[0].device)
        return torch.softmax(-log_ppl / self.tau, dim=0)

    def run(self, senders: Sequence[Agent], documents: Sequence[str], receiver: Agent, question: str) -> Outcome:
        pairs = self._pair(senders, documents)
        if not pairs:
            raise ValueError("packllm needs at least one agent with a document")
        vocab = pairs[0][0].tokenizer.get_vocab()
        for agent, _ in pairs[1:]:
            if agent.tokenizer.get_vocab() != vocab:
                raise GeometryMismatchError(f"packllm fuses next-token distributions: {agent.model_name} and "
                                            f"{pairs[0][0].model_name} do not share a tokenizer")
        t0 = now()  # wall clock over the whole protocol
        streams, nll, seconds = [], [], []
        for agent, doc in pairs:
            t = now(agent.device)
            prompt = PACK_PROMPT.format(document=doc, question=question)
            streams.append(agent.stream(prompt, self.max_new_tokens))
            nll.append(streams[-1].prompt_nll if self.scope == "prompt"
                       else _question_nll(agent, streams[-1], prompt, question))
            seconds.append(now(agent.device) - t)
        w = self.weights(nll)
        first = pairs[0][0]
        t1 = now(first.device)
        stop, turn, out, device = first.stop_ids, first.turn_marker, [], streams[0].logprobs.device
        by_token = False
        for i in range(self.max_new_tokens):
            fused = sum(float(wi) * s.logprobs.to(device) for wi, s in zip(w.tolist(), streams))  # (V,)
            tok = int(fused.argmax())
            if (by_token := tok in stop) or (turn and turn_begun(first.tokenizer, out + [tok], turn)):
                break  # a stop token, or a templateless model starting the next turn: as Agent
            out.append(tok)
            if i + 1 < self.max_new_tokens:
                for s in streams:
                    s.push(tok)
        decode = now(*(a.device for a, _ in pairs)) - t1
        text = answer_text(first.tokenizer, out, None if by_token else turn)
        context = max(s.position for s in streams)
        # Every agent reads in parallel, then all decode in lockstep: the slowest read, then the decode.
        return Outcome(self.name, text, 0, context, tuple(seconds), decode,
                       {"weights": [round(float(x), 6) for x in w], "tokens": len(out), "wall_s": now() - t0})


def _question_nll(agent: Agent, stream, prompt: str, question: str) -> torch.Tensor:
    """NLL of the question's own tokens inside the rendered prompt (conditioned on the document)."""
    text = agent.chat_text(prompt)
    start = text.rfind(question)
    offsets = agent.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    rows = [k for k, (a, b) in enumerate(offsets) if k > 0 and a < start + len(question) and b > start]
    index = torch.tensor(rows, dtype=torch.int64, device=stream.prompt_nll.device) - 1
    return stream.prompt_nll[index]  # nll[k - 1] scores token k

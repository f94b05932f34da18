"""CacheBack along a chain (docs/methods.md#cacheback-chain): hop i re-prefills the rows hop i-1 sent, reads its own new
document after them, thinks, scores the whole state against the receiver's query and sends on.

Budgets: relative B_i = T_old + ceil(T_new / r), or fixed B_i = min(B_max, T_old + T_new), where T_old
is the number of inherited rows and T_new the hop's own new rows. Inherited rows, token and latent alike,
compete with the new document rows (any of them may be dropped); only the hop state's first row and the
hop's own G latent rows are always kept, so each hop sends at most B_i + 1 + G rows. Every row keeps its
origin (which document, which characters), so evidence recall is measured on the final message.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from ..agent import SLOT, Agent
from ..clock import now
from ..errors import ConfigError
from ..message import Rows
from ..select import always_kept, fanin_budget, select_rows
from .base import SENDER_PROMPT, Outcome, register
from .cacheback import CacheBack
from .stages import Chain, Stage, flat_keywords
from .documents import chat_document, document_rows, token_document_spans

HOP_PROMPT = "Notes from the previous agent:\n" + SLOT + "\n\n" + SENDER_PROMPT
Origin = tuple[int, tuple[int, int]] | None  # (document index, character span) of a row, None for other rows


@register
@flat_keywords
@dataclass
class CacheBackChain(CacheBack):
    """CacheBack hop to hop: each hop re-prefills the rows the previous hop sent, reads its own document and
    sends on selected rows. Key parameters: `budget` (chain('relative') or chain('fixed', max_rows=...); flat:
    budget='fixed', max_rows=), `ratio`, `latent_steps`."""
    name = "cacheback_chain"
    budget: Stage = field(default_factory=Chain)  # chain('relative') or chain('fixed', max_rows=512)

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.budget, Chain):
            raise ConfigError(f"cacheback_chain sets each hop's budget itself: budget=chain(...), not {self.budget!r}")
        if self.units.takes_context or self.units.fill != "cut":
            raise ConfigError("cacheback_chain sets each hop's budget itself and spends it exactly: context= and "
                              "fill= are for fan-in")
        if self.encoding.attached:
            raise ConfigError(f"cacheback_chain re-prefills each hop's rows: encoding 'rows' or 'token_ids', not "
                              f"{self.encoding!r}")
        if self.score.reads_text:
            raise ConfigError("cacheback_chain scores each hop's state with a state selector: text selectors and "
                              "fuse= are for fan-in (cacheback, cacheback_x, retrieval)")

    def hop(self, sender: Agent, document: str, index: int, question: str, message: Rows | None,
            origins: list[Origin]) -> tuple[Rows, list[Origin], dict]:
        """One hop: read (message +) document, select, encode. Returns the rows to send and their origins."""
        t0 = now(sender.device)
        if message is None:  # the first hop reads as a fan-in sender does (shared inside `shared_reads()`)
            r = self.sender_read(sender, document)
            state, t0 = r.state, now(sender.device) - r.seconds
            per_row, eligible = document_rows(sender, document, len(state))
            row_origin = [(index, s) if s else None for s in per_row]
            budget, keep = fanin_budget(len(state), self.ratio), always_kept(state)
        else:
            state = sender.think(sender.prefill(HOP_PROMPT.format(document=document), rows=message),
                                 self.latent_steps, self.latent_mode)
            row_origin, eligible, keep = _hop_rows(sender, document, index, message, origins, len(state),
                                                   self.latent_steps)
            t_old, t_new = len(message), len(state) - len(message) - self.latent_steps
            budget = self.budget.hop(t_old, t_new)
        t1 = now(sender.device)
        scores = self.scores(sender, state, question)  # calibrated and probed as a fan-in sender's
        rows = select_rows(scores, budget, keep, self.span, eligible)  # fixed spans: a hop's rows are not sentences
        out = sender.rows(state.select(rows))
        t2 = now(sender.device) - self.score.rerun_seconds(None)
        info = {"read_s": t1 - t0, "select_s": t2 - t1, "rows": len(state), "budget": budget, "sent": len(rows),
                "shared_read": message is None and r.shared}
        return out, [row_origin[r] if r < len(row_origin) else None for r in rows.tolist()], info

    def run(self, senders: Sequence[Agent], documents: Sequence[str], receiver: Agent, question: str) -> Outcome:
        message, origins, seconds, hops = None, [], [], []
        for i, (sender, doc) in enumerate(self._pair(senders, documents)):
            t0 = now(sender.device)
            message, origins, info = self.hop(sender, doc, i, question, message, origins)
            # a shared first read is charged its measured time, not the lookup's
            seconds.append(now(sender.device) - t0 + (info["read_s"] if info["shared_read"] else 0.0))
            hops.append(info)
        nbytes = self.encoding.cost([message], message)[0]
        reply = receiver.answer(question, message=message, max_new_tokens=self.max_new_tokens)
        kept = tuple(tuple(o[1] for o in origins if o and o[0] == d) for d in range(len(documents)))
        # Hops run one after another: the chain's critical path is their sum, reported as one "sender".
        return Outcome(self.name, reply.text, nbytes, reply.context, (sum(seconds),), reply.seconds,
                       {"hops": hops, "message_rows": len(message), "rows_bytes": message.nbytes,
                        "token_id_bytes": message.token_id_nbytes}, kept_spans=kept)


def _hop_rows(sender: Agent, document: str, index: int, message: Rows, origins: list[Origin], n_rows: int,
              latent_steps: int) -> tuple[list[Origin], torch.Tensor, torch.Tensor]:
    """Origins, eligibility and always-kept rows of a hop state: [template | inherited | template + doc | G latent].

    Every inherited row (token or latent) and every document row is eligible; the first row and the hop's
    own `latent_steps` latent rows (the state's last rows) are always kept.
    """
    text, start = chat_document(sender, HOP_PROMPT.format(document=document), document)
    pre, _ = sender.slot_ids(text)  # the rows after the slot are tokenised from the text after it
    cut = text.index(SLOT) + len(SLOT)
    doc_origin: list[Origin] = [(index, s) if s else None
                                for s in token_document_spans(sender, text[cut:], document, start - cut)]
    row_origin = [None] * len(pre) + list(origins) + doc_origin
    device = sender.device  # with the sender's state (the message may come from another device)
    eligible = torch.zeros(n_rows, dtype=torch.bool, device=device)  # (T,)
    eligible[len(pre):len(pre) + len(message)] = True  # inherited rows compete, latent ones too
    eligible[len(pre) + len(message):len(row_origin)] = torch.tensor([o is not None for o in doc_origin],
                                                                     dtype=torch.bool, device=device)
    keep = torch.zeros(n_rows, dtype=torch.bool, device=device)  # (T,)
    keep[0] = True  # a hop state is never empty: it starts with the template
    keep[n_rows - latent_steps:] = True  # this hop's own latent rows
    return row_origin, eligible, keep

"""Token alignment between two agents that read the same chat with different tokenizers and templates.

C2C (docs/methods.md#c2c) fuses the sharer's K/V row of a token into the receiver's row of the *same* text, so
every receiver prompt token needs the sharer token it corresponds to. Both agents render the chat
with their own template; only the message contents are shared text (template markup, system
prompts and BOS differ from model to model and are masked out).

The alignment goes through characters of the shared content:

1. Each rendered prompt is located in content coordinates: where each message's content starts in
   that agent's rendered text (found by rendering the chat with sentinels in place of the contents,
   so a default system prompt that happens to contain the content cannot be mistaken for it; a
   template that trims contents is handled).
2. Each prompt token gets its character span in the rendered text: the fast tokenizer's offsets
   (checked to reproduce `agent.chat_ids`), else the characters each token adds when decoded after
   the tokens before it (decode a token, measure what it contributes to the text).
3. **Rule.** A receiver token aligns to the sharer token that covers the receiver token's *last*
   content character (the latest character of the shared content inside the token's span that the
   sharer's prompt also holds). That sharer token has read everything the receiver token has read
   (and possibly a little more), which is the causal counterpart of a K/V row. When several tokens
   of one side cover that character (a byte-level tokenizer splits a multi-byte character into
   pieces that all report the character's span), the pieces are paired counting from the end: the
   piece that completes the character maps to the sharer piece that completes it.
   Receiver tokens with no shared content character (template, BOS, system prompt) are masked out.

On identical tokenizers and templates the alignment is the identity on every content token.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Union

import torch

from ..errors import ConfigError

Chat = Union[str, Sequence[dict]]
_SENTINEL = "\ue000{}\ue001"  # private-use characters: no template or tokenizer gives them meaning


@dataclass(frozen=True, eq=False)
class TokenAlignment:
    """Receiver prompt token -> sharer prompt token.

    index: (T_r,) int64, the sharer row (index into the sharer's `chat_ids(chat)`, i.e. its prefill
        state's rows) each receiver row aligns to; -1 where `mask` is False.
    mask: (T_r,) bool, True where the receiver token holds shared content and has an aligned sharer token.
    exact: (T_r,) bool, True where both tokens cover exactly the same characters, split into as many
        byte pieces on both sides (a 1:1 match of the two segmentations there).
    receiver_ids / sharer_ids: the two prompts' token ids (to check the states were prefilled from them).
    """

    index: torch.Tensor
    mask: torch.Tensor
    exact: torch.Tensor
    receiver_ids: torch.Tensor
    sharer_ids: torch.Tensor

    def __len__(self) -> int:
        return self.index.shape[0]

    @property
    def num_aligned(self) -> int:
        return int(self.mask.sum())

    @property
    def num_exact(self) -> int:
        return int(self.exact.sum())


def align(receiver, sharer, chat: Chat) -> TokenAlignment:
    """Align the receiver's prompt tokens for `chat` to the sharer's (see the module docstring for the rule).

    `receiver` and `sharer` are agents (anything with `tokenizer`, `chat_text(chat)`, `chat_ids(chat)` and,
    for the receiver, `device`: the alignment's tensors index the receiver's state and live with it).
    """
    messages = [{"role": "user", "content": chat}] if isinstance(chat, str) else [dict(m) for m in chat]
    contents = [str(m.get("content", "")) for m in messages]
    base = [0]
    for c in contents:
        base.append(base[-1] + len(c))
    r_text, r_ids = receiver.chat_text(chat), list(receiver.chat_ids(chat))
    s_text, s_ids = sharer.chat_text(chat), list(sharer.chat_ids(chat))
    r_cc = _content_coords(receiver, messages, contents, base, r_text)  # receiver char -> content index / -1
    s_cc = _content_coords(sharer, messages, contents, base, s_text)
    s_at = [-1] * base[-1]  # content index -> sharer char
    for p, g in enumerate(s_cc):
        if g >= 0:
            s_at[g] = p
    r_spans = token_spans(receiver.tokenizer, r_text, r_ids)
    s_spans = token_spans(sharer.tokenizer, s_text, s_ids)
    r_first, r_last = _covering(r_spans, len(r_text), fill_gaps=False)
    s_first, s_last = _covering(s_spans, len(s_text), fill_gaps=True)

    index = [-1] * len(r_ids)  # built on the host, one tensor per field at the end
    for t, (a, b) in enumerate(r_spans):
        for c in range(b - 1, a - 1, -1):  # the token's last content character the sharer also holds
            g = r_cc[c]
            if g < 0 or s_at[g] < 0:
                continue
            p = s_at[g]
            if s_first[p] < 0:
                continue
            after = r_last[c] - t  # receiver pieces after this one on the same character
            index[t] = max(s_first[p], s_last[p] - after)
            break
    exact = [False] * len(r_ids)
    for t, u in enumerate(index):
        if u < 0:
            continue
        (a, b), (sa, sb) = r_spans[t], s_spans[u]
        exact[t] = ([r_cc[c] for c in range(a, b)] == [s_cc[c] for c in range(sa, sb)]
                    and [r_last[c] - r_first[c] for c in range(a, b)]  # byte pieces per character
                    == [s_last[c] - s_first[c] for c in range(sa, sb)])
    device = receiver.device
    index_t = torch.tensor(index, dtype=torch.int64, device=device)
    return TokenAlignment(index_t, index_t >= 0, torch.tensor(exact, dtype=torch.bool, device=device),
                          torch.tensor(r_ids, dtype=torch.int64, device=device),
                          torch.tensor(s_ids, dtype=torch.int64, device=device))


# -- content location ------------------------------------------------------------------------------
def _content_coords(agent, messages: list[dict], contents: list[str], base: list[int], text: str) -> list[int]:
    """For every character of `text`: its index in the concatenated message contents, or -1 (template)."""
    cc = [-1] * len(text)
    for i, (start, offset, length) in _locate(agent, messages, contents, text).items():
        for j in range(length):
            cc[start + j] = base[i] + offset + j
    return cc


def _locate(agent, messages, contents, text) -> dict[int, tuple[int, int, int]]:
    """Message i -> (start in text, start in content, length) of its content as rendered by this agent."""
    try:
        marked = agent.chat_text([m | {"content": _SENTINEL.format(i)} for i, m in enumerate(messages)])
        found = _match_sentinels(marked, contents, text)
    except Exception:  # a template that refuses the sentinel chat: fall back to searching
        found = None
    if found is not None:
        return found
    out, pos = {}, 0
    for i, c in enumerate(contents):  # in order: each content after the previous one
        for variant, offset in _variants(c):
            k = text.find(variant, pos) if variant else -1
            if k >= 0:
                out[i] = (k, offset, len(variant))
                pos = k + len(variant)
                break
    return out


def _variants(content: str) -> list[tuple[str, int]]:
    """The content as a template may render it: verbatim, or trimmed (with its offset in the content)."""
    lead = len(content) - len(content.lstrip())
    out = [(content, 0), (content.strip(), lead), (content.lstrip(), lead), (content.rstrip(), 0)]
    seen, uniq = set(), []
    for v, o in out:
        if v not in seen:
            seen.add(v)
            uniq.append((v, o))
    return uniq


def _match_sentinels(marked: str, contents: list[str], text: str) -> dict | None:
    """Read content positions off the sentinel rendering; None unless the real text is exactly that
    rendering with each sentinel replaced by its (possibly trimmed) content."""
    pieces, order, rest = [], [], marked
    while True:
        best = None
        for i in range(len(contents)):
            k = rest.find(_SENTINEL.format(i))
            if k >= 0 and (best is None or k < best[0]):
                best = (k, i)
        if best is None:
            pieces.append(rest)
            break
        k, i = best
        pieces.append(rest[:k])
        order.append(i)
        rest = rest[k + len(_SENTINEL.format(i)):]
    if len(set(order)) != len(order):
        return None  # a template that repeats a content: ambiguous
    out, pos = {}, 0
    if not text.startswith(pieces[0]):
        return None
    pos = len(pieces[0])
    for n, i in enumerate(order):
        nxt = pieces[n + 1]
        for variant, offset in _variants(contents[i]):
            if text.startswith(variant + nxt, pos) and (n + 1 < len(order) or pos + len(variant + nxt) == len(text)):
                out[i] = (pos, offset, len(variant))
                pos += len(variant) + len(nxt)
                break
        else:
            return None
    return out


# -- token character spans ------------------------------------------------------------------------
def token_spans(tokenizer, text: str, ids: list[int]) -> list[tuple[int, int]]:
    """Character span [a, b) of every token of `ids` (the tokenisation of `text`) in `text`.

    Fast tokenizers: their offsets, when re-tokenising `text` with them reproduces `ids` and the
    offsets are ordered. Otherwise each token's span is what it adds to the decoded text after the
    tokens before it (a token that adds nothing, e.g. a middle byte of a character, gets the span of
    the character it is part of); the decoded tokens must reproduce `text`.
    """
    if getattr(tokenizer, "is_fast", False):
        try:
            enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            spans = [tuple(map(int, o)) for o in enc["offset_mapping"]]
            if list(enc["input_ids"]) == list(ids) and _ordered(spans, len(text)):
                return spans
        except (NotImplementedError, TypeError, ValueError):
            pass
    return decoded_spans(tokenizer, text, ids)


def decoded_spans(tokenizer, text: str, ids: list[int], window: int = 8) -> list[tuple[int, int]]:
    """Spans by decoding: token t adds decode(ids[t-w:t+1]) minus decode(ids[t-w:t]) characters."""
    def dec(x):
        return tokenizer.decode(x, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    whole = dec(ids)
    if whole != text:
        raise ConfigError(f"{type(tokenizer).__name__}: decoding the prompt tokens does not reproduce the "
                         f"prompt text, and the tokenizer gives no usable offsets: cannot align its tokens")
    spans, end = [], 0
    for t in range(len(ids)):
        lo = max(0, t - window)
        # Decoding a window (not one token alone) keeps sentencepiece word-initial spaces and lets a
        # character split over byte tokens be counted once it is complete.
        added = len(dec(ids[lo:t + 1])) - len(dec(ids[lo:t])) if t > lo else len(dec(ids[t:t + 1]))
        added = max(added, 0)
        spans.append((end, end + added) if added else (max(end - 1, 0), end))
        end += added
    if end != len(text):
        raise ConfigError(f"{type(tokenizer).__name__}: token-by-token decoding covers {end} of {len(text)} "
                         "characters: cannot align its tokens")
    return spans


def _ordered(spans: list[tuple[int, int]], n: int) -> bool:
    prev = 0
    for a, b in spans:
        if not (0 <= a <= b <= n) or b < prev:
            return False
        prev = b
    return True


def _covering(spans: list[tuple[int, int]], n: int, fill_gaps: bool) -> tuple[list[int], list[int]]:
    """Per character: the first and last token whose span covers it (-1: none).

    With `fill_gaps`, a character no token covers (tokenizers that trim whitespace off offsets)
    belongs to the next token that starts after it.
    """
    first, last = [-1] * n, [-1] * n
    for t, (a, b) in enumerate(spans):
        for c in range(a, b):
            if first[c] < 0:
                first[c] = t
            last[c] = t
    if fill_gaps:
        nxt = -1
        starts = sorted((a, t) for t, (a, b) in enumerate(spans) if b > a)
        j = len(starts) - 1
        for c in range(n - 1, -1, -1):
            while j >= 0 and starts[j][0] > c:
                nxt = starts[j][1]
                j -= 1
            if first[c] < 0 and nxt >= 0:
                first[c] = last[c] = nxt
    return first, last

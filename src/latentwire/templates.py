"""Chat templates: how an agent turns a conversation into its model's text, where a message sits in the receiver's
prompt, and how an answer ends. Pure functions of a tokenizer (and, for stop tokens, the model's generation config);
`Agent` holds the cached results.

    text = chat_text(tokenizer, "Who leads it?")           # the model's own template, generation prompt open
    tail = continuation_text(tokenizer, "And the city?")   # close an open assistant turn, ask a new question
    pre, post = split_slot(chat_text(tokenizer, MESSAGE_PROMPT.format(question=q)))  # text around the message
"""
from __future__ import annotations

from typing import Sequence, Union

from .errors import StateFormatError

Chat = Union[str, Sequence[dict]]
SLOT = "\u2063MESSAGE\u2063"  # placeholder for a message inside the receiver's prompt
MESSAGE_PROMPT = "Notes from other agents:\n" + SLOT + "\n\nQuestion: {question}\nAnswer briefly."
KV_PROMPT = "Using the information above, answer briefly: {question}"
STOP_TOKENS = ("<|im_end|>", "<end_of_turn>", "<|endoftext|>")  # end-of-turn tokens some templates use besides EOS


def chat_text(tokenizer, chat: Chat, add_generation_prompt: bool = True) -> str:
    """`chat` (a user turn's text, or messages) in the model's chat template; base models without one read a plain
    transcript ("User: ...\\n\\nAssistant:"), BOS first when the model has one."""
    messages = [{"role": "user", "content": chat}] if isinstance(chat, str) else list(chat)
    if tokenizer.chat_template:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    text = (tokenizer.bos_token or "") + "".join(f"{m['role'].capitalize()}: {m['content']}\n\n" for m in messages)
    return text + ("Assistant:" if add_generation_prompt else "")


def continuation_text(tokenizer, question: str) -> str:
    """Template text that closes the open assistant turn a message ends in, then asks `question`.

    A full-KV message is another agent's prefill (ending at its generation prompt) plus latent steps, i.e. an open
    assistant turn. Rendering a two-turn chat with sentinels and keeping the tail gives this model's own turn-close
    and next-turn markup, with no second system prompt/BOS."""
    a, b = "\x00A\x00", "\x00B\x00"
    head = [{"role": "user", "content": a}, {"role": "assistant", "content": b}]
    before = chat_text(tokenizer, head, add_generation_prompt=False)
    full = chat_text(tokenizer, head + [{"role": "user", "content": question}])
    if not full.startswith(before) or b not in before:
        raise StateFormatError("this chat template cannot continue a conversation; pass the question as text")
    return before[before.index(b) + len(b):] + full[len(before):]


def split_slot(text: str) -> tuple[str, str]:
    """The text before and after the one `SLOT` in a rendered prompt."""
    if text.count(SLOT) != 1:
        raise StateFormatError(f"the prompt must hold the message slot exactly once (found {text.count(SLOT)})")
    before, after = text.split(SLOT)
    return before, after


def stop_ids(model, tokenizer) -> set[int]:
    """Token ids that end an answer: EOS (the tokenizer's and the generation config's) and the end-of-turn tokens
    the vocabulary holds as themselves."""
    ids = {tokenizer.eos_token_id}
    eos = getattr(model.generation_config, "eos_token_id", None)
    ids |= set(eos) if isinstance(eos, (list, tuple)) else {eos}
    for tok in STOP_TOKENS:
        tid = tokenizer.convert_tokens_to_ids(tok)
        if isinstance(tid, int) and tokenizer.convert_ids_to_tokens(tid) == tok:  # the token itself, even when it
            ids.add(tid)  # is also the unknown token (SmolLM2's <|endoftext|>); not an unknown's id
    return {i for i in ids if i is not None}


def turn_marker(tokenizer) -> str | None:
    """A templateless model reads a plain transcript (`chat_text`): its answer ends where it starts the next turn
    ("User:"), which a base model does in place of a stop token. None with a chat template."""
    return None if tokenizer.chat_template else "User:"

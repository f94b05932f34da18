"""An agent: one frozen causal LM + tokenizer + chat template, with exact KV state in and out.

    state = agent.prefill([{"role": "user", "content": doc}])   # KVState, T = H rows
    state = agent.think(state, steps=40)                         # + G latent rows
    reply = agent.answer("Who ...?", message=state)              # full-KV message before the prompt

Every call appends a `CallRecord` (wall time, rows in, tokens out, context) to `agent.calls`.
"""
from __future__ import annotations

import itertools
import logging
from functools import cached_property
from typing import Union

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from . import templates
from .templates import KV_PROMPT, MESSAGE_PROMPT, SLOT, Chat  # noqa: F401  (the agent's API: prompts and the slot)
from .clock import now
from .errors import (ConfigError, ContextOverflowError, StateFormatError, TokenizerMismatchError, UnknownNameError,
                     UnknownParameterError)
from .replies import Answer, CallRecord, Stream, answer_text, turn_begun  # noqa: F401  (Answer...: the agent's API)
from .message import Rows
from .models import cache_arg, load, tokenizer_fingerprint
from .blend import blended_cache, check_blend, recompute_count
from .rope import decoder_of
from .state import Geometry, KVState

_UIDS = itertools.count()

log = logging.getLogger("latentwire")

Message = Union[None, str, KVState, Rows]
LATENT_MODES = ("rescale", "realign")


def _check_window_arg(context_window) -> None:
    """ConfigError unless `context_window` is None (the model's own) or a whole number of positions ≥ 1."""
    if context_window is not None and (isinstance(context_window, bool) or not isinstance(context_window, int)
                                       or context_window < 1):
        raise ConfigError(f"context_window must be a whole number of positions ≥ 1 (None: the model's own), got "
                          f"{context_window!r}")


class Agent:
    def __init__(self, model, tokenizer, model_name: str, context_window: int | None = None):
        _check_window_arg(context_window)
        self.model, self.tokenizer, self.model_name = model.eval(), tokenizer, model_name
        self.decoder = decoder_of(model)  # the text decoder stack: model.model, or a multimodal model's language model
        config = model.config.get_text_config(decoder=True)
        self.context_window = int(config.max_position_embeddings) if context_window is None else context_window
        self.calls: list[CallRecord] = []
        self.uid = next(_UIDS)  # names this agent in memo keys: unlike id(), never reused by a later agent

    @classmethod
    def from_pretrained(cls, name_or_path: str = "smollm2-135m", device: str | torch.device | None = None,
                        dtype: str | torch.dtype | None = None, **kw) -> "Agent":
        """A bundled name, a local HF folder or a hub id; device/dtype default as `placement.resolve`. `kw`: the
        Agent's own arguments (`context_window`), checked before any model loads."""
        if unknown := sorted(set(kw) - {"context_window"}):
            raise UnknownParameterError("function", "Agent.from_pretrained", unknown[0],
                                        ["name_or_path", "device", "dtype", "context_window"])
        _check_window_arg(kw.get("context_window"))
        model, tokenizer, name = load(name_or_path, dtype=dtype, device=device)
        return cls(model, tokenizer, name, **kw)

    @property
    def device(self) -> torch.device:
        return self.model.get_input_embeddings().weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.get_input_embeddings().weight.dtype

    def new_cache(self, full_history: bool = False) -> DynamicCache:
        """An empty cache for this model, built on its device (transformers' sliding-window layers make a
        tensor at construction: on the default device otherwise). With `full_history`, sliding layers keep
        every row too (plain layers; the model's mask still applies the window, so its outputs are the same)."""
        if full_history:
            cache = DynamicCache()
            cache.layers = [DynamicLayer() for _ in self.geometry.layer_types]
            return cache
        with torch.device(self.device):
            return DynamicCache(config=self.model.config)

    def ids(self, ids) -> torch.Tensor:
        """Token ids as an int64 tensor on this agent's device, for the model: a list holding an id past the model's
        embeddings is a TokenizerMismatchError here, not an IndexError (or a CUDA device assert) inside the model."""
        if isinstance(ids, (list, tuple)) and ids and (low := min(ids)) < 0:
            raise TokenizerMismatchError(f"token id {low} is negative: {self.model_name} embeds ids 0 to "
                                         f"{self._vocab_rows - 1}")
        if isinstance(ids, (list, tuple)) and ids and (top := max(ids)) >= self._vocab_rows:
            raise TokenizerMismatchError(
                f"{self.model_name}'s tokenizer gives id {top} ({self.tokenizer.convert_ids_to_tokens(top)!r}) but the "
                f"model embeds {self._vocab_rows} tokens: that text cannot be read by this model")
        return torch.as_tensor(ids, dtype=torch.int64, device=self.device)

    @cached_property
    def geometry(self) -> Geometry:
        return Geometry.from_model(self.model, self.model_name, tokenizer_fingerprint(self.tokenizer))

    # -- tokens and embeddings ---------------------------------------------------------------
    def chat_ids(self, chat: Chat, add_generation_prompt: bool = True) -> list[int]:
        return self.encode(self.chat_text(chat, add_generation_prompt))

    def encode(self, text: str) -> list[int]:
        """`text`'s token ids, no special tokens added (checked against the model's embeddings when they reach it:
        `ids`)."""
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    @cached_property
    def _vocab_rows(self) -> int:
        return self.model.get_input_embeddings().num_embeddings

    def chat_text(self, chat: Chat, add_generation_prompt: bool = True) -> str:
        """`chat` in this model's chat template (a plain transcript without one: `templates.chat_text`)."""
        return templates.chat_text(self.tokenizer, chat, add_generation_prompt)

    @torch.no_grad()
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Input embeddings exactly as the model computes them (Gemma's √d scale included)."""
        return self.model.get_input_embeddings()(self.ids(ids))

    def _input_matrix(self) -> torch.Tensor:  # (V, d): effective input embeddings of every token
        """A fresh copy (not kept: 0.5-0.7 GB in fp32 for the bundled Qwen and Gemma); its users keep their result."""
        emb = self.model.get_input_embeddings()
        scale = getattr(emb, "embed_scale", None)  # Gemma: √d, a buffer on the model's device
        return emb.weight.detach() * (1.0 if scale is None else scale.to(emb.weight.dtype))

    @cached_property
    def mean_embedding_norm(self) -> float:
        return float(self._input_matrix().norm(dim=-1).mean())

    @cached_property
    def realign_matrix(self) -> torch.Tensor:
        """LatentMAS W_a: ridge least squares from the output space to the input space, W_out W_a ≈ W_in."""
        w_out = self.model.get_output_embeddings().weight.detach().double()  # (V, d)
        w_in = self._input_matrix()
        gram = w_out.T @ w_out
        ridge = 1e-5 * gram.diagonal().mean()
        return torch.linalg.solve(gram + ridge * torch.eye(gram.shape[0], dtype=gram.dtype, device=gram.device),
                                  w_out.T @ w_in.double()).to(w_in.dtype)  # (d, d)

    def latent_vector(self, hidden: torch.Tensor, mode: str = "rescale") -> torch.Tensor:
        """Map a last-layer hidden state (d,) to the next input embedding (d,).

        rescale (CacheBack): h scaled to the mean token-embedding norm.
        realign (LatentMAS): h @ W_a, then scaled to that same norm.
        """
        if mode not in LATENT_MODES:
            raise UnknownNameError("latent mode", mode, LATENT_MODES)
        v = hidden @ self.realign_matrix if mode == "realign" else hidden
        return v * (self.mean_embedding_norm / v.norm().clamp_min(1e-12))

    # -- forward ----------------------------------------------------------------------------
    def _forward(self, cache: DynamicCache, start: int, ids=None, embeds=None, positions: torch.Tensor | None = None,
                 mask=None) -> torch.Tensor:
        """Run n new rows at positions start..start+n-1 (or at `positions`, (n,), with a prepared attention `mask`)
        through the model, appended to `cache`; returns (n, d) final hidden."""
        n = (ids if ids is not None else embeds).shape[-2 if embeds is not None else -1]
        pos = torch.arange(start, start + n, device=self.device) if positions is None else positions
        extra = {} if mask is None else {"attention_mask": mask}
        out = self.decoder(input_ids=None if ids is None else self.ids(ids).reshape(1, -1),
                           inputs_embeds=None if embeds is None else embeds.reshape(1, n, -1),
                           **cache_arg(self.decoder, cache), position_ids=pos[None], use_cache=True, **extra)
        return out.last_hidden_state[0]


    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The model's next-token logits from final hidden states, as its own head computes them: Granite's and
        Cohere's logit scales and Gemma's soft-capping included."""
        config = self.model.config.get_text_config(decoder=True)
        logits = self.model.lm_head(hidden)
        scale = getattr(config, "logits_scaling", None)  # Granite divides its logits by this
        logits = logits / scale if scale else logits
        mult = getattr(config, "logit_scale", None)  # Cohere multiplies them by this
        logits = logits * mult if mult else logits
        cap = getattr(config, "final_logit_softcapping", None)
        return torch.tanh(logits / cap) * cap if cap else logits

    def check_window(self, **parts: int) -> None:
        """ContextOverflowError, naming each part, unless the parts (rows of a state, a prompt, the tokens to
        decode, ...) fit this model's context window together; callers check before any compute."""
        needed = sum(parts.values())
        if needed > self.context_window:
            raise ContextOverflowError(needed, self.context_window, parts)

    def _clock(self) -> float:
        """Seconds, after this agent's device has finished the work queued so far (`clock.now`)."""
        return now(self.device)

    def _record(self, op, t0, rows_in, tokens_out, context) -> None:
        self.calls.append(CallRecord(op, self._clock() - t0, rows_in, tokens_out, context))

    # -- the three verbs --------------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, chat: Chat, add_generation_prompt: bool = True, rows: Rows | None = None,
                full_history: bool = False) -> KVState:
        """Prefill a chat into a fresh state. With `rows`, the chat text holds `SLOT` once and the received
        rows are re-prefilled there (a chain hop reading the previous hop's message with its own input).
        With `full_history`, sliding-window layers keep every row's K/V (what a sender that ships selected
        rows' K/V needs); the state is otherwise the same."""
        t0 = self._clock()
        if rows is None:
            ids = self.ids(self.chat_ids(chat, add_generation_prompt))
            inputs, latents = {"ids": ids}, None
        else:
            pre, post = self.slot_ids(self.chat_text(chat, add_generation_prompt))
            self._check_rows(rows)
            row_ids = rows.token_ids.to(self.device)
            ids = torch.cat([self.ids(pre), row_ids, self.ids(post)])
            embeds = torch.cat([self.embed(pre), rows.embeds.to(self.device, self.dtype), self.embed(post)])
            inputs, latents = {"embeds": embeds}, embeds[len(pre):len(pre) + len(row_ids)][row_ids == -1]
        self.check_window(prompt=len(ids))
        cache = self.new_cache(full_history)
        hidden = self._forward(cache, 0, **inputs)
        state = KVState.from_cache(cache, self.geometry, ids, latents, last_hidden=hidden[-1].clone())
        self._record("prefill", t0, len(ids), 0, len(state))
        return state

    @torch.inference_mode()
    def think(self, state: KVState, steps: int, mode: str = "rescale", full_history: bool = False) -> KVState:
        """Run `steps` latent steps: the last hidden state, mapped back to the input space, is the next input.
        With `full_history` (the state must hold every row on its sliding layers) the latent rows keep theirs too;
        with no steps the state is returned as it is."""
        if steps < 0:
            raise ValueError(f"latent steps must be ≥ 0, got {steps}")
        if mode not in LATENT_MODES:
            raise UnknownNameError("latent mode", mode, LATENT_MODES)
        t0 = self._clock()
        if steps == 0:  # explicit: the message is then the prefill state alone, never "no message"
            log.info("think(steps=0): no latent steps; the state (%d rows) is sent as prefilled", len(state))
            self._record("think", t0, 0, 0, len(state))
            return state
        if state.last_hidden is None:
            raise StateFormatError("state has no last_hidden (it was selected, concatenated or re-rotated "
                                   "unevenly); latent steps continue only from a prefill/think state")
        self.geometry.check_same(state.geometry)
        self.check_window(state=len(state), latent_steps=steps)
        cache, hidden, latents = state.compact().to_cache(full_history), state.last_hidden, []
        for i in range(steps):
            e = self.latent_vector(hidden, mode)  # (d,)
            hidden = self._forward(cache, len(state) + i, embeds=e[None])[-1]
            latents.append(e)
        token_ids = torch.cat([state.token_ids, torch.full((steps,), -1, dtype=torch.int64, device=self.device)])
        out = KVState.from_cache(cache, self.geometry, token_ids, torch.cat([state.latents, torch.stack(latents)]),
                                 last_hidden=hidden.clone(), start=0)
        self._record("think", t0, steps, 0, len(out))
        return out if state.is_compact else out.rerotate(torch.cat([state.positions, state.positions[-1] + 1 +
                                                                    torch.arange(steps, device=self.device)]))

    def rows(self, state: KVState) -> Rows:
        """Continuous rows of a state: token embeddings for token rows, latent inputs at the mean norm."""
        rows = self.embed(state.token_ids.clamp_min(0))  # (T, d)
        if state.latents.shape[0]:
            lat = state.latents * (self.mean_embedding_norm / state.latents.norm(dim=-1, keepdim=True).clamp_min(1e-12))
            rows[state.is_latent] = lat.to(rows.dtype)
        return Rows(rows.detach(), state.token_ids.clone(), (state.geometry.model, state.geometry.tokenizer))

    @torch.inference_mode()
    def extend(self, state: KVState, user: str) -> KVState:
        """Continue a finished state with a new user turn (`user`), as one growing conversation: the open
        assistant turn the state ends in is closed by this model's own template, the turn is read after it
        and a new assistant turn opened (`continuation_text`). LatentMAS's sequential chain: each agent
        reads its input after the previous agents' state and thinks on."""
        return self.read_on(state, self.turn_ids(user))

    @torch.inference_mode()
    def read_on(self, state: KVState | None, ids, full_history: bool = False) -> KVState:
        """Continue a state (None: nothing) with token `ids` read right after its last row, no template added: the
        state of reading the state's text and then `ids` in one prefill, e.g. a document after a prefix several
        readers share (`protocols/prefix.py`). `full_history`: as `prefill` (the state must then hold every row)."""
        t0 = self._clock()
        ids = self.ids(ids)
        if state is None:
            self.check_window(prompt=len(ids))
            cache, start, token_ids, latents = self.new_cache(full_history), 0, ids, None
        else:
            self.geometry.check_same(state.geometry)
            self.check_window(state=len(state), prompt=len(ids))
            compact = state.compact()  # rows at 0..T-1: the ids continue at position T
            cache, start = compact.to_cache(full_history), len(compact)
            token_ids, latents = torch.cat([compact.token_ids, ids]), compact.latents
        hidden = self._forward(cache, start, ids=ids)
        out = KVState.from_cache(cache, self.geometry, token_ids, latents, last_hidden=hidden[-1].clone())
        self._record("prefill", t0, len(ids), 0, len(out))
        return out

    @torch.inference_mode()
    def answer(self, question: Chat, message: Message = None, max_new_tokens: int = 48) -> Answer:
        """Greedy answer to `question`, given an optional message (text, Rows or a full-KV state)."""
        t0 = self._clock()
        return self._generate(t0, *self._receiver_input(question, message, max_new_tokens), max_new_tokens)

    @torch.inference_mode()
    def answer_after(self, state: KVState, user: str, max_new_tokens: int = 48) -> Answer:
        """Greedy answer to a new user turn after a state this agent holds (an open assistant turn, e.g. a
        document it read before the question came): only the turn is prefilled (`continuation_text`)."""
        t0 = self._clock()
        return self._generate(t0, *self._after_state(state, self.turn_ids(user), max_new_tokens), max_new_tokens)

    @torch.inference_mode()
    def encode_rows(self, rows: Rows) -> KVState:
        """The K/V `rows` get where `answer(question, message=rows)` re-prefills them: this agent's template text
        before the message slot, then the rows, in one forward; the rows' state alone comes back, at positions
        0..B−1 (every row's K/V on sliding layers too). What a same-model sender ships so that its receiver attaches
        the rows (`answer_attached`) instead of re-prefilling them; the slot's text does not depend on the question."""
        self._check_rows(rows)
        pre = self.ids(self._slot_split("")[0])
        self.check_window(prompt=len(pre), message=len(rows))
        t0 = self._clock()
        cache = self.new_cache(full_history=True)
        self._forward(cache, 0, embeds=torch.cat([self.embed(pre), rows.embeds.to(self.device, self.dtype)]))
        token_ids = rows.token_ids.to(self.device)
        latents = rows.embeds.to(self.device, self.dtype)[token_ids == -1]  # the input fed at each latent row
        state = KVState.from_cache(cache, self.geometry, torch.cat([pre, token_ids]), latents)
        self._record("prefill", t0, len(pre) + len(rows), 0, len(state))
        return state.select(torch.arange(len(pre), len(state), device=self.device)).compact()

    @torch.inference_mode()
    def answer_attached(self, question: str, message: KVState, max_new_tokens: int = 48,
                        recompute: float = 0.0) -> Answer:
        """Greedy answer to `question` with K/V rows attached in the message slot, where `answer(message=rows)`
        re-prefills rows: this agent prefills its template text before the slot, places `message` right after it
        (keys re-rotated), then prefills only the text after the slot (the question) and decodes. For one sender's
        `encode_rows(rows)` this is `answer(question, message=rows)` to float error; for several senders' states
        placed one after another, each sender's rows have not seen the others' (they were encoded apart).

        `recompute` > 0: before the question, this agent recomputes that share of the attached rows, those whose
        K/V its own context changes most (blend.py); 1 recomputes every row, which is the re-prefill exactly."""
        if recompute_count(recompute, len(message)):  # bad input is refused before any compute
            check_blend(self, message)
        t0 = self._clock()
        self.geometry.check_same(message.geometry)
        pre, post = self._slot_split(question)
        self.check_window(message=len(message), prompt=len(pre) + len(post), max_new_tokens=max_new_tokens)
        cache, ids = self.new_cache(full_history=True), self.ids(pre)
        self._forward(cache, 0, ids=ids)
        head = KVState.from_cache(cache, self.geometry, ids)  # (P rows) this agent's own text before the slot
        placed = KVState.concat([head, message.compact().to(self.device, self.dtype)])  # gaps closed, as `answer`
        cache = blended_cache(self, placed, len(head), recompute) if recompute else placed.to_cache()
        return self._generate(t0, cache, len(placed), {"ids": self.ids(post)}, len(message),
                              len(pre) + len(post), max_new_tokens)

    @torch.inference_mode()
    def answer_recomputed(self, question: str, message: KVState, first: int, pick, max_new_tokens: int = 48) -> Answer:
        """`answer(question, message=state)` after recomputing the attached rows `pick` ((k,) indices into rows
        first..; rows before `first` are this agent's own prefix) in this context (`blend.blended_cache`): every row
        recomputed is the re-prefill of the message's rows after the prefix. The state must hold every row on sliding
        layers (a full-history read)."""
        check_blend(self, message)
        t0 = self._clock()
        self.geometry.check_same(message.geometry)
        ids = self.kv_prompt_ids(question)
        self.check_window(message=len(message), prompt=len(ids), max_new_tokens=max_new_tokens)
        own = message.compact().to(self.device, self.dtype)
        cache = blended_cache(self, own, first, 0.0, pick)
        return self._generate(t0, cache, len(own), {"ids": self.ids(ids)}, len(own), len(ids), max_new_tokens)

    def _after_state(self, state: KVState, ids: list[int], max_new_tokens: int):
        """`_receiver_input` for a prompt `ids` that continues a state: the state is the cache's prefix."""
        self.geometry.check_same(state.geometry)
        self.check_window(message=len(state), prompt=len(ids), max_new_tokens=max_new_tokens)
        own = state.compact().to(self.device, self.dtype)  # e.g. a float32 translator's rows for a bf16 receiver
        return own.to_cache(), len(own), {"ids": self.ids(ids)}, len(own), len(ids)

    def _generate(self, t0: float, cache: DynamicCache, start: int, inputs: dict, n_msg: int, prompt_tokens: int,
                  max_new_tokens: int) -> Answer:
        """Prefill `inputs` at `start` onto `cache`, then decode greedily: the Answer, timed from `t0`."""
        hidden = self._forward(cache, start, **inputs)
        t1 = self._clock()
        marks: list[float] = []
        out, turn_ended = self._decode(cache, start + hidden.shape[0], hidden[-1], max_new_tokens, marks)
        t2 = self._clock()
        context = n_msg + prompt_tokens + len(out)
        self._record("answer", t0, n_msg + prompt_tokens, len(out), context)
        by_token = len(marks) == len(out) + 1 and not turn_ended  # a stop token ended it: its last line is kept
        return Answer(answer_text(self.tokenizer, out, None if by_token else self.turn_marker), tuple(out),
                      prompt_tokens, n_msg, context, t1 - t0, t2 - t1, tuple(m - t1 for m in marks), turn_ended)

    @torch.inference_mode()
    def stream(self, prompt: Chat, max_new_tokens: int = 48, chunk: int = 256) -> Stream:
        """Prefill `prompt` and open a greedy decode, keeping each prompt token's negative log-likelihood
        (for perplexity). Logits are computed `chunk` rows at a time: (chunk, V) at most in memory."""
        ids = self.ids(self.chat_ids(prompt))
        self.check_window(prompt=len(ids), max_new_tokens=max_new_tokens)
        t0 = self._clock()
        cache = self.new_cache()
        hidden = self._forward(cache, 0, ids=ids)  # (n, d)
        nll = torch.cat([torch.nn.functional.cross_entropy(self.logits(h).float(), t, reduction="none")
                         for h, t in zip(hidden[:-1].split(chunk), ids[1:].split(chunk))]) if len(ids) > 1 \
            else torch.zeros(0, device=self.device)
        self._record("stream", t0, len(ids), 0, len(ids))
        return Stream(self, cache, len(ids), torch.log_softmax(self.logits(hidden[-1]).float(), dim=-1), nll)

    def _receiver_input(self, question: Chat, message: Message, max_new_tokens: int):
        """What the receiver prefills: (cache, start position, forward inputs, message rows, prompt tokens).

        Validates the message and checks the context window before any compute.
        """
        if message is None:
            ids = self.chat_ids(question)
            self.check_window(prompt=len(ids), max_new_tokens=max_new_tokens)
            return self.new_cache(), 0, {"ids": self.ids(ids)}, 0, len(ids)
        if not isinstance(question, str):
            raise TypeError("with a message, the question must be a string")
        if isinstance(message, KVState):  # full KV: the state is the prefix, the prompt continues after it
            return self._after_state(message, self.kv_prompt_ids(question), max_new_tokens)
        pre, post = self._slot_split(question)
        if isinstance(message, Rows):  # continuous rows, re-prefilled inside the template slot
            self._check_rows(message)
            self.check_window(message=len(message), prompt=len(pre) + len(post), max_new_tokens=max_new_tokens)
            embeds = torch.cat([self.embed(pre), message.embeds.to(self.device, self.dtype), self.embed(post)])
            return self.new_cache(), 0, {"embeds": embeds}, len(message), len(pre) + len(post)
        if isinstance(message, str):  # text, tokenised together with the prompt around it
            ids = self.chat_ids(self._with_slot(question).replace(SLOT, message))
            self.check_window(prompt=len(ids), max_new_tokens=max_new_tokens)
            n_msg = len(ids) - len(pre) - len(post)
            return self.new_cache(), 0, {"ids": self.ids(ids)}, n_msg, len(ids) - n_msg
        raise TypeError(f"a message is text, Rows or a KVState, not {type(message).__name__}")

    # -- helpers ----------------------------------------------------------------------------
    def kv_prompt_ids(self, question: str) -> list[int]:
        """Token ids that follow a full-KV message: the continuation (below) asking `question`."""
        return self.turn_ids(KV_PROMPT.format(question=question))

    def turn_ids(self, user: str) -> list[int]:
        """Token ids of a new user turn after an open assistant turn (`continuation_text`)."""
        return self.encode(self.continuation_text(user))

    def continuation_text(self, question: str) -> str:
        """Template text that closes the open assistant turn a message ends in, then asks `question`
        (`templates.continuation_text`)."""
        return templates.continuation_text(self.tokenizer, question)

    @staticmethod
    def _with_slot(question: str) -> str:
        return MESSAGE_PROMPT.format(question=question)

    def _slot_split(self, question: str) -> tuple[list[int], list[int]]:
        return self.slot_ids(self.chat_text(self._with_slot(question)))

    def slot_ids(self, text: str) -> tuple[list[int], list[int]]:
        """Token ids before and after the one `SLOT` in a rendered prompt."""
        before, after = templates.split_slot(text)
        return self.encode(before), self.encode(after)

    def _check_rows(self, rows: Rows) -> None:
        rows.check_space(self.geometry.model, self.geometry.tokenizer)
        if rows.embeds.shape[1] != self.geometry.hidden_size:
            raise StateFormatError(f"rows have width {rows.embeds.shape[1]}, this model's hidden size is "
                                   f"{self.geometry.hidden_size}")

    @cached_property
    def stop_ids(self) -> set[int]:
        """Token ids that end an answer (`templates.stop_ids`)."""
        return templates.stop_ids(self.model, self.tokenizer)

    @cached_property
    def turn_marker(self) -> str | None:
        """The next turn's marker that ends a templateless model's answer; None with a chat template
        (`templates.turn_marker`)."""
        return templates.turn_marker(self.tokenizer)

    def _decode(self, cache: DynamicCache, start: int, hidden: torch.Tensor, max_new_tokens: int,
                marks: list[float] | None = None) -> tuple[list[int], bool]:
        """Greedy tokens, and whether the next turn's marker ended them; `marks` (when given) gets the clock at each
        choice, and at the stop token if one ends it. A token that completes the transcript's `turn_marker` stops the
        answer as a stop token does (left out; the marker's first tokens are dropped from the text by
        `answer_text`)."""
        out: list[int] = []
        turn = self.turn_marker
        for i in range(max_new_tokens):
            tok = int(self.logits(hidden).argmax())  # int(): the device has finished this step
            if marks is not None:
                marks.append(now())  # int() above waited for the device
            if tok in self.stop_ids:
                return out, False
            if turn and turn_begun(self.tokenizer, out + [tok], turn):
                return out, True
            out.append(tok)
            if i + 1 < max_new_tokens:
                hidden = self._forward(cache, start + i, ids=self.ids([tok]))[-1]
        return out, False

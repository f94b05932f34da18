"""Recording kvpress scorers during a prefill instead of pruning (see `presses.py` for the selectors)."""
from __future__ import annotations

import importlib.util
import logging
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING

import torch

from ..agent import Agent
from ..clock import now
from ..errors import MissingExtraError, PressUnsupportedError
from ..rope import decoder_of
from ..state import KVState

if TYPE_CHECKING:
    from kvpress import BasePress

_KVPRESS_LOGGERS = ("kvpress.presses.base_press", "kvpress.presses.kvzip_press")
CHUNKKV_SCORERS = ("snapkv", "knorm")



# -- recording ------------------------------------------------------------------------------------
def chunk_row_scores(scores: torch.Tensor, chunk_length: int) -> torch.Tensor:
    """ChunkKVPress's chunk scores, one per row: (B, H_kv, T) -> (B, 1, T).

    As ChunkKVPress.compress: sum over KV heads, mean inside complete chunks of `chunk_length` rows
    from row 0, the remaining rows (if any) as one more chunk. Each row gets its chunk's score.
    With no complete chunk (T < chunk_length) ChunkKVPress falls back to the inner press's per-token
    pruning, so the inner scores are returned unchanged.
    """
    T = scores.shape[-1]
    n_full = T // chunk_length
    if n_full == 0:
        return scores
    summed = scores.sum(dim=1)  # (B, T)
    out = torch.empty_like(summed)
    main = summed[..., : n_full * chunk_length].reshape(summed.shape[0], n_full, chunk_length).mean(-1)
    out[..., : n_full * chunk_length] = main.repeat_interleave(chunk_length, dim=-1)
    if T % chunk_length:
        out[..., n_full * chunk_length:] = summed[..., n_full * chunk_length:].mean(-1, keepdim=True)
    return out[:, None]


def kvpress_installed() -> bool:
    """Whether the `kvpress` extra is installed (located, not imported)."""
    try:
        return importlib.util.find_spec("kvpress") is not None
    except ValueError:  # sys.modules["kvpress"] is None: blocked, as on a core install
        return False


def _missing_kvpress() -> MissingExtraError:
    return MissingExtraError("the kvpress selectors (snapkv, h2o, tova, knorm, chunkkv, kvzip)", "kvpress",
                             "kvpress==0.5.5")


def require_kvpress() -> None:
    """MissingExtraError naming the `kvpress` extra unless kvpress is installed (cheap: no import)."""
    if not kvpress_installed():
        raise _missing_kvpress()


def _kv():
    """The kvpress package, imported on first use: importing it costs ~2.5 s (it loads many model
    classes), which every latentwire process that imports `latentwire.select` would otherwise pay. kvpress is
    the optional extra `kvpress` (it pins transformers < 5.3); without it these selectors raise
    `MissingExtraError` naming the extra."""
    try:
        import kvpress as kv
    except ImportError as e:  # not installed, or blocked (sys.modules["kvpress"] = None)
        raise _missing_kvpress() from e

    return kv


@cache
def _recording_press_class() -> type:
    kv = _kv()

    @dataclass
    class RecordingPress(kv.BasePress):
        """Wraps a kvpress ScorerPress (or ChunkKVPress): records its per-layer scores, never prunes.

        `compress()` stores `press.score(...)` (ChunkKVPress: its chunk scores) for the layers in
        `layers` as (H_kv or 1, T) float64 and returns keys and values unchanged.
        """

        press: kv.BasePress
        layers: frozenset[int] | None = None  # layers to record; None = every hooked layer
        scores: dict[int, torch.Tensor] = field(default_factory=dict)
        seconds: float = 0.0  # time spent inside the press's scoring

        def __post_init__(self):
            if not isinstance(self.press, (kv.ScorerPress, kv.ChunkKVPress)):
                raise TypeError(f"RecordingPress wraps a ScorerPress or ChunkKVPress, "
                                f"not {type(self.press).__name__}")

        def post_init_from_model(self, model):
            self.press.post_init_from_model(model)

        def compress(self, module, hidden_states, keys, values, attentions, kwargs):
            i = int(module.layer_idx)
            if self.layers is not None and i not in self.layers:
                return keys, values
            t0 = now(keys.device)
            chunked = isinstance(self.press, kv.ChunkKVPress)
            inner = self.press.press if chunked else self.press
            s = inner.score(module, hidden_states, keys, values, attentions, kwargs)
            if s.shape != keys.shape[:3]:
                raise RuntimeError(f"layer {i}: {type(inner).__name__} scored {tuple(s.shape)} for keys "
                                   f"{tuple(keys.shape)}")
            if chunked:
                s = chunk_row_scores(s, self.press.chunk_length)
            self.scores[i] = s[0].detach().double()
            self.seconds += now(keys.device) - t0
            return keys, values

    return RecordingPress


def recording_press(press: "BasePress", layers=None):
    """A kvpress press (a `BasePress`, usable as `with rec(model): ...`) that records `press`'s scores
    per layer in `rec.scores` ({layer: (H_kv or 1, T) float64}) and returns keys/values unchanged."""
    return _recording_press_class()(press, None if layers is None else frozenset(layers))


@contextmanager
def _quiet_kvpress():
    """Silence kvpress's per-call warnings ("Model Gemma3ForCausalLM not tested", KVzip's cost note):
    the module docstring states both once."""
    loggers = [logging.getLogger(n) for n in _KVPRESS_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


@contextmanager
def _model_restored(model, attn_implementation: str | None):
    """Optionally switch the attention implementation; afterwards restore it and drop the
    `self_attn.rotary_emb` attributes kvpress's hook installs on every attention module."""
    before = model.config._attn_implementation
    layers = decoder_of(model).layers
    had = [hasattr(layer.self_attn, "rotary_emb") for layer in layers]
    if attn_implementation and attn_implementation != before:
        model.set_attn_implementation(attn_implementation)
    try:
        yield
    finally:
        if model.config._attn_implementation != before:
            model.set_attn_implementation(before)
        for layer, kept in zip(layers, had):
            if not kept and hasattr(layer.self_attn, "rotary_emb"):
                delattr(layer.self_attn, "rotary_emb")


def _on_model_device(agent: Agent):
    """The model's device as torch's default while kvpress's own code runs: it makes some tensors on the
    default device and moves them after (ObservedAttentionPress: `torch.arange(n).to(attentions.device)`),
    which would otherwise be a host round trip on every layer, or fail under another default device."""
    return torch.device(agent.device)


def _global_layers(state: KVState) -> list[int]:
    return [i for i, t in enumerate(state.geometry.layer_types) if t == "global"]


def _aggregate(per_layer: dict[int, torch.Tensor], layers: list[int]) -> torch.Tensor:
    """{layer: (H, n)} -> (n,): mean over heads, then over layers, float64."""
    missing = sorted(set(layers) - set(per_layer))
    if missing:
        raise RuntimeError(f"kvpress hooks recorded no scores for layers {missing}")
    return torch.stack([per_layer[i].double().mean(0) for i in layers]).mean(0)


@torch.inference_mode()
def record_prefill_layer_scores(agent: Agent, state: KVState, press: "BasePress", attn_implementation: str | None = None
                                ) -> tuple[dict[int, torch.Tensor], float, float]:
    """Prefill the state's token rows with `press` recording: {global layer: (H_kv or 1, n) float64 scores},
    wall seconds, press seconds. The per-layer scores before `record_prefill_scores` aggregates them."""
    agent.geometry.check_same(state.geometry)
    ids = state.token_ids[~state.is_latent].to(agent.device)  # kvpress runs on the model: ids go there
    rec = recording_press(press, _global_layers(state))
    model = agent.model
    t0 = now(agent.device)
    with _quiet_kvpress(), _model_restored(model, attn_implementation), _on_model_device(agent), rec(model):
        agent._forward(agent.new_cache(), 0, ids=ids)
    return rec.scores, now(agent.device) - t0, rec.seconds


@torch.inference_mode()
def record_prefill_scores(agent: Agent, state: KVState, press: "BasePress",
                          attn_implementation: str | None = None) -> tuple[torch.Tensor, float, float]:
    """Prefill the state's token rows with `press` recording: (n,) row scores, wall seconds, press seconds."""
    per_layer, seconds, press_seconds = record_prefill_layer_scores(agent, state, press, attn_implementation)
    return _aggregate(per_layer, _global_layers(state)), seconds, press_seconds


def _kvzip_template(tokenizer) -> tuple[list[int], list[int]]:
    """Prefix and suffix token ids around a user message, computed as KVzipPress.__call__ does."""
    if tokenizer.chat_template is None:
        prefix_text, suffix_text = "", "\n"
    else:
        dummy = "dummy context"
        separator = "\n" + "#" * len(dummy)
        text = tokenizer.apply_chat_template([{"role": "user", "content": dummy + separator}],
                                             add_generation_prompt=True, tokenize=False, enable_thinking=False)
        context, suffix_text = text.split(separator)
        prefix_text = context.split(dummy)[0]
    enc = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    return enc(prefix_text), enc(suffix_text)


def _refuse_sliding(agent: Agent, state: KVState) -> None:
    """kvpress refuses KVzip on Gemma3; so does latentwire, on any state with sliding-window layers."""
    if "sliding" in state.geometry.layer_types:
        raise PressUnsupportedError(
            f"kvzip cannot score {type(agent.model).__name__} ({state.geometry.model}): kvpress 0.5.5's KVzipPress "
            "refuses Gemma3 ('KVzipPress is not supported for Gemma3ForCausalLM') -- its context-reconstruction "
            "hook reads the whole context from every layer's cache, and sliding-window layers keep only their "
            f"last {state.geometry.sliding_window - 1} rows. Use snapkv, h2o, tova, knorm or chunkkv, which "
            "latentwire scores on the global layers.")


def refuse_rope_kvpress_cannot_rotate(agent: Agent, press: str) -> None:
    """kvpress rotates queries itself (SnapKV's window attention, KVzip's reconstruction) with Llama's
    `rotate_half` over the whole head: wrong for interleaved pairs (Cohere, GLM) and for partial rotary
    (Phi, GLM). Refused there rather than scored with wrongly rotated queries."""
    g = agent.geometry
    odd = sorted({kind for kind, spec in g.rope if spec.interleaved or spec.rotary_dim < g.head_dim})
    if odd:
        raise PressUnsupportedError(
            f"{press} cannot score {g.model}: kvpress rotates its queries as Llama does (pairs (i, i + D/2) over "
            f"the whole head), and this model's RoPE ({', '.join(odd)} layers) is interleaved or partial. Use "
            "cacheback, h2o or knorm.")


@torch.inference_mode()
def kvzip_layer_scores(agent: Agent, state: KVState, chunk_size: int = 2048,
                       plus: bool = False) -> tuple[dict[int, torch.Tensor], float]:
    """KVzip's context-reconstruction scores of the state's token rows per layer: {layer: (H_kv, n)
    float64} for every layer (kvpress's `score_val[layer, 0]`), seconds. `kvzip_scores` aggregates them.

    Runs over the state's own cache of its token rows (no re-prefill). Raises PressUnsupportedError
    for states with sliding-window layers (kvpress refuses Gemma3).
    """
    agent.geometry.check_same(state.geometry)
    _refuse_sliding(agent, state)
    rows = torch.nonzero(~state.is_latent).flatten()
    ids = state.token_ids[rows].to(agent.device)  # everything handed to kvpress lives on the model's device
    model = agent.model
    prefix, suffix = _kvzip_template(agent.tokenizer)
    t0 = now(agent.device)
    with _quiet_kvpress(), _model_restored(model, None), _on_model_device(agent):
        press = _kv().KVzipPress(compression_ratio=0.0, chunk_size=chunk_size, kvzip_plus_normalization=plus)
        # As KVzipPress.__call__ after the context prefill: the template prefix is not re-read (it is
        # only skipped when the state really starts with it), the suffix closes the repeat prompt.
        press.prefix_length = len(prefix) if ids[:len(prefix)].tolist() == prefix else 0
        press._suffix_ids = torch.tensor([suffix], dtype=torch.long, device=agent.device)
        press._context_ids = ids[None]
        press._cache = state.select(rows).compact().to_cache()
        try:
            press._perform_kvzip_compression(model, agent.tokenizer)  # ratio 0: scores, masks nothing
            per_layer = {i: press.score_val[i, 0].double() for i in range(agent.geometry.num_layers)}
        finally:
            press._reset_internal_parameters()
    return per_layer, now(agent.device) - t0


@torch.inference_mode()
def kvzip_scores(agent: Agent, state: KVState, chunk_size: int = 2048,
                 plus: bool = False) -> tuple[torch.Tensor, float]:
    """KVzip's context-reconstruction scores of the state's token rows: (n,) float64, seconds.

    Runs over the state's own cache of its token rows (no re-prefill). Raises PressUnsupportedError
    for states with sliding-window layers (kvpress refuses Gemma3).
    """
    per_layer, seconds = kvzip_layer_scores(agent, state, chunk_size, plus)
    return _aggregate(per_layer, _global_layers(state)), seconds


def _with_latents(state: KVState, token_scores: torch.Tensor) -> torch.Tensor:
    """(n,) token-row scores -> (T,): latent rows get the token rows' max (0 when there are none)."""
    out = torch.zeros(len(state), dtype=torch.float64, device=state.device)
    tok = ~state.is_latent
    if token_scores.numel():
        out[tok] = token_scores.to(state.device, torch.float64)
        out[state.is_latent] = float(token_scores.max())
    return out


# -- selectors ------------------------------------------------------------------------------------

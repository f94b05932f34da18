"""Tiny random-weight models of the three bundled architectures, built from configs (no files).

They keep what matters for exactness tests: GQA (Llama, Qwen2), Gemma3's hybrid sliding/global
layers with their two RoPE bases and √d embedding scale, and a tokenizer with a chat template.
`OTHER_ARCHS` are architectures users bring that differ where it matters: Qwen3 (per-head q/k norm),
Mistral, Phi-3 (one fused qkv projection; here with partial rotary, half of each head rotated), Phi-2
(`phi`: partial rotary split off before the model's rotation function), OLMo2
(q/k norm over all heads at once), Granite (embedding, attention, residual and logit multipliers), Cohere
and GLM (RoPE on interleaved channel pairs; GLM's partial).
"""
from __future__ import annotations

import torch

TINY_ARCHS = ("llama", "gemma3", "qwen2")
_SPECIALS = ["<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
_CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _byte_level(extra: list[str], merges: list[tuple[str, str]], chat_template: str):
    """A byte-level BPE tokenizer (256 byte symbols + ChatML specials + `extra`), built in memory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(_SPECIALS + sorted(pre_tokenizers.ByteLevel.alphabet()) + extra)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>",
                                   eos_token="<|im_end|>", additional_special_tokens=["<|im_start|>", "</s>"])
    fast.chat_template = chat_template
    return fast


def tiny_tokenizer():
    """Byte-level tokenizer (256 byte symbols + ChatML specials), built in memory."""
    return _byte_level([], [], _CHATML)


_BRACKETS = (
    "<s>[system] Be brief.</s>\n"
    "{% for m in messages %}<s>[{{ m['role'] }}] {{ m['content'] | trim }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>[assistant] {% endif %}"
)


def tiny_merged_tokenizer(chat_template: str = _BRACKETS):
    """A second tokenizer for cross-tokenizer tests: the same bytes plus three merges ("Ġt", "he", "Ġthe"),
    so one text segments differently, and another chat template (default: `[role]` turns with a system
    line). Its 264 ids fit the tiny models' embedding."""
    return _byte_level(["Ġt", "he", "Ġthe"], [("Ġ", "t"), ("h", "e"), ("Ġt", "he")], chat_template)


# arch -> (transformers config class, what differs from the shared tiny shape)
_OTHER = {
    "qwen3": ("Qwen3Config", dict(head_dim=16)),
    "mistral": ("MistralConfig", dict(head_dim=16, sliding_window=None)),
    "phi3": ("Phi3Config", dict(partial_rotary_factor=0.5)),
    "phi": ("PhiConfig", dict(partial_rotary_factor=0.5)),
    "olmo2": ("Olmo2Config", {}),
    "granite": ("GraniteConfig", dict(embedding_multiplier=12.0, attention_multiplier=0.1, residual_multiplier=0.5,
                                      logits_scaling=4.0)),
    "cohere": ("CohereConfig", {}),
    "glm": ("GlmConfig", dict(head_dim=16)),
}
OTHER_ARCHS = tuple(_OTHER)

TINY_VOCAB = 264  # ≥ len(tiny_tokenizer()) == 261


def tiny_config(arch: str, **overrides):
    import transformers
    from transformers import Gemma3TextConfig, LlamaConfig, Qwen2Config

    common = dict(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                  max_position_embeddings=1024, tie_word_embeddings=True, bos_token_id=1, eos_token_id=4,
                  pad_token_id=0)
    if arch == "llama":
        cfg = LlamaConfig(**common | dict(num_hidden_layers=3, num_key_value_heads=2, head_dim=16) | overrides)
    elif arch == "qwen2":
        cfg = Qwen2Config(**common | dict(num_hidden_layers=3, num_key_value_heads=2,
                                          rope_parameters={"rope_type": "default", "rope_theta": 1e6}) | overrides)
    elif arch == "gemma3":
        cfg = Gemma3TextConfig(**common | dict(
            num_hidden_layers=6, num_key_value_heads=1, head_dim=32, sliding_window=8, query_pre_attn_scalar=32,
            rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                             "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0}},
        ) | overrides)
    elif arch in OTHER_ARCHS:  # three layers, 2 KV heads, plus what makes each architecture differ
        config_class, extra = _OTHER[arch]
        cfg = getattr(transformers, config_class)(**common | dict(num_hidden_layers=3, num_key_value_heads=2) | extra
                                                  | overrides)
    else:
        from ..errors import UnknownNameError

        raise UnknownNameError("tiny architecture", arch, TINY_ARCHS + OTHER_ARCHS)
    cfg._attn_implementation = "eager"
    return cfg


def tiny_model(arch: str, seed: int = 0, **overrides):
    """A random-weight causal LM in eval mode, fp32, deterministic given the seed."""
    from transformers import AutoModelForCausalLM, Gemma3ForCausalLM

    config = tiny_config(arch, **overrides)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Gemma3ForCausalLM(config) if arch == "gemma3" else AutoModelForCausalLM.from_config(config)
    return model.eval()

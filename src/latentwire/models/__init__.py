"""Models: the bundled zoo (offline GGUF → cached safetensors) and tiny random-weight test models."""
from .tiny import OTHER_ARCHS, TINY_ARCHS, tiny_config, tiny_merged_tokenizer, tiny_model, tiny_tokenizer
from .zoo import DEFAULT_MODEL, ZOO, ZooModel, build_cache, cache_root, get_zoo_model, load, load_gguf
from .fingerprint import tokenizer_fingerprint
from .compat import cache_arg, output_cache

__all__ = ["DEFAULT_MODEL", "cache_arg", "output_cache", "ZOO", "ZooModel", "OTHER_ARCHS", "TINY_ARCHS", "build_cache", "cache_root", "get_zoo_model",
           "load", "load_gguf", "tiny_config", "tiny_merged_tokenizer", "tiny_model", "tiny_tokenizer", "tokenizer_fingerprint"]

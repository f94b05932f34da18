"""What changed in transformers' forward signature between the releases latentwire supports (5.0 to the newest 5.x).

transformers 5.25 renamed a model's cache argument and output field `past_key_values` → `cache` (the old name
still works, with a FutureWarning, until 5.40). `cache_arg` passes a cache under the name this model's `forward`
takes; `output_cache` reads it back from either output.
"""
from __future__ import annotations

import inspect
from functools import cache


@cache
def _cache_name(forward_owner: type) -> str:
    params = inspect.signature(forward_owner.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def cache_arg(module, kv_cache) -> dict:
    """{name: kv_cache} for `module(**...)`: `cache` where its forward takes it, else `past_key_values`."""
    return {_cache_name(type(module)): kv_cache}


def output_cache(out):
    """The cache a forward returned (`out.cache` on transformers ≥ 5.25, `out.past_key_values` before)."""
    got = getattr(out, "cache", None)
    return got if got is not None else out.past_key_values

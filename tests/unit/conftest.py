"""Session fixtures for the unit tier: tiny random-weight models (no files), the tiny tokenizer, helpers."""
from __future__ import annotations

import pytest
import torch

from latentwire.agent import Agent
from latentwire.models import OTHER_ARCHS, tiny_model, tiny_tokenizer, tokenizer_fingerprint
from latentwire.bench.episode import Episode, Span, write_episodes
from latentwire.state import Geometry, KVState
from latentwire.models.compat import cache_arg, output_cache

ARCHS = ("llama", "gemma3", "qwen2")
# Static RoPE variants on a tiny llama, keyed "llama-<rope_type>". yarn has attention_scaling != 1.
ROPE_VARIANTS = {
    "yarn": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 256},
    "llama3": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 256},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
}
# Architectures users bring (Qwen3, Mistral, Phi-3 with fused qkv and partial rotary): the state laws run on them too.
MODEL_KEYS = ARCHS + tuple(f"llama-{v}" for v in ROPE_VARIANTS) + OTHER_ARCHS


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Tiny models gain nothing from intra-op threads, and on a small/shared CPU the thread hand-off costs
    milliseconds per op (measured: decode steps ~50x slower with 2 threads than with 1). Restored after
    each module so other test tiers in the same session keep their threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(params=ARCHS)
def arch(request):
    """Parametrises a test over the three tiny architectures."""
    return request.param


@pytest.fixture(params=MODEL_KEYS)
def model_key(request):
    """Parametrises a test over the three archs and the RoPE-variant llamas."""
    return request.param


@pytest.fixture(params=list(ROPE_VARIANTS))
def rope_variant(request):
    return request.param


@pytest.fixture(scope="session")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="session")
def models():
    """arch -> tiny model (seed 0), built once per session."""
    return {arch: tiny_model(arch) for arch in ARCHS}


@pytest.fixture(scope="session")
def model_for(models):
    """key in MODEL_KEYS -> model; RoPE-variant llamas and the other architectures are built on first use and kept."""
    cache = dict(models)

    def get(key: str):
        if key not in cache:
            cache[key] = tiny_model(key) if key in OTHER_ARCHS else tiny_model(
                "llama", rope_parameters=ROPE_VARIANTS[key.removeprefix("llama-")])
        return cache[key]

    return get


@pytest.fixture(scope="session")
def geometry_for(model_for, tokenizer):
    fp = tokenizer_fingerprint(tokenizer)
    return lambda key, name=None: Geometry.from_model(model_for(key), name or key, fp)


@pytest.fixture
def agent_for(models, tokenizer):
    """A fresh Agent (empty `calls`) around the session's tiny model of an arch."""
    return lambda arch, **kw: Agent(models[arch], tokenizer, model_name=arch, **kw)


@pytest.fixture(scope="session")
def random_ids():
    """Deterministic random token ids (1, n), avoiding the special tokens."""
    return lambda n, seed=0: torch.randint(5, 261, (1, n), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="session")
def prefill_state(model_for, geometry_for):
    """State of a plain model forward over ids at positions start.. (the model's own cache)."""

    @torch.inference_mode()
    def run(key, ids, start=0):
        model = model_for(key)
        pos = None if start == 0 else torch.arange(start, start + ids.shape[1])[None]
        cache = output_cache(model(ids, position_ids=pos, use_cache=True))
        return KVState.from_cache(cache, geometry_for(key), ids[0], start=start)

    return run


@pytest.fixture(scope="session")
def greedy():
    """Greedy continuation: first token from `logits`, then n-1 more through `cache`.

    Returns (tokens, stacked last-position logits of every step): tiny random models often repeat one
    token whatever the context, so callers compare the logits too, not just the tokens.
    """

    @torch.inference_mode()
    def run(model, cache, logits, n):
        steps = [logits[0, -1]]
        out = [int(steps[-1].argmax())]
        for _ in range(n - 1):
            logits = model(input_ids=torch.tensor([[out[-1]]]), **cache_arg(model, cache), use_cache=True).logits
            steps.append(logits[0, -1])
            out.append(int(steps[-1].argmax()))
        return out, torch.stack(steps)

    return run


def max_diff(a: KVState, b: KVState, what: str = "keys") -> float:
    """Largest |a - b| over every layer's keys (or values); shapes and row positions must agree."""
    worst = 0.0
    for i, (la, lb) in enumerate(zip(a.layers, b.layers, strict=True)):
        assert torch.equal(la.positions, lb.positions), f"layer {i}: positions differ"
        d = (getattr(la, what) - getattr(lb, what)).abs()
        worst = max(worst, float(d.max()) if d.numel() else 0.0)
    return worst


@pytest.fixture(scope="session")
def kv_diff():
    return max_diff


@pytest.fixture
def spy_decode(monkeypatch):
    """Record what answer() hands to decoding: (start position, last hidden, cache keys per layer).
    Tiny random models often greedily repeat one token whatever the context, so tokens alone prove little."""

    def attach(agent):
        seen, decode = [], agent._decode

        def spy(cache, start, hidden, max_new_tokens, marks=None):
            seen.append((start, hidden.clone(), [layer.keys[0].clone() for layer in cache.layers]))
            return decode(cache, start, hidden, max_new_tokens, marks)

        monkeypatch.setattr(agent, "_decode", spy)
        return seen

    return attach


@pytest.fixture
def tiny_task(tmp_path):
    """A three-episode fan-in task file (the bench runner's and report's tests run it on tiny models)."""
    eps = [Episode(f"e{i}", "t", "fanin", "What is the code?", ["7341"],
                   ("The code is 7341. " * (1 + i), "Nothing here."), (Span(0, 0, 17),)) for i in range(3)]
    path = tmp_path / "task.jsonl"
    write_episodes(path, eps)
    return path

"""kvpress parity: the scores latentwire records are the ones kvpress prunes with.

kvpress, used its own way (`with press(model): model(...)`), prunes each (layer, KV head) of the cache
to its top-k rows by the press's score. Recording the same press (`recording_press`) and taking the
top-k of the recorded scores per (layer, KV head) must give exactly the rows kvpress kept. Which rows
kvpress kept is read off its pruned cache: every kept key equals one row of the unpruned cache (the
press prunes after each layer's attention, so the forward itself, and every key, is unchanged).

What latentwire then does differently is deliberate and documented in `select/presses.py`: one set
of rows for all layers and heads (mean of the scores), in spans, within the document's rows.
"""
import pytest
import torch

from latentwire.agent import Agent
from latentwire.models import tiny_model
from latentwire.select.press_recording import (_aggregate, _kv, _model_restored, kvzip_layer_scores, kvzip_scores,
                                               record_prefill_layer_scores, record_prefill_scores, recording_press)
from latentwire.models.compat import cache_arg, output_cache

pytestmark = pytest.mark.kvpress  # kvpress's own scorers: needs the `kvpress` extra

RATIO = 0.5  # kvpress compression_ratio: keep int(T · 0.5) rows per (layer, KV head)
PRESSES = {
    "snapkv": (lambda kv: kv.SnapKVPress(compression_ratio=RATIO, window_size=8, kernel_size=5), None),
    "h2o": (lambda kv: kv.ObservedAttentionPress(compression_ratio=RATIO), "eager"),
    "tova": (lambda kv: kv.TOVAPress(compression_ratio=RATIO), None),
    "knorm": (lambda kv: kv.KnormPress(compression_ratio=RATIO), None),
}


def kept_rows(full: torch.Tensor, pruned: torch.Tensor) -> list[set[int]]:
    """Per KV head: which rows of `full` (H, T, D) the pruned keys (H, k, D) are."""
    out = []
    for h in range(full.shape[0]):
        match = (pruned[h][:, None, :] == full[h][None, :, :]).all(dim=-1)  # (k, T)
        assert bool((match.sum(dim=1) == 1).all()), "each kept key must be exactly one row"
        out.append(set(match.float().argmax(dim=1).tolist()))
    return out


@pytest.mark.parametrize("name", list(PRESSES))
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_recorded_scores_select_what_kvpress_keeps(tokenizer, random_ids, arch, name):
    kv = _kv()
    make, attn = PRESSES[name]
    agent = Agent(tiny_model(arch), tokenizer, model_name=arch)
    model, ids = agent.model, random_ids(64, seed=5)
    T, n_kept = ids.shape[1], int(ids.shape[1] * (1 - RATIO))
    with torch.inference_mode(), _model_restored(model, attn):
        full = output_cache(model.model(ids, use_cache=True))
        pruned_cache = agent.new_cache()
        with make(kv)(model):  # kvpress its own way: the cache comes out pruned
            model.model(ids, **cache_arg(model.model, pruned_cache), use_cache=True)
        rec = recording_press(make(kv))
        with rec(model):  # latentwire's way: the same scorer, recorded, nothing pruned
            model.model(ids, **cache_arg(model.model, agent.new_cache()), use_cache=True)
    for i in range(len(model.model.layers)):
        ours = [set(s.topk(n_kept).indices.tolist()) for s in rec.scores[i]]  # (H_kv, T) -> top-k per head
        theirs = kept_rows(full.layers[i].keys[0], pruned_cache.layers[i].keys[0])
        assert pruned_cache.layers[i].keys.shape[-2] == n_kept < T
        assert ours == theirs, (name, i)


def test_the_parity_check_tells_presses_apart(tokenizer, random_ids):
    """Not vacuous: two different presses keep different rows, so equal sets above mean equal scores."""
    kv = _kv()
    agent = Agent(tiny_model("llama"), tokenizer, model_name="llama")
    ids, kept = random_ids(64, seed=5), {}
    for name in ("snapkv", "knorm"):
        cache = agent.new_cache()
        with torch.inference_mode(), PRESSES[name][0](kv)(agent.model):
            agent.model.model(ids, **cache_arg(agent.model.model, cache), use_cache=True)
        kept[name] = [layer.keys for layer in cache.layers]
    assert any(not torch.equal(a, b) for a, b in zip(kept["snapkv"], kept["knorm"]))


def test_per_layer_scores_are_what_the_selectors_aggregate(tokenizer, tmp_path):
    """The per-layer functions (benchmarks/press_parity.py ranks their scores per (layer, KV head)): mean over
    heads, then layers, is the selectors' row score; kvzip's are KVzipPress's own `score_val`, layer by layer."""
    kv = _kv()
    model = tiny_model("llama")
    agent = Agent(model, tokenizer, model_name="llama")
    state = agent.prefill("The blue crate holds 58 bolts. The red crate is empty. " * 2)
    layers, H = list(range(len(model.model.layers))), model.config.num_key_value_heads
    press = kv.SnapKVPress(window_size=8)
    per_layer = record_prefill_layer_scores(agent, state, press)[0]
    assert sorted(per_layer) == layers
    assert all(s.shape == (H, len(state)) and s.dtype == torch.float64 for s in per_layer.values())
    assert torch.equal(_aggregate(per_layer, layers), record_prefill_scores(agent, state, press)[0])
    zipped = kvzip_layer_scores(agent, state, chunk_size=40)[0]
    assert sorted(zipped) == layers and all(s.shape == (H, len(state)) for s in zipped.values())
    assert torch.equal(_aggregate(zipped, layers), kvzip_scores(agent, state, chunk_size=40)[0])
    tokenizer.save_pretrained(tmp_path)  # KVzipPress loads the tokenizer from model.config.name_or_path
    model.config.name_or_path = str(tmp_path)
    zp, seen = kv.KVzipPress(compression_ratio=0.5, chunk_size=40), []
    zp.compress_post = lambda m: seen.append(zp.score_val[:, 0].clone())  # (L, H, T) scores, before any pruning
    with zp(model), torch.inference_mode():
        model.model(input_ids=state.token_ids[None], **cache_arg(model.model, agent.new_cache()))
    for i in layers:
        assert torch.allclose(zipped[i], seen[0][i].double(), atol=1e-6), i
        assert float(zipped[i].abs().max()) > 0  # not vacuous

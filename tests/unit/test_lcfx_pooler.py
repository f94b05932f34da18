"""LCF-X's own pooler (LCF's two stages over variable-length spans), pinned on hand-made inputs.

    .venv/bin/python tests/unit/test_lcfx_pooler.py   # prints forward time and parameters, LCF-X vs XKV
"""
from __future__ import annotations

import pytest
import safetensors.torch
import torch

from latentwire.errors import LatentWireError, StateFormatError
from latentwire.translate import build, load
from latentwire.translate.layers import layer_groups
from latentwire.translate.lcf_pool import Spans, n_params, pool_slots, pool_spans, spans

CPU = torch.device("cpu")
# runs 0..2 | 10..11 | 20..24, width 3 -> spans of 3, 2, 3, 2 rows
POS = torch.tensor([0, 1, 2, 10, 11, 20, 21, 22, 23, 24], dtype=torch.int64, device=CPU)
LENGTHS = [3, 2, 3, 2]
SHARER_TEXT = "the sharer read this: Ned has 9 coins and gives 4 of them away."
RECEIVER_TEXT = "receiver: Ben has 5 fewer coins than Ned."


def _span_rows(values: list[float], D: int) -> torch.Tensor:
    """(1, 1, T, 2D): every row of span s is the constant values[s] (keys and values alike)."""
    rows = [torch.full((n, 2 * D), c, dtype=torch.float32, device=CPU) for n, c in zip(LENGTHS, values)]
    return torch.cat(rows)[None, None]


def test_spans_split_at_gaps_and_width():
    sp = spans(POS, 3)
    assert sp.lengths.tolist() == LENGTHS
    assert sp.mask.tolist() == [[True] * n + [False] * (3 - n) for n in LENGTHS]
    assert sp.index.tolist() == [[0, 1, 2], [3, 4, 4], [5, 6, 7], [8, 9, 9]]  # padding repeats the last row
    assert spans(POS, 100).lengths.tolist() == [3, 2, 5]  # gaps alone
    assert spans(POS, 1).lengths.tolist() == [1] * 10
    assert spans(POS - 50, 3).lengths.tolist() == LENGTHS  # negative positions: only differences count
    with pytest.raises(LatentWireError, match="width"):
        spans(POS, 0)
    with pytest.raises(LatentWireError, match="empty"):
        spans(POS[:0], 3)
    with pytest.raises(LatentWireError, match="mask"):
        Spans(sp.index, sp.mask.long(), sp.lengths)


def test_stage_one_gives_each_span_its_own_rows():
    D, consts = 4, [1.0, -2.0, 3.0, 5.0]
    x, sp = _span_rows(consts, D), spans(POS, 3)
    q = torch.randn(1, 1, D, generator=torch.Generator().manual_seed(0), dtype=torch.float32, device=CPU)
    out = pool_spans(x, q, sp)  # (1, 1, 4, 2D): any attention over constant rows gives the constant
    want = torch.tensor(consts, dtype=torch.float32, device=CPU)[:, None].expand(4, 2 * D)  # (n, 2D)
    torch.testing.assert_close(out[0, 0], want)
    # uniform attention (zero query) on varying rows: each span's mean over its real rows only
    x = torch.arange(10, dtype=torch.float32, device=CPU)[None, None, :, None].expand(1, 1, 10, 2 * D)
    out = pool_spans(x, torch.zeros(1, 1, D, dtype=torch.float32, device=CPU), sp)
    want = torch.tensor([1.0, 3.5, 6.0, 8.5], dtype=torch.float32, device=CPU)  # padding (a repeated row) weighs 0
    torch.testing.assert_close(out[0, 0, :, 0], want)


def test_stage_two_uniform_is_the_mean_of_span_summaries():
    D, consts = 4, [1.0, -2.0, 3.0, 5.0]
    summaries = pool_spans(_span_rows(consts, D), torch.zeros(1, 1, D, dtype=torch.float32, device=CPU), spans(POS, 3))
    out = pool_slots(summaries, torch.zeros(1, 1, 2, D, dtype=torch.float32, device=CPU))  # (1, 1, k=2, 2D)
    torch.testing.assert_close(out, torch.full((1, 1, 2, 2 * D), 1.75, dtype=torch.float32, device=CPU))
    # every span counts once whatever its length: the row mean would be 1.8
    row_mean = _span_rows(consts, D).mean(2)[0, 0, 0]
    assert abs(float(row_mean) - 1.8) < 1e-6
    # a sharp slot query picks the span whose key it matches
    q = torch.zeros(1, 1, 1, D, dtype=torch.float32, device=CPU)
    q[..., 0] = 100.0
    assert float(pool_slots(summaries, q)[0, 0, 0, 0]) == pytest.approx(5.0)


@pytest.mark.parametrize("sharer,receiver", [("gemma3", "llama"), ("llama", "gemma3"), ("qwen2", "gemma3")])
def test_zero_init_identity_and_both_stages_learn(sharer, receiver, agent_for):
    S, R = agent_for(sharer).prefill(SHARER_TEXT), agent_for(receiver).prefill(RECEIVER_TEXT)
    t = build("lcfx", S.geometry, R.geometry, span=4)
    out = t(S, R)
    assert all(torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values) for a, b in zip(out.layers, R.layers))
    Sb, Rb = S.to(dtype=torch.bfloat16), R.to(dtype=torch.bfloat16)
    assert all(torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values) and a.keys.dtype == torch.bfloat16
               for a, b in zip(t(Sb, Rb).layers, Rb.layers))
    with torch.no_grad():  # the zero-init output blocks the pooler's gradient; open it
        for f in t.fusers:
            f.out.weight.normal_(0.0, 0.05)
    out = t(S, R)
    sum(l.keys.float().pow(2).sum() + l.values.float().pow(2).sum() for l in out.layers).backward()
    for p in (t.pool.span_queries, t.pool.slot_queries):
        assert p.grad is not None and float(p.grad.abs().sum()) > 0


def test_pooler_sees_gaps_and_ignores_absolute_position(agent_for):
    S = agent_for("gemma3").prefill(SHARER_TEXT)
    t = build("lcfx", S.geometry, agent_for("llama").prefill("r").geometry, span=4)
    z = t.pool(S, layer_groups(S))  # (L_S, H k 2D)
    assert z.shape == (S.geometry.num_layers, t.pool.out_dim) and torch.isfinite(z).all()
    torch.testing.assert_close(t.pool(S.shift(37), layer_groups(S.shift(37))), z, rtol=1e-4, atol=1e-4)
    gaps = S.select([i for i in range(len(S)) if i % 3 != 1])
    lengths = spans(gaps.positions, 4).lengths.tolist()  # runs {0}, {2, 3}, {5, 6}, ...: the gaps cut spans
    assert lengths[0] == 1 and set(lengths[1:]) <= {1, 2} and sum(lengths) == len(gaps)
    assert not torch.allclose(t.pool(gaps, layer_groups(gaps)), z)


def test_parameter_counts_are_reported(agent_for):
    S, R = agent_for("gemma3").prefill("s"), agent_for("llama").prefill("r")
    t, x = build("lcfx", S.geometry, R.geometry), build("xkv", S.geometry, R.geometry)
    parts = t.n_params()
    assert parts["total"] == t.num_parameters == n_params(t) == parts["pool"] + parts["summary"] + parts["fusers"]
    g = S.geometry
    assert parts["pool"] == g.num_layers * g.num_kv_heads * g.head_dim * (1 + t.config.slots)  # stage 1 + stage 2
    assert n_params(x) == x.num_parameters > 0


def test_old_single_step_checkpoint_is_refused(agent_for, tmp_path):
    S, R = agent_for("qwen2").prefill("s"), agent_for("gemma3").prefill("r")
    t = build("lcfx", S.geometry, R.geometry)
    t.save(tmp_path)
    w = safetensors.torch.load_file(tmp_path / "translator.safetensors")
    w["pool.queries"] = w.pop("pool.slot_queries")
    del w["pool.span_queries"]
    safetensors.torch.save_file(w, tmp_path / "translator.safetensors")
    with pytest.raises(StateFormatError, match="two-stage span pooler"):
        load(tmp_path)
    with pytest.raises(LatentWireError, match="span"):
        build("lcfx", S.geometry, R.geometry, span=0)


def _median_ms(fn, calls: int) -> float:
    import statistics
    import time

    for _ in range(5):
        fn()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _timing(calls: int = 50) -> None:
    """Median time of `calls` calls after warm-up, tiny models, one thread, no grad: the whole forward of
    LCF-X vs XKV, and the sharer pooler alone (LCF's two stages vs XKV's one-step SlotPool, same groups)."""
    from latentwire.agent import Agent
    from latentwire.models import tiny_model, tiny_tokenizer

    torch.set_num_threads(1)
    tok = tiny_tokenizer()
    agents = {a: Agent(tiny_model(a), tok, model_name=a) for a in ("llama", "qwen2", "gemma3")}
    for sharer, receiver in [("gemma3", "llama"), ("llama", "gemma3"), ("qwen2", "gemma3"), ("llama", "qwen2")]:
        S, R = agents[sharer].prefill(SHARER_TEXT * 4), agents[receiver].prefill(RECEIVER_TEXT * 4)
        lc, xk = (build(m, S.geometry, R.geometry).eval() for m in ("lcfx", "xkv"))
        groups = layer_groups(S)
        with torch.no_grad():
            fwd = {"lcfx": _median_ms(lambda: lc(S, R), calls), "xkv": _median_ms(lambda: xk(S, R), calls)}
            pool = {"lcfx": _median_ms(lambda: lc.pool(S, groups), calls),
                    "xkv": _median_ms(lambda: xk.pool_s.pool_groups(groups), calls)}
        p = {"lcfx": n_params(lc), "xkv": n_params(xk)}
        g, h = S.geometry, R.geometry
        print(f"{sharer:>6} (L={g.num_layers} H={g.num_kv_heads} D={g.head_dim}) -> {receiver:<6} "
              f"(L={h.num_layers} H={h.num_kv_heads} D={h.head_dim}) T_S={len(S)} T_R={len(R)}\n"
              f"    forward: LCF-X {fwd['lcfx']:.2f} ms, XKV {fwd['xkv']:.2f} ms, "
              f"LCF-X/XKV x{fwd['lcfx'] / fwd['xkv']:.2f} | sharer pooler: LCF {pool['lcfx']:.3f} ms, "
              f"XKV {pool['xkv']:.3f} ms, x{pool['lcfx'] / pool['xkv']:.2f}"
              f" | params: LCF-X {p['lcfx']:,d}, XKV {p['xkv']:,d}, XKV/LCF-X {p['xkv'] / p['lcfx']:.3f}")


if __name__ == "__main__":
    _timing()

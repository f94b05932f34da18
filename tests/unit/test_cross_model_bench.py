"""benchmarks/cross_model.py's guards, on tiny models: the latent maps a plan uses are checked against their
pair and latent mode before any episode runs, and each map's identity is pinned for resumes."""
from __future__ import annotations

from pathlib import Path

import pytest

from latentwire.agent import Agent
from latentwire.protocols.base import SENDER_PROMPT
from latentwire.translate.latent_map import fit_latent_map

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
DOCS = ["Ana Silva leads the Heron project in Porto.", "Bruno Novak leads the Kestrel project."]


def _plan_with_map(cm, folder: Path, a: str, b: str, **extra):
    spec = {"name": "cacheback_x", "ratio": 8, "latent_steps": 2, "delivery": "spans+latent",
            "latent_map": str(folder)} | extra
    return [(f"{a}→{b} cacheback_x(ratio=8, delivery='spans+latent')", a, b, spec)]


def test_maps_are_checked_and_pinned(tmp_path, monkeypatch, models, tokenizer):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import cross_model as cm

    agents = {"qwen2": Agent(models["qwen2"], tokenizer, "qwen2"), "llama": Agent(models["llama"], tokenizer, "llama"),
              "gemma3": Agent(models["gemma3"], tokenizer, "gemma3")}
    fit_latent_map(agents["qwen2"], agents["llama"], [SENDER_PROMPT.format(document=d) for d in DOCS],
                   ridge=1e-2).save(tmp_path / "qwen2_llama")
    ident = cm.check_maps(_plan_with_map(cm, tmp_path / "qwen2_llama", "qwen2", "llama"), agents)
    assert set(ident) == {"qwen2_llama"} and len(ident["qwen2_llama"]["sha256"]) == 64
    assert ident["qwen2_llama"]["latent_mode"] == "rescale"
    with pytest.raises(SystemExit, match="qwen2.*llama.*gemma3"):  # the map of another pair, named
        cm.check_maps(_plan_with_map(cm, tmp_path / "qwen2_llama", "gemma3", "llama"), agents)
    with pytest.raises(SystemExit, match="'rescale' latent rows of qwen2.*'realign'"):
        cm.check_maps(_plan_with_map(cm, tmp_path / "qwen2_llama", "qwen2", "llama", latent_mode="realign"), agents)


def test_recorded_spec_keeps_repository_paths_relative(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import cross_model as cm

    inside = {"name": "cacheback_x", "latent_map": str(cm.ROOT / "runs" / "latent_maps" / "a_b")}
    assert cm.recorded(inside) == inside | {"latent_map": str(Path("runs") / "latent_maps" / "a_b")}
    outside = {"name": "cacheback_x", "latent_map": str(tmp_path / "a_b")}
    assert cm.recorded(outside) == outside  # a map outside the repository keeps its absolute path
    assert cm.recorded({"name": "text", "ratio": 8}) == {"name": "text", "ratio": 8}


def test_translators_are_planned_checked_and_pinned(tmp_path, monkeypatch, models, tokenizer):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import cross_model as cm

    from latentwire.translate import build

    agents = {k: Agent(models[k], tokenizer, k) for k in ("qwen2", "llama", "gemma3")}
    build("dense", agents["qwen2"].geometry, agents["llama"].geometry, context_aware=False).save(
        tmp_path / "dense_qwen2_llama", extra={"step": 7})
    rows = cm.plan([("qwen2", "llama"), ("gemma3", "llama")], [8], None, tmp_path)
    translated = [r for r in rows if r[3].get("delivery") == "translated"]
    assert [r[0] for r in translated] == ["qwen2→llama cacheback_x(ratio=8, delivery='translated')"]  # gemma3: none
    ident = cm.check_translators(translated, agents)
    assert ident["qwen2_llama"]["method"] == "dense" and ident["qwen2_llama"]["step"] == 7
    assert len(ident["qwen2_llama"]["sha256"]) == 64
    wrong = [("gemma3→llama x", "gemma3", "llama", translated[0][3])]
    with pytest.raises(SystemExit, match="qwen2 -> receiver llama; got sharer gemma3"):
        cm.check_translators(wrong, agents)
    build("dense", agents["gemma3"].geometry, agents["llama"].geometry, context_aware=True).save(
        tmp_path / "dense_gemma3_llama")
    aware = cm.plan([("gemma3", "llama")], [8], None, tmp_path)
    with pytest.raises(SystemExit, match="trained context-aware"):
        cm.check_translators(aware, agents)
    labels = {r[0] for r in rows}
    assert ("qwen2→llama cacheback_x(ratio=8, delivery='translated')", "qwen2→llama cacheback_x(ratio=8)") in \
        cm.verdict_pairs([("qwen2", "llama")], [8], labels)


def test_a_folder_grows_by_pairs_but_no_verdict_mixes_dtypes(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import cross_model as cm

    bf, f32 = "torch.bfloat16", "torch.float32"
    legacy = {"dtype": {"s": bf, "q": bf},  # written before rows recorded their dtype: one per model
              "protocols": {lab: {"sender": a, "receiver": b} for lab, a, b, _ in cm.plan([("s", "q")], [8], None)}}
    recorded = cm.row_dtypes(legacy)
    assert set(recorded.values()) == {bf} and "q→q alone" in recorded and "s→q text(ratio=8)" in recorded
    reverse = {lab: f32 for lab, *_ in cm.plan([("q", "s")], [8], None)}  # new rows only: s's references, q senders
    assert cm.dtype_clashes(recorded, reverse, [("s", "q"), ("q", "s")], [8]) == []
    third = {lab: f32 for lab, *_ in cm.plan([("g", "q")], [8], None)}  # would re-use q's bf16 references
    clash = cm.dtype_clashes(recorded, third, [("s", "q"), ("g", "q")], [8])
    assert [c.split(":")[0] for c in clash] == ["s→q", "g→q"]  # both pairs' verdicts would read the mixed q rows
    assert "`q→q alone` (recorded)" in clash[1] and "`g→q cacheback_x(ratio=8)`" in clash[1]
    assert cm.dtype_clashes(recorded, {lab: bf for lab in third}, [("s", "q"), ("g", "q")], [8]) == []
    assert cm.joint(bf, f32) == "torch.bfloat16→torch.float32"


def test_the_report_says_how_each_pair_ran(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import cross_model as cm

    rows = cm.plan([("s", "q"), ("q", "s")], [8], None)
    old_env = {"run": None, "cpu_model": "Xeon", "cpu_bf16": ["avx512_bf16"]}  # records from before run ids
    new_env = {"run": "r2", "cpu_model": "EPYC", "cpu_bf16": []}
    config = {"environment": old_env, "resumed": [new_env],
              "protocols": {lab: {"sender": a, "receiver": b,
                                  "dtype": "torch.float32" if b == "s" else "torch.bfloat16"} for lab, a, b, _ in rows}}
    records = [{"protocol": lab} if b == "q" else {"protocol": lab, "run": "r2"} for lab, a, b, _ in rows]
    records.append({"protocol": "s→q text(ratio=8)", "run": "r2"})  # one row of s→q resumed on the EPYC
    lines = cm.how_pairs_ran(config, records, [("s", "q"), ("q", "s")], [8])
    s_q = next(x for x in lines if x.startswith("- `s→q`"))
    assert s_q.startswith("- `s→q`: torch.bfloat16 on EPYC, no native bf16 (1 rows: `s→q text(ratio=8)`); "
                          "Xeon, native bf16 (avx512_bf16) (")
    assert s_q.endswith("compare machines too")
    assert "- `q→s`: torch.float32 on EPYC, no native bf16" in lines


def test_sender_step_rows_are_planned_and_judged(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import cross_model as cm

    rows = cm.plan([("s", "q")], [8, 16], None, None, (0, 8))  # 8 is the main row: not planned twice
    extra = [(lab, spec) for lab, _, _, spec in rows if "latent_steps=" in lab]
    assert extra == [("s→q cacheback_x(ratio=8, latent_steps=0)", {"name": "cacheback_x", "ratio": 8, "latent_steps": 0}),
                     ("s→q cacheback_x(ratio=16, latent_steps=0)", {"name": "cacheback_x", "ratio": 16, "latent_steps": 0})]
    assert not [lab for lab, *_ in cm.plan([("s", "q")], [8], None) if "latent_steps=" in lab]  # opt-in only
    pairs = cm.verdict_pairs([("s", "q")], [8, 16], {lab for lab, *_ in rows})
    g0 = [p for p in pairs if "latent_steps=0" in p[0]]
    assert g0 == [("s→q cacheback_x(ratio=8, latent_steps=0)", "s→q cacheback_x(ratio=8)"),
                  ("s→q cacheback_x(ratio=8, latent_steps=0)", "q→q cacheback(ratio=8)"),
                  ("s→q cacheback_x(ratio=16, latent_steps=0)", "s→q cacheback_x(ratio=16)"),
                  ("s→q cacheback_x(ratio=16, latent_steps=0)", "q→q cacheback(ratio=16)")]
    assert all("latent_steps=0" not in lab for p in pairs if "latent_steps=0" not in p[0] for lab in p)

"""The headline study's cells are pure functions of (cell, n, seed) and prefix-stable in n, so a cell's
records stay valid when a later run extends it (benchmarks/latent_vs_text.py)."""
from __future__ import annotations

from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_code1_prefix_stable_unique_and_spans_blocks(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from latent_vs_text import code1_episodes

    short, long = code1_episodes(5, 7, block=12), code1_episodes(14, 7, block=12)
    assert [e.to_json() for e in short] == [e.to_json() for e in long[:5]]
    assert len({e.id for e in long}) == len({e.question for e in long}) == 14
    assert all(e.meta["scope"] == "single" for e in long)
    # 12-episode blocks hold fewer than 14 single-scope questions: later blocks are renamed, not clashing
    assert any(e.id.startswith("code-b") for e in long) and long[0].id == "code-0000"


def test_facts_cells_prefix_stable(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from latent_vs_text import cell_episodes

    a, b = cell_episodes("facts1_500", 3, 11), cell_episodes("facts1_500", 6, 11)
    assert [e.to_json() for e in a] == [e.to_json() for e in b[:3]]


def test_command_log_keeps_every_command_once_in_order(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from latent_vs_text import commands, log_command

    assert commands(tmp_path) == []
    core = "python benchmarks/latent_vs_text.py --cells facts1_500 --protocols core --n 150"
    grid = "python benchmarks/latent_vs_text.py --cells facts1_500 --protocols all --n 150"
    for cmd in (core, core, grid, core):  # a resume of the same command is not logged twice
        log_command(tmp_path, cmd)
    assert commands(tmp_path) == [core, grid]
    assert (tmp_path / "command.txt").read_text() == f"{core}\n{grid}\n"


def test_cell_report_and_index_quote_one_holm_p(monkeypatch, tmp_path):
    """The index adjusts each cell's headline rows over the cell's own report family, so the two agree."""
    import json

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import latent_vs_text as L
    from latentwire.bench.report import compare, with_holm

    protocols = {"text": {"name": "text", "params": {}}, "fullcontext": {"name": "fullcontext", "params": {}},
                 "text(ratio=8)": {"name": "text", "params": {"ratio": 8}},
                 "fullkv(latent_steps=8, query_aware=False)": {"name": "fullkv", "params": {}},
                 "fullkv(latent_steps=8, query_aware=True)": {"name": "fullkv", "params": {"query_aware": True}},
                 "cacheback(ratio=8, latent_steps=8)": {"name": "cacheback", "params": {"ratio": 8}},
                 "cacheback(ratio=8, latent_steps=0)": {"name": "cacheback", "params": {"ratio": 8}}}
    pairs = L.cell_pairs(protocols)
    assert len(pairs) == len(set(pairs)) and ("cacheback(ratio=8, latent_steps=8)", "text(ratio=8)") in pairs
    assert ("fullkv(latent_steps=8, query_aware=False)", "fullkv(latent_steps=8, query_aware=True)") in pairs
    records = [{"episode": f"e{i}", "protocol": p, "accuracy": float((i * 7 + j * 3) % 5 < 2), "tteoa": 1.0 + j,
                "sender_seconds": [0.5]}
               for i in range(30) for j, p in enumerate(protocols)]
    for cell in ("one_cell", "two_cell"):  # a second cell must not change the first's Holm p
        folder = tmp_path / cell
        folder.mkdir()
        (folder / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        (folder / "config.json").write_text(json.dumps({"config": {"protocols": protocols, "dtype": "bfloat16"},
                                                        "episodes": [f"e{i}" for i in range(30)]}))
    family = with_holm([compare(records, a, b) for a, b in pairs])
    want = {(c["a"], c["b"]): c["p_holm"] for c in family}
    L.write_index(tmp_path)
    got = json.loads((tmp_path / "verdicts.json").read_text())
    assert got and all(v["p_holm"] == want[(v["a"], v["b"])] for v in got)
    assert len(got) == 2 * sum((a, b) in want for a, b in L.HEADLINE)

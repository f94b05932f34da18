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

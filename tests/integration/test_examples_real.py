"""The README's first example on the bundled default model: CacheBack's answer must be right, not only printed."""
import runpy
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cacheback_fanin.py"


def test_cacheback_fanin_example_answers_lisbon_on_the_default_model(monkeypatch, capsys):
    monkeypatch.delenv("LATENTWIRE_EXAMPLE_MODEL", raising=False)  # the bundled default, as a new user runs it
    monkeypatch.setattr(sys, "argv", [str(EXAMPLE)])
    runpy.run_path(str(EXAMPLE), run_name="__main__")
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.strip()}
    assert set(lines) == {"alone", "text", "fullkv", "cacheback"}, lines
    assert "Lisbon" in lines["cacheback"], lines["cacheback"]
    assert "Lisbon" in lines["fullkv"], lines["fullkv"]
    assert "Lisbon" not in lines["alone"], "the receiver alone never read the project notes"

"""Every file in examples/ runs end to end on the tiny models; docs/examples.md shows each one verbatim, and every
example the README shows is verbatim too.

The examples load their models with `Agent.from_pretrained(name)`, the name taken from an environment
variable (bundled models by default). Here the names are "tiny-<arch>" and `from_pretrained` is patched
to build the session's tiny random-weight models, so the examples run in seconds without model files.
Tiny models answer nonsense; what is checked is that every call goes through and prints its lines.
"""
from __future__ import annotations

import re
import runpy
import sys
from pathlib import Path

import pytest

from latentwire.agent import Agent
from latentwire.bench.episode import load_episodes

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
README = ROOT / "README.md"
EXAMPLES_PAGE = ROOT / "docs" / "examples.md"
# A README code block that is an example's content is preceded by `<!-- example: examples/NAME.py -->`.
_EXAMPLE_BLOCK = re.compile(r"<!-- example: (examples/[\w.]+) -->\s*\n```python\n(.*?)```", re.S)
_EPISODE_BLOCK = re.compile(r"<!-- episode -->\s*\n```json\n(.*?)```", re.S)


@pytest.fixture
def tiny_agents(monkeypatch, models, tokenizer):
    """`Agent.from_pretrained("tiny-<arch>")` builds an Agent around the session's tiny model of <arch>."""
    def from_pretrained(cls, name, *args, **kw):
        arch = name.removeprefix("tiny-")
        assert name.startswith("tiny-") and arch in models, f"examples must take the model name from the env: {name}"
        return cls(models[arch], tokenizer, model_name=arch)

    monkeypatch.setattr(Agent, "from_pretrained", classmethod(from_pretrained))
    monkeypatch.setenv("LATENTWIRE_EXAMPLE_MODEL", "tiny-llama")
    monkeypatch.setenv("LATENTWIRE_EXAMPLE_SHARER", "tiny-gemma3")  # a different family from the receiver
    monkeypatch.setenv("LATENTWIRE_EXAMPLE_RECEIVER", "tiny-llama")
    monkeypatch.delenv("LATENTWIRE_EXAMPLE_TRANSLATOR", raising=False)


def test_there_are_examples():
    assert {p.name for p in EXAMPLES} >= {"cacheback_fanin.py", "merge.py", "translate.py", "your_documents.py"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_runs_on_tiny_models(path, tiny_agents, monkeypatch, tmp_path, capsys):
    argv = [str(path)]
    if path.name == "your_documents.py":
        docs = ["The blue crate holds 58 copper bolts.", "The red crate is empty."]
        for i, text in enumerate(docs):
            (tmp_path / f"doc{i}.txt").write_text(text, encoding="utf-8")
        argv += ["How many bolts are in the blue crate?"] + [str(tmp_path / f"doc{i}.txt") for i in range(len(docs))]
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(path), run_name="__main__")
    out = capsys.readouterr().out
    assert out.strip(), f"{path.name} printed nothing"


def test_the_examples_page_shows_every_example_verbatim_and_the_readme_shows_some():
    blocks = _EXAMPLE_BLOCK.findall(EXAMPLES_PAGE.read_text(encoding="utf-8"))
    shown = {name for name, _ in blocks}
    assert shown == {f"examples/{p.name}" for p in EXAMPLES}, "every example appears in docs/examples.md, once each"
    assert len(blocks) == len(shown)
    in_readme = _EXAMPLE_BLOCK.findall(README.read_text(encoding="utf-8"))
    assert "examples/cacheback_fanin.py" in {name for name, _ in in_readme}
    for name, code in blocks + in_readme:
        assert code == (ROOT / name).read_text(encoding="utf-8"), f"the block for {name} differs from the file"


def test_readme_episode_line_loads(tmp_path):
    blocks = _EPISODE_BLOCK.findall(README.read_text(encoding="utf-8"))
    assert blocks, "the README shows an episode line"
    path = tmp_path / "my.jsonl"
    path.write_text(blocks[0], encoding="utf-8")
    (episode,) = load_episodes(path)
    assert episode.topology == "fanin" and len(episode.contexts) >= 2
    assert all(text in " ".join(episode.contexts) for text in episode.evidence_text())


def test_your_documents_says_what_to_do_when_a_message_would_overflow(tiny_agents, monkeypatch, tmp_path, capsys):
    """A document set too long for one protocol: that protocol is refused before compute with the way out, and
    the example goes on with the protocols that fit (here CacheBack at 8× fits; full context does not)."""
    agent = Agent.from_pretrained("tiny-llama")
    sentence = "The blue crate holds 58 copper bolts. "
    per_sentence = len(agent.tokenizer(sentence, add_special_tokens=False)["input_ids"])
    long_doc = sentence * int(0.6 * agent.context_window / per_sentence)  # one fits a sender; two overflow
    paths = []
    for i in range(2):
        paths.append(tmp_path / f"doc{i}.txt")
        paths[-1].write_text(long_doc, encoding="utf-8")
    monkeypatch.setattr(sys, "argv", [str(ROOT / "examples" / "your_documents.py"), "How many bolts?", *map(str, paths)])
    runpy.run_path(str(ROOT / "examples" / "your_documents.py"), run_name="__main__")
    lines = capsys.readouterr().out.splitlines()
    by_protocol = {line.split()[0]: line for line in lines if line.strip()}
    assert "does not fit" in by_protocol["fullcontext"] and "fewer or shorter documents" in by_protocol["fullcontext"]
    assert "does not fit" not in by_protocol["cacheback"] and "bytes" in by_protocol["cacheback"]

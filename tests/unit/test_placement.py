"""Device and dtype defaults come from one place, bad requests are one-line typed errors, runs record both."""
import json

import pytest
import torch

from latentwire import cli, placement
from latentwire.errors import DeviceError
from latentwire.placement import dtype_name, parse_device, parse_dtype, resolve


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    monkeypatch.delenv("LATENTWIRE_DEVICE", raising=False)
    monkeypatch.delenv("LATENTWIRE_DTYPE", raising=False)


@pytest.mark.parametrize("name,want", [("bf16", torch.bfloat16), ("bfloat16", torch.bfloat16),
                                       ("float32", torch.float32), ("fp32", torch.float32),
                                       ("torch.float16", torch.float16), (torch.bfloat16, torch.bfloat16),
                                       ("auto", None), (None, None)])
def test_dtype_names(name, want):
    assert parse_dtype(name) == want


def test_unknown_dtype_lists_the_valid_ones():
    with pytest.raises(DeviceError, match="unknown dtype 'bf8'; valid: auto, .*bfloat16.*float32"):
        parse_dtype("bf8")
    with pytest.raises(DeviceError, match="not supported"):
        parse_dtype(torch.int8)


@pytest.mark.parametrize("device", ["tpu", "gpu0", "meta"])
def test_unknown_devices_are_refused(device):
    with pytest.raises(DeviceError, match="valid: auto, cpu, cuda"):
        parse_device(device)


def test_cuda_without_cuda_says_what_to_do(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeviceError, match="CUDA is not available here.*use --device cpu"):
        resolve("cuda")


def test_cuda_index_past_the_last_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(DeviceError, match=r"only 1 CUDA device\(s\)"):
        parse_device("cuda:3")


def test_bf16_on_a_cuda_device_without_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (7, 0))
    assert resolve("cuda").dtype == torch.float32  # the default falls back
    with pytest.raises(DeviceError, match="does not support bfloat16"):
        resolve("cuda", "bf16")  # an explicit request is refused, not silently changed


def test_cuda_default_dtype_is_bf16_only_where_it_is_native(monkeypatch):
    """torch.cuda.is_bf16_supported() counts emulation (True on a V100 or T4): the default asks the device's compute
    capability instead, of the device asked for."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)  # emulated counts here
    caps = {0: (7, 0), 1: (8, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: caps[torch.device(d).index or 0])
    assert resolve("cuda:0").dtype == torch.float32 and "7.0" in resolve("cuda:0").reason
    assert resolve("cuda:1").dtype == torch.bfloat16
    assert resolve("cuda:0", "bf16").dtype == torch.bfloat16  # asked for: runs, emulated


def test_fp16_on_the_cpu_is_refused():
    with pytest.raises(DeviceError, match="float16 on the CPU.*bfloat16"):
        resolve("cpu", "float16")


@pytest.mark.parametrize("flags,want", [(("amx_bf16", "avx512_bf16"), torch.bfloat16), (("avx512_bf16",), torch.bfloat16),
                                        ((), torch.float32)])
def test_cpu_default_dtype_follows_native_bf16(monkeypatch, flags, want):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(placement, "cpu_bf16_flags", lambda: flags)
    place = resolve()
    assert place.device == torch.device("cpu") and place.dtype == want
    assert (", ".join(flags) in place.reason) if flags else "emulated" in place.reason


def test_environment_overrides_the_default_but_not_an_argument(monkeypatch):
    monkeypatch.setenv("LATENTWIRE_DTYPE", "float32")
    assert resolve("cpu").dtype == torch.float32 and "LATENTWIRE_DTYPE" in resolve("cpu").reason
    assert resolve("cpu", "bf16").dtype == torch.bfloat16
    monkeypatch.setenv("LATENTWIRE_DEVICE", "tpu")
    with pytest.raises(DeviceError, match=r"\$LATENTWIRE_DEVICE='tpu': unknown device"):  # names the variable
        resolve()
    assert resolve("cpu").device == torch.device("cpu")  # a given device: the bad variable is not read
    monkeypatch.setenv("LATENTWIRE_DTYPE", "fp64")
    with pytest.raises(DeviceError, match=r"\$LATENTWIRE_DTYPE='fp64'"):
        resolve("cpu")
    assert resolve("cpu", "float32").dtype == torch.float32


def test_models_command_shows_the_default_placement(capsys):
    assert cli.main(["models"]) == 0
    place = resolve()
    assert f"--device {place.device} --dtype {dtype_name(place.dtype)}" in capsys.readouterr().out


def test_bad_placement_fails_before_anything_loads(capsys, tmp_path):
    assert cli.main(["bench", "run", "--task", "facts", "--protocols", "alone", "--dtype", "fp8",
                     "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "DeviceError: unknown dtype 'fp8'" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run" / "records.jsonl").exists()


def test_run_config_records_device_and_dtype(tokenizer, tmp_path):
    from latentwire.agent import Agent
    from latentwire.bench.episode import Episode
    from latentwire.bench.runner import RunConfig, run
    from latentwire.models import tiny_model

    agent = Agent(tiny_model("llama").to(torch.bfloat16), tokenizer, model_name="llama")
    ep = Episode(id="e0", task="t", topology="fanin", question="What?", answers=["x"], contexts=["Some text."],
                 evidence=[], meta={})
    path = tmp_path / "eps.jsonl"
    path.write_text(ep.to_json() + "\n")
    out = run(RunConfig(str(path), "alone", "llama", device="cpu", dtype="float32"), tmp_path / "run",
              progress=False, agent=agent)
    record = json.loads((out / "config.json").read_text())
    assert (record["config"]["device"], record["config"]["dtype"]) == ("cpu", "bfloat16")  # what ran: the agent's
    assert "cpu_bf16" in record["environment"] and "cuda" in record["environment"]


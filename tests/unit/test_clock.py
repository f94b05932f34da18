"""The library's one clock (`latentwire.clock.now`): it waits for the CUDA devices it is given before reading
perf_counter, and nothing else in the package reads a clock, so no timed interval ends before its device's
queued work (the GPU check, benchmarks/gpu_smoke.py, runs the suite on a CUDA device)."""
from __future__ import annotations

import ast
import time
from pathlib import Path

import pytest
import torch

import latentwire
from latentwire import clock

SRC = Path(latentwire.__file__).resolve().parent


@pytest.fixture
def synced(monkeypatch):
    """The devices torch.cuda.synchronize was called with, in order (no CUDA device is needed to record them)."""
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(torch.device(device)))
    return calls


def test_now_waits_for_each_cuda_device_given(synced):
    t0 = time.perf_counter()
    t = clock.now(torch.device("cuda", 1), "cpu", None, "cuda:0")
    assert t0 <= t <= time.perf_counter()
    assert synced == [torch.device("cuda", 1), torch.device("cuda", 0)]


def test_now_on_cpu_or_without_a_device_never_synchronises(synced):
    a = clock.now()
    b = clock.now(torch.device("cpu"), "cpu", None)
    assert a <= b and synced == []


def test_timed_waits_for_every_device_it_is_given_at_both_ends(synced):
    from latentwire.protocols.base import timed

    out, seconds = timed({torch.device("cuda", 0), torch.device("cpu")}, sum, [1, 2])
    assert out == 3 and seconds >= 0 and synced == [torch.device("cuda", 0)] * 2
    synced.clear()
    assert timed("cuda:1", len, "ab")[0] == 2 and synced == [torch.device("cuda", 1)] * 2  # one device, not a set


def test_now_refuses_a_device_name_torch_does_not_know():
    with pytest.raises(RuntimeError):
        clock.now("not-a-device")


def _clock_reads(tree: ast.AST) -> list[int]:
    """Lines that read a clock directly: time.perf_counter/time/monotonic (and their _ns forms), called or imported."""
    names = {"perf_counter", "time", "monotonic", "process_time"}
    names |= {n + "_ns" for n in names}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "time" \
                and node.attr in names:
            out.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "time" and {a.name for a in node.names} & names:
            out.append(node.lineno)
    return sorted(out)


def test_no_module_but_the_clock_reads_time():
    """Every timed boundary goes through `now` (a direct perf_counter would end a CUDA interval at the launch)."""
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        if path == SRC / "clock.py" or "stdlib" in path.relative_to(SRC).parts:  # stdlib: task documents (data)
            continue
        offenders += [f"{path.relative_to(SRC)}:{line}" for line in _clock_reads(ast.parse(path.read_text("utf-8")))]
    assert offenders == [], offenders


def test_the_source_rule_finds_a_direct_clock_read():
    """The rule above can fail: it sees each way of reading time directly."""
    src = "import time\nfrom time import monotonic\nt = time.perf_counter()\nu = time.time_ns()\ntime.sleep(1)\n"
    assert _clock_reads(ast.parse(src)) == [2, 3, 4]

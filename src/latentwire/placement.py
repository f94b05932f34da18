"""Where models run and in which dtype: the one place that picks defaults and validates requests.

    placement = resolve()                      # defaults: CUDA if available, else CPU; bf16 where it is fast
    placement = resolve("cuda:1", "bf16")      # explicit; a device or dtype that cannot run is a DeviceError

Defaults, in order: the argument, then $LATENTWIRE_DEVICE / $LATENTWIRE_DTYPE, then
  device: "cuda" when `torch.cuda.is_available()`, else "cpu";
  dtype:  bfloat16 on CUDA devices that support it and on CPUs with native bf16 arithmetic (AMX or
          AVX512-BF16, where a bf16 prefill is 2.6-3.3x faster than fp32); float32 everywhere else.
Every other module takes its device from the model or state it works on, never from a constant.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch

from .errors import DeviceError

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16, "half": torch.float16}
_CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")


@functools.lru_cache(maxsize=1)
def cpu_bf16_flags() -> tuple[str, ...]:
    """The CPU feature flags that make bf16 matmuls native here (Linux /proc/cpuinfo; empty elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return tuple(fl for fl in _CPU_BF16_FLAGS if fl in flags)
    except OSError:
        pass
    return ()


@dataclass(frozen=True)
class Placement:
    device: torch.device
    dtype: torch.dtype
    reason: str = ""  # why these were chosen (shown by `latentwire models`, recorded in run configs)

    def to_json(self) -> dict:
        return {"device": str(self.device), "dtype": dtype_name(self.dtype), "reason": self.reason}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def parse_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    """A torch dtype from a name ("bf16", "float32", ...), a dtype, or None/"auto" (= pick the default)."""
    if dtype is None or isinstance(dtype, torch.dtype):
        if dtype is not None and dtype not in DTYPES.values():
            raise DeviceError(f"dtype {dtype} is not supported for models; use one of float32, bfloat16, float16")
        return dtype
    key = str(dtype).strip().lower().removeprefix("torch.")
    if key == "auto":
        return None
    if key not in DTYPES:
        raise DeviceError(f"unknown dtype {dtype!r}; valid: auto, {', '.join(sorted(DTYPES))}")
    return DTYPES[key]


def parse_device(device: str | torch.device | None) -> torch.device | None:
    """A torch device that exists on this machine, or None/"auto" (= pick the default)."""
    if device is None or (isinstance(device, str) and device.strip().lower() == "auto"):
        return None
    try:
        dev = torch.device(device.strip() if isinstance(device, str) else device)
    except (RuntimeError, TypeError) as e:
        raise DeviceError(f"unknown device {device!r}; valid: auto, cpu, cuda, cuda:N, mps") from e
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(f"device {device!r}: CUDA is not available here (torch {torch.__version__}, "
                              f"CUDA build: {torch.version.cuda or 'no'}); use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise DeviceError(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) here "
                              f"(cuda:0..cuda:{torch.cuda.device_count() - 1})")
    elif dev.type == "mps":
        if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise DeviceError(f"device {device!r}: MPS is not available here; use --device cpu")
    elif dev.type != "cpu":
        raise DeviceError(f"device {device!r} is not supported; valid: auto, cpu, cuda, cuda:N, mps")
    return dev


# Host-side work that no model state places (text retrievers and their small encoders): always the CPU.
HOST = torch.device("cpu")


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def default_dtype(device: torch.device) -> tuple[torch.dtype, str]:
    """The fastest dtype that runs natively on `device`, and why."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)  # this device, not the current one
        if major >= 8:  # Ampere and later; older cards (V100, T4) only emulate bf16, slowly
            return torch.bfloat16, f"CUDA device with native bf16 (compute capability {major}.{minor})"
        return torch.float32, f"CUDA device without native bf16 (compute capability {major}.{minor})"
    if device.type == "cpu":
        flags = cpu_bf16_flags()
        if flags:
            return torch.bfloat16, f"CPU with native bf16 ({', '.join(flags)})"
        return torch.float32, "CPU without AMX / AVX512-BF16: bf16 would be emulated (slow)"
    return torch.float32, f"{device.type}: float32 by default"


def check_runs(device: torch.device, dtype: torch.dtype) -> None:
    """DeviceError when `device` cannot run a model in `dtype`."""
    if device.type == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported(
            including_emulation=True):  # an explicit request runs where it can, emulated or not
        raise DeviceError(f"{device} does not support bfloat16; use --dtype float32 (or float16)")
    if device.type == "cpu" and dtype == torch.float16:
        raise DeviceError("float16 on the CPU is emulated and slower than float32; use --dtype bfloat16 "
                          "(native on CPUs with AMX / AVX512-BF16) or float32")


def resolve(device: str | torch.device | None = None, dtype: str | torch.dtype | None = None) -> Placement:
    """Validate a requested device and dtype and fill in the defaults (see the module docstring)."""
    dev = parse_device(device)
    env_dev = None if dev else _from_env("LATENTWIRE_DEVICE", parse_device)  # a given device wins: env unread
    reasons = ["device given" if dev else "device from $LATENTWIRE_DEVICE" if env_dev else
               "CUDA available" if torch.cuda.is_available() else "no CUDA"]
    dev = dev or env_dev or default_device()
    dt = parse_dtype(dtype)
    if dt is None:
        dt = _from_env("LATENTWIRE_DTYPE", parse_dtype)
        if dt is None:
            dt, why = default_dtype(dev)
            reasons.append(why)
        else:
            reasons.append("dtype from $LATENTWIRE_DTYPE")
    else:
        reasons.append("dtype given")
    check_runs(dev, dt)
    return Placement(dev, dt, "; ".join(reasons))


def _from_env(name: str, parse):
    """`parse` of the environment variable `name` (None when unset); a bad value's error names the variable."""
    value = os.environ.get(name)
    try:
        return parse(value)
    except DeviceError as e:
        raise DeviceError(f"${name}={value!r}: {e}") from e

"""Translator forward time on fixed inputs: XKV against the LCF-X fuser (docs/methods.md, "XKV").

The XKV paper reports its translator 10.3× faster than the LCF-X fuser with 76% fewer trainable
parameters. `compare` measures both ratios on one pair of states:

    time ratio   = median LCF-X forward ÷ median XKV forward      (the paper: 10.3)
    param ratio  = XKV trainable parameters ÷ LCF-X's             (the paper: ≤ 0.24)

A forward is `compose(translator, states)`, what the `translated` pair protocol times as
`translator_ms`, under `torch.inference_mode()`, on the same inputs every call. The methods' calls
are interleaved (one of each per round, after `warmup` rounds), so slow drift in the machine's
speed reaches both alike; the median is over `calls` rounds. On CUDA each call is synchronised.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import torch

from ..clock import now
from ..errors import ConfigError
from .base import Translator
from .compose import PairStates, compose

MIN_CALLS = 50


@dataclass
class ForwardTiming:
    method: str
    parameters: int
    median_ms: float
    calls: int
    times_ms: list[float] = field(repr=False, default_factory=list)

    def to_json(self) -> dict:
        return {"method": self.method, "parameters": self.parameters, "median_ms": self.median_ms,
                "calls": self.calls, "times_ms": self.times_ms}


def _device(translator: Translator) -> torch.device:
    return next(translator.parameters()).device


def time_forwards(translators: dict[str, Translator], states: PairStates, calls: int = MIN_CALLS,
                  warmup: int = 5) -> dict[str, ForwardTiming]:
    """Median forward time (ms) of each translator over `calls` interleaved calls on `states`, after
    `warmup` untimed rounds."""
    if calls < 1 or warmup < 0:
        raise ConfigError(f"calls must be ≥ 1 and warmup ≥ 0, got {calls}, {warmup}")
    times: dict[str, list[float]] = {name: [] for name in translators}
    with torch.inference_mode():
        for round_ in range(warmup + calls):
            for name, t in translators.items():
                t0 = now(_device(t))
                compose(t, states)
                t1 = now(_device(t))
                if round_ >= warmup:
                    times[name].append(1e3 * (t1 - t0))
    return {name: ForwardTiming(t.name, t.num_parameters, statistics.median(times[name]), calls, times[name])
            for name, t in translators.items()}


def compare(xkv: Translator, lcfx: Translator, states: PairStates, calls: int = MIN_CALLS,
            warmup: int = 5) -> dict:
    """XKV vs LCF-X on the same states: both timings, the time ratio LCF-X ÷ XKV and the parameter
    ratio XKV ÷ LCF-X."""
    if (xkv.name, lcfx.name) != ("xkv", "lcfx"):
        raise ConfigError(f"compare(xkv, lcfx) got {xkv.name!r}, {lcfx.name!r}")
    out = time_forwards({"xkv": xkv, "lcfx": lcfx}, states, calls, warmup)
    return {"xkv": out["xkv"], "lcfx": out["lcfx"],
            "time_ratio": out["lcfx"].median_ms / out["xkv"].median_ms,
            "param_ratio": out["xkv"].parameters / out["lcfx"].parameters}

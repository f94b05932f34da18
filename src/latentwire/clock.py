"""The library's one clock. CUDA runs kernels asynchronously: `time.perf_counter()` read right after a launch
measures the launch, not the work, and the work then lands in whichever later interval first waits for it (a
sender's selection counted as the receiver's time). Every timed boundary reads `now(device, ...)`, which first
waits for the work queued on each CUDA device it is given; on a CPU (or with no device) it is perf_counter."""
from __future__ import annotations

import time

import torch


def now(*devices: torch.device | str | None) -> float:
    """perf_counter seconds, after every CUDA device among `devices` has finished the work queued so far."""
    for device in devices:
        if device is not None and torch.device(device).type == "cuda":
            torch.cuda.synchronize(device)
    return time.perf_counter()

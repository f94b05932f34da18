"""Integration tier: the real bundled SmolLM2, loaded once per session (its cache is built on first use).

The shared fixture is fp32 on purpose: several tests here compare states bit-for-bit against the
model's own fp32 forward (exactness to 1e-4). The bf16 default path has its own tests (test_bf16.py)
with bf16 tolerances (docs/precision.md).
"""
from pathlib import Path

import pytest
from transformers.utils import logging as hf_logging

from latentwire.agent import Agent


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """Every test in this folder is `integration` (real bundled models), marked in its file or not, so
    `pytest -m "not integration"` never builds a model cache."""
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def smollm2() -> Agent:
    hf_logging.disable_progress_bar()
    return Agent.from_pretrained("smollm2-135m", dtype="float32")
